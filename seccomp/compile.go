package seccomp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"

	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// Program is a compiled policy: the classic-BPF filter for the native
// architecture plus the rule list the plan prints. A Program returned by
// Compile is the caller's own copy.
type Program struct {
	Policy        string
	Arch          string // libseccomp's name of the native arch: "amd64", "arm64"
	Filter        []unix.SockFilter
	Rules         []RuleView
	DefaultAction string
}

// RuleView is one (syscall, rule) pair of a compiled policy, for
// `str profile show --plan`.
type RuleView struct {
	Syscall   string
	Number    int32  // native syscall number, -1 when the syscall does not exist on this arch
	Action    string // "allow", "errno EPERM", "kill_process"
	Condition string // "" (always) or "arg1 & 0xffffffff == 0x5412 && ..."
	Reason    string
	// Skipped is set when the syscall does not exist on the native arch
	// (e.g. open on arm64), so the rule is not part of Filter.
	Skipped bool
}

// Audit architecture values (linux/audit.h) of the architectures this
// package compiles for, and the x32 syscall bit.
const (
	AuditArchX86_64  uint32 = 0xc000003e
	AuditArchI386    uint32 = 0x40000003
	AuditArchAArch64 uint32 = 0xc00000b7
	AuditArchARM     uint32 = 0x40000028

	// X32SyscallBit is __X32_SYSCALL_BIT: x32 syscalls enter the x86_64
	// kernel with AUDIT_ARCH_X86_64 and this bit set in nr.
	X32SyscallBit int32 = 0x40000000
)

// nativeArch describes the architecture we compile for.
type nativeArch struct {
	scmp  libseccomp.ScmpArch
	name  string
	audit uint32
}

func native() (nativeArch, error) {
	a, err := libseccomp.GetNativeArch()
	if err != nil {
		return nativeArch{}, fmt.Errorf("seccomp: native architecture: %w", err)
	}
	switch a {
	case libseccomp.ArchAMD64:
		return nativeArch{a, "amd64", AuditArchX86_64}, nil
	case libseccomp.ArchARM64:
		return nativeArch{a, "arm64", AuditArchAArch64}, nil
	}
	return nativeArch{}, fmt.Errorf("seccomp: native architecture %s is not supported (amd64 and arm64 are)", a)
}

// knownSyscall reports whether libseccomp knows name as a real syscall on
// amd64 or arm64 (policies are shared by both; a name that exists only on
// one is skipped on the other and shown as skipped in the plan).
func knownSyscall(name string) bool {
	for _, a := range []libseccomp.ScmpArch{libseccomp.ArchAMD64, libseccomp.ArchARM64} {
		if nr, err := libseccomp.GetSyscallFromNameByArch(name, a); err == nil && nr >= 0 {
			return true
		}
	}
	return false
}

var programCache sync.Map // cache key (policy name + content hash) -> *Program

// Compile validates the policy and compiles it for the native
// architecture. Programs are cached per policy name and content hash
// inside the process, so compiling the same policy again costs a hash and
// a map lookup (a cached program was valid when it was stored).
//
// The filter is, in order: a guard written here (archGuard: a foreign
// architecture or an x32 syscall number kills the process), the blocks
// for syscalls with argument conditions (argcode.go), and libseccomp's
// program for all other syscalls, whose own bad-arch action is
// kill_process as well. Before a program is cached, Compile runs it
// through Simulate and compares it with Evaluate (see selfCheck).
func (p *Policy) Compile() (*Program, error) {
	key, err := cacheKey(p)
	if err != nil {
		return nil, err
	}
	if v, ok := programCache.Load(key); ok {
		return v.(*Program).clone(), nil
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	// An embedded policy, unchanged: its program was compiled and
	// self-checked at build time (precompiled.go).
	if prog, ok := fromPrecompiled(p, key); ok {
		v, _ := programCache.LoadOrStore(key, prog)
		return v.(*Program).clone(), nil
	}
	prog, err := p.compile()
	if err != nil {
		return nil, err
	}
	v, _ := programCache.LoadOrStore(key, prog)
	return v.(*Program).clone(), nil
}

var embeddedCache sync.Map // embedded policy name -> *Program

// CompileEmbedded is Load(name) followed by Compile, cached by name: the
// embedded files cannot change while the process runs, so after the
// first call this is a map lookup and a copy. This is what the worker
// calls for every sandbox it starts.
func CompileEmbedded(name string) (*Program, error) {
	if v, ok := embeddedCache.Load(name); ok {
		return v.(*Program).clone(), nil
	}
	if prog, ok := embeddedPrecompiled(name); ok {
		embeddedCache.Store(name, prog)
		return prog.clone(), nil
	}
	p, err := Load(name)
	if err != nil {
		return nil, err
	}
	prog, err := p.Compile()
	if err != nil {
		return nil, err
	}
	embeddedCache.Store(name, prog)
	return prog.clone(), nil
}

func cacheKey(p *Policy) (string, error) {
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("seccomp: policy %s: hash for cache: %w", p.source, err)
	}
	sum := sha256.Sum256(b)
	return p.Name + "\x00" + string(sum[:]), nil
}

