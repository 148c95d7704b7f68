package launcher

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
)

func needV1(t *testing.T) {
	t.Helper()
	if why := v1TestSkip(); why != "" {
		mustwork.Skip(t, why)
	}
}

// A cgroup set is kept for reuse only when it is empty and clean: not
// with a process in it, not after a fork hit pids.max; once kept, its
// CPU time reads 0 and its memory cgroup is not part of it.
func TestV1KeepOnlyEmptyAndClean(t *testing.T) {
	needV1(t)
	stateDir := t.TempDir()
	deadline := time.Now().Add(30 * time.Second) // a failure guard, not a measure
	// in starts script in a fresh set of plan, and waits until ready().
	in := func(plan CgroupPlan, script string, ready func(c *cgroupV1) bool) (*cgroupV1, *exec.Cmd) {
		t.Helper()
		c, err := newCgroupV1(newCgroupSpace(stateDir), newCgroupID(), plan, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.Kill() // a shell's sleep outlives the shell's own kill below
			_ = c.Delete()
		})
		cmd := exec.Command("/bin/sh", "-c", "read _; "+script)
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		for _, ctl := range c.order {
			if err := os.WriteFile(filepath.Join(c.paths[ctl], "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
				t.Fatalf("move into %s: %v", c.paths[ctl], err)
			}
		}
		if _, err := stdin.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		for !ready(c) {
			if time.Now().After(deadline) {
				t.Fatal("the shell never got ready")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return c, cmd
	}
	// settled: emptied by Kill, nothing dying, thawed: only check 4 is left.
	settled := func(c *cgroupV1) bool {
		st, _ := readSmall(filepath.Join(c.paths["freezer"], "freezer.state"), 64)
		return c.Empty() && readInt(filepath.Join(c.paths["pids"], "pids.current")) == 0 && strings.TrimSpace(string(st)) == "THAWED"
	}

	// Busy: a shell and its sleep inside (pids.max not hit).
	busy, _ := in(CgroupPlan{PidsMax: 16}, "sleep 600 & wait", func(c *cgroupV1) bool { return procsIn(t, c.paths["pids"]) >= 2 })
	if sp := busy.keep(); sp != nil {
		t.Fatalf("kept with processes inside: %v", sp.paths)
	}

	// Dirty: forks stopped by pids.max, then everything killed.
	dirty, dirtyCmd := in(CgroupPlan{PidsMax: 2}, "for i in 1 2 3 4; do sleep 600 & done; wait", func(c *cgroupV1) bool {
		return readKV(filepath.Join(c.paths["pids"], "pids.events"))["max"] > 0
	})
	if err := dirty.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = dirtyCmd.Wait() // reaped: pids.current counts a zombie
	for !settled(dirty) {
		if time.Now().After(deadline) {
			t.Fatal("the processes outlived Kill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if sp := dirty.keep(); sp != nil {
		t.Fatalf("kept after a fork hit pids.max (pids.events max is not reset): %v", sp.paths)
	}

	// Clean: a shell that ran to its end.
	clean, cmd := in(CgroupPlan{PidsMax: 16}, "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done", func(*cgroupV1) bool { return true })
	_ = cmd.Wait()
	for !settled(clean) {
		if time.Now().After(deadline) {
			t.Fatal("the shell never left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if readInt(filepath.Join(clean.paths["cpuacct"], "cpuacct.usage")) == 0 {
		t.Fatal("cpuacct.usage 0 after the shell ran: nothing to reset")
	}
	sp := clean.keep()
	if sp == nil {
		t.Fatal("an empty, clean set was not kept")
	}
	defer sp.remove()
	if _, ok := sp.paths["memory"]; ok {
		t.Fatal("the memory cgroup is kept for reuse")
	}
	if _, ok := clean.paths["memory"]; !ok || len(clean.paths) != 1 {
		t.Fatalf("the sandbox keeps %v, want only its memory cgroup", clean.paths)
	}
	if n := readInt(filepath.Join(sp.paths["cpuacct"], "cpuacct.usage")); n != 0 {
		t.Fatalf("a kept set's cpuacct.usage is %d, want 0", n)
	}
}

// Sandboxes of a resident launcher's kind reuse one set, one after the
// other, each in a memory cgroup of its own; drain removes it.
func TestResidentSandboxesReuseCgroups(t *testing.T) {
	needV1(t)
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	l.spares = &cgroupSpares{byPlan: map[CgroupPlan][]*v1Spare{}}
	req := Request{Profile: "restrictive", Argv: []string{"/bin/true"}}
	var kept string
	for i := range 3 {
		res, err := l.Run(context.Background(), req)
		if err != nil || res.SetupError != nil || res.ExitCode != 0 {
			t.Fatalf("sandbox %d: %v %+v", i, err, res)
		}
		var all []*v1Spare
		for _, list := range l.spares.byPlan {
			all = append(all, list...)
		}
		if len(all) != 1 {
			t.Fatalf("after sandbox %d: %d kept sets, want 1", i, len(all))
		}
		if i == 0 {
			kept = all[0].paths["pids"]
		} else if all[0].paths["pids"] != kept {
			t.Fatalf("sandbox %d kept %s, not the set it was given (%s)", i, all[0].paths["pids"], kept)
		}
	}
	l.spares.drain()
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("drain left %s (%v)", kept, err)
	}
}
