package seccomp

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// Data mirrors the kernel's struct seccomp_data, the packet a seccomp filter
// reads:
//
//	struct seccomp_data { int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]; };
//
// Nr is the raw syscall number as the CPU passed it (on x86_64 an x32 call
// has bit 0x40000000 set), Arch an AUDIT_ARCH_* value.
type Data struct {
	Nr   int32
	Arch uint32
	IP   uint64
	Args [6]uint64
}

// seccompDataSize is sizeof(struct seccomp_data).
const seccompDataSize = 64

// bytes lays d out in native (little-endian on amd64 and arm64) byte order,
// exactly as the kernel presents it to BPF_LD|BPF_ABS loads.
func (d Data) bytes() [seccompDataSize]byte {
	var b [seccompDataSize]byte
	binary.NativeEndian.PutUint32(b[0:], uint32(d.Nr))
	binary.NativeEndian.PutUint32(b[4:], d.Arch)
	binary.NativeEndian.PutUint64(b[8:], d.IP)
	for i, a := range d.Args {
		binary.NativeEndian.PutUint64(b[16+8*i:], a)
	}
	return b
}

// Return values of a seccomp filter (SECCOMP_RET_*): the action lives in
// the upper 16 bits, the data (an errno for ERRNO) in the lower 16.
const (
	RetKillProcess uint32 = 0x80000000
	RetKillThread  uint32 = 0x00000000
	RetTrap        uint32 = 0x00030000
	RetErrno       uint32 = 0x00050000
	RetUserNotif   uint32 = 0x7fc00000
	RetTrace       uint32 = 0x7ff00000
	RetLog         uint32 = 0x7ffc0000
	RetAllow       uint32 = 0x7fff0000

	RetActionFull uint32 = 0xffff0000 // SECCOMP_RET_ACTION_FULL
	RetData       uint32 = 0x0000ffff // SECCOMP_RET_DATA
)

// DescribeRet renders a filter return value the way the plan prints
// actions: "allow", "errno EPERM", "kill_process", ...
func DescribeRet(ret uint32) string {
	switch ret & RetActionFull {
	case RetKillProcess:
		return "kill_process"
	case RetKillThread:
		return "kill_thread"
	case RetTrap:
		return "trap"
	case RetErrno:
		return "errno " + errnoName(unix.Errno(ret&RetData))
	case RetUserNotif:
		return "user_notif"
	case RetTrace:
		return "trace"
	case RetLog:
		return "log"
	case RetAllow:
		return "allow"
	}
	return fmt.Sprintf("unknown(%#x)", ret)
}

// maxInsns is BPF_MAXINSNS, the kernel's limit on a classic BPF program.
const maxInsns = 4096

// Classic BPF opcode fields (linux/bpf_common.h).
const (
	bpfClassMask = 0x07
	bpfLD        = 0x00
	bpfLDX       = 0x01
	bpfST        = 0x02
	bpfSTX       = 0x03
	bpfALU       = 0x04
	bpfJMP       = 0x05
	bpfRET       = 0x06
	bpfMISC      = 0x07

	bpfSizeMask = 0x18
	bpfW        = 0x00

	bpfModeMask = 0xe0
	bpfIMM      = 0x00
	bpfABS      = 0x20
	bpfMEM      = 0x60
	bpfLEN      = 0x80

	bpfOpMask = 0xf0
	bpfADD    = 0x00
	bpfSUB    = 0x10
	bpfMUL    = 0x20
	bpfDIV    = 0x30
	bpfOR     = 0x40
	bpfAND    = 0x50
	bpfLSH    = 0x60
	bpfRSH    = 0x70
	bpfNEG    = 0x80
	bpfMOD    = 0x90
	bpfXOR    = 0xa0

	bpfJA   = 0x00
	bpfJEQ  = 0x10
	bpfJGT  = 0x20
	bpfJGE  = 0x30
	bpfJSET = 0x40

	bpfSrcMask = 0x08
	bpfK       = 0x00
	bpfX       = 0x08

	bpfRvalMask = 0x18
	bpfA        = 0x10

	bpfMiscOpMask = 0xf8
	bpfTAX        = 0x00
	bpfTXA        = 0x80

	bpfMemWords = 16 // BPF_MEMWORDS
)

