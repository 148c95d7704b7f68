package e2e

// Fault-survival tests (issue 11, part A): a worker SIGKILLed with
// sandboxes running and pooled, a broker killed while calls run, a reply
// the broker never takes. Every check is scoped to this test's worker
// (its processes, their cgroups, its work dir): other workers may run
// sandboxes on the same machine at the same time.

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/internal/testfs"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/worker/transport"
)

// faultTools: hold waits until a file named gate appears next to the
// module (the tools dir, bound read-only into every sandbox at its host
// path), so the test decides when each call finishes.
const faultTools = `
import os, time

HERE = os.path.dirname(os.path.abspath(__file__))

def hold(ctx, gate, seconds=300):
    ctx.send_status("holding")
    deadline = time.time() + float(seconds)
    path = os.path.join(HERE, gate)
    while not os.path.exists(path) and time.time() < deadline:
        time.sleep(0.05)
    return {"gate": gate, "released": os.path.exists(path)}
`

const faultManifest = `  hold: {module: fault_tools, function: hold}
`

// warmHold is hold with a warm pool of two.
const warmHold = `  warm_hold: {module: fault_tools, function: hold, warm: 2, timeout_seconds: 60}
`

func newFaultEnv(t *testing.T, more string) *env {
	t.Helper()
	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "fault_tools.py"), []byte(faultTools), 0o644))
	writeManifest(t, e.manifest, e2eManifest+faultManifest+more)
	return e
}

// release lets every hold call waiting on gate finish.
func (e *env) release(t *testing.T, gate string) {
	t.Helper()
	must(t, os.WriteFile(filepath.Join(e.tools, gate), nil, 0o644))
}

// ---- processes, cgroups, mounts of one worker ---------------------------

// proc is a process identified by pid and start time (a pid can be reused).
type proc struct {
	pid   int
	start string
	cmd   string
}

func (p proc) String() string { return fmt.Sprintf("%d (%s)", p.pid, p.cmd) }

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// descendants lists the processes below root (not root itself).
func descendants(root int) []proc {
	children := map[int][]int{}
	starts := map[int]string{}
	for _, pid := range allPids() {
		if st, ok := readStat(pid); ok {
			children[st.ppid] = append(children[st.ppid], pid)
			starts[pid] = st.start
		}
	}
	var out []proc
	todo := children[root]
	for len(todo) > 0 {
		pid := todo[0]
		todo = todo[1:]
		out = append(out, proc{pid: pid, start: starts[pid], cmd: cmdline(pid)})
		todo = append(todo, children[pid]...)
	}
	return out
}

// below reports whether pid is a descendant of root now.
func below(pid, root int) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		st, ok := readStat(pid)
		if !ok {
			return false
		}
		if st.ppid == root {
			return true
		}
		pid = st.ppid
	}
	return false
}

func (p proc) alive() bool {
	st, ok := readStat(p.pid)
	return ok && st.start == p.start
}

// sandboxCgroups returns the sandbox cgroup directories (every v1
// controller, or the v2 one) the processes are in: the launcher names
// each sandbox's "str-<12 hex of its state directory>-s<16 hex>"
// (launcher/cgroup.go, cgroupSpace).
var sandboxCgroupRE = regexp.MustCompile(`^str-[0-9a-f]{12}-s[0-9a-f]{16}$`)

func sandboxCgroups(procs []proc) map[string]bool {
	dirs := map[string]bool{}
	for _, p := range procs {
		cgs, err := procfs.Cgroups(strconv.Itoa(p.pid))
		if err != nil {
			continue
		}
		for ctl, path := range cgs { // ctl "": the v2 hierarchy, at the root
			if !sandboxCgroupRE.MatchString(filepath.Base(path)) {
				continue
			}
			dir := filepath.Join("/sys/fs/cgroup", ctl, path)
			if _, err := os.Stat(dir); err == nil {
				dirs[dir] = true
			}
		}
	}
	return dirs
}

// mountsUnder lists every mount point under base, any filesystem.
func mountsUnder(t *testing.T, base string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], base+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// strangers lists the processes, other than those below the worker
// keep (0: none), whose working directory or root is under dir.
func strangers(dir string, keep int) []string {
	var out []string
	for _, pid := range allPids() {
		if pid == os.Getpid() || (keep > 0 && (pid == keep || below(pid, keep))) {
			continue
		}
		for _, link := range []string{"cwd", "root"} {
			p, err := os.Readlink(fmt.Sprintf("/proc/%d/%s", pid, link))
			if err == nil && (p == dir || strings.HasPrefix(p, dir+"/")) {
				out = append(out, fmt.Sprintf("%d (%s) %s=%s", pid, cmdline(pid), link, p))
				break
			}
		}
	}
	return out
}

