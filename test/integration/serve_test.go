package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// The resident launcher (str serve): a run through it must look, from
// inside and from the caller's side, exactly like a one-shot str run.

// serveProc is a running str serve.
type serveProc struct {
	socket string
	cmd    *exec.Cmd
	log    *bytes.Buffer
	pool   int
}

// startServe starts str serve on a socket in a fresh directory and waits
// until every served profile's pool is built.
func startServe(t *testing.T, pool int, extra ...string) *serveProc {
	t.Helper()
	needRoot(t)
	dir, err := os.MkdirTemp("", "str-serve-")
	if err != nil {
		t.Fatal(err)
	}
	// Reachable by any uid: the refusal test connects as another one.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sp := &serveProc{socket: filepath.Join(dir, "serve.sock"), log: &bytes.Buffer{}, pool: pool}
	args := append([]string{"serve", "--socket", sp.socket, "--pool", strconv.Itoa(pool), "--profiles", "restrictive,standard"}, extra...)
	sp.cmd = exec.Command(strBin, args...)
	sp.cmd.Stdout, sp.cmd.Stderr = sp.log, sp.log
	if err := sp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = sp.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = sp.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = sp.cmd.Process.Kill()
			t.Errorf("str serve did not stop within 60 s of SIGTERM; log:\n%s", sp.log)
		}
		os.RemoveAll(dir)
	})
	if !eventually(60*time.Second, func() bool { return sp.waiting() == 2*pool }) {
		t.Fatalf("str serve: %d pre-built sandboxes await a call, want %d; log:\n%s", sp.waiting(), 2*pool, sp.log)
	}
	return sp
}

// waiting counts the server's children that are still the init (a
// pre-built sandbox waiting at step 10a): the server's own clone child,
// with the server's command line.
func (sp *serveProc) waiting() int { return len(sp.waitingPids()) }

