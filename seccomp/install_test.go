package seccomp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childEnv selects the re-executed child mode of this test binary:
// "<policy>" installs that policy and runs the probes, "none" runs the
// probes without a filter (the control), "no-nnp" calls the installer without
// no_new_privs, "x32:<policy>" installs the policy and makes an x32 call,
// "sweep:<policy>" asks the kernel for the policy's decision on every row
// of the decisions fixture. The filter is never installed in the go test
// process itself (STYLE.md rule 11).
const childEnv = "STR_SECCOMP_TEST_CHILD"

// errNoNewPrivs is installFilter's cause on a thread without no_new_privs.
var errNoNewPrivs = errors.New("no_new_privs is not set on this thread")

// installFilter loads filter (EncodeFilter's bytes, handed to the kernel
// as they are) on the calling thread as a sandbox's step 19 does: the
// same seccomp(2) call, for this thread only (no TSYNC: the child that
// calls it then execs or probes from the same locked thread), and only
// after no_new_privs (without it the kernel takes a filter only from
// CAP_SYS_ADMIN). The size check of step 19 is nsinit's checkFilter.
func installFilter(filter []byte) error {
	_, err := installFilterFlags(filter, 0)
	return err
}

// installFilterFlags is installFilter with seccomp(2)'s flags; with
// SECCOMP_FILTER_FLAG_NEW_LISTENER it returns the filter's listener
// (close-on-exec), as a per-tool template's step 19 loads its filter.
func installFilterFlags(filter []byte, flags uintptr) (int, error) {
	if len(filter) == 0 || len(filter)%8 != 0 {
		return -1, fmt.Errorf("seccomp program of %d bytes is not whole sock_filter records", len(filter))
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return -1, fmt.Errorf("prctl(PR_GET_NO_NEW_PRIVS): %w", err)
	}
	if nnp != 1 {
		return -1, errNoNewPrivs
	}
	fprog := unix.SockFprog{Len: uint16(len(filter) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&filter[0]))}
	fd, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func TestMain(m *testing.M) {
	if mode, ok := os.LookupEnv(childEnv); ok {
		os.Exit(seccompChild(mode))
	}
	os.Exit(m.Run())
}

// pythonScript exercises what a tool typically does with CPython 3.11's
// standard library and prints python-stdlib-ok; then it expects socket
// families other than unix/inet/inet6/netlink to be refused with
// EAFNOSUPPORT (exit 3 if AF_PACKET works, 4 on another errno).
const pythonScript = `
import json, os, socket, subprocess, sys, tempfile, threading, hashlib, time, select
out = {}
def work(i):
    out[i] = hashlib.sha256(str(i).encode()).hexdigest()
ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
assert len(out) == 4
assert subprocess.run(["/bin/true"]).returncode == 0
r = subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True, text=True, check=True)
assert r.stdout.strip() == "42", r.stdout
assert len(os.urandom(32)) == 32
a, b = socket.socketpair()
a.sendall(b"ping"); assert b.recv(4) == b"ping"
select.select([a], [], [], 0)
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "x.json")
    with open(p, "w") as f:
        json.dump({"ok": True}, f)
    with open(p) as f:
        assert json.load(f) == {"ok": True}
time.sleep(0.01)
print("python-stdlib-ok")
import errno
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    print("AF_PACKET socket created"); sys.exit(3)
except OSError as e:
    if e.errno != errno.EAFNOSUPPORT:
        print("AF_PACKET:", e); sys.exit(4)
print("python-ok")
`

// probe is one raw syscall made by the child after the filter is loaded.
type probe struct {
	name string
	nr   uintptr
	args [6]uintptr
}