// TestFaultWorkerSIGKILL: a worker SIGKILLed with calls running (cold
// and warm) and a warm pool full leaves, once a new worker has started
// on the same work dir and config, no process of its sandboxes, no
// cgroup of them (nor their lock files), no mount and no work dir or
// pooled sandbox's work area; the new worker serves, cold and warm.
func TestFaultWorkerSIGKILL(t *testing.T) {
	requireRoot(t)
	e := newFaultEnv(t, warmHold)
	extra := map[string]string{"SANDBOX_MAX_CONCURRENT": "8"}
	w := startWorker(t, e, 0, extra)
	a := newAgent(t, w.port)
	poolSize := func(w *workerProc) float64 { return w.labelledMetric(`str_worker_warm_pool_size{tool="warm_hold"}`) }
	waitFor(t, "the warm pool full", 60*time.Second, func() bool { return poolSize(w) == 2 })

	// 1. three cold calls and one warm call running; the pool's other
	// sandbox idle (the claimed one is replaced once its call is over).
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, a.invoke("hold", map[string]any{"args": map[string]any{"gate": "never"}}))
	}
	warmID := a.invoke("warm_hold", map[string]any{"args": map[string]any{"gate": "never"}})
	ids = append(ids, warmID)
	for _, id := range ids {
		waitFor(t, "call "+id+" running", 60*time.Second, func() bool { return len(a.status(id)) > 0 })
	}
	if hits := w.labelledMetric(`str_worker_warm_hits_total{tool="warm_hold"}`); hits != 1 {
		t.Fatalf("warm hits = %v, want 1: the warm call was not served by a pooled sandbox", hits)
	}
	waitFor(t, "the other pooled sandbox idle", 60*time.Second, func() bool { return poolSize(w) == 1 })

	// 2. what the worker has now: its sandboxes' processes, their
	// cgroups, its mounts and work dirs.
	procs := descendants(w.cmd.Process.Pid)
	cgroups := sandboxCgroups(procs)
	sandboxIDs := map[string]bool{}
	for dir := range cgroups {
		name := filepath.Base(dir) // str-<state dir>-<id>; the lock file is named <id>
		sandboxIDs[name[strings.LastIndex(name, "-")+1:]] = true
	}
	if len(sandboxIDs) < 5 {
		t.Fatalf("%d sandbox cgroups (%v) of %d processes, want at least 5 (4 calls, 1 pooled): the check below proves little",
			len(sandboxIDs), cgroups, len(procs))
	}
	mounts := mountsUnder(t, e.root)
	work := testfs.Names(e.work)
	// The three cold calls' work dirs (named call-<random> by the
	// worker, not after their task ids), each with its tmpfs.
	callDirs := 0
	for _, m := range mounts {
		if strings.HasPrefix(m, filepath.Join(e.work, "call-")) {
			callDirs++
		}
	}
	if callDirs < 3 {
		t.Fatalf("%d call work dirs mounted, want 3 (the running cold calls): %q", callDirs, mounts)
	}
	warmDirs := 0
	for _, n := range work {
		if strings.HasPrefix(n, ".warm-") {
			warmDirs++
		}
	}
	if warmDirs < 2 {
		t.Fatalf("%d warm work areas (%v), want 2 (one serving, one pooled)", warmDirs, work)
	}
	t.Logf("before SIGKILL: %d processes, %d sandbox cgroups, %d mounts, work dir %v", len(procs), len(sandboxIDs), len(mounts), work)

	// 3. SIGKILL. The mounts stay (nobody is left to unmount them): the
	// next start-up has something to sweep.
	w.stop(syscall.SIGKILL)
	if m := mountsUnder(t, e.root); len(m) == 0 {
		t.Fatalf("no mount left after SIGKILL: the start-up sweep has nothing to do")
	}

	// 4. a new worker on the same work dir and config.
	w2 := startWorker(t, e, 0, extra)
	var alive []string
	deadline := time.Now().Add(30 * time.Second)
	for {
		alive = alive[:0]
		for _, p := range procs {
			if p.alive() {
				alive = append(alive, p.String())
			}
		}
		if len(alive) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(alive) > 0 {
		t.Errorf("processes of the killed worker's sandboxes still alive 30 s after the restart: %v", alive)
	}
	for dir := range cgroups {
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("cgroup of the killed worker's sandbox left: %s (stat: %v; processes: %s)", dir, err, readOr(filepath.Join(dir, "cgroup.procs")))
		}
	}
	for id := range sandboxIDs {
		lock := filepath.Join("/run/str/cgroups", id)
		if _, err := os.Lstat(lock); !os.IsNotExist(err) {
			t.Errorf("cgroup lock file of the killed worker's sandbox left: %s (lstat: %v)", lock, err)
		}
	}
	if s := strangers(e.root, w2.cmd.Process.Pid); len(s) > 0 {
		t.Errorf("processes not of the new worker with their cwd or root under %s: %v", e.root, s)
	}
	now := mountsUnder(t, e.root)
	for _, m := range mounts {
		if contains(now, m) {
			t.Errorf("mount of the killed worker left: %s", m)
		}
	}
	for _, m := range now {
		if !strings.HasPrefix(m, filepath.Join(e.work, ".warm-")) {
			t.Errorf("mount under %s that is not a work area of the new pool: %s", e.root, m)
		}
	}
	for _, n := range testfs.Names(e.work) {
		if contains(work, n) {
			t.Errorf("work dir of the killed worker left: %s", filepath.Join(e.work, n))
		}
	}

	// 5. the new worker serves, cold and warm.
	a2 := newAgent(t, w2.port)
	e.release(t, "go")
	for _, tool := range []string{"hold", "warm_hold"} {
		if r := a2.reply(a2.invoke(tool, map[string]any{"args": map[string]any{"gate": "go"}}), replyWait); !isSuccess(r) {
			t.Fatalf("%s after the restart: %s", tool, r)
		}
	}

	// 6. and leaves nothing when it stops.
	w2.stop(syscall.SIGTERM)
	if m := mountsUnder(t, e.root); len(m) > 0 {
		t.Errorf("mounts left after the new worker stopped: %q", m)
	}
	if n := testfs.Names(e.work); len(n) > 0 {
		t.Errorf("left in the work dir after the new worker stopped: %v", n)
	}
}

