package integration

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/test/internal/strbuild"
)

// str's entry stub (cmd/str/fast_linux_amd64.s): on linux/amd64 a served
// `str run [--serve S] [--profile P] [--timeout D] -- CMD...` is answered
// before Go's runtime starts; anything else is the Go path's. From the
// caller's side the two must not differ.

// fastRun is one str run: its output and exit status, and whether Go's
// runtime started (GODEBUG=inittrace=1 makes it print a line per package
// init to stderr; those lines are taken out of Stderr).
type fastRun struct {
	run
	goStarted bool
}

// strExec runs str with args, env added to the test's environment, and
// stdin; bounded like str().
func strExec(t *testing.T, bin, stdin string, env []string, args ...string) fastRun {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "GODEBUG=inittrace=1"), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, cmd, fmt.Sprintf("str %q", args), &errb)
	r := fastRun{run: run{Stdout: out.String(), Exit: cmd.ProcessState.ExitCode()}}
	var kept []string
	for _, l := range strings.SplitAfter(errb.String(), "\n") {
		if strings.HasPrefix(l, "init ") && strings.Contains(l, " @") {
			r.goStarted = true
			continue
		}
		kept = append(kept, l)
	}
	r.Stderr = strings.Join(kept, "")
	return r
}

// goPath forces the Go path with an option the stub does not take and
// that changes nothing (-pids=0: the profile's limit).
func goPath(args []string) []string {
	return append([]string{"run", "-pids=0"}, args...)
}

// TestStrEntryIsStub: the str under test (make build's) enters at the
// stub on linux/amd64, and the stub's first act is not Go's runtime.
func TestStrEntryIsStub(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	checkEntry(t, strBin, true)
}

// checkEntry: bin's ELF entry is main.fastEntry's code (stub) or Go's
// _rt0_amd64_linux (!stub).
func checkEntry(t *testing.T, bin string, stub bool) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatalf("%s: no symbol table (stripped?): %v", bin, err)
	}
	want := "_rt0_amd64_linux"
	if stub {
		want = "main.fastEntry.abi0" // the assembly's own (ABI0) symbol
	}
	for _, s := range syms {
		if s.Name == want {
			if s.Value != f.Entry {
				t.Fatalf("%s: ELF entry %#x, %s is at %#x: built without -ldflags=%s (scripts/str-ldflags.sh)?", bin, f.Entry, want, s.Value, strings.Join(strbuild.StrFlags("linux", "amd64"), " "))
			}
			return
		}
	}
	t.Fatalf("%s: no symbol %s", bin, want)
}

