package integration

// The cgroup v2 set: str's v2 path for real (memory.max, pids.max, cpu.max,
// CLONE_INTO_CGROUP, cgroup.kill teardown, a delegated subtree used by an
// unprivileged caller). Hosts whose controllers are bound to cgroup v1 cannot
// run it, so it runs inside the throw-away VM that
// test/integration/vm/run-in-vm.sh boots with a pure cgroup v2 hierarchy
// (scripts/test-vm.sh, make test-vm). The harness sets STR_CGROUP_V2=1 there;
// everywhere else these tests skip, even with STR_MUST_WORK=1, because the
// host run covers cgroup v1. Inside the VM, STR_MUST_WORK=1 turns every unmet
// precondition into a failure.
//
// The set is small on purpose: without KVM the guest is emulated (TCG) and
// a process start costs ~50x what it costs on the host. Nothing here asserts
// a duration; waits are bounded polls whose limit is a backstop only.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"

	"golang.org/x/sys/unix"
)

const (
	v2Root = "/sys/fs/cgroup"
	// v2Backstop bounds one str run: emulated guests are slow, and a hang
	// must fail one test rather than the whole VM run.
	v2Backstop = 300 * time.Second
	// v2PipeGrace: how long after str's exit its output may stay open
	// (only by a process that outlived it, which none may).
	v2PipeGrace = 30 * time.Second
	// v2Hog allocates without end: tail keeps its one newline-free "line".
	v2Hog = "head -c 300M /dev/zero | tail"
)

// needCgroupV2 is the precondition of every test of the set.
func needCgroupV2(t *testing.T) {
	t.Helper()
	if os.Getenv("STR_CGROUP_V2") != "1" {
		t.Skip("cgroup v2 set: runs inside the cgroup v2 VM via make test-vm " +
			"(test/integration/vm/run-in-vm.sh sets STR_CGROUP_V2=1 there); the host run covers cgroup v1")
	}
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "cgroup v2 set: needs root in the VM (run-in-vm.sh runs the command as root)")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(v2Root, &st); err != nil || st.Type != unix.CGROUP2_SUPER_MAGIC {
		mustwork.Skip(t, fmt.Sprintf("STR_CGROUP_V2=1 but %s is not a cgroup2 mount (statfs: type %#x, error %v)", v2Root, st.Type, err))
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup" {
			mustwork.Skip(t, "STR_CGROUP_V2=1 but a cgroup v1 hierarchy is mounted at "+f[1]+": not a pure cgroup v2 host")
		}
	}
	ctl, err := os.ReadFile(filepath.Join(v2Root, "cgroup.subtree_control"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !slices.Contains(strings.Fields(string(ctl)), c) {
			mustwork.Skip(t, fmt.Sprintf("controller %s is not enabled in %s/cgroup.subtree_control (%q)", c, v2Root, strings.TrimSpace(string(ctl))))
		}
	}
}

// v2Proc is one `str run --result - ...` started in the background, so a
// test can look at the sandbox's cgroup while it runs.
type v2Proc struct {
	cmd       *exec.Cmd
	out, errb bytes.Buffer
	done      chan struct{}
	err       error
}

// v2Opts are how a test starts str; the zero value is the test's str as
// root with the test's environment.
type v2Opts struct {
	Bin  string               // str binary; "" = strBin
	Wrap []string             // a command str runs under (strace)
	Attr *syscall.SysProcAttr // credentials, cgroup
	Env  []string             // nil = the test's environment
}

