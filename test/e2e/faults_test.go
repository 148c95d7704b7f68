package e2e

// Fault-survival tests (issue 11, part A): a worker SIGKILLed with
// sandboxes running and pooled, a broker killed while calls run, a reply
// the broker never takes. Every check is scoped to this test's worker
// (its processes, their cgroups, its work dir): other workers may run
// sandboxes on the same machine at the same time.

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
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
  warm_hold: {module: fault_tools, function: hold, warm: 2, timeout_seconds: 60}
`

func newFaultEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "fault_tools.py"), []byte(faultTools), 0o644))
	writeManifest(t, e.manifest, e2eManifest+faultManifest)
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

// procStat returns the parent pid and the start time of pid.
func procStat(pid int) (ppid int, start string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	// The command name (field 2) may hold spaces: fields count from its ")".
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 {
		return 0, "", false
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[19], true
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

func allPids() []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// descendants lists the processes below root (not root itself).
func descendants(root int) []proc {
	children := map[int][]int{}
	starts := map[int]string{}
	for _, pid := range allPids() {
		if ppid, start, ok := procStat(pid); ok {
			children[ppid] = append(children[ppid], pid)
			starts[pid] = start
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
		ppid, _, ok := procStat(pid)
		if !ok {
			return false
		}
		if ppid == root {
			return true
		}
		pid = ppid
	}
	return false
}

func (p proc) alive() bool {
	_, start, ok := procStat(p.pid)
	return ok && start == p.start
}

// sandboxCgroups returns the sandbox cgroup directories (every v1
// controller, or the v2 one) the processes are in: the launcher puts
// each sandbox in "<parent>/str/s<16 hex>" (launcher/cgroup.go).
func sandboxCgroups(procs []proc) map[string]bool {
	dirs := map[string]bool{}
	for _, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 || !strings.Contains(parts[2], "/str/s") {
				continue
			}
			for _, ctl := range strings.Split(parts[1], ",") {
				dir := filepath.Join("/sys/fs/cgroup", ctl, parts[2])
				if parts[1] == "" {
					dir = filepath.Join("/sys/fs/cgroup", parts[2])
				}
				if _, err := os.Stat(dir); err == nil {
					dirs[dir] = true
				}
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

func names(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
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
	e := newFaultEnv(t)
	extra := map[string]string{"SANDBOX_MAX_CONCURRENT": "8"}
	w := startWorker(t, e, 0, extra)
	a := newAgent(t, w.port)
	poolSize := func(w *workerProc) float64 { return w.labelledMetric(`str_worker_warm_pool_size{tool="warm_hold"}`) }
	waitFor(t, "the warm pool full", 60*time.Second, func() bool { return poolSize(w) == 2 })

	// 1. three cold calls and one warm call running; the pool refilled.
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
	waitFor(t, "the warm pool refilled", 60*time.Second, func() bool { return poolSize(w) == 2 })

	// 2. what the worker has now: its sandboxes' processes, their
	// cgroups, its mounts and work dirs.
	procs := descendants(w.cmd.Process.Pid)
	cgroups := sandboxCgroups(procs)
	ids6 := map[string]bool{}
	for dir := range cgroups {
		ids6[filepath.Base(dir)] = true
	}
	if len(ids6) < 6 {
		t.Fatalf("%d sandbox cgroups (%v) of %d processes, want at least 6 (4 calls, 2 pooled): the check below proves little",
			len(ids6), cgroups, len(procs))
	}
	mounts := mountsUnder(t, e.root)
	work := names(e.work)
	for _, id := range ids[:3] {
		if !contains(mounts, filepath.Join(e.work, "task-"+id)) {
			t.Fatalf("the work dir of running call %s is not mounted: %q", id, mounts)
		}
	}
	warmDirs := 0
	for _, n := range work {
		if strings.HasPrefix(n, ".warm-") {
			warmDirs++
		}
	}
	if warmDirs < 3 {
		t.Fatalf("%d warm work areas (%v), want 3 (one serving, two pooled)", warmDirs, work)
	}
	t.Logf("before SIGKILL: %d processes, %d sandbox cgroups, %d mounts, work dir %v", len(procs), len(ids6), len(mounts), work)

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
	for id := range ids6 {
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
	for _, n := range names(e.work) {
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
	if n := names(e.work); len(n) > 0 {
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