// waitingPids are their host pids.
func (sp *serveProc) waitingPids() []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(st[bytes.LastIndexByte(st, ')')+2:])
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != strconv.Itoa(sp.cmd.Process.Pid) {
			continue
		}
		if cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(cl) == sp.cmdline() {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// cmdline is the server's own command line, as /proc shows it.
func (sp *serveProc) cmdline() string {
	cl, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", sp.cmd.Process.Pid))
	if err != nil {
		return "\x00unreadable"
	}
	return string(cl)
}

// served runs str run through the server (--serve) with args.
func (sp *serveProc) served(t *testing.T, args ...string) run {
	t.Helper()
	return str(t, append([]string{"--serve", sp.socket}, args...)...)
}

// TestServeSameAsOneShot: stdout, stderr, exit code, PID 1, the uid, an
// empty capability set, seccomp mode 2 and no_new_privs, the same
// environment, working directory and root listing, through the server
// and one-shot; the server's runs are its pre-built sandboxes
// (result.resident), each with a host uid of its own and a fresh /tmp.
func TestServeSameAsOneShot(t *testing.T) {
	sp := startServe(t, 2)
	script := `echo out; echo err >&2; id; echo pid=$$; grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; ` +
		`env | sort; pwd; ls -a / /tmp; hostname; ls /tmp/; touch /tmp/left-by-a-call; exit 7`
	for _, profile := range []string{"restrictive", "standard"} {
		one := str(t, "--profile", profile, "--", "/bin/sh", "-c", script)
		srv := sp.served(t, "--profile", profile, "--", "/bin/sh", "-c", script)
		if one.Exit != 7 || srv.Exit != 7 {
			t.Fatalf("%s: exit one-shot %d, served %d, want 7\none-shot stderr: %s\nserved stderr: %s", profile, one.Exit, srv.Exit, one.Stderr, srv.Stderr)
		}
		if !srv.Res.Resident || one.Res.Resident {
			t.Fatalf("%s: resident one-shot %v, served %v: the served run did not use a pre-built sandbox; server log:\n%s", profile, one.Res.Resident, srv.Res.Resident, sp.log)
		}
		if one.Stdout != srv.Stdout || one.Stderr != srv.Stderr {
			t.Errorf("%s: the tool's view differs\none-shot stdout:\n%s\nserved stdout:\n%s\none-shot stderr: %q\nserved stderr: %q", profile, one.Stdout, srv.Stdout, one.Stderr, srv.Stderr)
		}
		for _, want := range []string{"out\n", "pid=1\n", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
			if !strings.Contains(srv.Stdout, want) {
				t.Errorf("%s: served stdout lacks %q:\n%s", profile, want, srv.Stdout)
			}
		}
		if strings.Contains(srv.Stdout, "left-by-a-call") {
			t.Errorf("%s: a previous call's file is visible in /tmp:\n%s", profile, srv.Stdout)
		}
	}

	// A host uid per call: the outside id of uid_map's tool line.
	hostUID := func() string {
		r := sp.served(t, "--profile", "restrictive", "--", "/bin/sh", "-c", "cat /proc/self/uid_map")
		if r.Exit != 0 || !r.Res.Resident {
			t.Fatalf("exit %d resident %v: %s", r.Exit, r.Res.Resident, r.Stderr)
		}
		f := strings.Fields(r.Stdout)
		if len(f) != 6 {
			t.Fatalf("uid_map: %q", r.Stdout)
		}
		return f[4]
	}
	seen := map[string]bool{}
	for range 3 {
		u := hostUID()
		if seen[u] {
			t.Errorf("host uid %s served two calls", u)
		}
		seen[u] = true
	}
}

// TestServeExitCodesAndSignals: 127, 126, a timeout (124), bad requests
// (125, the same message), the tool's own status and SIGTERM to the client (the sandbox ends as
// a cancelled one-shot run: SIGINT, then SIGKILL) through the server, as
// one-shot.
func TestServeExitCodesAndSignals(t *testing.T) {
	sp := startServe(t, 1)
	for _, c := range []struct {
		args []string
		exit int
	}{
		{[]string{"--profile", "restrictive", "--", "no-such-command"}, 127},
		{[]string{"--profile", "restrictive", "--", "/etc"}, 126},
		{[]string{"--profile", "restrictive", "--timeout", "1s", "--", "sleep", "30"}, 124},
		{[]string{"--profile", "restrictive", "--memory", "100Gi", "--", "/bin/true"}, 125},
		// Credentials need their own plan: run one-shot, refused there (an
		// isolated profile reaches no host) as without --serve, never
		// served without them.
		{[]string{"--profile", "restrictive", "--credential", "T=env:HOME", "--credential-host", "T=example.com",
			"--credential-header", "T=Authorization: {value}", "--", "/bin/true"}, 125},
		// PID 1 ignores a signal it sends itself without a handler.
		{[]string{"--profile", "restrictive", "--", "/bin/sh", "-c", "kill -SEGV $$; exit 9"}, 9},
		{[]string{"--profile", "restrictive", "--", "/bin/sh", "-c", "exit 3"}, 3},
	} {
		one := str(t, c.args...)
		srv := sp.served(t, c.args...)
		if one.Exit != srv.Exit {
			t.Errorf("%q: one-shot exit %d, served %d\none-shot: %s\nserved: %s", c.args, one.Exit, srv.Exit, one.Stderr, srv.Stderr)
		}
		if srv.Exit != c.exit {
			t.Errorf("%q: served exit %d, want %d: %s", c.args, srv.Exit, c.exit, srv.Stderr)
		}
		if one.Stderr != srv.Stderr {
			t.Errorf("%q: stderr differs\none-shot: %q\nserved:   %q", c.args, one.Stderr, srv.Stderr)
		}
	}

	// SIGTERM to the client: the marker names the sandbox's process.
	marker := fmt.Sprintf("str-serve-term-%d", time.Now().UnixNano())
	cmd := exec.Command(strBin, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "sleep 300; true", marker)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 1 }) {
		t.Fatalf("the served sandbox never ran: %s", errb.String())
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	_ = cmd.Wait()
	// sleep as PID 1 has no SIGINT handler: SIGKILL after the grace.
	if got := cmd.ProcessState.ExitCode(); got != 128+int(syscall.SIGKILL) {
		t.Errorf("SIGTERM to the client: exit %d, want %d (as one-shot); stderr: %s", got, 128+int(syscall.SIGKILL), errb.String())
	}
	if left := sandboxShells(marker); len(left) > 0 {
		t.Errorf("the sandbox outlived its cancelled call: pids %v", left)
	}
}