// v2Start starts `str run --result - ARGS...`.
func v2Start(t *testing.T, o v2Opts, args ...string) *v2Proc {
	t.Helper()
	if o.Bin == "" {
		o.Bin = strBin
	}
	argv := append(append(slices.Clone(o.Wrap), o.Bin, "run", "--result", "-"), args...)
	p := &v2Proc{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errb
	p.cmd.SysProcAttr, p.cmd.Env = o.Attr, o.Env
	p.cmd.Dir = "/"
	// Wait returns this long after str exits even if something it left
	// behind still holds its stdout or stderr: the test then fails naming
	// that (wait: exec.ErrWaitDelay) instead of waiting for the pipe
	// forever (the VM's timeout, with nothing printed).
	p.cmd.WaitDelay = v2PipeGrace
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p
}

func (p *v2Proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// wait returns the run; the tool's stdout is what precedes the result JSON.
func (p *v2Proc) wait(t *testing.T) run {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(v2Backstop):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("%v did not finish within %v; stderr:\n%s", p.cmd.Args, v2Backstop, p.errb.String())
	}
	if errors.Is(p.err, exec.ErrWaitDelay) {
		t.Errorf("%v exited but its stdout or stderr stayed open %v later: a process it started outlived it", p.cmd.Args, v2PipeGrace)
	}
	r := run{Stdout: p.out.String(), Stderr: p.errb.String(), Exit: p.cmd.ProcessState.ExitCode()}
	i := strings.LastIndex(r.Stdout, "{\n  \"exit_code\"")
	if i < 0 {
		t.Fatalf("%v: no result JSON on stdout (exit %d)\nstdout:\n%s\nstderr:\n%s", p.cmd.Args, r.Exit, r.Stdout, r.Stderr)
	}
	if err := json.Unmarshal([]byte(r.Stdout[i:]), &r.Res); err != nil {
		t.Fatalf("result JSON: %v\n%s", err, r.Stdout[i:])
	}
	r.Stdout = r.Stdout[:i]
	t.Logf("exit %d, result %+v", r.Exit, r.Res)
	return r
}

// v2SandboxParent is the cgroup directory in which a launcher started by
// this test creates sandbox cgroups: the test's own cgroup (sandbox
// cgroups are named str-<state directory>-s<id>, see isSandboxCgroup).
func v2SandboxParent(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	own, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "0::")
	if !ok {
		t.Fatalf("/proc/self/cgroup is not a pure cgroup v2 entry: %q", b)
	}
	return filepath.Join(v2Root, own)
}

// v2Subdirs lists the sandbox cgroups in dir.
func v2Subdirs(dir string) map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() && isSandboxCgroup(e.Name()) {
			m[e.Name()] = true
		}
	}
	return m
}