func childProbes() []probe {
	// cachestat is not named in any policy; it is 451 on amd64 and arm64
	// and exists on kernels >= 6.5 (older kernels answer ENOSYS too, so
	// the control test does not rely on it).
	const nrCachestat uintptr = 451
	// Every probe must be harmless when it is NOT filtered: the control
	// run (mode "none") makes the same calls as root in the host's
	// namespaces. So mount targets a path that does not exist (ENOENT
	// from the kernel, EPERM from the filter).
	none := []byte("none\x00")
	target := []byte("/nonexistent-str-seccomp-probe/mnt\x00")
	tmpfs := []byte("tmpfs\x00")
	ptr := func(b []byte) uintptr { return uintptr(unsafe.Pointer(&b[0])) }
	return []probe{
		{"getpid", unix.SYS_GETPID, [6]uintptr{}},
		{"unshare(CLONE_NEWUSER)", unix.SYS_UNSHARE, [6]uintptr{unix.CLONE_NEWUSER}},
		{"keyctl(GET_KEYRING_ID)", unix.SYS_KEYCTL, [6]uintptr{0, ^uintptr(3) + 1}}, // KEY_SPEC_SESSION_KEYRING = -3
		{"mount(tmpfs, missing target)", unix.SYS_MOUNT, [6]uintptr{ptr(none), ptr(target), ptr(tmpfs), 0, 0}},
		{"clone3(NULL)", unix.SYS_CLONE3, [6]uintptr{0, 0}},
		// PTRACE_ATTACH to a pid that cannot exist: ESRCH from the kernel,
		// EPERM from the filter, and no side effect either way (TRACEME
		// would stop the child for a tracer that never comes).
		{"ptrace(ATTACH, no such pid)", unix.SYS_PTRACE, [6]uintptr{unix.PTRACE_ATTACH, 0x7ffffff0}},
		{"ioctl(-1, TIOCSTI)", unix.SYS_IOCTL, [6]uintptr{^uintptr(0), unix.TIOCSTI}},
		{"ioctl(-1, TIOCSTI|1<<32)", unix.SYS_IOCTL, [6]uintptr{^uintptr(0), unix.TIOCSTI | 1<<32}},
		{"ioctl(-1, TCGETS)", unix.SYS_IOCTL, [6]uintptr{^uintptr(0), unix.TCGETS}},
		{"personality(ADDR_NO_RANDOMIZE)", unix.SYS_PERSONALITY, [6]uintptr{0x0040000}},
		{"cachestat(-1)", nrCachestat, [6]uintptr{^uintptr(0)}},
		{"bpf", unix.SYS_BPF, [6]uintptr{^uintptr(0)}},
		{"userfaultfd", unix.SYS_USERFAULTFD, [6]uintptr{0}},
		{"socket(AF_NETLINK, NETLINK_ROUTE)", unix.SYS_SOCKET, [6]uintptr{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE}},
		{"socket(AF_NETLINK, NETLINK_AUDIT)", unix.SYS_SOCKET, [6]uintptr{unix.AF_NETLINK, unix.SOCK_RAW | unix.SOCK_CLOEXEC, unix.NETLINK_AUDIT}},
	}
}

type childReport struct {
	Errnos     map[string]string `json:"errnos"`
	PythonExit int               `json:"python_exit"`
	Error      string            `json:"error,omitempty"`
}

func errnoText(e syscall.Errno) string {
	if e == 0 {
		return "OK"
	}
	return unix.ErrnoName(e)
}

// seccompChild runs in the re-executed test binary.
//
//  1. lock the OS thread: the filter and the exec happen on this thread
//  2. compile the policy
//  3. prctl(PR_SET_NO_NEW_PRIVS, 1)
//  4. installFilter (step 19's seccomp(2) call)
//  5. raw syscall probes
//  6. syscall.ForkExec python3 from this thread, wait for it
//  7. print the report as the last stdout line
func seccompChild(mode string) int {
	if pol, ok := strings.CutPrefix(mode, "x32:"); ok {
		return x32Child(pol)
	}
	if pol, ok := strings.CutPrefix(mode, "sweep:"); ok {
		return sweepChild(pol)
	}
	if pol, ok := strings.CutPrefix(mode, "template:"); ok {
		return templateChild(pol)
	}
	rep := childReport{Errnos: map[string]string{}, PythonExit: -1}
	emit := func() int {
		b, _ := json.Marshal(rep)
		fmt.Printf("\nREPORT %s\n", b)
		return 0
	}
	// 1.
	runtime.LockOSThread()
	// 2.
	var filter []byte
	if mode != "none" && mode != "no-nnp" {
		p, err := Load(mode)
		if err != nil {
			rep.Error = err.Error()
			return emit()
		}
		prog, err := p.Compile()
		if err != nil {
			rep.Error = err.Error()
			return emit()
		}
		filter = EncodeFilter(prog.Filter)
	}
	if mode == "no-nnp" {
		p, _ := Load("standard")
		prog, _ := p.Compile()
		err := installFilter(EncodeFilter(prog.Filter))
		rep.Error = fmt.Sprint(err)
		if errors.Is(err, errNoNewPrivs) {
			rep.Errnos["install"] = "ErrNoNewPrivs"
		}
		return emit()
	}
	// 3.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		rep.Error = "prctl(PR_SET_NO_NEW_PRIVS): " + err.Error()
		return emit()
	}
	// 4.
	if filter != nil {
		if err := installFilter(filter); err != nil {
			rep.Error = err.Error()
			return emit()
		}
	}
	// 5.
	for _, p := range childProbes() {
		_, _, e := unix.RawSyscall6(p.nr, p.args[0], p.args[1], p.args[2], p.args[3], p.args[4], p.args[5])
		rep.Errnos[p.name] = errnoText(e)
	}
	// 6.
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		rep.Error = err.Error()
		return emit()
	}
	pid, err := syscall.ForkExec("/usr/bin/python3", []string{"python3", "-I", "-c", pythonScript}, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		Files: []uintptr{devnull.Fd(), os.Stdout.Fd(), os.Stderr.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL},
	})
	if err != nil {
		rep.Error = "ForkExec python3: " + err.Error()
		return emit()
	}
	var ws syscall.WaitStatus
	if _, err := syscall.Wait4(pid, &ws, 0, nil); err != nil {
		rep.Error = "wait4: " + err.Error()
		return emit()
	}
	switch {
	case ws.Exited():
		rep.PythonExit = ws.ExitStatus()
	case ws.Signaled():
		rep.PythonExit = 128 + int(ws.Signal())
	}
	// 7.
	return emit()
}