// TestServeFallsBackWhenNotPoolable: a bind, lower limits or a narrower
// network need another plan: the server says so and str run runs
// one-shot (result.resident false), with the same outcome.
func TestServeFallsBackWhenNotPoolable(t *testing.T) {
	sp := startServe(t, 1)
	dir := worldDir(t)
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("bound\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--profile", "restrictive", "--memory", "100Mi", "--", "/bin/echo", "ok"},
		{"--profile", "standard", "--net", "isolated", "--", "/bin/echo", "ok"},
		{"--profile", "permissive", "--", "/bin/echo", "ok"},
		{"--profile", "restrictive", "--ro-bind", dir + ":/mnt", "--", "/bin/cat", "/mnt/f"},
		// argv larger than a call message: one-shot passes it.
		{"--profile", "restrictive", "--", "/bin/sh", "-c", "echo ok", "x", strings.Repeat("a", 100<<10), strings.Repeat("b", 100<<10)},
	} {
		r := sp.served(t, args...)
		if r.Exit != 0 || r.Res.Resident {
			t.Errorf("%.200q: exit %d resident %v, want 0 and one-shot: %s", args, r.Exit, r.Res.Resident, r.Stderr)
		}
		if r.Stdout != "ok\n" && r.Stdout != "bound\n" {
			t.Errorf("%.200q: stdout %q", args, r.Stdout)
		}
	}
	// Unreachable: one-shot too.
	r := str(t, "--serve", filepath.Join(dir, "nothing.sock"), "--profile", "restrictive", "--", "/bin/true")
	if r.Exit != 0 || r.Res.Resident {
		t.Errorf("no server: exit %d resident %v: %s", r.Exit, r.Res.Resident, r.Stderr)
	}
	// A poolable one still is served.
	if r := sp.served(t, "--profile", "restrictive", "--timeout", "10s", "--", "/bin/true"); r.Exit != 0 || !r.Res.Resident {
		t.Errorf("a shorter timeout: exit %d resident %v, want served: %s", r.Exit, r.Res.Resident, r.Stderr)
	}
}