// v2AwaitSandbox polls parent, while p runs, for a child cgroup not in
// before that holds a process, and returns its path ("" if p ended first).
// Tests run one at a time, so a new child is this run's sandbox; once it
// holds a process its limits are set (the launcher writes them between
// mkdir and clone).
func v2AwaitSandbox(parent string, before map[string]bool, p *v2Proc) string {
	for p.running() {
		for name := range v2Subdirs(parent) {
			dir := filepath.Join(parent, name)
			if !before[name] && v2Peek(filepath.Join(dir, "cgroup.procs")) != "" {
				return dir
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	return ""
}

// v2Leftovers fails the test if parent has a child cgroup not in before.
func v2Leftovers(t *testing.T, parent string, before map[string]bool) {
	t.Helper()
	for name := range v2Subdirs(parent) {
		if !before[name] {
			t.Errorf("sandbox cgroup %s/%s is still there after str run returned", parent, name)
		}
	}
}

// v2Peek reads a cgroup file of a running sandbox; "" if it is gone.
func v2Peek(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

// memory.max: a hog in a 64 MiB sandbox is OOM-killed and the result says so.
func TestCgroupV2MemoryMaxOOM(t *testing.T) {
	needCgroupV2(t)
	parent := v2SandboxParent(t)
	before := v2Subdirs(parent)
	p := v2Start(t, v2Opts{}, "--profile", "standard", "--memory", "64Mi", "--", "/bin/sh", "-c", v2Hog)
	memMax := ""
	if dir := v2AwaitSandbox(parent, before, p); dir != "" {
		memMax = v2Peek(filepath.Join(dir, "memory.max"))
	}
	r := p.wait(t)
	if memMax != strconv.Itoa(64<<20) {
		t.Errorf("memory.max of the sandbox cgroup = %q, want %d", memMax, 64<<20)
	}
	if !r.Res.OOMKilled || r.Exit == 0 {
		t.Fatalf("want oom_killed and a failed tool, got exit %d, result %+v\nstderr:\n%s", r.Exit, r.Res, r.Stderr)
	}
	if r.Res.PeakMemoryBytes <= 0 || r.Res.PeakMemoryBytes > 64<<20 {
		t.Errorf("peak_memory_bytes = %d, want in (0, 64Mi] (memory.peak of the sandbox cgroup)", r.Res.PeakMemoryBytes)
	}
	v2Leftovers(t, parent, before)
}

// pids.max: a shell fork loop is stopped by the sandbox's pids limit.
func TestCgroupV2PidsMax(t *testing.T) {
	needCgroupV2(t)
	parent := v2SandboxParent(t)
	before := v2Subdirs(parent)
	// The init is one task that became the tool (PID 1): it reports
	// its thread count (1), and pids.max is the request exactly.
	script := `echo init-threads=$(ls /proc/1/task | wc -l); i=0; while [ $i -lt 40 ]; do sleep 60 & i=$((i+1)); done; echo all-forked; wait`
	p := v2Start(t, v2Opts{}, "--profile", "standard", "--pids", "16", "--timeout", "240s", "--", "/bin/sh", "-c", script)
	pidsMax := ""
	if dir := v2AwaitSandbox(parent, before, p); dir != "" {
		pidsMax = v2Peek(filepath.Join(dir, "pids.max"))
	}
	r := p.wait(t)
	t.Logf("tool stdout: %q", r.Stdout)
	if pidsMax != "16" {
		t.Errorf("pids.max of the sandbox cgroup = %q, want 16 (the request: no allowance, the init is one task)", pidsMax)
	}
	if !strings.Contains(r.Stdout, "init-threads=1\n") {
		t.Fatalf("the tool did not start (exit %d):\n%s", r.Exit, r.Stderr)
	}
	if strings.Contains(r.Stdout, "all-forked") || !r.Res.PidsLimit || r.Exit == 0 || r.Res.TimedOut {
		t.Fatalf("want the fork loop stopped by pids.max (pids_limit_hit, non-zero exit, no timeout); got exit %d, result %+v\nstdout: %s\nstderr: %s",
			r.Exit, r.Res, r.Stdout, r.Stderr)
	}
	v2Leftovers(t, parent, before)
}

// cpu.max: the planned quota is in the sandbox's cpu.max while it runs,
// the spinner is throttled, and it gets a fraction of the wall time.
func TestCgroupV2CPUMax(t *testing.T) {
	needCgroupV2(t)
	parent := v2SandboxParent(t)
	before := v2Subdirs(parent)
	// A 1 s spin (by the wall clock, so the run is short on any machine)
	// under a 200m limit: 20 ms of CPU per 100 ms period.
	p := v2Start(t, v2Opts{}, "--profile", "standard", "--cpus", "200m", "--",
		"/usr/bin/timeout", "1", "/bin/sh", "-c", "while :; do :; done")
	dir := v2AwaitSandbox(parent, before, p)
	if dir == "" {
		t.Fatalf("the sandbox cgroup never appeared under %s", parent)
	}
	cpuMax := v2Peek(filepath.Join(dir, "cpu.max"))
	var throttled int64
	for p.running() {
		b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
		if err != nil {
			break // torn down
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "nr_throttled "); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				throttled = max(throttled, n)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	r := p.wait(t)
	if cpuMax != "20000 100000" {
		t.Errorf("cpu.max of the sandbox cgroup = %q, want \"20000 100000\" (--cpus 200m)", cpuMax)
	}
	// timeout(1) ends the spinner after 1 s and exits 124 itself.
	if r.Exit != 124 || r.Res.TimedOut {
		t.Fatalf("want the spinner ended by timeout(1) (exit 124, not str's timeout); got exit %d, result %+v\nstderr: %s", r.Exit, r.Res, r.Stderr)
	}
	if throttled == 0 {
		t.Errorf("cpu.stat nr_throttled stayed 0 while a spinner ran under cpu.max %q", cpuMax)
	}
	if r.Res.CPUTimeMs <= 0 || r.Res.CPUTimeMs >= 0.5*r.Res.WallTimeMs {
		t.Errorf("cpu_time_ms %.1f vs wall_time_ms %.1f: want 0 < cpu < 0.5 x wall under a 0.2 CPU limit", r.Res.CPUTimeMs, r.Res.WallTimeMs)
	}
	v2Leftovers(t, parent, before)
}

// CLONE_INTO_CGROUP: nsinit is born inside the sandbox cgroup. The tool
// sees the root of its own cgroup namespace ("0::/"), which the clone
// created together with the process, so the process was in the sandbox
// cgroup at that instant; a move afterwards would show a path. With
// strace, the launcher's clone3 carries CLONE_INTO_CGROUP and nothing
// writes a sandbox cgroup's cgroup.procs.
func TestCgroupV2CloneIntoCgroup(t *testing.T) {
	needCgroupV2(t)
	parent := v2SandboxParent(t)
	before := v2Subdirs(parent)
	var wrap []string
	trace := filepath.Join(t.TempDir(), "strace.out")
	if path, err := exec.LookPath("strace"); err == nil {
		wrap = []string{path, "-f", "--seccomp-bpf", "-qq", "-e", "trace=clone,clone3,openat,openat2", "-o", trace}
	} else {
		t.Log("no strace: checking the cgroup namespace view and the host view only")
	}
	p := v2Start(t, v2Opts{Wrap: wrap}, "--profile", "standard", "--", "/bin/sh", "-c", "cat /proc/self/cgroup; sleep 2")
	dir := v2AwaitSandbox(parent, before, p)
	var nsinitSeen bool
	for dir != "" && p.running() && !nsinitSeen {
		procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			break
		}
		for _, pid := range strings.Fields(string(procs)) {
			st, _ := os.ReadFile("/proc/" + pid + "/status")
			for _, line := range strings.Split(string(st), "\n") {
				if f := strings.Fields(line); len(f) > 2 && f[0] == "NSpid:" && f[len(f)-1] == "1" {
					nsinitSeen = true // PID 1 of the sandbox's pid namespace
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	r := p.wait(t)
	if r.Exit != 0 {
		t.Fatalf("exit %d\nstderr: %s", r.Exit, r.Stderr)
	}
	if got := strings.TrimSpace(r.Stdout); got != "0::/" {
		t.Errorf("/proc/self/cgroup inside the sandbox = %q, want \"0::/\"", got)
	}
	if !nsinitSeen {
		t.Errorf("the sandbox's PID 1 (nsinit) never showed up in %s/cgroup.procs", dir)
	}
	if wrap != nil {
		b, err := os.ReadFile(trace)
		if err != nil {
			t.Fatal(err)
		}
		into := regexp.MustCompile(`clone3\(\{flags=[A-Z_|]*CLONE_INTO_CGROUP`)
		writeProcs := regexp.MustCompile(`openat2?\([^"]*"` + regexp.QuoteMeta(parent) + `/[^"]*/cgroup\.procs", [^)]*O_(WRONLY|RDWR)`)
		if !into.Match(b) {
			t.Errorf("no clone3 with CLONE_INTO_CGROUP in the trace of str run")
		}
		if m := writeProcs.Find(b); m != nil {
			t.Errorf("str wrote a sandbox cgroup's cgroup.procs (a move, not CLONE_INTO_CGROUP): %s", m)
		}
	}
	v2Leftovers(t, parent, before)
}

// cgroup.kill teardown: a daemon the tool double-forks and a process put
// into the sandbox cgroup from outside its pid namespace (only cgroup.kill
// can reach that one) are both gone when str run returns, and so is the
// sandbox cgroup.
func TestCgroupV2KillTeardown(t *testing.T) {
	needCgroupV2(t)
	parent := v2SandboxParent(t)
	before := v2Subdirs(parent)
	daemon := strconv.Itoa(200000 + os.Getpid()) // unique sleep arguments
	foreign := strconv.Itoa(300000 + os.Getpid())
	p := v2Start(t, v2Opts{}, "--profile", "standard", "--", "/bin/sh", "-c",
		"(setsid sleep "+daemon+" </dev/null >/dev/null 2>&1 &); sleep 2; echo tool-done")
	dir := v2AwaitSandbox(parent, before, p)
	if dir == "" {
		t.Fatalf("the sandbox cgroup never appeared under %s", parent)
	}
	intruder := exec.Command("/bin/sleep", foreign)
	if err := intruder.Start(); err != nil {
		t.Fatal(err)
	}
	intruderDone := make(chan error, 1)
	go func() { intruderDone <- intruder.Wait() }() // reaped at once: no zombie holds the cgroup
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(intruder.Process.Pid)), 0); err != nil {
		_ = intruder.Process.Kill()
		t.Fatalf("move a process into %s: %v", dir, err)
	}
	r := p.wait(t)
	var ierr error
	select {
	case ierr = <-intruderDone:
	case <-time.After(10 * time.Second): // backstop: it should be dead already
		_ = intruder.Process.Kill()
		ierr = <-intruderDone
		t.Errorf("the process moved into the sandbox cgroup survived str run")
	}
	var ee *exec.ExitError
	if !errors.As(ierr, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the process moved into the sandbox cgroup ended with %v, want SIGKILL (cgroup.kill)", ierr)
	}
	if r.Exit != 0 || !strings.Contains(r.Stdout, "tool-done") {
		t.Fatalf("exit %d, stdout %q\nstderr: %s", r.Exit, r.Stdout, r.Stderr)
	}
	for _, m := range []string{"sleep " + daemon, "sleep " + foreign} {
		if pids := findProcs(m); len(pids) > 0 {
			t.Errorf("%q is still running (pids %v) after str run returned", m, pids)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("sandbox cgroup %s still exists (stat: %v); warnings: %v", dir, err, r.Res.Warnings)
	}
	v2Leftovers(t, parent, before)
}

// Rootless delegation: root delegates a cgroup subtree to uid 65534 (the
// directory and its cgroup.procs, cgroup.subtree_control and
// cgroup.threads, as systemd Delegate=yes does) and starts str there as
// that uid. str moves itself into <subtree>/str-supervisor and creates the
// sandbox cgroup beside it in <subtree>, with its limits in force: the hog
// is OOM-killed at 64 MiB.
func TestCgroupV2RootlessDelegation(t *testing.T) {
	needCgroupV2(t)
	const uid, gid = 65534, 65534
	// A copy of str in a directory uid 65534 can reach.
	bdir, err := os.MkdirTemp("", "str-v2-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(bdir)
	if err := os.Chmod(bdir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := strCopyIn(t, bdir)

	deleg := filepath.Join(v2Root, fmt.Sprintf("str-v2-deleg-%d", os.Getpid()))
	if err := os.Mkdir(deleg, 0o755); err != nil {
		t.Fatal(err)
	}
	defer v2RemoveTree(t, deleg)
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		if err := os.Chown(filepath.Join(deleg, f), uid, gid); err != nil {
			t.Fatalf("delegate %s: %v", deleg, err)
		}
	}
	dfd, err := os.Open(deleg)
	if err != nil {
		t.Fatal(err)
	}
	defer dfd.Close()

	parent := deleg
	p := v2Start(t, v2Opts{Bin: bin, Env: []string{"PATH=/usr/bin:/bin"}, Attr: &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}},
		UseCgroupFD: true, // str starts inside the delegated subtree
		CgroupFD:    int(dfd.Fd()),
	}}, "--profile", "standard", "--memory", "64Mi", "--", "/bin/sh", "-c", "cat /proc/self/cgroup; id -u; "+v2Hog)
	dir := v2AwaitSandbox(parent, map[string]bool{}, p)
	memMax, launcherCg := "", ""
	if dir != "" {
		memMax = v2Peek(filepath.Join(dir, "memory.max"))
		launcherCg = v2Peek(fmt.Sprintf("/proc/%d/cgroup", p.cmd.Process.Pid))
	}
	r := p.wait(t)
	t.Logf("str (uid %d) ran in %q; sandbox cgroup %s", uid, launcherCg, dir)
	if dir == "" {
		t.Fatalf("no sandbox cgroup appeared under the delegated %s (exit %d)\nstderr: %s", parent, r.Exit, r.Stderr)
	}
	if memMax != strconv.Itoa(64<<20) {
		t.Errorf("memory.max of %s = %q, want %d", dir, memMax, 64<<20)
	}
	if lines := strings.Fields(r.Stdout); len(lines) < 2 || lines[0] != "0::/" || lines[1] != strconv.Itoa(uid) {
		t.Errorf("tool stdout %q, want \"0::/\" (own cgroup namespace) then uid %d", r.Stdout, uid)
	}
	if strings.Contains(r.Stderr, "cgroup limits not applied") {
		t.Errorf("str in a delegated v2 subtree warns that the limits were not applied:\n%s", r.Stderr)
	}
	if !r.Res.OOMKilled || r.Exit == 0 {
		t.Fatalf("want the hog OOM-killed inside the delegated subtree; got exit %d, result %+v\nstderr: %s", r.Exit, r.Res, r.Stderr)
	}
	v2Leftovers(t, parent, map[string]bool{})
}

// v2RemoveTree removes a test's cgroup subtree, deepest first, killing
// anything left in it.
func v2RemoveTree(t *testing.T, top string) {
	t.Helper()
	_ = os.WriteFile(filepath.Join(top, "cgroup.kill"), []byte("1"), 0)
	var dirs []string
	_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	slices.Reverse(dirs)
	for _, d := range dirs {
		var err error
		for range 100 { // the kernel may still be tearing down killed tasks
			if err = unix.Rmdir(d); err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.ENOENT) {
			t.Errorf("remove cgroup %s: %v", d, err)
		}
	}
}