func (pr *Program) clone() *Program {
	c := *pr
	c.Filter = append([]unix.SockFilter(nil), pr.Filter...)
	c.Rules = append([]RuleView(nil), pr.Rules...)
	return &c
}

func scmpAction(a Action) libseccomp.ScmpAction {
	switch a.Kind {
	case ActionAllow:
		return libseccomp.ActAllow
	case ActionErrno:
		return libseccomp.ActErrno.SetReturnCode(int16(errnos[a.Errno]))
	case ActionKillProcess:
		return libseccomp.ActKillProcess
	case ActionKillThread:
		return libseccomp.ActKillThread
	case ActionLog:
		return libseccomp.ActLog
	}
	panic("seccomp: unvalidated action " + a.Kind)
}

// retValue is the SECCOMP_RET_* value the kernel sees for a.
func retValue(a Action) uint32 {
	switch a.Kind {
	case ActionAllow:
		return RetAllow
	case ActionErrno:
		return RetErrno | uint32(errnos[a.Errno])
	case ActionKillProcess:
		return RetKillProcess
	case ActionKillThread:
		return RetKillThread
	case ActionLog:
		return RetLog
	}
	panic("seccomp: unvalidated action " + a.Kind)
}

// compile does the work of Compile for a validated policy:
//
//  1. pick the native arch and resolve every syscall name
//  2. build a libseccomp filter: default action, bad-arch action
//     kill_process, and the unconditional rules of every syscall that has
//     no conditional rule
//  3. export libseccomp's BPF through a memfd and decode the records
//  4. generate the argument blocks for syscalls with conditional rules
//     (argcode.go)
//  5. assemble: arch/x32 guard, argument blocks, libseccomp's program
//  6. check the result against the policy's own semantics (Evaluate)
//     with Simulate
//
// Why libseccomp does not get the conditional rules: when a syscall has an
// unconditional rule and conditional rules with other actions (ioctl:
// allow, but EPERM for TIOCSTI), libseccomp 2.5 silently keeps only the
// unconditional one, and it orders overlapping conditional rules by its
// own tree, not by the file. The policy's semantics are "first matching
// conditional rule, then the unconditional rule, then the default", so
// those syscalls are emitted by argcode.go, whose output step 6 checks.
func (p *Policy) compile() (*Program, error) {
	fail := func(step int, what string, err error) error {
		return fmt.Errorf("seccomp: compile policy %s (step %d, %s): %w", p.Name, step, what, err)
	}
	// 1. native arch and syscall numbers
	arch, err := native()
	if err != nil {
		return nil, fail(1, "native arch", err)
	}
	plan := planRules(p, arch)
	prog := &Program{Policy: p.Name, Arch: arch.name, DefaultAction: p.DefaultAction.String(), Rules: plan.views}

	// 2. libseccomp filter for the unconditional-only syscalls
	f, err := libseccomp.NewFilter(scmpAction(p.DefaultAction))
	if err != nil {
		return nil, fail(2, "seccomp_init", err)
	}
	defer f.Release()
	if err := f.SetBadArchAction(libseccomp.ActKillProcess); err != nil {
		return nil, fail(2, "set bad-arch action kill_process", err)
	}
	// Level 2 makes libseccomp dispatch on the syscall number with a
	// binary tree instead of a linear list: fewer instructions run per
	// syscall. Step 6 checks the result like any other output.
	if err := f.SetOptimize(2); err != nil {
		return nil, fail(2, "set optimize level 2 (binary tree)", err)
	}
	for _, u := range plan.uncond {
		// A rule whose action is the default action only documents a
		// decision (Validate made sure no other rule names the syscall);
		// libseccomp refuses it, and leaving it out changes nothing.
		if u.rule.Action == p.DefaultAction {
			continue
		}
		if err := f.AddRuleExact(libseccomp.ScmpSyscall(u.nr), scmpAction(u.rule.Action)); err != nil {
			return nil, fail(2, fmt.Sprintf("rules[%d] %s -> %s", u.index, u.name, u.rule.Action), err)
		}
	}

	// 3. export
	raw, err := exportBPF(f)
	if err != nil {
		return nil, fail(3, "export BPF", err)
	}
	body, err := decodeSockFilters(raw)
	if err != nil {
		return nil, fail(3, "decode BPF", err)
	}

	// 4. argument blocks
	blocks, err := argBlocks(p, plan.cond)
	if err != nil {
		return nil, fail(4, "argument conditions", err)
	}

	// 5. assemble
	prog.Filter = append(append(archGuard(arch), blocks...), body...)
	if len(prog.Filter) > maxInsns {
		return nil, fail(5, "size", fmt.Errorf("%d instructions exceed BPF_MAXINSNS (%d)", len(prog.Filter), maxInsns))
	}

	// 6. self-check
	if err := p.selfCheck(prog, arch); err != nil {
		return nil, fail(6, "self-check with Simulate", err)
	}
	return prog, nil
}