// TestFastPathSameAsGoPath: through the stub and through the Go path, the
// same stdout, stderr and exit status for the tool's statuses, str's own
// (124 timeout, 126, 127), the caller's stdin, argv that needs no
// quoting to survive, a large environment, the socket from
// $STR_SERVE_SOCKET; and the stub never started Go's runtime.
func TestFastPathSameAsGoPath(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	sp := startServe(t, 1)
	var bigEnv []string
	for i := range 2000 {
		bigEnv = append(bigEnv, fmt.Sprintf("STR_FAST_%04d=%s", i, strings.Repeat("v", 80)))
	}
	bigEnv = append(bigEnv, "PYTHONUNBUFFERED=passed-through") // standard's passthrough
	for _, c := range []struct {
		name  string
		stdin string
		env   []string
		args  []string
		exit  int
	}{
		{"true", "", nil, []string{"--serve", sp.socket, "--profile", "restrictive", "--", "/bin/true"}, 0},
		{"status 3, stdout and stderr", "", nil, []string{"--serve=" + sp.socket, "--profile=restrictive", "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 3},
		{"stdin", "line one\nline two\n", nil, []string{"--profile", "restrictive", "--serve", sp.socket, "--", "/bin/sh", "-c", "cat; echo done"}, 0},
		{"argv", "", nil, []string{"--serve", sp.socket, "--", "/bin/sh", "-c", `for a in "$@"; do printf '[%s]\n' "$a"; done`, "sh", "a b", "it's", `"q"`, "", "ü 日本", "-x", "--", "$HOME"}, 0},
		{"timeout", "", nil, []string{"--serve", sp.socket, "--profile", "restrictive", "--timeout", "1s", "--", "sleep", "30"}, 124},
		{"not found", "", nil, []string{"--serve", sp.socket, "--profile", "restrictive", "--", "no-such-command"}, 127},
		{"not executable", "", nil, []string{"--serve", sp.socket, "--profile", "restrictive", "--", "/etc"}, 126},
		{"large environment", "", bigEnv, []string{"--serve", sp.socket, "--profile", "standard", "--", "/bin/sh", "-c", "env | sort"}, 0},
		{"socket from the environment", "", []string{"STR_SERVE_SOCKET=" + sp.socket}, []string{"--profile", "standard", "--", "/bin/echo", "ok"}, 0},
	} {
		fast := strExec(t, strBin, c.stdin, c.env, append([]string{"run"}, c.args...)...)
		slow := strExec(t, strBin, c.stdin, c.env, goPath(c.args)...)
		if fast.goStarted {
			t.Errorf("%s: Go's runtime started on the fast path: the stub handed %q to the Go path", c.name, c.args)
		}
		if !slow.goStarted {
			t.Errorf("%s: the forced Go path shows no runtime start", c.name)
		}
		if fast.Exit != c.exit || slow.Exit != c.exit {
			t.Errorf("%s: exit fast %d, Go path %d, want %d\nfast stderr: %s\nGo stderr: %s", c.name, fast.Exit, slow.Exit, c.exit, fast.Stderr, slow.Stderr)
		}
		if fast.Stdout != slow.Stdout || fast.Stderr != slow.Stderr {
			t.Errorf("%s: output differs\nfast stdout: %q\nGo stdout:   %q\nfast stderr: %q\nGo stderr:   %q", c.name, fast.Stdout, slow.Stdout, fast.Stderr, slow.Stderr)
		}
		switch c.name {
		case "stdin":
			if fast.Stdout != c.stdin+"done\n" {
				t.Errorf("stdin: stdout %q", fast.Stdout)
			}
		case "large environment":
			if !strings.Contains(fast.Stdout, "PYTHONUNBUFFERED=passed-through\n") {
				t.Errorf("large environment: the passthrough name is not in the tool's environment:\n%.2000s", fast.Stdout)
			}
		}
	}

	// Bytes that are not UTF-8 reach the tool exactly as given, served
	// or one-shot (the plan and the call never pass through JSON).
	args := []string{"--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", `printf '[%s]' "$@"`, "sh", "\xff\xfe", "a\x80b"}
	const exact = "[\xff\xfe][a\x80b]"
	fast := strExec(t, strBin, "", nil, append([]string{"run"}, args...)...)
	one := strExec(t, strBin, "", nil, append([]string{"run", "--profile", "restrictive", "--"}, args[5:]...)...)
	if fast.goStarted || fast.Exit != 0 || fast.Stdout != exact || one.Stdout != exact {
		t.Errorf("non-UTF-8 argv: fast %q (exit %d, Go started %v), one-shot %q; want %q", fast.Stdout, fast.Exit, fast.goStarted, one.Stdout, exact)
	}
}

// TestFastPathFallsBack: what the stub does not serve is the Go path's,
// with the Go path's outcome: no server (one-shot), a profile the server
// does not serve (not_poolable: one-shot), a bad --timeout (the request
// is bad: the Go path's usage error), other options and subcommands.
func TestFastPathFallsBack(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	sp := startServe(t, 1)
	dir := worldDir(t)
	for _, c := range []struct {
		name   string
		env    []string
		args   []string
		exit   int
		stdout string
		stderr string
	}{
		{"no server", nil, []string{"run", "--serve", filepath.Join(dir, "nothing.sock"), "--profile", "restrictive", "--", "/bin/echo", "ok"}, 0, "ok\n", ""},
		{"not poolable", nil, []string{"run", "--serve", sp.socket, "--profile", "permissive", "--", "/bin/echo", "ok"}, 0, "ok\n", ""},
		{"bad timeout", nil, []string{"run", "--serve", sp.socket, "--timeout", "soon", "--", "/bin/true"}, 2, "", `str run: --timeout "soon"`},
		{"empty socket", []string{"STR_SERVE_SOCKET="}, []string{"run", "--profile", "restrictive", "--", "/bin/echo", "ok"}, 0, "ok\n", ""},
		{"profile dir", []string{"STR_PROFILE_DIR=" + dir}, []string{"run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/echo", "ok"}, 0, "ok\n", ""},
		{"another option", nil, []string{"run", "--serve", sp.socket, "--env", "A=1", "--", "/bin/sh", "-c", "echo $A"}, 0, "1\n", ""},
		{"given twice", nil, []string{"run", "--serve", sp.socket, "--profile", "standard", "--profile", "restrictive", "--", "/bin/echo", "ok"}, 0, "ok\n", ""},
		{"no --", nil, []string{"run", "--serve", sp.socket, "/bin/echo", "ok"}, 0, "ok\n", ""},
		{"version", nil, []string{"version"}, 0, "str ", ""},
	} {
		r := strExec(t, strBin, "", c.env, c.args...)
		if !r.goStarted {
			t.Errorf("%s: the stub did not hand %q to the Go path", c.name, c.args)
		}
		if r.Exit != c.exit || !strings.HasPrefix(r.Stdout, c.stdout) || !strings.Contains(r.Stderr, c.stderr) {
			t.Errorf("%s: exit %d stdout %q stderr %q, want %d, %q..., stderr with %q", c.name, r.Exit, r.Stdout, r.Stderr, c.exit, c.stdout, c.stderr)
		}
	}

	// str invoked as bwrap: bubblewrap's command line, the Go path's.
	bw := filepath.Join(dir, "bwrap")
	if err := os.Symlink(strBin, bw); err != nil {
		t.Fatal(err)
	}
	if r := strExec(t, bw, "", nil, "run", "--serve", sp.socket, "--", "/bin/true"); !r.goStarted {
		t.Errorf("invoked as bwrap: the stub served %q", "run --serve")
	}

	// stdin closed: the stub's socket would be fd 0 (and sent as the
	// tool's stdin); the Go path runs it with /dev/null there.
	r := strExec(t, "/bin/sh", "", nil, "-c", `exec "$0" "$@" <&-`, strBin, "run", "--serve", sp.socket, "--profile", "restrictive", "--",
		"/bin/sh", "-c", "readlink /proc/self/fd/0")
	if !r.goStarted || r.Exit != 0 || r.Stdout != "/dev/null\n" {
		t.Errorf("stdin closed: Go started %v, exit %d, the tool's stdin %q, want the Go path and /dev/null; stderr %s", r.goStarted, r.Exit, r.Stdout, r.Stderr)
	}
}

// TestFastPathCancel: SIGTERM to a client on the fast path cancels the
// call as the Go client does (the sandbox is ended: sleep as PID 1 has no
// SIGINT handler, so SIGKILL after the grace, 137), and the sandbox is
// gone afterwards; the Go path gives the same status and stderr.
func TestFastPathCancel(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	sp := startServe(t, 1)
	cancel := func(fast bool) (int, string) {
		marker := fmt.Sprintf("str-fast-term-%d", time.Now().UnixNano())
		args := []string{"--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "sleep 300; true", marker}
		if fast {
			args = append([]string{"run"}, args...)
		} else {
			args = goPath(args)
		}
		cmd := exec.Command(strBin, args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if !eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 1 }) {
			_ = cmd.Process.Kill()
			t.Fatalf("fast %v: the served sandbox never ran: %s", fast, errb.String())
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if left := sandboxShells(marker); len(left) > 0 {
			t.Errorf("fast %v: the sandbox outlived its cancelled call: pids %v", fast, left)
		}
		return cmd.ProcessState.ExitCode(), errb.String()
	}
	fastExit, fastErr := cancel(true)
	goExit, goErr := cancel(false)
	if fastExit != 128+int(syscall.SIGKILL) || fastExit != goExit || fastErr != goErr {
		t.Errorf("SIGTERM: fast path exit %d stderr %q, Go path exit %d stderr %q, want %d for both", fastExit, fastErr, goExit, goErr, 128+int(syscall.SIGKILL))
	}
}

// TestFastPathSyscalls: the whole fast path of a served /bin/true under
// strace -f: no thread is cloned and nothing is mapped (Go's runtime, which
// does both at once, never starts); the count is logged.
func TestFastPathSyscalls(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		mustwork.Skip(t, "needs strace (make test-deps)")
	}
	sp := startServe(t, 1)
	log := filepath.Join(t.TempDir(), "strace")
	out, err := exec.Command(strace, "-f", "-qq", "-o", log, strBin, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/true").CombinedOutput()
	if err != nil {
		t.Fatalf("strace str run: %v\n%s", err, out)
	}
	data, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	var calls []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		l = strings.TrimLeft(l, "0123456789 ") // strace -f's pid
		name, _, _ := strings.Cut(l, "(")
		calls = append(calls, name)
	}
	for _, bad := range []string{"clone", "clone3", "mmap", "rt_sigaction", "sched_getaffinity"} {
		if slices.Contains(calls, bad) {
			t.Errorf("the fast path made %s: Go's runtime started\n%s", bad, data)
		}
	}
	t.Logf("the fast path's %d syscalls (execve included): %s", len(calls), strings.Join(calls, " "))
}

// TestFlaglessBuild: str built without the entry flag (any go build, and
// every platform but linux/amd64) is the Go path alone, and is served the
// same; a linux/arm64 build links.
func TestFlaglessBuild(t *testing.T) {
	sp := startServe(t, 1)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "str")
	for _, b := range []struct {
		out string
		env []string
	}{
		{bin, []string{"CGO_ENABLED=0"}},
		{filepath.Join(dir, "str-arm64"), []string{"CGO_ENABLED=0", "GOARCH=arm64"}},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, "./cmd/str")
		cmd.Dir = "../.."
		cmd.Env = append(os.Environ(), b.env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %v: %v\n%s", b.env, err, out)
		}
	}
	if runtime.GOARCH == "amd64" {
		checkEntry(t, bin, false)
	}
	r := strExec(t, bin, "", nil, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "echo out; exit 3")
	if !r.goStarted || r.Exit != 3 || r.Stdout != "out\n" {
		t.Errorf("flagless build: exit %d stdout %q stderr %q Go started %v, want 3, out, the Go path", r.Exit, r.Stdout, r.Stderr, r.goStarted)
	}
}