func readOr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return strings.TrimSpace(string(b))
}

// ---- the broker -----------------------------------------------------------

// gate forwards the worker's broker connections (loopback TCP) to the
// dev broker; while shut it accepts and closes them, so the test decides
// when the worker gets back to a restarted broker (after the agent has).
type gate struct {
	ln     net.Listener
	target int
	open   atomic.Bool
}

func newGate(t *testing.T, target int) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	g := &gate{ln: ln, target: target}
	g.open.Store(true)
	go g.serve()
	t.Cleanup(func() { ln.Close() })
	return g
}

func (g *gate) port() int { return g.ln.Addr().(*net.TCPAddr).Port }

func (g *gate) serve() {
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		if !g.open.Load() {
			c.Close()
			continue
		}
		up, err := netDial(g.target)
		if err != nil {
			c.Close()
			continue
		}
		go func() { io.Copy(up, c); up.Close(); c.Close() }()
		go func() { io.Copy(c, up); c.Close(); up.Close() }()
	}
}

// logged reports whether the worker logged msg for request id.
func (w *workerProc) logged(msg, id string) bool {
	for _, line := range strings.Split(w.log.String(), "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg && rec["id"] == id {
			return true
		}
	}
	return false
}

// workDirOf is the work dir the worker logged for request id ("" if
// none yet): work dirs are named by the worker, not after task ids.
func (w *workerProc) workDirOf(id string) string {
	for _, line := range strings.Split(w.log.String(), "\n") {
		var rec map[string]any
		if strings.Contains(line, "work dir made") && json.Unmarshal([]byte(line), &rec) == nil && rec["id"] == id {
			p, _ := rec["path"].(string)
			return p
		}
	}
	return ""
}

// answeredOutcome is the outcome the worker logged for request id ("" if none).
func (w *workerProc) answeredOutcome(id string) string {
	for _, line := range strings.Split(w.log.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "invocation answered" && rec["id"] == id {
			s, _ := rec["outcome"].(string)
			return s
		}
	}
	return ""
}

const replyLostMsg = "reply lost: the agent got no answer"

