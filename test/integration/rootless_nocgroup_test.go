package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/procfs"
)

// noCgroupWarning is what the launcher says when a profile's cgroup
// limits are not applied (launcher.CgroupPlan.Warning).
const noCgroupWarning = "cgroup limits not applied (memory.max, cpu.max, pids.max): no cgroup (not delegated to uid 65534)"

// nobodyStr is str as uid 65534 with nothing set up: no cgroup delegated,
// a state directory of its own. run runs it with args and extra
// environment, returning stdout, stderr and the exit code.
type nobodyStr struct {
	t   *testing.T
	bin string
	dir string // owned by 65534
}

func newNobodyStr(t *testing.T) *nobodyStr {
	needRoot(t) // to drop to uid 65534
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	// The test needs a caller whose cgroup was not delegated to 65534:
	// this test process's own (the child inherits it).
	cgs, _ := procfs.Cgroups("self")
	for c, p := range cgs {
		var st syscall.Stat_t
		if syscall.Stat(filepath.Join("/sys/fs/cgroup", c, p), &st) == nil && (st.Uid == 65534 || st.Mode&0o002 != 0) {
			mustwork.Skip(t, "this process's cgroup "+c+":"+p+" is writable by uid 65534: not a host without delegation")
		}
	}
	top := t.TempDir()
	for _, d := range []string{filepath.Dir(top), top} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := strCopyIn(t, top)
	dir := filepath.Join(top, "home")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return &nobodyStr{t: t, bin: bin, dir: dir}
}

func (n *nobodyStr) run(env []string, args ...string) (stdout, stderr string, code int) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "setpriv", append([]string{"--reuid", "65534", "--regid", "65534", "--clear-groups", n.bin}, args...)...)
	cmd.Dir = "/"
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + n.dir, "STR_STATE_DIR=" + filepath.Join(n.dir, "state")}, env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	cmd.WaitDelay = 5 * time.Second // a process that kept the pipes open must not hang the test
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		n.t.Fatalf("str %v: %v\nstderr: %s", args, err, e.String())
	}
	return o.String(), e.String(), code
}

// TestRootlessNoCgroup: an unprivileged str run with the default profile
// works on a host where nothing delegated a cgroup to the user, as
// bubblewrap would: it says once on stderr, and in --result, that the
// profile's cgroup limits were not applied; what holds without a cgroup
// still does (the rlimits; the timeout, which kills every process).
func TestRootlessNoCgroup(t *testing.T) {
	n := newNobodyStr(t)
	result := filepath.Join(n.dir, "result.json")
	_, stderr, code := n.run(nil, "run", "--one-shot", "--result", result, "--", "/bin/true")
	if code != 0 {
		t.Fatalf("str run as uid 65534 without a cgroup: exit %d\n%s", code, stderr)
	}
	if lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n"); len(lines) != 1 || !strings.Contains(lines[0], noCgroupWarning) || !strings.Contains(lines[0], "str doctor") {
		t.Errorf("stderr is not the one warning %q:\n%s", noCgroupWarning, stderr)
	}
	data, err := os.ReadFile(result)
	if err != nil {
		t.Fatal(err)
	}
	var res launcher.Result
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("--result: %v\n%s", err, data)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], noCgroupWarning) {
		t.Errorf("--result warnings %q, want the one cgroup warning", res.Warnings)
	}

	// The plan says it where the limits would be.
	plan, stderr, code := n.run(nil, "profile", "show", "standard", "--plan")
	if code != 0 || !strings.Contains(plan, "cgroup: none (not delegated to uid 65534): limits not enforced") {
		t.Errorf("str profile show standard --plan as uid 65534: exit %d\n%s%s", code, plan, stderr)
	}

	// The operator forbids the fallback: the run is refused, as before.
	_, stderr, code = n.run([]string{"STR_REQUIRE_CGROUP=1"}, "run", "--one-shot", "--", "/bin/true")
	if code == 0 || !strings.Contains(stderr, "STR_REQUIRE_CGROUP=1") {
		t.Errorf("STR_REQUIRE_CGROUP=1 without a cgroup: exit %d, want a refusal naming it:\n%s", code, stderr)
	}
}