// x32Child installs a policy and then makes an x32 syscall (getpid with
// __X32_SYSCALL_BIT). The filter must kill the process with SIGSYS before
// the kernel looks at the number; returning at all is a failure.
func x32Child(policy string) int {
	runtime.LockOSThread()
	p, err := Load(policy)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	prog, err := p.Compile()
	if err != nil {
		fmt.Println(err)
		return 2
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println(err)
		return 2
	}
	if err := installFilter(EncodeFilter(prog.Filter)); err != nil {
		fmt.Println(err)
		return 2
	}
	_, _, e := unix.RawSyscall(uintptr(X32SyscallBit)|unix.SYS_GETPID, 0, 0, 0)
	fmt.Printf("x32 getpid returned: %v\n", e)
	return 1
}

func runChild(t *testing.T, mode string) (childReport, string) {
	t.Helper()
	// The deadline only keeps a wedged child from hanging the suite; it
	// is not an assertion about speed.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	out := stdout.String()
	i := strings.LastIndex(out, "\nREPORT ")
	if err != nil || i < 0 {
		t.Fatalf("child %s: %v\nstdout:\n%s\nstderr:\n%s", mode, err, out, stderr.String())
	}
	var rep childReport
	if err := json.Unmarshal([]byte(strings.TrimSpace(out[i+len("\nREPORT "):])), &rep); err != nil {
		t.Fatalf("child %s: bad report: %v\n%s", mode, err, out)
	}
	return rep, out + "\nstderr:\n" + stderr.String()
}

// TestInstalledFilter loads each policy for real in a re-executed child
// (no_new_privs makes this unprivileged, so it never skips) and checks the
// errnos the kernel returns, then runs CPython under the filter.
func TestInstalledFilter(t *testing.T) {
	want := map[string]string{
		"getpid":                            "OK",
		"unshare(CLONE_NEWUSER)":            "EPERM",
		"keyctl(GET_KEYRING_ID)":            "EPERM",
		"mount(tmpfs, missing target)":      "EPERM",
		"clone3(NULL)":                      "ENOSYS",
		"ptrace(ATTACH, no such pid)":       "EPERM",
		"ioctl(-1, TIOCSTI)":                "EPERM",
		"ioctl(-1, TIOCSTI|1<<32)":          "EPERM",
		"ioctl(-1, TCGETS)":                 "EBADF", // reached the kernel
		"personality(ADDR_NO_RANDOMIZE)":    "EPERM",
		"cachestat(-1)":                     "ENOSYS",
		"bpf":                               "EPERM",
		"userfaultfd":                       "EPERM",
		"socket(AF_NETLINK, NETLINK_ROUTE)": "OK",
		"socket(AF_NETLINK, NETLINK_AUDIT)": "EAFNOSUPPORT",
	}
	// nesting lets namespaces, mounts and TIOCSTI reach the kernel, which
	// answers them itself (the probes' arguments are invalid).
	nesting := map[string]string{
		"unshare(CLONE_NEWUSER)":       "EINVAL",
		"mount(tmpfs, missing target)": "ENOENT",
		"ioctl(-1, TIOCSTI)":           "EBADF",
		"ioctl(-1, TIOCSTI|1<<32)":     "EBADF",
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			rep, out := runChild(t, name)
			if rep.Error != "" {
				t.Fatalf("child error: %s\n%s", rep.Error, out)
			}
			for probe, w := range want {
				if n, ok := nesting[probe]; ok && name == "nesting" {
					w = n
				}
				if got := rep.Errnos[probe]; got != w {
					t.Errorf("%s under %s = %s, want %s", probe, name, got, w)
				}
			}
			if rep.PythonExit != 0 || !strings.Contains(out, "python-ok") {
				t.Errorf("python3 under %s exited %d\n%s", name, rep.PythonExit, out)
			}
		})
	}
}

