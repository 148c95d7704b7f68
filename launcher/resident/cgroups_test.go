package resident

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
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/procfs"
)

func needV1(t *testing.T) {
	t.Helper()
	switch {
	case os.Geteuid() != 0:
		mustwork.Skip(t, "creating v1 cgroups needs root")
	case launcher.DetectCgroup() != launcher.CgroupV1:
		mustwork.Skip(t, "the host has no writable cgroup v1 hierarchy (cgroup v2 or none): v1 reuse is tested where v1 is mounted")
	}
}

// cgroupFile is a cgroup file's content, trimmed.
func cgroupFile(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A cgroup set is kept for reuse only when it is empty and clean
// (checks 2-5): not with a process in it, not after a fork hit
// pids.max; once kept, its CPU time reads 0.
func TestV1Keepable(t *testing.T) {
	needV1(t)
	l := planLauncher(t)
	deadline := time.Now().Add(30 * time.Second) // a failure guard, not a measure
	// in starts script in a fresh cgroup of the launcher's with pids.max
	// pidsMax, and waits until ready(its reused hierarchies' paths).
	in := func(pidsMax int64, script string, ready func(paths map[string]string) bool) (*launcher.Cgroup, map[string]string, *exec.Cmd) {
		t.Helper()
		pl, err := l.Plan(launcher.Request{Profile: "restrictive", Argv: []string{"/bin/true"}})
		if err != nil {
			t.Fatal(err)
		}
		pl.Cgroup.PidsMax = pidsMax
		c, err := l.NewCgroup(pl)
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
		if err := c.Enter(cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		cgs, err := procfs.Cgroups(strconv.Itoa(cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		paths := map[string]string{}
		for _, ctl := range launcher.CgroupReused {
			paths[ctl] = filepath.Join("/sys/fs/cgroup", ctl, cgs[ctl])
		}
		if _, err := stdin.Write([]byte("go\n")); err != nil {
			t.Fatal(err)
		}
		for !ready(paths) {
			if time.Now().After(deadline) {
				t.Fatal("the shell never got ready")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return c, paths, cmd
	}
	// settled: emptied, nothing dying, thawed: only check 4 is left.
	settled := func(c *launcher.Cgroup, paths map[string]string) bool {
		return c.Empty() && cgroupFile(t, paths["pids"], "pids.current") == "0" && cgroupFile(t, paths["freezer"], "freezer.state") == "THAWED"
	}

	// Busy: a shell and its sleep inside (pids.max not hit).
	_, busy, _ := in(16, "sleep 600 & wait", func(p map[string]string) bool {
		return len(strings.Fields(cgroupFile(t, p["pids"], "cgroup.procs"))) >= 2
	})
	if keepable(busy) {
		t.Fatalf("kept with processes inside: %v", busy)
	}

	// Dirty: forks stopped by pids.max, then everything killed.
	dirtyCg, dirty, dirtyCmd := in(2, "for i in 1 2 3 4; do sleep 600 & done; wait", func(p map[string]string) bool {
		return cgroupFile(t, p["pids"], "pids.events") != "max 0"
	})
	if err := dirtyCg.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = dirtyCmd.Wait() // reaped: pids.current counts a zombie
	for !settled(dirtyCg, dirty) {
		if time.Now().After(deadline) {
			t.Fatal("the processes outlived Kill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if keepable(dirty) {
		t.Fatalf("kept after a fork hit pids.max (pids.events max is not reset): %v", dirty)
	}

	// Clean: a shell that ran to its end.
	cleanCg, clean, cmd := in(16, "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done", func(map[string]string) bool { return true })
	_ = cmd.Wait()
	for !settled(cleanCg, clean) {
		if time.Now().After(deadline) {
			t.Fatal("the shell never left")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if cgroupFile(t, clean["cpuacct"], "cpuacct.usage") == "0" {
		t.Fatal("cpuacct.usage 0 after the shell ran: nothing to reset")
	}
	if !keepable(clean) {
		t.Fatal("an empty, clean set was not kept")
	}
	if n := cgroupFile(t, clean["cpuacct"], "cpuacct.usage"); n != "0" {
		t.Fatalf("a kept set's cpuacct.usage is %s, want 0", n)
	}
}

// Sandboxes of a resident launcher reuse one set, one after the other,
// each in a memory cgroup of its own; drain removes it.
func TestResidentSandboxesReuseCgroups(t *testing.T) {
	needV1(t)
	l := planLauncher(t)
	spares := newCgroupSpares()
	l.ReuseCgroups(spares)
	req := launcher.Request{Profile: "restrictive", Argv: []string{"/bin/true"}}
	var kept string
	for i := range 3 {
		res, err := l.Run(context.Background(), req)
		if err != nil || res.SetupError != nil || res.ExitCode != 0 {
			t.Fatalf("sandbox %d: %v %+v", i, err, res)
		}
		var all []*launcher.KeptCgroups
		for _, list := range spares.byPlan {
			all = append(all, list...)
		}
		if len(all) != 1 {
			t.Fatalf("after sandbox %d: %d kept sets, want 1", i, len(all))
		}
		if _, ok := all[0].Paths["memory"]; ok {
			t.Fatal("the memory cgroup is kept for reuse")
		}
		if i == 0 {
			kept = all[0].Paths["pids"]
		} else if all[0].Paths["pids"] != kept {
			t.Fatalf("sandbox %d kept %s, not the set it was given (%s)", i, all[0].Paths["pids"], kept)
		}
	}
	spares.drain()
	if _, err := os.Stat(kept); !os.IsNotExist(err) {
		t.Fatalf("drain left %s (%v)", kept, err)
	}
}