// outcomes maps each id to the outcome the worker logged for it.
func outcomes(w *workerProc, ids []string) map[string]string {
	m := map[string]string{}
	for _, id := range ids {
		m[id] = w.answeredOutcome(id)
	}
	return m
}

// TestFaultBrokerCutMidRun: the dev broker SIGKILLed with six calls
// running and restarted on the same port. Three calls finish during the
// outage (their replies wait for the broker), three after the worker is
// back. Every call is either answered to the agent or reported lost by
// the worker (log line and str_worker_replies_lost_total), never both,
// never neither; the success metric counts exactly the answered ones.
func TestFaultBrokerCutMidRun(t *testing.T) {
	requireRoot(t)
	e := newFaultEnv(t, "")
	port := freePort(t)
	b := startDevBroker(t, port)
	// Cleanups run last first: the worker stops, then the broker.
	t.Cleanup(func() { b.Process.Signal(syscall.SIGTERM); b.Wait() })
	g := newGate(t, port)
	w := startWorker(t, e, g.port(), map[string]string{broker.TokenFileEnv: broker.TokenFileFor(port), "SANDBOX_MAX_CONCURRENT": "8"})
	a := newAgent(t, port)

	// 1. six calls running.
	var early, late, all []string
	// A reply the worker cannot publish is retried until the task's
	// deadline (receipt + 60 s + 5 s), within the wait of step 6.
	for i := 0; i < 3; i++ {
		early = append(early, a.invoke("hold", map[string]any{"args": map[string]any{"gate": "early"}, "timeout_seconds": 60}))
		late = append(late, a.invoke("hold", map[string]any{"args": map[string]any{"gate": "late"}, "timeout_seconds": 60}))
	}
	all = append(append(all, early...), late...)
	for _, id := range all {
		waitFor(t, "call "+id+" running", 60*time.Second, func() bool { return len(a.status(id)) > 0 })
	}

	// 2. the broker killed; the worker's way back shut.
	must(t, b.Process.Kill())
	b.Wait()
	g.open.Store(false)
	w.waitReady(false)

	// 3. three calls finish while it is down: their replies wait.
	e.release(t, "early")
	for _, id := range early {
		waitFor(t, "call "+id+" finished", 60*time.Second, func() bool { return w.logged("tool finished", id) })
	}

	// 4. the broker back on the same port; the agent reconnects (its
	// subscriptions ride in its CONNECT), then the worker may.
	b = startDevBroker(t, port)
	waitFor(t, "the agent reconnected", 30*time.Second, func() bool { return a.c.State() == transport.Connected })
	g.open.Store(true)
	w.waitReady(true)

	// 5. the other three finish.
	e.release(t, "late")

	// 6. each call answered or reported lost.
	answered := map[string][]byte{}
	lost := map[string]bool{}
	var missing []string
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		missing = missing[:0]
		for _, id := range all {
			select {
			case r := <-a.replyChan(id):
				answered[id] = r
			default:
			}
			if w.logged(replyLostMsg, id) {
				lost[id] = true
			}
			if answered[id] == nil && !lost[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(missing) > 0 {
		t.Fatalf("calls neither answered nor reported lost 120 s after the broker came back: %v (answered %d, lost %d of %d); worker outcomes: %v",
			missing, len(answered), len(lost), len(all), outcomes(w, missing))
	}
	successes := 0
	for _, id := range all {
		switch {
		case answered[id] != nil && lost[id]:
			t.Errorf("call %s both answered (%s) and reported lost", id, answered[id])
		case answered[id] != nil && isSuccess(answered[id]):
			successes++
		case answered[id] != nil:
			t.Errorf("call %s answered with a failure: %s", id, answered[id])
		}
	}
	t.Logf("%d calls: %d answered, %d reported lost", len(all), len(answered), len(lost))
	if got := w.labelledMetric(`str_worker_invocations_total{outcome="success",tool="hold"}`); got != float64(successes) {
		t.Errorf("success metric %v, want %d (the answered calls)", got, successes)
	}
	if got := w.labelledMetric(`str_worker_invocations_total{outcome="reply_failed",tool="hold"}`); got != float64(len(lost)) {
		t.Errorf("reply_failed metric %v, want %d (the lost calls)", got, len(lost))
	}
	if got := w.metric("str_worker_replies_lost_total"); got != float64(len(lost)) {
		t.Errorf("str_worker_replies_lost_total %v, want %d", got, len(lost))
	}
}

// TestFaultBrokerCutReplyLost: the broker gone for longer than the worker
// waits to publish a reply (the task's deadline, at least 30 s): the
// reply is reported lost (log, str_worker_replies_lost_total, outcome
// reply_failed), its work dir unmounted. Then a second call's result is
// complete and its reply waiting for the broker when SIGTERM comes: the
// worker ends within the shutdown grace period and its reply window (plus
// a generous margin), reports that reply lost too (not CANCELLED: the
// result was complete), and leaves no mount and no work dir.
func TestFaultBrokerCutReplyLost(t *testing.T) {
	requireRoot(t)
	e := newFaultEnv(t, "")
	port := freePort(t)
	b := startDevBroker(t, port)
	t.Cleanup(func() { b.Process.Kill(); b.Wait() })
	const grace = 2 * time.Second
	w := startWorker(t, e, port, map[string]string{"SHUTDOWN_GRACE_SECONDS": strconv.Itoa(int(grace.Seconds()))})
	a := newAgent(t, port)
	first := a.invoke("hold", map[string]any{"args": map[string]any{"gate": "first"}, "timeout_seconds": 5})
	second := a.invoke("hold", map[string]any{"args": map[string]any{"gate": "second"}, "timeout_seconds": 120})
	for _, id := range []string{first, second} {
		waitFor(t, "call "+id+" running", 60*time.Second, func() bool { return len(a.status(id)) > 0 })
	}
	must(t, b.Process.Kill())
	b.Wait()
	w.waitReady(false)

	// 1. the first reply waits for the broker until it gives up.
	e.release(t, "first")
	waitFor(t, "the first reply reported lost", 120*time.Second, func() bool { return w.logged(replyLostMsg, first) })
	if got := w.metric("str_worker_replies_lost_total"); got != 1 {
		t.Errorf("str_worker_replies_lost_total %v, want 1", got)
	}
	if got := w.labelledMetric(`str_worker_invocations_total{outcome="reply_failed",tool="hold"}`); got != 1 {
		t.Errorf("reply_failed metric %v, want 1", got)
	}
	if got := w.labelledMetric(`str_worker_invocations_total{outcome="success",tool="hold"}`); got != 0 {
		t.Errorf("success metric %v, want 0: a lost reply counted as a success", got)
	}
	var firstDir string // named by the worker, not after the task id
	waitFor(t, "the first call's work dir logged", 30*time.Second, func() bool { firstDir = w.workDirOf(first); return firstDir != "" })
	waitFor(t, "the first work dir unmounted and removed", 30*time.Second, func() bool {
		_, err := os.Lstat(firstDir)
		return !contains(mountsUnder(t, e.work), firstDir) && os.IsNotExist(err)
	})

	// 2. the second result complete, its reply waiting; SIGTERM.
	e.release(t, "second")
	waitFor(t, "the second call finished", 60*time.Second, func() bool { return w.logged("tool finished", second) })
	if secondDir := w.workDirOf(second); secondDir == "" || !contains(mountsUnder(t, e.work), secondDir) {
		t.Fatalf("the second call's work dir is not mounted while its reply waits: %q", mountsUnder(t, e.work))
	}
	sent := time.Now()
	must(t, w.cmd.Process.Signal(syscall.SIGTERM))
	limit := grace + 5*time.Second + 20*time.Second // grace + the reply window (worker/execute.go) + margin
	select {
	case <-w.done:
	case <-time.After(limit):
		t.Fatalf("the worker did not end within %v of SIGTERM with a reply waiting for a dead broker:\n%s", limit, tail(w.log.String(), 30))
	}
	t.Logf("the worker ended %v after SIGTERM", time.Since(sent).Round(time.Millisecond))
	if !w.logged(replyLostMsg, second) {
		t.Errorf("the second reply is not reported lost:\n%s", tail(w.log.String(), 30))
	}
	if got := w.answeredOutcome(second); got != "reply_failed" {
		t.Errorf("the second call's outcome %q, want reply_failed", got)
	}
	if m := mountsUnder(t, e.root); len(m) > 0 {
		t.Errorf("mounts left after the worker ended: %q", m)
	}
	if n := testfs.Names(e.work); len(n) > 0 {
		t.Errorf("left in the work dir after the worker ended: %v", n)
	}
}