// TestFastPathRefused: a caller SO_PEERCRED refuses is answered
// "refused" on the fast path too; the stub hands the call to the Go path,
// which warns and runs one-shot as always. An allowed uid is served by
// the stub.
func TestFastPathRefused(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	sp := startServe(t, 1, "--allow-uid", "65532")
	// The binary where any uid can run it.
	dir := worldDir(t)
	data, err := os.ReadFile(strBin)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "str")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	as := func(uid uint32) (fastRun, string) {
		cmd := exec.Command(bin, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/echo", "ok")
		cmd.Dir = "/"
		cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		_ = cmd.Run()
		return fastRun{run: run{Stdout: out.String(), Exit: cmd.ProcessState.ExitCode()}, goStarted: strings.Contains(errb.String(), "init runtime @")}, errb.String()
	}
	r, stderr := as(65533)
	if !r.goStarted || !strings.Contains(stderr, "refused this caller") || !strings.Contains(stderr, "uid 65533") {
		t.Errorf("uid 65533: Go started %v, stderr:\n%s", r.goStarted, stderr)
	}
	r, stderr = as(65532)
	if r.goStarted || r.Exit != 0 || r.Stdout != "ok\n" {
		t.Errorf("uid 65532 (allowed): Go started %v, exit %d, stdout %q, stderr:\n%s", r.goStarted, r.Exit, r.Stdout, stderr)
	}
}