// TestServeRefusesUnauthorizedPeer: SO_PEERCRED decides. The socket's
// mode (0600 without --allow-*) is opened here on purpose, so that the
// second gate is what refuses uid 65533; --allow-uid 65532 is served.
func TestServeRefusesUnauthorizedPeer(t *testing.T) {
	sp := startServe(t, 1, "--allow-uid", "65532")
	fi, err := os.Stat(sp.socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o666 {
		t.Errorf("socket mode %o with --allow-uid, want 0666 (SO_PEERCRED decides)", fi.Mode().Perm())
	}
	// The binary, where any uid can run it.
	bdir, err := os.MkdirTemp("", "str-serve-bin-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(bdir)
	_ = os.Chmod(bdir, 0o755)
	bin := strCopyIn(t, bdir)
	asIDs := func(socket string, uid, gid uint32) (string, int) {
		cmd := exec.Command(bin, "run", "--serve", socket, "--profile", "restrictive", "--result", "-", "--", "/bin/true")
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
		out, _ := cmd.CombinedOutput()
		return string(out), cmd.ProcessState.ExitCode()
	}
	as := func(uid uint32) (string, int) { return asIDs(sp.socket, uid, uid) }
	out, _ := as(65533)
	if !strings.Contains(out, "refused this caller") || !strings.Contains(out, "uid 65533") {
		t.Errorf("uid 65533 was not refused:\n%s", out)
	}
	if strings.Contains(out, `"resident": true`) {
		t.Errorf("uid 65533 was served:\n%s", out)
	}
	out, code := as(65532)
	if code != 0 || !strings.Contains(out, `"resident": true`) {
		t.Errorf("--allow-uid 65532 was not served (exit %d):\n%s", code, out)
	}

	// Without --allow-*, the file itself keeps others out (0600 root).
	sp2 := startServe(t, 1)
	if fi, err := os.Stat(sp2.socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket without --allow-*: %v %v, want mode 0600", fi, err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 {
		t.Errorf("socket owned by uid %d, want root", st.Uid)
	}

	// --allow-group: the file is root:GROUP 0660; a member (here by its
	// gid) is served, anyone else cannot even connect and runs one-shot.
	sp3 := startServe(t, 1, "--allow-group", "65530")
	fi, err = os.Stat(sp3.socket)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != 65530 {
		t.Errorf("socket with --allow-group 65530: mode %o owner %d:%d, want 0660 0:65530", fi.Mode().Perm(), st.Uid, st.Gid)
	}
	if out, code := asIDs(sp3.socket, 65531, 65530); code != 0 || !strings.Contains(out, `"resident": true`) {
		t.Errorf("a member of --allow-group was not served (exit %d):\n%s", code, out)
	}
	if out, _ := asIDs(sp3.socket, 65533, 65533); strings.Contains(out, `"resident": true`) {
		t.Errorf("a non-member was served:\n%s", out)
	}
}

// TestServeSurvivesClientDisconnect: a client killed mid-call (no cancel
// message; the connection closes) ends its sandbox, which is reaped, and
// the pool is refilled; the server serves the next call.
func TestServeSurvivesClientDisconnect(t *testing.T) {
	sp := startServe(t, 2)
	marker := fmt.Sprintf("str-serve-gone-%d", time.Now().UnixNano())
	cmd := exec.Command(strBin, "run", "--serve", sp.socket, "--profile", "restrictive", "--", "/bin/sh", "-c", "sleep 300; true", marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 1 }) {
		t.Fatal("the served sandbox never ran")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if !eventually(30*time.Second, func() bool { return len(sandboxShells(marker)) == 0 }) {
		t.Fatalf("the sandbox of a vanished client still runs: %v", sandboxShells(marker))
	}
	// Reaped: no zombie child of the server's is left.
	if !eventually(30*time.Second, func() bool { return sp.zombies() == 0 }) {
		t.Errorf("%d zombie children of str serve", sp.zombies())
	}
	if !eventually(60*time.Second, func() bool { return sp.waiting() == 2*sp.pool }) {
		t.Errorf("pool not refilled: %d waiting, want %d; log:\n%s", sp.waiting(), 2*sp.pool, sp.log)
	}
	if r := sp.served(t, "--profile", "restrictive", "--", "/bin/echo", "still here"); r.Exit != 0 || r.Stdout != "still here\n" || !r.Res.Resident {
		t.Errorf("the next call: exit %d resident %v stdout %q: %s", r.Exit, r.Res.Resident, r.Stdout, r.Stderr)
	}
	if sp.cmd.ProcessState != nil {
		t.Fatalf("str serve exited: %s", sp.log)
	}
}

// zombies counts the server's children in state Z.
func (sp *serveProc) zombies() int {
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil || e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+2:]))
		if len(f) >= 2 && f[0] == "Z" && f[1] == strconv.Itoa(sp.cmd.Process.Pid) {
			n++
		}
	}
	return n
}

