package seccomp

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
)

// The seccomp fuzz targets are differential, as gVisor tests its filters:
// the BPF program is run on seccomp_data rows by the interpreter
// (Simulate) and must return exactly what the policy's own semantics
// (Evaluate) say.

// fuzzBytes hands out the fuzz input a few bytes at a time; an exhausted
// input reads as zeros.
type fuzzBytes []byte

func (b *fuzzBytes) next(n int) []byte {
	var out [8]byte
	k := copy(out[:n], *b)
	*b = (*b)[k:]
	return out[:n]
}

func (b *fuzzBytes) u8() uint8   { return b.next(1)[0] }
func (b *fuzzBytes) u64() uint64 { return binary.LittleEndian.Uint64(b.next(8)) }
func (b *fuzzBytes) empty() bool { return len(*b) == 0 }

// fuzzTarget is a policy with the syscall numbers and argument values its
// rules mention, which rows are biased towards.
type fuzzTarget struct {
	policy *Policy
	filter *Program
	nrs    []int32
	vals   []uint64
}

func newFuzzTarget(p *Policy, prog *Program) *fuzzTarget {
	ft := &fuzzTarget{policy: p, filter: prog}
	arch, err := native()
	if err != nil {
		panic(err)
	}
	for _, r := range p.Rules {
		for _, n := range r.Names {
			if nr, ok := arch.resolve(n); ok {
				ft.nrs = append(ft.nrs, nr)
			}
		}
		for _, c := range r.Args {
			ft.vals = append(ft.vals, *c.Value)
			if c.Mask != nil {
				ft.vals = append(ft.vals, *c.Mask)
			}
		}
	}
	return ft
}

// row builds one seccomp_data from the input: the syscall is mostly one
// the policy names (else any number, with or without the x32 bit), the
// arch mostly the native one, and each argument either raw or a value
// the rules mention with some bits flipped.
func (ft *fuzzTarget) row(b *fuzzBytes, native uint32) Data {
	d := Data{Arch: native}
	sel := b.u8()
	raw := b.u64()
	switch {
	case sel&3 != 0 && len(ft.nrs) > 0:
		d.Nr = ft.nrs[int(raw%uint64(len(ft.nrs)))]
	default:
		d.Nr = int32(raw)
	}
	switch sel >> 2 & 7 {
	case 0:
		d.Arch = []uint32{AuditArchI386, AuditArchARM, AuditArchAArch64, AuditArchX86_64, 0}[int(raw>>32)%5]
	case 1:
		d.Arch = uint32(raw >> 32)
	case 2:
		d.Nr |= X32SyscallBit
	}
	d.IP = raw
	mix := b.u8()
	for i := range d.Args {
		a := b.u64()
		if mix&(1<<i) != 0 && len(ft.vals) > 0 {
			v := ft.vals[int(a&0xffff)%len(ft.vals)]
			switch a >> 16 & 3 {
			case 0:
				a = v
			case 1:
				a = v + 1
			case 2:
				a = v - 1
			default:
				a = v ^ a&^0xffffffff // the rule's value, other upper bits
			}
		}
		d.Args[i] = a
	}
	return d
}

// check runs one row through the program and the policy.
func (ft *fuzzTarget) check(t *testing.T, d Data) {
	t.Helper()
	got, err := Simulate(ft.filter.Filter, d)
	if err != nil {
		t.Fatalf("policy %s: Simulate nr=%d arch=%#x args=%#x: %v", ft.policy.Name, d.Nr, d.Arch, d.Args, err)
	}
	want, err := ft.policy.Evaluate(d)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("policy %s: nr=%d arch=%#x args=%#x: the filter returns %s (%#x), the policy says %s (%#x)",
			ft.policy.Name, d.Nr, d.Arch, d.Args, DescribeRet(got), got, DescribeRet(want), want)
	}
}

var fuzzEmbeddedTargets = sync.OnceValues(func() ([]*fuzzTarget, error) {
	var out []*fuzzTarget
	for _, name := range Names() {
		p, err := Load(name)
		if err != nil {
			return nil, err
		}
		// What the worker installs: the precompiled program when it is
		// current, else a fresh compile.
		prog, err := CompileEmbedded(name)
		if err != nil {
			return nil, err
		}
		out = append(out, newFuzzTarget(p, prog))
	}
	return out, nil
})

