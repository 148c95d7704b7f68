package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/syncbuf"
)

// str run's side of the resident launcher (resident.Call): a
// cancelled call, a server gone mid-call, a listener that is not root.

// strExec runs str with args, env added to the test's environment, and
// stdin; bounded like str().
func strExec(t *testing.T, stdin string, env []string, args ...string) run {
	t.Helper()
	cmd := exec.Command(strBin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitStarted(t, cmd, fmt.Sprintf("str %q", args), &errb)
	return run{Stdout: out.String(), Stderr: errb.String(), Exit: cmd.ProcessState.ExitCode()}
}

// TestServeClientCancel: SIGTERM to a served str run cancels the call
// (the sandbox is ended: sleep as PID 1 has no SIGINT handler, so SIGKILL
// after the grace, 137), and the sandbox is gone afterwards.
func TestServeClientCancel(t *testing.T) {
	sp := startServe(t, 1)
	marker := fmt.Sprintf("str-serve-term-%d", time.Now().UnixNano())
	cmd := exec.Command(strBin, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "sleep 300; true", marker)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 1 }) {
		_ = cmd.Process.Kill()
		t.Fatalf("the served sandbox never ran: %s", errb.String())
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	if left := sandboxShells(marker); len(left) > 0 {
		t.Errorf("the sandbox outlived its cancelled call: pids %v", left)
	}
	if got := cmd.ProcessState.ExitCode(); got != 128+int(syscall.SIGKILL) || errb.String() != "" {
		t.Errorf("SIGTERM: exit %d stderr %q, want %d and nothing", got, errb.String(), 128+int(syscall.SIGKILL))
	}
}

// TestServeServerGone: the server dies mid-call (issue 29, item 6). The
// command ran (its shell was seen in the sandbox), so str run neither
// runs it again nor says "could not be set up" (125, safe to retry): it
// exits 123 (outcome.ExitResidentLost) saying the command may have run.
func TestServeServerGone(t *testing.T) {
	sp := startServe(t, 1)
	marker := fmt.Sprintf("str-serve-gone-%d", time.Now().UnixNano())
	go func() {
		if eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 1 }) {
			_ = sp.cmd.Process.Kill()
		}
	}()
	r := strExec(t, "", nil, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "sleep 300; true", marker)
	stderr := strings.ReplaceAll(r.Stderr, sp.socket, "SOCKET")
	want := "str run: resident launcher SOCKET died during the call; the command may have run (no reply: EOF)\n"
	if r.Exit != 123 || stderr != want {
		t.Errorf("server gone: exit %d stderr %q; want 123 and %q", r.Exit, stderr, want)
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
// not a str serve. str run connects, sees the listener's uid
// (SO_PEERCRED) and sends nothing, neither the request nor the caller's
// stdio; it warns and runs one-shot. The socket is the one named by
// --serve, and the default one under $STR_STATE_DIR
// (resident.DefaultSocket): there the unknown profile ends the
// one-shot run before any sandbox (a run with another state directory
// must not sweep this host's cgroups).
func TestResidentListenerMustBeRoot(t *testing.T) {
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

	r := strExec(t, "", nil, "run", "--serve", sock, "--profile", "restrictive", "--", "/bin/echo", "ok")
	if r.Exit != 0 || r.Stdout != "ok\n" || !strings.Contains(r.Stderr, warn) {
		t.Errorf("--serve to a non-root listener: exit %d, stdout %q, stderr %q; want one-shot and %q", r.Exit, r.Stdout, r.Stderr, warn)
	}
	r = strExec(t, "", []string{"STR_STATE_DIR=" + state}, "run", "--profile", "no-such-profile", "--", "/bin/true")
	if r.Exit != 125 || !strings.Contains(r.Stderr, warn) || !strings.Contains(r.Stderr, sock) {
		t.Errorf("the default socket under $STR_STATE_DIR: exit %d, stderr %q; want its warning naming %s, exit 125 (no such profile)", r.Exit, r.Stderr, sock)
	}
	// str run connected for each run, and sent nothing.
	if !eventually(30*time.Second, func() bool { return len(conns()) >= 2 }) {
		t.Fatalf("the fake listener saw %d connections, want 2: %q", len(conns()), conns())
	}
	for _, c := range conns() {
		if c != "conn 0" {
			t.Errorf("a non-root listener was sent something: %q", conns())
			break
		}
	}
}