// TestProbesDiscriminate is the control: without a filter the same probes
// must give different answers, or TestInstalledFilter proves nothing.
func TestProbesDiscriminate(t *testing.T) {
	rep, out := runChild(t, "none")
	if rep.Error != "" {
		t.Fatalf("child error: %s\n%s", rep.Error, out)
	}
	for probe, filtered := range map[string]string{
		"ioctl(-1, TIOCSTI)":                "EPERM",
		"ioctl(-1, TIOCSTI|1<<32)":          "EPERM",
		"clone3(NULL)":                      "ENOSYS",
		"bpf":                               "EPERM",
		"ptrace(ATTACH, no such pid)":       "EPERM",
		"socket(AF_NETLINK, NETLINK_AUDIT)": "EAFNOSUPPORT",
	} {
		if got := rep.Errnos[probe]; got == filtered {
			t.Errorf("without a filter %s = %s, the same as with one: the probe cannot tell them apart", probe, got)
		}
	}
	// Without the filter the standard-library part works and AF_PACKET is
	// not refused with EAFNOSUPPORT (created as root: 3; EPERM otherwise: 4).
	if (rep.PythonExit != 3 && rep.PythonExit != 4) || !strings.Contains(out, "python-stdlib-ok") {
		t.Errorf("python3 without a filter exited %d, want 3 or 4 after python-stdlib-ok\n%s", rep.PythonExit, out)
	}
}

// TestX32SyscallKills makes a real x32 syscall under each policy: the
// process must die of SIGSYS (SECCOMP_RET_KILL_PROCESS).
func TestX32SyscallKills(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("x32 exists only on amd64 (GOARCH=%s)", runtime.GOARCH)
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=x32:"+name)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("child: %v\n%s", err, out)
			}
			ws := ee.Sys().(syscall.WaitStatus)
			if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
				t.Fatalf("child ended with %v, want death by SIGSYS\n%s", ee, out)
			}
		})
	}
}

func TestInstallRequiresNoNewPrivs(t *testing.T) {
	rep, out := runChild(t, "no-nnp")
	if rep.Errnos["install"] != "ErrNoNewPrivs" || !strings.Contains(rep.Error, "no_new_privs is not set") {
		t.Fatalf("Install without no_new_privs = %q\n%s", rep.Error, out)
	}
}

// The kernel sweep asks the kernel itself what a policy decides, for every
// row of the decisions fixture, without running a single probed syscall.
// Under the policy sits a marker filter, installed first, that returns
// ERRNO(sweepMarker) for any call whose sixth argument is sweepMagic and
// allows everything else (so the child can still install the policy).
// The kernel runs every filter and acts on the most restrictive action;
// between two ERRNO results it keeps the newer filter's (the policy's,
// installed second). So a probe with sweepMagic in args[5] returns
//
//	policy allow (or log)      -> sweepMarker (ERRNO beats ALLOW): not executed
//	policy errno E             -> E (the policy's, newer): not executed
//	policy kill                -> the child dies (such rows are not probed)
//
// No embedded policy puts a condition on args[5] (the test checks), so the
// magic value cannot change the policy's decision.
const (
	sweepMagic  uint64 = 0x5374725f5377704d // "StrSwpM"
	sweepMarker uint32 = 4000               // an errno no policy returns (<= MAX_ERRNO)
)

// seccompBypass reports the syscall numbers the kernel never shows to a
// seccomp filter: on x86_64, uretprobe (335, Linux 6.11) and uprobe (336)
// are passed through by __secure_computing, and called from anywhere but
// the kernel's probe trampoline they raise SIGILL. The sweep cannot ask
// about them, and no policy can decide them.
func seccompBypass(arch archSpec, nr int32) bool {
	return arch.audit == AuditArchX86_64 && (nr == 335 || nr == 336)
}

