package seccomp

import (
	"fmt"
	"sort"

	"golang.org/x/sys/unix"
)

// leaf is what the program does for one syscall number: return ret, or,
// when code is set, run code (an argument block of condBlock, every path
// of which ends in a RET).
type leaf struct {
	ret  uint32
	code []unix.SockFilter
}

func (l leaf) sameAction(o leaf) bool { return l.code == nil && o.code == nil && l.ret == o.ret }

// numRange is the syscall numbers lo..hi (inclusive), all decided by do.
type numRange struct {
	lo, hi uint32
	do     leaf
}

// numberRanges cuts the whole 32-bit number space into ranges of equal
// decision: the named numbers with their leaves, every other number the
// default. Neighbours with the same plain action are merged (read, write,
// open, close, ... are one range); argument blocks stay one number each.
func numberRanges(leaves map[int32]leaf, def leaf) []numRange {
	nrs := make([]uint32, 0, len(leaves))
	for nr := range leaves {
		nrs = append(nrs, uint32(nr))
	}
	sort.Slice(nrs, func(i, j int) bool { return nrs[i] < nrs[j] })
	var out []numRange
	add := func(r numRange) {
		if n := len(out); n > 0 && out[n-1].hi+1 == r.lo && out[n-1].do.sameAction(r.do) {
			out[n-1].hi = r.hi
			return
		}
		out = append(out, r)
	}
	next := uint32(0) // the first number not yet covered
	for _, nr := range nrs {
		if nr > next {
			add(numRange{next, nr - 1, def})
		}
		add(numRange{nr, nr, leaves[int32(nr)]})
		next = nr + 1
	}
	if len(nrs) == 0 || nrs[len(nrs)-1] != ^uint32(0) {
		add(numRange{next, ^uint32(0), def})
	}
	return out
}

// dispatch emits a binary search over ranges (which cover 0..2^32-1 in
// order) on A, the syscall number:
//
//	if A >= ranges[mid].lo goto upper half
//	lower half ...
//	upper half ...
//
// down to one range, whose leaf is emitted in place. A syscall costs about
// log2(len(ranges)) comparisons. A conditional jump reaches at most 255
// instructions; when the lower half is longer, the comparison falls
// through to a BPF_JA (32-bit offset) instead:
//
//	if A >= lo goto +0 else goto +1
//	goto upper half
//	lower half ...
func dispatch(ranges []numRange) ([]unix.SockFilter, error) {
	if len(ranges) == 0 {
		return nil, fmt.Errorf("internal: no number ranges")
	}
	if len(ranges) == 1 {
		if ranges[0].do.code != nil {
			return ranges[0].do.code, nil
		}
		return []unix.SockFilter{{Code: bpfRET | bpfK, K: ranges[0].do.ret}}, nil
	}
	mid := len(ranges) / 2
	lower, err := dispatch(ranges[:mid])
	if err != nil {
		return nil, err
	}
	upper, err := dispatch(ranges[mid:])
	if err != nil {
		return nil, err
	}
	split := ranges[mid].lo
	var out []unix.SockFilter
	if len(lower) <= 255 {
		out = append(out, unix.SockFilter{Code: bpfJMP | bpfJGE | bpfK, Jt: uint8(len(lower)), Jf: 0, K: split})
	} else {
		out = append(out,
			unix.SockFilter{Code: bpfJMP | bpfJGE | bpfK, Jt: 0, Jf: 1, K: split},
			unix.SockFilter{Code: bpfJMP | bpfJA, K: uint32(len(lower))})
	}
	out = append(out, lower...)
	return append(out, upper...), nil
}
