package seccomp

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Program is a compiled policy: the classic-BPF filter for the native
// architecture plus the rule list the plan prints. A Program returned by
// Compile is the caller's own copy.
type Program struct {
	Policy        string
	Arch          string // GOARCH of the program: "amd64", "arm64"
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

var programCache sync.Map // cache key (policy name + content hash) -> *Program

// Compile validates the policy and compiles it for the native
// architecture. Programs are cached per policy name and content hash
// inside the process, so compiling the same policy again costs a hash and
// a map lookup (a cached program was valid when it was stored).
//
// The filter is, in order: the guard (archGuard: a foreign architecture
// or an x32 syscall number kills the process) and a binary search on the
// syscall number whose leaves return an action or run the argument
// conditions of one syscall (argcode.go); compileFor writes all of it.
// Before a program is cached, Compile runs it through Simulate and
// compares it with Evaluate (see selfCheck).
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

// CompileStacked compiles a policy that is only ever stacked on another
// filter (str bwrap's --disable-userns filter): its default action may
// be allow, because the filter under it decides every call it does not
// refuse itself; every other rule of Validate holds. Never for a
// sandbox's one policy, which stays default-deny.
func (p *Policy) CompileStacked() (*Program, error) {
	q := *p
	if q.DefaultAction.Kind == ActionAllow {
		q.DefaultAction = Action{Kind: ActionErrno, Errno: "EPERM"}
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return p.compile()
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
	case ActionNotify:
		return RetUserNotif
	}
	panic("seccomp: unvalidated action " + a.Kind)
}

// compile compiles a validated policy for the native architecture.
func (p *Policy) compile() (*Program, error) {
	arch, err := native()
	if err != nil {
		return nil, fmt.Errorf("seccomp: compile policy %s (step 1, native arch): %w", p.Name, err)
	}
	return p.compileFor(arch)
}

// compileFor is the generator, the only one: it turns a validated policy
// into the whole classic-BPF program for arch, in pure Go.
//
//  1. resolve every syscall name to arch's number (syscalls.go)
//  2. decide every syscall number: a plain action (its unconditional
//     rule) or a block of argument conditions (argcode.go) ending in its
//     fallback; numbers no rule names get the default action
//  3. cut the number space into ranges of equal decision
//  4. assemble: the arch/x32 guard, then a binary search over the ranges
//     whose leaves return the action or run the argument block
//  5. check the size against BPF_MAXINSNS
//  6. check the result against the policy's own semantics (Evaluate)
//     with Simulate
//
// The semantics are "first matching conditional rule in file order, then
// the unconditional rule, then the default" (Evaluate). The tests compare
// the program with libseccomp's on every syscall number of every
// supported arch, and with the kernel's own decisions (install_test.go).
func (p *Policy) compileFor(arch archSpec) (*Program, error) {
	fail := func(step int, what string, err error) error {
		return fmt.Errorf("seccomp: compile policy %s for %s (step %d, %s): %w", p.Name, arch.name, step, what, err)
	}
	// 1. syscall numbers
	plan := planRules(p, arch)
	prog := &Program{Policy: p.Name, Arch: arch.name, DefaultAction: p.DefaultAction.String(), Rules: plan.views}

	// 2. one decision per named syscall number
	leaves := map[int32]leaf{}
	for _, u := range plan.uncond {
		leaves[u.nr] = leaf{ret: retValue(u.rule.Action)}
	}
	for _, c := range plan.cond {
		block, err := condBlock(p, c)
		if err != nil {
			return nil, fail(2, "argument conditions", err)
		}
		leaves[c.nr] = leaf{code: block}
	}

	// 3. ranges
	ranges := numberRanges(leaves, leaf{ret: retValue(p.DefaultAction)})

	// 4. assemble
	tree, err := dispatch(ranges)
	if err != nil {
		return nil, fail(4, "dispatch", err)
	}
	prog.Filter = append(archGuard(arch), tree...)

	// 5. size
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

func planRules(p *Policy, arch archSpec) rulePlan {
	var plan rulePlan
	nrOf := map[string]int32{}
	conditional := map[string]*condSyscall{}
	for i, r := range p.Rules {
		cond := condText(r.Args)
		for _, n := range r.Names {
			view := RuleView{Syscall: n, Number: -1, Action: r.Action.String(), Condition: cond, Reason: r.Reason}
			nr, ok := arch.resolve(n)
			if !ok {
				view.Skipped = true
				plan.views = append(plan.views, view)
				continue
			}
			view.Number = nr
			plan.views = append(plan.views, view)
			nrOf[n] = nr
			if len(r.Args) > 0 {
				c, ok := conditional[n]
				if !ok {
					c = &condSyscall{name: n, nr: nr, fallback: p.DefaultAction}
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

// archGuard is the program's prefix, which every syscall passes first:
//
//	0: A = seccomp_data.arch
//	1: if A == NATIVE goto 3
//	2: return KILL_PROCESS                    foreign arch (i386, arm, ...)
//	3: A = seccomp_data.nr
//	4: if A >= 0x40000000 goto 5 else goto 6  (amd64 only)
//	5: return KILL_PROCESS                    x32 syscall, or beyond
//	6: the dispatch on A (dispatch)
//
// A foreign arch is killed, not refused: its syscall numbers mean other
// calls, so no rule of this policy applies to them. On amd64 an x32 call
// enters with AUDIT_ARCH_X86_64 and bit 0x40000000 in nr; comparing
// unsigned, everything from that bit up is killed, so no number with high
// bits set reaches the dispatch.
func archGuard(arch archSpec) []unix.SockFilter {
	kill := unix.SockFilter{Code: bpfRET | bpfK, K: RetKillProcess}
	g := []unix.SockFilter{
		{Code: bpfLD | bpfW | bpfABS, K: offArch},
		{Code: bpfJMP | bpfJEQ | bpfK, Jt: 1, Jf: 0, K: arch.audit},
		kill,
		{Code: bpfLD | bpfW | bpfABS, K: offNr},
	}
	if arch.audit == AuditArchX86_64 {
		g = append(g,
			unix.SockFilter{Code: bpfJMP | bpfJGE | bpfK, Jt: 0, Jf: 1, K: uint32(X32SyscallBit)},
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
func (p *Policy) selfCheck(prog *Program, arch archSpec) error {
	for _, d := range probes(p, arch) {
		got, err := Simulate(prog.Filter, d)
		if err != nil {
			return fmt.Errorf("probe nr=%d arch=%#x args=%#x: %w", d.Nr, d.Arch, d.Args, err)
		}
		want := p.evaluate(d, arch)
		if got != want {
			return fmt.Errorf("probe nr=%d arch=%#x args=%#x: filter returns %s, policy says %s", d.Nr, d.Arch, d.Args, DescribeRet(got), DescribeRet(want))
		}
	}
	return nil
}

// probes builds the self-check's seccomp_data rows.
func probes(p *Policy, arch archSpec) []Data {
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
			nr, ok := arch.resolve(n)
			if !ok {
				continue
			}
			out = append(out, Data{Nr: nr, Arch: arch.audit}, Data{Nr: nr, Arch: arch.audit, Args: [6]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}})
			if len(r.Args) > 0 {
				// every condition of this rule at its own value
				d := Data{Nr: nr, Arch: arch.audit}
				for _, c := range r.Args {
					if c.Index < 6 && c.Value != nil {
						d.Args[c.Index] = *c.Value
					}
				}
				out = append(out, d)
			}
			for _, c := range r.Args {
				for _, v := range values {
					d := Data{Nr: nr, Arch: arch.audit}
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