// sandboxShells are the host pids of a sandbox's "/bin/sh -c 'sleep 300;
// true' MARKER" (PID 1 inside; the client's own command line names the
// marker too, after "str").
func sandboxShells(marker string) []string {
	var pids []string
	for _, pid := range findProcs(marker) {
		if cl, err := os.ReadFile("/proc/" + pid + "/cmdline"); err == nil && strings.HasPrefix(string(cl), "/bin/sh\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestServeReplacesIdleSandboxes: a pre-built sandbox not called within
// --idle is killed (its idle limit) and replaced, so the pool keeps its
// size with new sandboxes, and a call after that is served.
func TestServeReplacesIdleSandboxes(t *testing.T) {
	sp := startServe(t, 1, "--idle", "2s")
	first := sp.waitingPids()
	replaced := func() bool {
		now := sp.waitingPids()
		if len(now) != 2 {
			return false
		}
		for _, p := range now {
			if slices.Contains(first, p) {
				return false
			}
		}
		return true
	}
	if !eventually(60*time.Second, replaced) {
		t.Fatalf("pre-built sandboxes %v, still %v after their idle limit; log:\n%s", first, sp.waitingPids(), sp.log)
	}
	if r := sp.served(t, "--profile", "standard", "--", "/bin/echo", "fresh"); r.Exit != 0 || r.Stdout != "fresh\n" || !r.Res.Resident {
		t.Errorf("a call after the replacement: exit %d resident %v stdout %q: %s", r.Exit, r.Res.Resident, r.Stdout, r.Stderr)
	}
}

// refusedFlood is a local user str serve refuses, as fast as it can:
// conns connections from threads threads, each sending a request of size
// bytes with three descriptors, or (every third) nothing, the last 256
// of those per thread held open; it never reads an answer. It prints "done N"
// with the connections it made.
const refusedFlood = `
import array, collections, resource, socket, sys, threading
path, conns, threads, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
hold = min(256, (hard - 64) // threads)
payload = b"{" + b"x" * (size - 1)
made = [0] * threads
fds = array.array("i", [0, 1, 2]).tobytes()
def flood(k):
    silent = collections.deque()
    for i in range(conns // threads):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(path)
            made[k] += 1
        except OSError:
            s.close()
            continue
        if i % 3:
            try:
                s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            except OSError:
                pass
            s.close()
        else:
            silent.append(s)
            if len(silent) > hold:
                silent.popleft().close()
    for s in silent:
        s.close()
ts = [threading.Thread(target=flood, args=(k,)) for k in range(threads)]
for t in ts: t.start()
for t in ts: t.join()
print("done", sum(made), flush=True)
`

// procStatusKB is a field of /proc/PID/status in KiB (VmRSS, VmHWM).
func procStatusKB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("%s: %q", field, l)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestServeRefusedPeerBounded: what a refused local user costs str serve
// is bounded (issue 29, item 7; it had grown the server from 13 to 206
// MB and written 20,000 log lines in 8 s). 20,000 connections of uid
// 65533 (128 KiB requests with descriptors, or silent ones held open)
// leave the server's peak resident memory within 40 MiB of where it
// started, its log with a bounded number of refusal lines (one per
// refusalLogInterval, counted whatever the flood took), and the server
// serving an allowed caller after it.
func TestServeRefusedPeerBounded(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		mustwork.Skip(t, "needs /usr/bin/python3 (the refused peer's flood)")
	}
	sp := startServe(t, 1, "--allow-uid", "65532")
	pid := sp.cmd.Process.Pid
	before := procStatusKB(t, pid, "VmRSS")
	start := time.Now()
	flood := exec.Command("/usr/bin/python3", "-c", refusedFlood, sp.socket, "20000", "32", strconv.Itoa(128<<10))
	flood.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65533, Gid: 65533, Groups: []uint32{}}}
	out, err := flood.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "done ") {
		t.Fatalf("the flood: %v\n%s", err, out)
	}
	elapsed := time.Since(start)
	peak := procStatusKB(t, pid, "VmHWM")
	t.Logf("refused flood (%s): %s in %v; str serve VmRSS %d KiB before, peak %d KiB", "20000 connections", strings.TrimSpace(string(out)), elapsed.Round(time.Millisecond), before, peak)
	if peak-before > 40<<10 {
		t.Errorf("str serve's peak resident memory grew by %d KiB under a refused peer's flood (from %d KiB), want at most 40 MiB", peak-before, before)
	}
	// Still running.
	if err := sp.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("str serve is gone after the flood: %v; log:\n%s", err, sp.log)
	}
	// The log, complete once the server stopped: one refusal line per
	// 10 s interval of the flood (the first at its start).
	_ = sp.cmd.Process.Signal(syscall.SIGTERM)
	_ = sp.cmd.Wait()
	lines := strings.Count(sp.log.String(), "str serve: refused")
	allowed := 1 + int(time.Since(start)/(10*time.Second))
	if lines > allowed {
		t.Errorf("%d refusal log lines for one refused uid over %v, want at most %d (one per 10 s)", lines, time.Since(start).Round(time.Second), allowed)
	}
	if lines == 0 {
		t.Errorf("no refusal logged:\n%s", sp.log)
	}
}