// TestFastPathServerGone: the server dies mid-call (issue 29, item 6).
// The command ran (its shell was seen in the sandbox), so neither path
// runs it again nor says "could not be set up" (125, safe to retry): both
// exit 123 (launcher.ExitResidentLost) with the same message saying the
// command may have run.
func TestFastPathServerGone(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	gone := func(fast bool) fastRun {
		sp := startServe(t, 1)
		marker := fmt.Sprintf("str-fast-gone-%d", time.Now().UnixNano())
		args := []string{"--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "sleep 300; true", marker}
		if fast {
			args = append([]string{"run"}, args...)
		} else {
			args = goPath(args)
		}
		go func() {
			if eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 1 }) {
				_ = sp.cmd.Process.Kill()
			}
		}()
		r := strExec(t, strBin, "", nil, args...)
		r.Stderr = strings.ReplaceAll(r.Stderr, sp.socket, "SOCKET")
		return r
	}
	fast, slow := gone(true), gone(false)
	want := "str run: resident launcher SOCKET died during the call; the command may have run (no reply: EOF)\n"
	if fast.goStarted || fast.Exit != 123 || fast.Exit != slow.Exit || fast.Stderr != slow.Stderr || fast.Stderr != want {
		t.Errorf("server gone: fast path exit %d stderr %q (Go started %v), Go path exit %d stderr %q; want 123 and %q from both", fast.Exit, fast.Stderr, fast.goStarted, slow.Exit, slow.Stderr, want)
	}
}

