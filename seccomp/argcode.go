package seccomp

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Offsets in struct seccomp_data (little-endian: amd64, arm64).
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

func argLo(i uint) uint32 { return offArgs + 8*uint32(i) }
func argHi(i uint) uint32 { return offArgs + 8*uint32(i) + 4 }

// Jump targets inside one condition before they are resolved: a
// condition's code ends either in "holds" (fall through to the next
// condition, or the rule's RET) or "fails" (go to the next rule).
const (
	toNext uint8 = 0   // the next instruction
	toPass uint8 = 254 // end of this condition: it holds
	toFail uint8 = 255 // end of this rule: it does not hold
)

// condCode emits one 64-bit argument comparison as 32-bit classic BPF.
// Jt/Jf use toNext/toPass/toFail and are resolved by ruleCode.
//
// Every comparison is on the full 64-bit value, high word first, so that
// setting upper bits cannot dodge a rule (the CVE-2019-10063 class of
// bypass); a masked_eq whose mask has no upper bits skips the high word
// because it cannot influence the result.
func condCode(c Arg) []unix.SockFilter {
	ld := func(off uint32) unix.SockFilter { return unix.SockFilter{Code: bpfLD | bpfW | bpfABS, K: off} }
	and := func(k uint32) unix.SockFilter { return unix.SockFilter{Code: bpfALU | bpfAND | bpfK, K: k} }
	j := func(op uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: bpfJMP | op | bpfK, Jt: jt, Jf: jf, K: k}
	}
	v := *c.Value
	vHi, vLo := uint32(v>>32), uint32(v)
	var code []unix.SockFilter
	switch c.Op {
	case OpEq, OpMaskedEq:
		mask := ^uint64(0)
		if c.Op == OpMaskedEq {
			mask = *c.Mask
		}
		mHi, mLo := uint32(mask>>32), uint32(mask)
		if mHi != 0 {
			code = append(code, ld(argHi(c.Index)))
			if mHi != 0xffffffff {
				code = append(code, and(mHi))
			}
			code = append(code, j(bpfJEQ, vHi, toNext, toFail))
		}
		if mLo != 0 {
			code = append(code, ld(argLo(c.Index)))
			if mLo != 0xffffffff {
				code = append(code, and(mLo))
			}
			code = append(code, j(bpfJEQ, vLo, toNext, toFail))
		}
	case OpNe:
		code = append(code,
			ld(argHi(c.Index)), j(bpfJEQ, vHi, toNext, toPass),
			ld(argLo(c.Index)), j(bpfJEQ, vLo, toFail, toNext))
	case OpGt, OpGe:
		lo := bpfJGT
		if c.Op == OpGe {
			lo = bpfJGE
		}
		code = append(code,
			ld(argHi(c.Index)), j(bpfJGT, vHi, toPass, toNext), j(bpfJEQ, vHi, toNext, toFail),
			ld(argLo(c.Index)), j(uint16(lo), vLo, toNext, toFail))
	case OpLt, OpLe:
		// lo < v  == !(lo >= v);  lo <= v == !(lo > v)
		lo := bpfJGE
		if c.Op == OpLe {
			lo = bpfJGT
		}
		code = append(code,
			ld(argHi(c.Index)), j(bpfJGT, vHi, toFail, toNext), j(bpfJEQ, vHi, toNext, toPass),
			ld(argLo(c.Index)), j(uint16(lo), vLo, toFail, toNext))
	default:
		panic("seccomp: unvalidated op " + c.Op)
	}
	return code
}

// ruleCode emits one conditional rule: its conditions, then RET action.
// A failing condition jumps past the RET.
func ruleCode(r Rule) ([]unix.SockFilter, error) {
	var code []unix.SockFilter
	var condEnd []int // for each instruction, the index where its condition ends
	for _, c := range r.Args {
		cc := condCode(c)
		end := len(code) + len(cc)
		for range cc {
			condEnd = append(condEnd, end)
		}
		code = append(code, cc...)
	}
	ruleEnd := len(code) + 1 // past the RET
	for i := range code {
		if code[i].Code&bpfClassMask != bpfJMP {
			continue
		}
		for _, t := range []*uint8{&code[i].Jt, &code[i].Jf} {
			var target int
			switch *t {
			case toNext:
				continue
			case toPass:
				target = condEnd[i]
			case toFail:
				target = ruleEnd
			default:
				return nil, fmt.Errorf("internal: unresolved jump %d", *t)
			}
			off := target - i - 1
			if off < 0 || off > 253 {
				return nil, fmt.Errorf("jump of %d instructions does not fit", off)
			}
			*t = uint8(off)
		}
	}
	return append(code, unix.SockFilter{Code: bpfRET | bpfK, K: retValue(r.Action)}), nil
}

// condBlock emits the leaf of one syscall with conditional rules:
//
//	rule 1: conditions..., return action 1
//	rule 2: ...
//	return fallback                   (the unconditional rule, or the default)
//
// so that the first matching rule decides, in file order. Every path
// through the block ends in a RET.
func condBlock(p *Policy, c condSyscall) ([]unix.SockFilter, error) {
	var body []unix.SockFilter
	for _, i := range c.rules {
		rc, err := ruleCode(p.Rules[i])
		if err != nil {
			return nil, fmt.Errorf("rules[%d] %s: %w", i, c.name, err)
		}
		body = append(body, rc...)
	}
	return append(body, unix.SockFilter{Code: bpfRET | bpfK, K: retValue(c.fallback)}), nil
}