func sweepMarkerFilter() []unix.SockFilter {
	return []unix.SockFilter{
		{Code: bpfLD | bpfW | bpfABS, K: argLo(5)},
		{Code: bpfJMP | bpfJEQ | bpfK, Jt: 0, Jf: 3, K: uint32(sweepMagic & 0xffffffff)},
		{Code: bpfLD | bpfW | bpfABS, K: argHi(5)},
		{Code: bpfJMP | bpfJEQ | bpfK, Jt: 0, Jf: 1, K: uint32(sweepMagic >> 32)},
		{Code: bpfRET | bpfK, K: RetErrno | sweepMarker},
		{Code: bpfRET | bpfK, K: RetAllow},
	}
}

// sweepRows are the rows of the decisions fixture the kernel can be asked
// about from this process: the native arch, numbers below the x32 bit,
// and a decision that is not a kill. args[5] carries sweepMagic.
func sweepRows(p *Policy, prog *Program) ([]Data, []uint32, error) {
	arch, err := native()
	if err != nil {
		return nil, nil, err
	}
	var rows []Data
	var want []uint32
	for _, d := range decisionRows(p, arch) {
		if d.Arch != arch.audit || uint32(d.Nr) >= uint32(X32SyscallBit) || seccompBypass(arch, d.Nr) {
			continue
		}
		d.Args[5] = sweepMagic
		ret, err := Simulate(prog.Filter, d)
		if err != nil {
			return nil, nil, err
		}
		switch ret & RetActionFull {
		case RetAllow, RetLog:
			ret = sweepMarker
		case RetErrno:
			ret &= RetData
		default:
			continue
		}
		rows = append(rows, d)
		want = append(want, ret)
	}
	return rows, want, nil
}

// sweepChild installs the marker filter and the policy on a locked
// thread and prints the errno of every sweep row, in order.
func sweepChild(policy string) int {
	runtime.LockOSThread()
	p, err := Load(policy)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	prog, err := p.Compile()
	if err != nil {
		fmt.Println(err)
		return 2
	}
	rows, _, err := sweepRows(p, prog)
	if err != nil {
		fmt.Println(err)
		return 2
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println(err)
		return 2
	}
	if err := installFilter(EncodeFilter(sweepMarkerFilter())); err != nil {
		fmt.Println("marker filter:", err)
		return 2
	}
	if err := installFilter(EncodeFilter(prog.Filter)); err != nil {
		fmt.Println("policy:", err)
		return 2
	}
	got := make([]uint32, len(rows))
	for i, d := range rows {
		_, _, e := unix.RawSyscall6(uintptr(uint32(d.Nr)), uintptr(d.Args[0]), uintptr(d.Args[1]), uintptr(d.Args[2]), uintptr(d.Args[3]), uintptr(d.Args[4]), uintptr(d.Args[5]))
		got[i] = uint32(e)
	}
	b, _ := json.Marshal(got)
	fmt.Printf("\nSWEEP %s\n", b)
	return 0
}

// TestKernelSweep: for every policy, the kernel's decision on every row of
// the decisions fixture (every syscall number 0..1100 and every argument
// probe) equals the simulator's. With TestFrozenDecisions this ties the
// installed program to the frozen decisions.
func TestKernelSweep(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			p, prog := compileEmbedded(t, name)
			for i, r := range p.Rules {
				for _, c := range r.Args {
					if c.Index == 5 {
						t.Fatalf("rules[%d] has a condition on args[5], where the sweep puts its magic value", i)
					}
				}
			}
			rows, want, err := sweepRows(p, prog)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=sweep:"+name)
			out, err := cmd.CombinedOutput()
			i := bytes.LastIndex(out, []byte("\nSWEEP "))
			if err != nil || i < 0 {
				t.Fatalf("child: %v\n%s", err, out)
			}
			var got []uint32
			if err := json.Unmarshal(bytes.TrimSpace(out[i+len("\nSWEEP "):]), &got); err != nil {
				t.Fatalf("child report: %v\n%s", err, out)
			}
			if len(got) != len(rows) {
				t.Fatalf("child answered %d rows, want %d", len(got), len(rows))
			}
			allowed := 0
			for j := range rows {
				if got[j] != want[j] {
					t.Errorf("%s: kernel %d, simulator %d (%d = allowed)", formatRow(rows[j], 0), got[j], want[j], sweepMarker)
				}
				if want[j] == sweepMarker {
					allowed++
				}
			}
			// The sweep must see both answers, or it proves nothing.
			if allowed == 0 || allowed == len(rows) {
				t.Fatalf("%d of %d rows allowed: the sweep does not discriminate", allowed, len(rows))
			}
			t.Logf("%d rows, %d allowed, kernel and simulator agree on all", len(rows), allowed)
		})
	}
}