// FuzzEmbeddedPolicies: every embedded policy's program agrees with the
// policy on seccomp_data rows built from the input (seeds in
// testdata/fuzz/FuzzEmbeddedPolicies). Each input is a sequence of rows,
// each row checked against every embedded policy.
func FuzzEmbeddedPolicies(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		targets, err := fuzzEmbeddedTargets()
		if err != nil {
			t.Fatal(err)
		}
		arch, err := native()
		if err != nil {
			t.Fatal(err)
		}
		b := fuzzBytes(data)
		for rows := 0; rows < 64; rows++ {
			start := b
			for _, ft := range targets {
				rb := start // the same row for every policy
				ft.check(t, ft.row(&rb, arch.audit))
				b = rb
			}
			if b.empty() {
				break
			}
		}
	})
}

// Building blocks of random policies: real syscalls (some with
// conditional rules in the embedded policies, some absent on one arch,
// "clone3" and "open" for instance), every action and op, and one bad
// value of each to exercise Validate.
var (
	fuzzSyscalls = []string{"read", "write", "ioctl", "socket", "clone", "prctl", "personality", "getpid",
		"open", "mmap", "kill", "clone3", "arch_prctl", "renameat2", "unshare", "no_such_syscall"}
	fuzzActions = []Action{{Kind: ActionAllow}, {Kind: ActionErrno, Errno: "EPERM"}, {Kind: ActionErrno, Errno: "ENOSYS"},
		{Kind: ActionErrno, Errno: "EAFNOSUPPORT"}, {Kind: ActionKillProcess}, {Kind: ActionKillThread}, {Kind: ActionLog},
		{Kind: ActionErrno}, {Kind: "trap"}}
	fuzzOps = []string{OpEq, OpNe, OpLt, OpLe, OpGt, OpGe, OpMaskedEq, "bogus"}
)

// fuzzPolicy builds a small policy from the input: a default action and
// one to four rules of one or two syscalls, each with up to three argument
// conditions.
func fuzzPolicy(b *fuzzBytes) *Policy {
	p := &Policy{Version: 1, Name: "fuzz", Description: "built by FuzzCompile",
		DefaultAction: fuzzActions[int(b.u8())%len(fuzzActions)]}
	nrules := 1 + int(b.u8())%4
	for i := 0; i < nrules; i++ {
		hdr := b.u8()
		r := Rule{Action: fuzzActions[int(b.u8())%len(fuzzActions)], Reason: fmt.Sprintf("rule %d", i)}
		r.Names = append(r.Names, fuzzSyscalls[int(b.u8())%len(fuzzSyscalls)])
		if hdr&1 != 0 {
			r.Names = append(r.Names, fuzzSyscalls[int(b.u8())%len(fuzzSyscalls)])
		}
		for j := 0; j < int(hdr>>1&3); j++ {
			sel := b.u8()
			v := b.u64()
			// sel: bits 0-2 the index (6 and 7 are invalid), 3-5 the op,
			// 7 a mask (invalid unless masked_eq).
			c := Arg{Index: uint(sel & 7), Op: fuzzOps[int(sel>>3&7)], Value: &v}
			if c.Op == OpMaskedEq || sel&0x80 != 0 {
				m := b.u64()
				if c.Op == OpMaskedEq && sel&0x80 == 0 {
					v &= m // usually a value that can match
				}
				c.Mask = &m
			}
			r.Args = append(r.Args, c)
		}
		p.Rules = append(p.Rules, r)
	}
	return p
}

// FuzzCompile: a small random policy built from the input (seeds in
// testdata/fuzz/FuzzCompile), when it validates, compiles, and its program
// agrees with Evaluate on the self-check's probes and on rows built from
// the rest of the input. It calls compile, not Compile: the per-process
// program cache would keep every policy the fuzzer invents. compile still
// runs the self-check (the generator and the probes, a few ms per input).
func FuzzCompile(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		b := fuzzBytes(data)
		p := fuzzPolicy(&b)
		if p.Validate() != nil {
			return
		}
		prog, err := p.compile()
		if err != nil {
			t.Fatalf("a valid policy does not compile: %v\npolicy: %+v", err, p.Rules)
		}
		arch, err := native()
		if err != nil {
			t.Fatal(err)
		}
		ft := newFuzzTarget(p, prog)
		for _, d := range probes(p, arch) {
			ft.check(t, d)
		}
		for rows := 0; rows < 64 && !b.empty(); rows++ {
			ft.check(t, ft.row(&b, arch.audit))
		}
	})
}
