package launcher

import (
	"bytes"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The resident launcher (str serve) reuses v1 cgroups of the pids, cpu,
// cpuacct and freezer hierarchies from one sandbox to the next, one
// sandbox at a time: making and removing them was 10 % of its CPU (perf),
// plus the kernel's deferred work of each removal. The memory cgroup is
// always fresh: what a sandbox leaves charged there (page cache, kernel
// objects: 70-160 KiB after a /bin/true) would otherwise show in the next
// one's peak memory and count against its limit.
//
// A set of cgroups is kept for reuse only when it is, checked in this
// order after its sandbox was reaped and its statistics read:
//
//  1. the launcher reuses cgroups (str serve), and the cgroup is v1;
//  2. empty: no thread listed in any of the four tasks files, and
//     pids.current 0 (a dying task still counts there);
//  3. thawed (freezer.state THAWED);
//  4. clean: pids.events max 0 (a counter no write resets);
//  5. reset: cpuacct.usage written 0 (what Stats reports as CPU time).
//
// Anything else is removed as before. A kept set holds its lock file
// (no sweep touches it) and its limits (it is only handed to a sandbox
// of the same CgroupPlan); its tasks files are chowned to the next
// sandbox's host ids by that sandbox's self-entry (L5), which takes them
// from the previous one's.

// cgroupReused are the hierarchies whose cgroups a resident launcher
// reuses.
var cgroupReused = []string{"pids", "cpu", "cpuacct", "freezer"}

// v1Spare is one kept set: a cgroup in each reused hierarchy, by name.
type v1Spare struct {
	paths map[string]string // controller -> dir
	lock  *lockFile
}

// cgroupSpares are a launcher's kept sets, by the plan they were made
// for. nil: the launcher does not reuse cgroups.
type cgroupSpares struct {
	mu     sync.Mutex
	byPlan map[CgroupPlan][]*v1Spare
}

// ReuseCgroups makes l keep the v1 pids, cpu, cpuacct and freezer
// cgroups of its sandboxes for the next ones, one sandbox at a time, when
// checks 1-5 above pass (str serve's sandboxes: package
// launcher/resident). drain removes every kept set: call it once no
// sandbox of l is left.
func (l *Launcher) ReuseCgroups() (drain func()) {
	l.spares = &cgroupSpares{byPlan: map[CgroupPlan][]*v1Spare{}}
	return l.spares.drain
}

// path is the spare's cgroup in hierarchy ctl (none for a nil spare).
func (s *v1Spare) path(ctl string) (string, bool) {
	if s == nil {
		return "", false
	}
	p, ok := s.paths[ctl]
	return p, ok
}

func (sp *cgroupSpares) take(pl CgroupPlan) *v1Spare {
	if sp == nil {
		return nil
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	list := sp.byPlan[pl]
	if len(list) == 0 {
		return nil
	}
	s := list[len(list)-1]
	sp.byPlan[pl] = list[:len(list)-1]
	return s
}

func (sp *cgroupSpares) put(pl CgroupPlan, s *v1Spare) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.byPlan[pl] = append(sp.byPlan[pl], s)
}

// drain removes every kept set (ReuseCgroups' caller, at its end).
func (sp *cgroupSpares) drain() {
	if sp == nil {
		return
	}
	sp.mu.Lock()
	all := sp.byPlan
	sp.byPlan = map[CgroupPlan][]*v1Spare{}
	sp.mu.Unlock()
	for _, list := range all {
		for _, s := range list {
			s.remove()
		}
	}
}

// remove rmdirs the set and releases its lock (kept when a directory
// stays: the next sweep after this process is gone removes it).
func (s *v1Spare) remove() {
	if s == nil {
		return
	}
	ok := true
	for _, p := range s.paths {
		if err := retryBusy(func() error { return unix.Rmdir(p) }); err != nil {
			ok = false
		}
	}
	if ok {
		s.lock.release()
	}
}

// keep is checks 2-5 on the reused hierarchies of c (a reaped sandbox's
// cgroup, its statistics read): it returns them as a spare and drops
// them from c, or nil when any check fails (c unchanged).
func (c *cgroupV1) keep() *v1Spare {
	s := &v1Spare{paths: map[string]string{}, lock: c.lock}
	if c.spare != nil {
		s = c.spare
	}
	for _, ctl := range cgroupReused {
		p, ok := c.paths[ctl]
		if !ok || (c.spare != nil && p != c.spare.paths[ctl]) {
			return nil // a hierarchy this host does not mount
		}
		s.paths[ctl] = p
	}
	for _, p := range s.paths {
		// 2. empty.
		if b, err := readSmall(filepath.Join(p, "tasks"), 64); err != nil || len(bytes.TrimSpace(b)) > 0 {
			return nil
		}
	}
	if readInt(filepath.Join(s.paths["pids"], "pids.current")) != 0 {
		return nil
	}
	// 3. thawed.
	if b, err := readSmall(filepath.Join(s.paths["freezer"], "freezer.state"), 64); err != nil || strings.TrimSpace(string(b)) != "THAWED" {
		return nil
	}
	// 4. clean.
	if ev, ok := readKV(filepath.Join(s.paths["pids"], "pids.events"))["max"]; !ok || ev != 0 {
		return nil
	}
	// 5. reset.
	if err := writeFiles(s.paths["cpuacct"], [][2]string{{"cpuacct.usage", "0"}}); err != nil {
		return nil
	}
	if readInt(filepath.Join(s.paths["cpuacct"], "cpuacct.usage")) != 0 {
		return nil
	}
	for _, ctl := range cgroupReused {
		delete(c.paths, ctl)
	}
	if c.spare != nil {
		c.spare = nil
	} else {
		c.lock = nil // the spare holds it now; the memory cgroup of the same name goes without it
	}
	return s
}
