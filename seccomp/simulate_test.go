package seccomp

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func compileEmbedded(t *testing.T, name string) (*Policy, *Program) {
	t.Helper()
	p, err := Load(name)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	return p, prog
}

func nativeAudit(t *testing.T) uint32 {
	t.Helper()
	a, err := native()
	if err != nil {
		t.Fatal(err)
	}
	return a.audit
}

func nr(t *testing.T, name string) int32 {
	t.Helper()
	n, err := SyscallNumber(name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const (
	cloneNewUser = 0x10000000
	cloneNewNS   = 0x00020000
	cloneNewNet  = 0x40000000
	tiocsti      = 0x5412
	tioclinux    = 0x541C
	tcgets       = 0x5401
)

func TestPolicyTable(t *testing.T) {
	arch := nativeAudit(t)
	errno := func(e unix.Errno) uint32 { return RetErrno | uint32(e) }
	type row struct {
		name string
		sys  string
		nr   int32 // used when sys == ""
		arch uint32
		args [6]uint64
		want uint32
	}
	common := []row{
		{name: "read", sys: "read", want: RetAllow},
		{name: "getpid", sys: "getpid", want: RetAllow},
		{name: "execve", sys: "execve", want: RetAllow},
		{name: "fsopen", sys: "fsopen", want: errno(unix.EPERM)},
		{name: "clone vfork (Go ForkExec)", sys: "clone", args: [6]uint64{unix.CLONE_VM | unix.CLONE_VFORK | uint64(unix.SIGCHLD)}, want: RetAllow},
		{name: "clone fork", sys: "clone", args: [6]uint64{uint64(unix.SIGCHLD)}, want: RetAllow},
		{name: "clone thread (glibc)", sys: "clone", args: [6]uint64{unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD | unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID}, want: RetAllow},
		{name: "clone upper bits ignored", sys: "clone", args: [6]uint64{1<<40 | uint64(unix.SIGCHLD)}, want: RetAllow},
		{name: "clone3", sys: "clone3", want: errno(unix.ENOSYS)},
		{name: "keyctl", sys: "keyctl", want: errno(unix.EPERM)},
		{name: "add_key", sys: "add_key", want: errno(unix.EPERM)},
		{name: "bpf", sys: "bpf", want: errno(unix.EPERM)},
		{name: "perf_event_open", sys: "perf_event_open", want: errno(unix.EPERM)},
		{name: "userfaultfd", sys: "userfaultfd", want: errno(unix.EPERM)},
		{name: "io_uring_setup", sys: "io_uring_setup", want: errno(unix.EPERM)},
		{name: "io_uring_enter", sys: "io_uring_enter", want: errno(unix.EPERM)},
		{name: "kexec_load", sys: "kexec_load", want: errno(unix.EPERM)},
		{name: "finit_module", sys: "finit_module", want: errno(unix.EPERM)},
		{name: "ptrace", sys: "ptrace", want: errno(unix.EPERM)},
		{name: "process_vm_writev", sys: "process_vm_writev", want: errno(unix.EPERM)},
		{name: "open_by_handle_at", sys: "open_by_handle_at", want: errno(unix.EPERM)},
		{name: "ioctl TIOCLINUX", sys: "ioctl", args: [6]uint64{0, tioclinux}, want: errno(unix.EPERM)},
		{name: "ioctl TIOCLINUX upper bits", sys: "ioctl", args: [6]uint64{0, tioclinux | 1<<63}, want: errno(unix.EPERM)},
		{name: "ioctl TCGETS", sys: "ioctl", args: [6]uint64{1, tcgets}, want: RetAllow},
		{name: "ioctl near TIOCSTI", sys: "ioctl", args: [6]uint64{1, tiocsti + 1}, want: RetAllow},
		{name: "personality 0", sys: "personality", args: [6]uint64{0}, want: RetAllow},
		{name: "personality query", sys: "personality", args: [6]uint64{0xffffffff}, want: RetAllow},
		{name: "personality ADDR_NO_RANDOMIZE", sys: "personality", args: [6]uint64{0x0040000}, want: errno(unix.EPERM)},
		{name: "personality READ_IMPLIES_EXEC", sys: "personality", args: [6]uint64{0x0400000}, want: errno(unix.EPERM)},
		{name: "socket AF_UNIX", sys: "socket", args: [6]uint64{unix.AF_UNIX, unix.SOCK_STREAM}, want: RetAllow},
		{name: "socket AF_INET6", sys: "socket", args: [6]uint64{unix.AF_INET6, unix.SOCK_DGRAM}, want: RetAllow},
		{name: "socket AF_NETLINK ROUTE", sys: "socket", args: [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE}, want: RetAllow},
		{name: "socket AF_NETLINK AUDIT", sys: "socket", args: [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_AUDIT}, want: errno(unix.EAFNOSUPPORT)},
		{name: "socket AF_NETLINK XFRM", sys: "socket", args: [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_XFRM}, want: errno(unix.EAFNOSUPPORT)},
		{name: "socket AF_NETLINK ROUTE high bits", sys: "socket", args: [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, 1 << 32}, want: RetAllow},
		{name: "socket AF_PACKET", sys: "socket", args: [6]uint64{unix.AF_PACKET, unix.SOCK_RAW}, want: errno(unix.EAFNOSUPPORT)},
		{name: "socket AF_VSOCK", sys: "socket", args: [6]uint64{unix.AF_VSOCK, unix.SOCK_STREAM}, want: errno(unix.EAFNOSUPPORT)},
		{name: "prctl PR_SET_PDEATHSIG", sys: "prctl", args: [6]uint64{unix.PR_SET_PDEATHSIG, 9}, want: RetAllow},
		{name: "prctl PR_SET_NAME", sys: "prctl", args: [6]uint64{unix.PR_SET_NAME}, want: RetAllow},
		{name: "prctl PR_SET_MM", sys: "prctl", args: [6]uint64{unix.PR_SET_MM}, want: errno(unix.EPERM)},
		{name: "prctl PR_SET_PTRACER", sys: "prctl", args: [6]uint64{unix.PR_SET_PTRACER}, want: errno(unix.EPERM)},
		{name: "seccomp (stacking)", sys: "seccomp", want: RetAllow},
		{name: "unknown syscall 999", nr: 999, want: errno(unix.ENOSYS)},
		{name: "unlisted real syscall cachestat", sys: "cachestat", want: errno(unix.ENOSYS)},
		{name: "i386 arch", nr: 1, arch: AuditArchI386, want: RetKillProcess},
		{name: "arm arch", nr: 1, arch: AuditArchARM, want: RetKillProcess},
		{name: "no arch", nr: 0, arch: 0x1, want: RetKillProcess},
	}
	if arch == AuditArchX86_64 {
		common = append(common,
			row{name: "x32 read", nr: X32SyscallBit, want: RetKillProcess},
			row{name: "x32 getpid", nr: X32SyscallBit | 39, want: RetKillProcess},
			row{name: "x32 ioctl", nr: X32SyscallBit | 514, want: RetKillProcess},
			row{name: "nr 21 is i386 mount but x86_64 access", nr: 21, arch: AuditArchX86_64, want: RetAllow},
		)
	}
	// strict: what every policy but nesting refuses (nestingOpens).
	strict := []row{
		{name: "mount", sys: "mount", want: errno(unix.EPERM)},
		{name: "umount2", sys: "umount2", want: errno(unix.EPERM)},
		{name: "pivot_root", sys: "pivot_root", want: errno(unix.EPERM)},
		{name: "unshare", sys: "unshare", args: [6]uint64{cloneNewUser}, want: errno(unix.EPERM)},
		{name: "setns", sys: "setns", want: errno(unix.EPERM)},
		{name: "clone NEWUSER", sys: "clone", args: [6]uint64{cloneNewUser | uint64(unix.SIGCHLD)}, want: errno(unix.EPERM)},
		{name: "clone NEWNS", sys: "clone", args: [6]uint64{cloneNewNS}, want: errno(unix.EPERM)},
		{name: "clone NEWNET|VM", sys: "clone", args: [6]uint64{cloneNewNet | unix.CLONE_VM}, want: errno(unix.EPERM)},
		{name: "chroot", sys: "chroot", want: errno(unix.EPERM)},
		{name: "ioctl TIOCSTI", sys: "ioctl", args: [6]uint64{0, tiocsti}, want: errno(unix.EPERM)},
		{name: "ioctl TIOCSTI upper bits", sys: "ioctl", args: [6]uint64{0, tiocsti | 1<<32}, want: errno(unix.EPERM)},
		{name: "ioctl TIOCSTI all upper bits", sys: "ioctl", args: [6]uint64{0, tiocsti | 0xffffffff00000000}, want: errno(unix.EPERM)},
	}
	perPolicy := map[string][]row{
		"nesting": {
			{name: "mount", sys: "mount", want: RetAllow},
			{name: "umount2", sys: "umount2", want: RetAllow},
			{name: "pivot_root", sys: "pivot_root", want: RetAllow},
			{name: "chroot", sys: "chroot", want: RetAllow},
			{name: "open_tree", sys: "open_tree", want: RetAllow},
			{name: "mount_setattr", sys: "mount_setattr", want: RetAllow},
			{name: "unshare NEWUSER", sys: "unshare", args: [6]uint64{cloneNewUser}, want: RetAllow},
			{name: "setns", sys: "setns", want: RetAllow},
			{name: "sethostname", sys: "sethostname", want: RetAllow},
			{name: "clone NEWUSER", sys: "clone", args: [6]uint64{cloneNewUser | uint64(unix.SIGCHLD)}, want: RetAllow},
			{name: "clone NEWNS|NEWPID", sys: "clone", args: [6]uint64{cloneNewNS | unix.CLONE_NEWPID | uint64(unix.SIGCHLD)}, want: RetAllow},
			{name: "prctl PR_CAPBSET_DROP", sys: "prctl", args: [6]uint64{unix.PR_CAPBSET_DROP, 21}, want: RetAllow},
			{name: "prctl PR_CAP_AMBIENT", sys: "prctl", args: [6]uint64{unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL}, want: RetAllow},
			{name: "prctl PR_SET_KEEPCAPS", sys: "prctl", args: [6]uint64{unix.PR_SET_KEEPCAPS, 1}, want: RetAllow},
			{name: "prctl PR_SET_DUMPABLE", sys: "prctl", args: [6]uint64{unix.PR_SET_DUMPABLE, 1}, want: RetAllow},
			{name: "prctl PR_SET_CHILD_SUBREAPER", sys: "prctl", args: [6]uint64{unix.PR_SET_CHILD_SUBREAPER, 1}, want: RetAllow},
			{name: "prctl PR_GET_CHILD_SUBREAPER", sys: "prctl", args: [6]uint64{unix.PR_GET_CHILD_SUBREAPER, 1}, want: RetAllow},
			{name: "prctl PR_SET_SECUREBITS", sys: "prctl", args: [6]uint64{unix.PR_SET_SECUREBITS}, want: errno(unix.EPERM)},
			{name: "prctl PR_CAPBSET_DROP upper bits", sys: "prctl", args: [6]uint64{unix.PR_CAPBSET_DROP | 1<<32}, want: RetAllow},
			{name: "ioctl TIOCSTI (the kernel refuses it without a controlling terminal)", sys: "ioctl", args: [6]uint64{0, tiocsti}, want: RetAllow},
			{name: "ioctl TIOCSETD", sys: "ioctl", args: [6]uint64{0, 0x5423 | 1<<32}, want: errno(unix.EPERM)},
			// what a nested sandbox must still never reach
			{name: "fsopen", sys: "fsopen", want: errno(unix.EPERM)},
			{name: "fsconfig", sys: "fsconfig", want: errno(unix.EPERM)},
			{name: "fsmount", sys: "fsmount", want: errno(unix.EPERM)},
			{name: "clone3 NEWUSER (flags unreadable)", sys: "clone3", want: errno(unix.ENOSYS)},
			{name: "request_key", sys: "request_key", want: errno(unix.EPERM)},
			{name: "io_uring_register", sys: "io_uring_register", want: errno(unix.EPERM)},
			{name: "kexec_file_load", sys: "kexec_file_load", want: errno(unix.EPERM)},
			{name: "init_module", sys: "init_module", want: errno(unix.EPERM)},
			{name: "delete_module", sys: "delete_module", want: errno(unix.EPERM)},
			{name: "process_vm_readv", sys: "process_vm_readv", want: errno(unix.EPERM)},
			{name: "pidfd_getfd", sys: "pidfd_getfd", want: errno(unix.EPERM)},
			{name: "name_to_handle_at", sys: "name_to_handle_at", want: errno(unix.EPERM)},
			{name: "syslog", sys: "syslog", want: errno(unix.EPERM)},
			{name: "settimeofday", sys: "settimeofday", want: errno(unix.EPERM)},
			{name: "clock_settime", sys: "clock_settime", want: errno(unix.EPERM)},
			{name: "reboot", sys: "reboot", want: errno(unix.EPERM)},
			{name: "swapon", sys: "swapon", want: errno(unix.EPERM)},
			{name: "acct", sys: "acct", want: errno(unix.EPERM)},
			{name: "quotactl", sys: "quotactl", want: errno(unix.EPERM)},
			{name: "fanotify_init", sys: "fanotify_init", want: errno(unix.EPERM)},
			{name: "prctl PR_SET_MM", sys: "prctl", args: [6]uint64{unix.PR_SET_MM}, want: errno(unix.EPERM)},
			{name: "personality ADDR_NO_RANDOMIZE", sys: "personality", args: [6]uint64{0x0040000}, want: errno(unix.EPERM)},
			{name: "socket AF_PACKET", sys: "socket", args: [6]uint64{unix.AF_PACKET, unix.SOCK_RAW}, want: errno(unix.EAFNOSUPPORT)},
			{name: "socket AF_NETLINK NETFILTER", sys: "socket", args: [6]uint64{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER}, want: errno(unix.EAFNOSUPPORT)},
		},
		"restrictive": {
			{name: "shmget", sys: "shmget", want: errno(unix.ENOSYS)},
			{name: "mknodat", sys: "mknodat", want: errno(unix.ENOSYS)},
			{name: "prlimit64 self", sys: "prlimit64", args: [6]uint64{0, unix.RLIMIT_NOFILE, 1}, want: RetAllow},
			{name: "prlimit64 other", sys: "prlimit64", args: [6]uint64{1, unix.RLIMIT_NOFILE, 1}, want: errno(unix.EPERM)},
			{name: "personality PER_LINUX32", sys: "personality", args: [6]uint64{0x8}, want: errno(unix.EPERM)},
		},
		"standard": {
			{name: "shmget", sys: "shmget", want: RetAllow},
			{name: "prlimit64 other", sys: "prlimit64", args: [6]uint64{1}, want: RetAllow},
			{name: "io_setup", sys: "io_setup", want: errno(unix.ENOSYS)},
			{name: "personality PER_LINUX32", sys: "personality", args: [6]uint64{0x8}, want: errno(unix.EPERM)},
		},
		"permissive": {
			{name: "shmget", sys: "shmget", want: RetAllow},
			{name: "io_setup", sys: "io_setup", want: RetAllow},
			{name: "personality PER_LINUX32", sys: "personality", args: [6]uint64{0x8}, want: RetAllow},
			{name: "personality PER_LINUX32 upper bits", sys: "personality", args: [6]uint64{0x8 | 1<<32}, want: RetAllow},
		},
	}
	for _, pname := range Names() {
		p, prog := compileEmbedded(t, pname)
		rows := append(append([]row(nil), common...), perPolicy[pname]...)
		if pname != "nesting" {
			rows = append(rows, strict...)
		}
		if len(perPolicy[pname]) == 0 {
			t.Errorf("no policy-specific rows for %s", pname)
		}
		for _, r := range rows {
			t.Run(pname+"/"+r.name, func(t *testing.T) {
				d := Data{Nr: r.nr, Arch: arch, Args: r.args}
				if r.sys != "" {
					d.Nr = nr(t, r.sys)
				}
				if r.arch != 0 {
					d.Arch = r.arch
				}
				got, err := Simulate(prog.Filter, d)
				if err != nil {
					t.Fatal(err)
				}
				if got != r.want {
					t.Errorf("filter: nr %d args %#x = %s, want %s", d.Nr, d.Args[:2], DescribeRet(got), DescribeRet(r.want))
				}
				ev, err := p.Evaluate(d)
				if err != nil {
					t.Fatal(err)
				}
				if ev != r.want {
					t.Errorf("Evaluate: nr %d args %#x = %s, want %s", d.Nr, d.Args[:2], DescribeRet(ev), DescribeRet(r.want))
				}
			})
		}
	}
}

// The compiled filter and the policy's direct meaning (Evaluate) must
// agree on every row; random arguments are biased towards the values the
// rules mention, with random upper bits.
func TestFilterAgreesWithEvaluate(t *testing.T) {
	arch := nativeAudit(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, pname := range Names() {
		p, prog := compileEmbedded(t, pname)
		var nrs []int32
		var vals []uint64
		for _, r := range p.Rules {
			for _, n := range r.Names {
				if v, err := SyscallNumber(n); err == nil {
					nrs = append(nrs, v)
				}
			}
			for _, c := range r.Args {
				vals = append(vals, *c.Value)
			}
		}
		arg := func() uint64 {
			switch rng.IntN(4) {
			case 0:
				return rng.Uint64()
			case 1:
				return vals[rng.IntN(len(vals))]
			case 2:
				return vals[rng.IntN(len(vals))] | rng.Uint64()<<32
			default:
				return vals[rng.IntN(len(vals))] | uint64(1)<<rng.IntN(32)
			}
		}
		for i := 0; i < 20000; i++ {
			d := Data{Arch: arch, Nr: nrs[rng.IntN(len(nrs))]}
			switch rng.IntN(20) {
			case 0:
				d.Nr = int32(rng.IntN(1024))
			case 1:
				d.Arch = []uint32{AuditArchI386, AuditArchARM, AuditArchAArch64, AuditArchX86_64}[rng.IntN(4)]
			case 2:
				d.Nr |= X32SyscallBit
			}
			for j := range d.Args {
				d.Args[j] = arg()
			}
			got, err := Simulate(prog.Filter, d)
			if err != nil {
				t.Fatal(err)
			}
			want, err := p.Evaluate(d)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%s: nr %d arch %#x args %#x: filter %s, Evaluate %s", pname, d.Nr, d.Arch, d.Args, DescribeRet(got), DescribeRet(want))
			}
		}
	}
}

// Every comparison operator, on values around the boundary and with the
// upper word set, through the generated code.
func TestArgumentOperators(t *testing.T) {
	arch := nativeAudit(t)
	const v = 0x1_0000_0005
	for _, op := range []string{OpEq, OpNe, OpLt, OpLe, OpGt, OpGe, OpMaskedEq} {
		a := Arg{Index: 2, Op: op, Value: ptr(uint64(v))}
		if op == OpMaskedEq {
			a.Mask = ptr(uint64(0xff_0000_00ff))
		}
		p := &Policy{Version: 1, Name: "ops-" + strings.ReplaceAll(op, "_", "-"), Description: "operator test",
			DefaultAction: Action{Kind: ActionErrno, Errno: "ENOSYS"},
			Rules: []Rule{
				{Names: []string{"write"}, Action: Action{Kind: ActionAllow}, Args: []Arg{a}, Reason: "condition under test"},
				{Names: []string{"write"}, Action: Action{Kind: ActionErrno, Errno: "EPERM"}, Reason: "otherwise"},
			}}
		prog, err := p.Compile()
		if err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		w := nr(t, "write")
		for _, x := range []uint64{0, 4, 5, 6, v - 1, v, v + 1, 0x5, 0x2_0000_0005, 0x0_ffff_ffff, 0xffff_ffff_ffff_ffff, 0x1_0000_0000, 0x33_0000_0005, 0x1_1111_1105} {
			d := Data{Nr: w, Arch: arch}
			d.Args[2] = x
			got, err := Simulate(prog.Filter, d)
			if err != nil {
				t.Fatal(err)
			}
			want := RetErrno | uint32(unix.EPERM)
			if a.holds(d) {
				want = RetAllow
			}
			if got != want {
				t.Errorf("%s %#x: arg %#x -> %s, want %s", op, v, x, DescribeRet(got), DescribeRet(want))
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestCompileCachesAndCopies(t *testing.T) {
	p, err := Load("standard")
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	orig := append([]unix.SockFilter(nil), a.Filter...)
	a.Filter[0].K = 0xdead
	a.Rules[0].Reason = "changed"
	b, err := p.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(b.Filter, orig) || b.Rules[0].Reason == "changed" {
		t.Fatal("a caller's changes to a Program leaked into the cache")
	}
	// A different policy with the same name must not get the cached program.
	q, _ := Load("standard")
	q.Rules = q.Rules[:len(q.Rules)-1]
	c, err := q.Compile()
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(c.Filter, orig) {
		t.Fatal("changed policy with the same name got the cached program")
	}
}

func TestProgramRulesForPlan(t *testing.T) {
	_, prog := compileEmbedded(t, "standard")
	if prog.Policy != "standard" || prog.DefaultAction != "errno ENOSYS" {
		t.Fatalf("program header %q %q", prog.Policy, prog.DefaultAction)
	}
	var sti, clone3 *RuleView
	for i := range prog.Rules {
		r := &prog.Rules[i]
		if r.Syscall == "ioctl" && r.Condition == "arg1 & 0xffffffff == 0x5412" {
			sti = r
		}
		if r.Syscall == "clone3" {
			clone3 = r
		}
		if r.Reason == "" || r.Action == "" {
			t.Errorf("rule view %+v lacks action or reason", *r)
		}
	}
	if sti == nil || sti.Action != "errno EPERM" || !strings.Contains(sti.Reason, "TIOCSTI") || sti.Number != nr(t, "ioctl") {
		t.Errorf("TIOCSTI row = %+v", sti)
	}
	if clone3 == nil || clone3.Action != "errno ENOSYS" || !strings.Contains(clone3.Reason, "fall back") {
		t.Errorf("clone3 row = %+v", clone3)
	}
}

func TestSyscallNumber(t *testing.T) {
	if _, err := SyscallNumber("not_a_syscall"); err == nil {
		t.Error("unknown name accepted")
	}
	a, _ := native()
	if a.audit == AuditArchX86_64 {
		for name, want := range map[string]int32{"read": 0, "ioctl": 16, "clone": 56, "clone3": 435} {
			if got := nr(t, name); got != want {
				t.Errorf("SyscallNumber(%s) = %d, want %d", name, got, want)
			}
		}
	}
}

func TestSimulateInstructions(t *testing.T) {
	ld := func(k uint32) unix.SockFilter { return unix.SockFilter{Code: bpfLD | bpfW | bpfABS, K: k} }
	ret := func(k uint32) unix.SockFilter { return unix.SockFilter{Code: bpfRET | bpfK, K: k} }
	d := Data{Nr: 7, Arch: 0x1234, Args: [6]uint64{0x1_0000_0002}}
	// A = args[0].hi (1) ; X = A ; A = nr (7) ; A = A*X+... ; M[3] = A; A = 0; A = M[3]; ret A
	prog := []unix.SockFilter{
		ld(20), {Code: bpfMISC | bpfTAX}, ld(0),
		{Code: bpfALU | bpfADD | bpfX},          // 8
		{Code: bpfALU | bpfLSH | bpfK, K: 2},    // 32
		{Code: bpfALU | bpfOR | bpfK, K: 1},     // 33
		{Code: bpfALU | bpfSUB | bpfK, K: 3},    // 30
		{Code: bpfALU | bpfDIV | bpfK, K: 4},    // 7
		{Code: bpfALU | bpfMOD | bpfK, K: 4},    // 3
		{Code: bpfALU | bpfXOR | bpfK, K: 0xf0}, // 0xf3
		{Code: bpfST, K: 3}, {Code: bpfLD | bpfIMM, K: 0}, {Code: bpfLD | bpfMEM, K: 3},
		{Code: bpfJMP | bpfJSET | bpfK, Jt: 1, Jf: 0, K: 0x80},
		ret(1),
		{Code: bpfJMP | bpfJGT | bpfK, Jt: 0, Jf: 1, K: 0xf2},
		{Code: bpfRET | bpfA},
		ret(2),
	}
	got, err := Simulate(prog, d)
	if err != nil || got != 0xf3 {
		t.Fatalf("got %#x, %v; want 0xf3", got, err)
	}
	for _, tc := range []struct {
		name string
		prog []unix.SockFilter
		want string
	}{
		{"empty", nil, "0 instructions"},
		{"no ret", []unix.SockFilter{ld(0)}, "ran off the end"},
		{"load past end", []unix.SockFilter{ld(64), ret(0)}, "outside struct seccomp_data"},
		{"unaligned", []unix.SockFilter{ld(2), ret(0)}, "unaligned"},
		{"jump past end", []unix.SockFilter{{Code: bpfJMP | bpfJEQ | bpfK, Jt: 5}, ret(0)}, "past the end"},
		{"ja past end", []unix.SockFilter{{Code: bpfJMP | bpfJA, K: 1}, ret(0)}, "past the end"},
		{"div by zero", []unix.SockFilter{{Code: bpfALU | bpfDIV | bpfX}, ret(0)}, "division by zero"},
		{"byte load", []unix.SockFilter{{Code: bpfLD | 0x10 | bpfABS}, ret(0)}, "32-bit"},
		{"scratch index", []unix.SockFilter{{Code: bpfST, K: 16}, ret(0)}, "scratch memory"},
	} {
		if _, err := Simulate(tc.prog, d); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestDescribeRet(t *testing.T) {
	for ret, want := range map[uint32]string{
		RetAllow: "allow", RetKillProcess: "kill_process", RetKillThread: "kill_thread",
		RetErrno | uint32(unix.EPERM): "errno EPERM", RetErrno | 200: "errno 200", RetLog: "log",
	} {
		if got := DescribeRet(ret); got != want {
			t.Errorf("DescribeRet(%#x) = %q, want %q", ret, got, want)
		}
	}
}

func TestCompileEmbedded(t *testing.T) {
	_, want := compileEmbedded(t, "restrictive")
	for range 2 {
		got, err := CompileEmbedded("restrictive")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got.Filter, want.Filter) || got.Policy != want.Policy || got.Arch != want.Arch {
			t.Fatal("CompileEmbedded differs from Load+Compile")
		}
		// The reviewer's view comes from the .json beside the program.
		rules, def, err := EmbeddedViews("restrictive")
		if err != nil || !reflect.DeepEqual(rules, want.Rules) || def != want.DefaultAction {
			t.Fatalf("EmbeddedViews differs from Load+Compile: %v", err)
		}
		got.Filter[0].K = 0 // must not reach the cache
	}
	if _, err := CompileEmbedded("nosuch"); err == nil {
		t.Fatal("unknown policy compiled")
	}
}

func BenchmarkCompileEmbedded(b *testing.B) {
	for b.Loop() {
		if _, err := CompileEmbedded("standard"); err != nil {
			b.Fatal(err)
		}
	}
}

// SyscallNumber (tests only) returns the native syscall number of name.
func SyscallNumber(name string) (int32, error) {
	arch, err := native()
	if err != nil {
		return -1, err
	}
	nr, ok := arch.resolve(name)
	if !ok {
		return -1, fmt.Errorf("seccomp: syscall %q does not exist on %s", name, arch.name)
	}
	return nr, nil
}

// A program whose lower half of the search is longer than a conditional
// jump reaches (255 instructions) uses a BPF_JA; every syscall still gets
// the policy's decision.
func TestDispatchFarJumps(t *testing.T) {
	arch, err := native()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for n := range arch.syscalls() {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return arch.syscalls()[names[i]] < arch.syscalls()[names[j]] })
	p := &Policy{Version: 1, Name: "far-jumps", Description: "long argument blocks",
		DefaultAction: Action{Kind: ActionErrno, Errno: "ENOSYS"}}
	for i, n := range names[:40] {
		p.Rules = append(p.Rules,
			Rule{Names: []string{n}, Action: Action{Kind: ActionErrno, Errno: "EPERM"}, Reason: "block",
				Args: []Arg{{Index: 0, Op: OpGe, Value: ptr(uint64(i) << 20)}, {Index: 1, Op: OpMaskedEq, Mask: ptr(uint64(0xff_0000_00ff)), Value: ptr(uint64(i))},
					{Index: 2, Op: OpNe, Value: ptr(uint64(7))}}},
			Rule{Names: []string{n}, Action: Action{Kind: ActionAllow}, Reason: "rest"})
	}
	prog, err := p.Compile() // includes the self-check against Evaluate
	if err != nil {
		t.Fatal(err)
	}
	far := 0
	for _, ins := range prog.Filter {
		if ins.Code == bpfJMP|bpfJA && ins.K > 255 {
			far++
		}
	}
	if far == 0 {
		t.Fatalf("%d instructions, %d far jumps: the test does not reach the BPF_JA path", len(prog.Filter), far)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 20000; i++ {
		d := Data{Arch: arch.audit, Nr: int32(rng.IntN(1100))}
		if rng.IntN(2) == 0 {
			d.Nr = arch.syscalls()[names[rng.IntN(45)]]
		}
		k := uint64(rng.IntN(45))
		d.Args[0] = k<<20 + uint64(rng.IntN(3)) - 1
		d.Args[1] = k | rng.Uint64()&^0xff_0000_00ff
		d.Args[2] = uint64(6 + rng.IntN(3))
		got, err := Simulate(prog.Filter, d)
		if err != nil {
			t.Fatal(err)
		}
		if want, _ := p.Evaluate(d); got != want {
			t.Fatalf("nr %d args %#x: filter %s, Evaluate %s", d.Nr, d.Args[:2], DescribeRet(got), DescribeRet(want))
		}
	}
}
