package launcher

import (
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

// TestV2MissingControllers: a cgroup.subtree_control line is a list of
// whole names. "cpuset" does not stand for "cpu" (nor "hugetlb" for
// anything), so a parent with only cpuset, hugetlb and memory enabled
// still needs cpu and pids.
func TestV2MissingControllers(t *testing.T) {
	want := []string{"memory", "pids", "cpu"}
	for _, c := range []struct {
		file    string
		missing []string
	}{
		{"", []string{"memory", "pids", "cpu"}},
		{"cpuset memory\n", []string{"pids", "cpu"}},
		{"cpuset hugetlb memory rdma\n", []string{"pids", "cpu"}},
		{"cpuset cpu io memory hugetlb pids rdma misc\n", nil},
		{"memory pids cpu", nil},
		{"  cpu\tmemory \n pids\n", nil},
		{"memorycpu pids", []string{"memory", "cpu"}},
	} {
		if got := v2MissingControllers([]byte(c.file), want); !slices.Equal(got, c.missing) {
			t.Errorf("%q: missing %q, want %q", c.file, got, c.missing)
		}
	}
}

// TestV1KillEmptyAndNot: Kill of a v1 sandbox cgroup SIGKILLs a process
// that lives in it (and its child, forked inside), and leaves the cgroup
// thawed; Kill of the emptied cgroup (what a worker does after each
// reply) does nothing and fails nothing, and the cgroup is removable.
func TestV1KillEmptyAndNot(t *testing.T) {
	if why := v1TestSkip(); why != "" {
		mustwork.Skip(t, why)
	}
	// A state directory of the test's own: no other str process's sweep
	// looks at its cgroups (cgroupSpace).
	c, err := newCgroupV1(newCgroupSpace(t.TempDir()), newCgroupID(), CgroupPlan{PidsMax: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Delete()

	// A shell that forks a sleep inside the cgroup, then waits for it.
	cmd := exec.Command("/bin/sh", "-c", "read _; sleep 600 & wait")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	for _, ctl := range c.order {
		if err := os.WriteFile(filepath.Join(c.paths[ctl], "cgroup.procs"), []byte(pid), 0); err != nil {
			_ = cmd.Process.Kill()
			t.Fatalf("move %s into %s: %v", pid, c.paths[ctl], err)
		}
	}
	stdin.Write([]byte("go\n"))
	deadline := time.Now().Add(30 * time.Second) // a failure guard, not a measure
	for procsIn(t, c.paths["memory"]) < 2 {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			t.Fatal("the shell's child never showed up in the cgroup")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.Empty() {
		t.Fatal("Empty: true with two processes in the cgroup")
	}
	if err := c.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err = <-waited:
	case <-time.After(30 * time.Second): // a failure guard, not a measure
		_ = cmd.Process.Kill()
		t.Fatal("the shell outlived Kill")
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the shell ended with %v, want SIGKILL", err)
	}
	for procsIn(t, c.paths["memory"]) > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the shell's child outlived Kill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if fz, ok := c.paths["freezer"]; ok {
		// Read until THAWED (a failure guard, not a measure): once seen
		// failing on a loaded machine, the state and error are reported.
		var st []byte
		var rerr error
		for {
			st, rerr = os.ReadFile(filepath.Join(fz, "freezer.state"))
			if strings.TrimSpace(string(st)) == "THAWED" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("freezer.state after Kill: %q (read error %v), want THAWED", st, rerr)
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if !c.Empty() {
		t.Fatal("Empty: false after every process was reaped")
	}
	if err := c.Kill(); err != nil {
		t.Errorf("Kill of the empty cgroup: %v", err)
	}
	if err := c.Delete(); err != nil {
		t.Errorf("Delete: %v", err)
	}
}

// v1TestSkip is why a test of the v1 cgroup code cannot run here ("" if it can).
func v1TestSkip() string {
	switch {
	case os.Geteuid() != 0:
		return "creating v1 cgroups needs root"
	case DetectCgroup() != CgroupV1:
		return "the host has no writable cgroup v1 hierarchy (cgroup v2 or none): the v1 kill path is tested where v1 is mounted"
	}
	return ""
}

func procsIn(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	return len(strings.Fields(string(b)))
}

// The sweep of stale cgroups runs at most once per sweepEvery across the
// str processes of a host (the stamp in the state directory), and again
// once that has passed; a stamp that cannot be read means a sweep.
func TestSweepDueSpacesSweeps(t *testing.T) {
	dir := t.TempDir()
	sp := newCgroupSpace(dir)
	now := time.Now()
	if !sweepDue(sp, now) {
		t.Fatal("no stamp yet (no cgroups/ dir): want a sweep")
	}
	if err := os.Mkdir(filepath.Join(dir, "cgroups"), 0o700); err != nil {
		t.Fatal(err)
	}
	if !sweepDue(sp, now) {
		t.Fatal("no stamp yet: want a sweep")
	}
	if sweepDue(sp, now.Add(time.Second)) {
		t.Fatal("a sweep 1 s after the last one")
	}
	if !sweepDue(sp, now.Add(sweepEvery+time.Second)) {
		t.Fatalf("no sweep %v after the last one", sweepEvery+time.Second)
	}
	if !sweepDue(sp, now.Add(-time.Hour)) {
		t.Fatal("a stamp an hour in the future (clock set back): want a sweep")
	}
}