// TestRootlessNoCgroupForkBounded: without pids.max, a fork loop is still
// bounded, by RLIMIT_NPROC (128 in the standard profile), counted in the
// sandbox's own user namespace.
func TestRootlessNoCgroupForkBounded(t *testing.T) {
	n := newNobodyStr(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		mustwork.Skip(t, "needs /usr/bin/python3 for the fork loop")
	}
	const loop = `
import os, time
n = 0
try:
    while n < 10000:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        n += 1
except OSError as e:
    print("bounded", n, e.errno)
`
	stdout, stderr, code := n.run(nil, "run", "--one-shot", "--timeout", "60s", "--", "/usr/bin/python3", "-c", loop)
	f := strings.Fields(stdout)
	if code != 0 || len(f) != 3 || f[0] != "bounded" {
		t.Fatalf("fork loop: exit %d, stdout %q, want \"bounded N 11\"\n%s", code, stdout, stderr)
	}
	forks, _ := strconv.Atoi(f[1])
	if forks >= 128 || f[2] != "11" {
		t.Errorf("fork loop made %s processes (errno %s), want fewer than RLIMIT_NPROC 128 and EAGAIN", f[1], f[2])
	}
}

// TestRootlessNoCgroupDaemonDies: without a cgroup to kill, the sandbox's
// end kills a double-forked daemon all the same (its pid namespace dies
// with its PID 1): at the timeout, and when the tool exits first.
func TestRootlessNoCgroupDaemonDies(t *testing.T) {
	n := newNobodyStr(t)
	for i, c := range []struct {
		name, tail string
		timedOut   bool
	}{
		{"timeout", "exec /bin/sleep 3601", true},
		{"tool exits", "exit 0", false},
	} {
		token := fmt.Sprintf("3600.%d%d", os.Getpid(), i)
		// The daemon says it started (through a FIFO the tool reads)
		// before the tool goes on.
		script := fmt.Sprintf(`mkfifo /tmp/up && (setsid /bin/sh -c 'echo started > /tmp/up; exec /bin/sleep %s' &) && cat /tmp/up && %s`, token, c.tail)
		stdout, stderr, code := n.run(nil, "run", "--one-shot", "--timeout", "3s", "--", "/bin/sh", "-c", script)
		if !strings.Contains(stdout, "started") {
			t.Fatalf("%s: the daemon did not start: exit %d\n%s%s", c.name, code, stdout, stderr)
		}
		if timedOut := strings.Contains(stderr, "timed out"); timedOut != c.timedOut {
			t.Errorf("%s: timed out %v, want %v (exit %d)\n%s", c.name, timedOut, c.timedOut, code, stderr)
		}
		if pids := procsWithArg(token); len(pids) > 0 {
			for _, p := range pids {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			t.Errorf("%s: the double-forked daemon outlived its sandbox: pids %v", c.name, pids)
		}
	}
}

// procsWithArg lists the host's processes with arg in their command line.
func procsWithArg(arg string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(b), arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestBwrapRootlessNoCgroup: str bwrap as an unprivileged user with
// nothing set up runs where bubblewrap runs, and says once that the
// profile's cgroup limits were not applied.
func TestBwrapRootlessNoCgroup(t *testing.T) {
	n := newNobodyStr(t)
	_, stderr, code := n.run(nil, "bwrap", "--ro-bind", "/", "/", "true")
	if code != 0 {
		t.Fatalf("str bwrap --ro-bind / / true as uid 65534 without a cgroup: exit %d\n%s", code, stderr)
	}
	if strings.Count(stderr, "cgroup limits not applied") != 1 || !strings.Contains(stderr, noCgroupWarning) {
		t.Errorf("stderr lacks the one warning %q:\n%s", noCgroupWarning, stderr)
	}
	plan, _, _ := n.run(nil, "bwrap", "--plan", "--ro-bind", "/", "/", "true")
	if !strings.Contains(plan, "cgroup: none (not delegated to uid 65534): limits not enforced") {
		t.Errorf("str bwrap --plan does not say the limits are not enforced:\n%s", plan)
	}
}
