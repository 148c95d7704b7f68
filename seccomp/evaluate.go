package seccomp

import (
	"fmt"
	"sync"

	libseccomp "github.com/seccomp/libseccomp-golang"
)

// Evaluate is the policy's meaning, computed directly from the data
// without BPF: what the kernel must return for d on the native
// architecture. Compile checks its program against Evaluate, and tests
// compare the two on many rows.
//
//  1. an arch other than the native one: kill_process
//  2. on amd64, a syscall number with the x32 bit or above it (0x40000000
//     and up as unsigned; negative numbers are never syscalls):
//     kill_process
//  3. the syscall's conditional rules in file order: the first whose
//     conditions all hold decides
//  4. else the syscall's unconditional rule
//  5. else the default action
func (p *Policy) Evaluate(d Data) (uint32, error) {
	arch, err := native()
	if err != nil {
		return 0, err
	}
	// 1.
	if d.Arch != arch.audit {
		return RetKillProcess, nil
	}
	// 2. The guard kills the x32 bit; libseccomp's x86_64 program kills
	// every number from 0x40000000 up but -1, which has the bit.
	if arch.audit == AuditArchX86_64 && uint32(d.Nr) >= uint32(X32SyscallBit) {
		return RetKillProcess, nil
	}
	var uncond *Rule
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.names(d.Nr, arch.scmp) {
			continue
		}
		if len(r.Args) == 0 {
			uncond = r
			continue
		}
		// 3.
		if r.matches(d) {
			return retValue(r.Action), nil
		}
	}
	// 4.
	if uncond != nil {
		return retValue(uncond.Action), nil
	}
	// 5.
	return retValue(p.DefaultAction), nil
}

func (r *Rule) names(nr int32, arch libseccomp.ScmpArch) bool {
	for _, n := range r.Names {
		if got, ok := resolve(n, arch); ok && got == nr {
			return true
		}
	}
	return false
}

func (r *Rule) matches(d Data) bool {
	for _, c := range r.Args {
		if !c.holds(d) {
			return false
		}
	}
	return true
}

func (c Arg) holds(d Data) bool {
	if c.Index > 5 || c.Value == nil {
		panic(fmt.Sprintf("seccomp: unvalidated condition %s", c))
	}
	a, v := d.Args[c.Index], *c.Value
	switch c.Op {
	case OpEq:
		return a == v
	case OpNe:
		return a != v
	case OpLt:
		return a < v
	case OpLe:
		return a <= v
	case OpGt:
		return a > v
	case OpGe:
		return a >= v
	case OpMaskedEq:
		return a&*c.Mask == v
	}
	panic("seccomp: unvalidated op " + c.Op)
}

var resolveCache sync.Map // name + "/" + arch -> int32 (-1: not on this arch)

// resolve is GetSyscallFromNameByArch with a cache; ok is false when the
// syscall does not exist on arch.
func resolve(name string, arch libseccomp.ScmpArch) (int32, bool) {
	key := name + "/" + arch.String()
	if v, ok := resolveCache.Load(key); ok {
		nr := v.(int32)
		return nr, nr >= 0
	}
	nr := int32(-1)
	if got, err := libseccomp.GetSyscallFromNameByArch(name, arch); err == nil && got >= 0 {
		nr = int32(got)
	}
	resolveCache.Store(key, nr)
	return nr, nr >= 0
}