// fakeListener listens on a SOCK_SEQPACKET socket at path as uid 65534
// (not root, so not a str serve) and logs the bytes each accepted
// connection brought before its peer closed it.
func fakeListener(t *testing.T, path string) (log func() []string) {
	t.Helper()
	needRoot(t)
	const script = `
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1]); s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    c.close()
    print("conn", n, flush=True)
`
	cmd := exec.Command("/usr/bin/python3", "-c", script, path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !eventually(30*time.Second, func() bool { return strings.Contains(out.String(), "listening") }) {
		t.Fatalf("the fake listener did not start: %s", out.String())
	}
	return func() []string {
		var conns []string
		for _, l := range strings.Split(out.String(), "\n") {
			if strings.HasPrefix(l, "conn ") {
				conns = append(conns, l)
			}
		}
		return conns
	}
}

// TestResidentListenerMustBeRoot: a socket whose listener is not root is
// not a str serve. The stub and the Go path each connect, see the
// listener's uid (SO_PEERCRED) and send nothing, neither the request nor
// the caller's stdio; the Go path warns and runs one-shot. The socket is
// the one named by --serve, and the default one under $STR_STATE_DIR
// (the stub's rule for the default, as launcher.DefaultResidentSocket):
// there the unknown profile ends the one-shot run before any sandbox (a
// run with another state directory must not sweep this host's cgroups).
func TestResidentListenerMustBeRoot(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("the entry stub is linux/amd64's")
	}
	dir := worldDir(t)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(state, "serve.sock")
	conns := fakeListener(t, sock)
	const warn = "the listener is uid 65534, not root: not a str serve"

	r := strExec(t, strBin, "", nil, "run", "--serve", sock, "--profile", "restrictive", "--", "/bin/echo", "ok")
	if !r.goStarted || r.Exit != 0 || r.Stdout != "ok\n" || !strings.Contains(r.Stderr, warn) {
		t.Errorf("--serve to a non-root listener: Go started %v, exit %d, stdout %q, stderr %q; want the Go path, one-shot, and %q", r.goStarted, r.Exit, r.Stdout, r.Stderr, warn)
	}
	r = strExec(t, strBin, "", []string{"STR_STATE_DIR=" + state}, "run", "--profile", "no-such-profile", "--", "/bin/true")
	if !r.goStarted || r.Exit != 125 || !strings.Contains(r.Stderr, warn) || !strings.Contains(r.Stderr, sock) {
		t.Errorf("the default socket under $STR_STATE_DIR: Go started %v, exit %d, stderr %q; want the Go path, its warning naming %s, exit 125 (no such profile)", r.goStarted, r.Exit, r.Stderr, sock)
	}
	// The stub and the Go path connected for each run, and sent nothing.
	if !eventually(30*time.Second, func() bool { return len(conns()) >= 4 }) {
		t.Fatalf("the fake listener saw %d connections, want 4 (stub and Go path, two runs): %q", len(conns()), conns())
	}
	for _, c := range conns() {
		if c != "conn 0" {
			t.Errorf("a non-root listener was sent something: %q", conns())
			break
		}
	}
}