// uncondRule is one syscall whose only rule is unconditional.
type uncondRule struct {
	name  string
	nr    int32
	index int
	rule  Rule
}

// condSyscall is one syscall with conditional rules: Rules are tried in
// file order, then Fallback (the unconditional rule's action, or the
// default action).
type condSyscall struct {
	name     string
	nr       int32
	rules    []int // indexes into Policy.Rules
	fallback Action
}

type rulePlan struct {
	views  []RuleView
	uncond []uncondRule
	cond   []condSyscall // sorted by nr
}

func planRules(p *Policy, arch nativeArch) rulePlan {
	var plan rulePlan
	nrOf := map[string]int32{}
	conditional := map[string]*condSyscall{}
	for i, r := range p.Rules {
		cond := condText(r.Args)
		for _, n := range r.Names {
			view := RuleView{Syscall: n, Number: -1, Action: r.Action.String(), Condition: cond, Reason: r.Reason}
			nr, err := libseccomp.GetSyscallFromNameByArch(n, arch.scmp)
			if err != nil || nr < 0 {
				view.Skipped = true
				plan.views = append(plan.views, view)
				continue
			}
			view.Number = int32(nr)
			plan.views = append(plan.views, view)
			nrOf[n] = int32(nr)
			if len(r.Args) > 0 {
				c, ok := conditional[n]
				if !ok {
					c = &condSyscall{name: n, nr: int32(nr), fallback: p.DefaultAction}
					conditional[n] = c
				}
				c.rules = append(c.rules, i)
			}
		}
	}
	for i, r := range p.Rules {
		if len(r.Args) > 0 {
			continue
		}
		for _, n := range r.Names {
			nr, ok := nrOf[n]
			if !ok {
				continue
			}
			if c, ok := conditional[n]; ok {
				c.fallback = r.Action
				continue
			}
			plan.uncond = append(plan.uncond, uncondRule{name: n, nr: nr, index: i, rule: r})
		}
	}
	for _, c := range conditional {
		plan.cond = append(plan.cond, *c)
	}
	sort.Slice(plan.cond, func(a, b int) bool { return plan.cond[a].nr < plan.cond[b].nr })
	return plan
}

func condText(args []Arg) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = a.String()
	}
	return strings.Join(parts, " && ")
}

// exportBPF writes libseccomp's program into an anonymous memfd (no pipe
// buffer to fill, no file on disk) and reads it back.
func exportBPF(f *libseccomp.ScmpFilter) ([]byte, error) {
	fd, err := unix.MemfdCreate("str-seccomp-bpf", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	file := os.NewFile(uintptr(fd), "memfd:str-seccomp-bpf")
	defer file.Close()
	if err := f.ExportBPF(file); err != nil {
		return nil, fmt.Errorf("seccomp_export_bpf: %w", err)
	}
	if _, err := file.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("rewind memfd: %w", err)
	}
	return io.ReadAll(file)
}

// decodeSockFilters splits raw bytes into struct sock_filter records
// (u16 code, u8 jt, u8 jf, u32 k, native byte order).
func decodeSockFilters(raw []byte) ([]unix.SockFilter, error) {
	const size = 8
	if len(raw) == 0 || len(raw)%size != 0 {
		return nil, fmt.Errorf("%d bytes is not a whole number of %d-byte sock_filter records", len(raw), size)
	}
	out := make([]unix.SockFilter, 0, len(raw)/size)
	for i := 0; i < len(raw); i += size {
		out = append(out, unix.SockFilter{
			Code: binary.NativeEndian.Uint16(raw[i:]),
			Jt:   raw[i+2],
			Jf:   raw[i+3],
			K:    binary.NativeEndian.Uint32(raw[i+4:]),
		})
	}
	return out, nil
}