// Simulate runs a classic BPF seccomp program on one seccomp_data packet
// and returns the SECCOMP_RET_* value the kernel would act on. It accepts
// the instruction subset the kernel's seccomp_check_filter accepts (32-bit
// absolute loads inside seccomp_data, LEN, immediate and scratch-memory
// loads and stores, ALU, jumps, RET, TAX/TXA) and reports anything else,
// an out-of-range jump or load, a division by zero or running off the end
// as an error rather than guessing.
func Simulate(filter []unix.SockFilter, d Data) (uint32, error) {
	if len(filter) == 0 || len(filter) > maxInsns {
		return 0, fmt.Errorf("seccomp: simulate: program has %d instructions (want 1..%d)", len(filter), maxInsns)
	}
	pkt := d.bytes()
	var (
		a, x uint32
		mem  [bpfMemWords]uint32
	)
	for pc := 0; pc < len(filter); pc++ {
		ins := filter[pc]
		bad := func(why string) error {
			return fmt.Errorf("seccomp: simulate: instruction %d {code %#04x jt %d jf %d k %#x}: %s", pc, ins.Code, ins.Jt, ins.Jf, ins.K, why)
		}
		switch ins.Code & bpfClassMask {
		case bpfLD, bpfLDX:
			if ins.Code&bpfSizeMask != bpfW {
				return 0, bad("only 32-bit loads are allowed in seccomp")
			}
			var v uint32
			switch ins.Code & bpfModeMask {
			case bpfABS:
				if ins.Code&bpfClassMask != bpfLD {
					return 0, bad("LDX|ABS is not a valid instruction")
				}
				if ins.K%4 != 0 || ins.K > seccompDataSize-4 {
					return 0, bad("load outside struct seccomp_data or unaligned")
				}
				v = binary.NativeEndian.Uint32(pkt[ins.K:])
			case bpfIMM:
				v = ins.K
			case bpfMEM:
				if ins.K >= bpfMemWords {
					return 0, bad("scratch memory index out of range")
				}
				v = mem[ins.K]
			case bpfLEN:
				v = seccompDataSize
			default:
				return 0, bad("unsupported load mode")
			}
			if ins.Code&bpfClassMask == bpfLD {
				a = v
			} else {
				x = v
			}
		case bpfST, bpfSTX:
			if ins.K >= bpfMemWords {
				return 0, bad("scratch memory index out of range")
			}
			if ins.Code&bpfClassMask == bpfST {
				mem[ins.K] = a
			} else {
				mem[ins.K] = x
			}
		case bpfALU:
			src := ins.K
			if ins.Code&bpfSrcMask == bpfX {
				src = x
			}
			switch ins.Code & bpfOpMask {
			case bpfADD:
				a += src
			case bpfSUB:
				a -= src
			case bpfMUL:
				a *= src
			case bpfDIV:
				if src == 0 {
					return 0, bad("division by zero")
				}
				a /= src
			case bpfMOD:
				if src == 0 {
					return 0, bad("modulo by zero")
				}
				a %= src
			case bpfOR:
				a |= src
			case bpfAND:
				a &= src
			case bpfXOR:
				a ^= src
			case bpfLSH:
				a <<= src & 31
			case bpfRSH:
				a >>= src & 31
			case bpfNEG:
				a = -a
			default:
				return 0, bad("unsupported ALU operation")
			}
		case bpfJMP:
			op := ins.Code & bpfOpMask
			if op == bpfJA {
				if int(ins.K) >= len(filter)-pc-1 {
					return 0, bad("jump past the end of the program")
				}
				pc += int(ins.K)
				continue
			}
			src := ins.K
			if ins.Code&bpfSrcMask == bpfX {
				src = x
			}
			var cond bool
			switch op {
			case bpfJEQ:
				cond = a == src
			case bpfJGT:
				cond = a > src
			case bpfJGE:
				cond = a >= src
			case bpfJSET:
				cond = a&src != 0
			default:
				return 0, bad("unsupported jump")
			}
			off := int(ins.Jf)
			if cond {
				off = int(ins.Jt)
			}
			if off >= len(filter)-pc-1 {
				return 0, bad("jump past the end of the program")
			}
			pc += off
		case bpfRET:
			switch ins.Code & bpfRvalMask {
			case bpfK:
				return ins.K, nil
			case bpfA:
				return a, nil
			default:
				return 0, bad("RET|X is not allowed in seccomp")
			}
		case bpfMISC:
			switch ins.Code & bpfMiscOpMask {
			case bpfTAX:
				x = a
			case bpfTXA:
				a = x
			default:
				return 0, bad("unsupported MISC operation")
			}
		}
	}
	return 0, fmt.Errorf("seccomp: simulate: ran off the end of a %d-instruction program without RET", len(filter))
}
