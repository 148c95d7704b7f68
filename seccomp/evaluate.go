package seccomp

import "fmt"

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
	return p.evaluate(d, arch), nil
}

// evaluate is Evaluate for arch.
func (p *Policy) evaluate(d Data, arch archSpec) uint32 {
	// 1.
	if d.Arch != arch.audit {
		return RetKillProcess
	}
	// 2.
	if arch.audit == AuditArchX86_64 && uint32(d.Nr) >= uint32(X32SyscallBit) {
		return RetKillProcess
	}
	var uncond *Rule
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.names(d.Nr, arch) {
			continue
		}
		if len(r.Args) == 0 {
			uncond = r
			continue
		}
		// 3.
		if r.matches(d) {
			return retValue(r.Action)
		}
	}
	// 4.
	if uncond != nil {
		return retValue(uncond.Action)
	}
	// 5.
	return retValue(p.DefaultAction)
}

func (r *Rule) names(nr int32, arch archSpec) bool {
	for _, n := range r.Names {
		if got, ok := arch.resolve(n); ok && got == nr {
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
