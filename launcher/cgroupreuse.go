package launcher

import "golang.org/x/sys/unix"

// CgroupReuse is how a resident launcher (str serve: package
// launcher/resident, whose cgroups.go has the policy and its checks)
// reuses the v1 cgroups of the CgroupReused hierarchies from one sandbox
// to the next, one sandbox at a time: a new sandbox takes a kept set
// made for its CgroupPlan instead of making its own there, and a reaped
// sandbox's set is offered back. The memory cgroup is always fresh.
// A kept set holds its lock file (no sweep touches it) and its limits
// (it is only handed to a sandbox of the same CgroupPlan); its tasks
// files are chowned to the next sandbox's host ids by that sandbox's
// self-entry (L5), which takes them from the previous one's.
type CgroupReuse interface {
	// Take returns a kept set made for pl, nil when there is none.
	Take(pl CgroupPlan) *KeptCgroups
	// Keep is given the set of a reaped v1 sandbox of pl, its statistics
	// read: true keeps it (for Take; removed with KeptCgroups.Remove),
	// false leaves it to be removed with the sandbox's memory cgroup.
	Keep(pl CgroupPlan, set *KeptCgroups) bool
}

// CgroupReused are the v1 hierarchies whose cgroups CgroupReuse keeps.
var CgroupReused = []string{"pids", "cpu", "cpuacct", "freezer"}

// KeptCgroups is one set: a cgroup in each CgroupReused hierarchy, and
// the lock file that keeps this state directory's sweeps from it.
type KeptCgroups struct {
	Paths map[string]string // controller -> dir
	lock  *lockFile
}

// ReuseCgroups makes l's sandboxes reuse their v1 cgroups through r
// (str serve's). Call it before l's first sandbox.
func (l *Launcher) ReuseCgroups(r CgroupReuse) { l.reuse = r }

// path is the set's cgroup in hierarchy ctl (none for a nil set).
func (s *KeptCgroups) path(ctl string) (string, bool) {
	if s == nil {
		return "", false
	}
	p, ok := s.Paths[ctl]
	return p, ok
}

// Remove rmdirs the set and releases its lock (kept when a directory
// stays: the next sweep after this process is gone removes it).
func (s *KeptCgroups) Remove() {
	if s == nil {
		return
	}
	ok := true
	for _, p := range s.Paths {
		if err := retryBusy(func() error { return unix.Rmdir(p) }); err != nil {
			ok = false
		}
	}
	if ok {
		s.lock.release()
	}
}

// offer hands the CgroupReused cgroups of c (a reaped sandbox's, its
// statistics read) to r, all or none: a set kept is dropped from c,
// which then holds only its memory cgroup; one r refuses stays c's.
func (c *cgroupV1) offer(r CgroupReuse, pl CgroupPlan) {
	s := &KeptCgroups{Paths: map[string]string{}, lock: c.lock}
	if c.spare != nil {
		s = c.spare
	}
	for _, ctl := range CgroupReused {
		p, ok := c.paths[ctl]
		if !ok || (c.spare != nil && p != c.spare.Paths[ctl]) {
			return // a hierarchy this host does not mount
		}
		s.Paths[ctl] = p
	}
	if !r.Keep(pl, s) {
		return
	}
	for _, ctl := range CgroupReused {
		delete(c.paths, ctl)
	}
	if c.spare != nil {
		c.spare = nil
	} else {
		c.lock = nil // the set holds it now; the memory cgroup of the same name goes without it
	}
}