// archGuard is the prefix in front of libseccomp's program. libseccomp
// already checks the arch (bad-arch action kill_process) and, for an
// x86_64 filter without x32, kills syscall numbers >= 0x40000000; the
// guard repeats both checks in six instructions a reviewer can read here,
// so neither defence depends on libseccomp's code generation alone:
//
//	0: A = seccomp_data.arch
//	1: if A == NATIVE goto 3
//	2: return KILL_PROCESS                  foreign arch (i386, arm, ...)
//	3: A = seccomp_data.nr
//	4: if A & 0x40000000 goto 5 else goto 6  (amd64 only)
//	5: return KILL_PROCESS                  x32 syscall
//	6: libseccomp's program
func archGuard(arch nativeArch) []unix.SockFilter {
	ld := func(off uint32) unix.SockFilter {
		return unix.SockFilter{Code: bpfLD | bpfW | bpfABS, K: off}
	}
	kill := unix.SockFilter{Code: bpfRET | bpfK, K: RetKillProcess}
	g := []unix.SockFilter{
		ld(4),
		{Code: bpfJMP | bpfJEQ | bpfK, Jt: 1, Jf: 0, K: arch.audit},
		kill,
	}
	if arch.audit == AuditArchX86_64 {
		g = append(g,
			ld(0),
			unix.SockFilter{Code: bpfJMP | bpfJSET | bpfK, Jt: 0, Jf: 1, K: uint32(X32SyscallBit)},
			kill,
		)
	}
	return g
}

// selfCheck compares the compiled program with the policy's own semantics
// (Evaluate) on a fixed set of probes: an unused syscall number, a foreign
// arch, an x32 number, every syscall the policy names with all-zero and
// all-ones arguments, and for every argument condition its value, the
// value +/- 1, the value with the upper 32 bits set, and the value with
// the bits outside its mask flipped.
func (p *Policy) selfCheck(prog *Program, arch nativeArch) error {
	for _, d := range probes(p, arch) {
		got, err := Simulate(prog.Filter, d)
		if err != nil {
			return fmt.Errorf("probe nr=%d arch=%#x args=%#x: %w", d.Nr, d.Arch, d.Args, err)
		}
		want, err := p.Evaluate(d)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("probe nr=%d arch=%#x args=%#x: filter returns %s, policy says %s", d.Nr, d.Arch, d.Args, DescribeRet(got), DescribeRet(want))
		}
	}
	return nil
}

// probes builds the self-check's seccomp_data rows.
func probes(p *Policy, arch nativeArch) []Data {
	foreign := AuditArchI386
	if arch.audit == AuditArchAArch64 {
		foreign = AuditArchARM
	}
	out := []Data{
		{Nr: 4095, Arch: arch.audit},
		{Nr: 0, Arch: foreign},
		{Nr: 1, Arch: 0},
	}
	if arch.audit == AuditArchX86_64 {
		out = append(out, Data{Nr: X32SyscallBit, Arch: arch.audit}, Data{Nr: X32SyscallBit | 1, Arch: arch.audit},
			Data{Nr: -1 << 31, Arch: arch.audit}) // above the x32 range, without its bit
	}
	var values []uint64
	for _, r := range p.Rules {
		for _, c := range r.Args {
			if c.Value == nil {
				continue
			}
			v := *c.Value
			values = append(values, v, v+1, v-1, v|0xffffffff00000000, v|1<<32)
			if c.Mask != nil {
				values = append(values, v|^*c.Mask, v^(^*c.Mask&0xffffffff))
			}
		}
	}
	for _, r := range p.Rules {
		for _, n := range r.Names {
			nr, err := libseccomp.GetSyscallFromNameByArch(n, arch.scmp)
			if err != nil || nr < 0 {
				continue
			}
			out = append(out, Data{Nr: int32(nr), Arch: arch.audit}, Data{Nr: int32(nr), Arch: arch.audit, Args: [6]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}})
			if len(r.Args) > 0 {
				// every condition of this rule at its own value
				d := Data{Nr: int32(nr), Arch: arch.audit}
				for _, c := range r.Args {
					if c.Index < 6 && c.Value != nil {
						d.Args[c.Index] = *c.Value
					}
				}
				out = append(out, d)
			}
			for _, c := range r.Args {
				for _, v := range values {
					d := Data{Nr: int32(nr), Arch: arch.audit}
					if c.Index < 6 {
						d.Args[c.Index] = v
					}
					out = append(out, d)
				}
			}
		}
	}
	return out
}
