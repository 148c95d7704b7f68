package resident

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/launcher"
)

// The resident launcher reuses v1 cgroups of the pids, cpu, cpuacct and
// freezer hierarchies (launcher.CgroupReused) from one sandbox to the
// next, one sandbox at a time: making and removing them was 10 % of its
// CPU (perf), plus the kernel's deferred work of each removal. The
// memory cgroup is always fresh: what a sandbox leaves charged there
// (page cache, kernel objects: 70-160 KiB after a /bin/true) would
// otherwise show in the next one's peak memory and count against its
// limit.
//
// A set of cgroups is kept for reuse only when it is, checked in this
// order after its sandbox was reaped and its statistics read:
//
//  1. the launcher reuses cgroups (str serve: launcher.ReuseCgroups),
//     and the cgroup is v1;
//  2. empty: no thread listed in any of the four tasks files, and
//     pids.current 0 (a dying task still counts there);
//  3. thawed (freezer.state THAWED);
//  4. clean: pids.events max 0 (a counter no write resets);
//  5. reset: cpuacct.usage written 0 (what Stats reports as CPU time).
//
// Check 1 is the launcher's (it offers only v1 sets, and only to the
// launcher.CgroupReuse it was given); checks 2-5 are keepable's. A file
// that cannot be read fails its check. Anything else is removed as
// before. A kept set holds its lock file and its limits, as
// launcher.CgroupReuse says.

// cgroupSpares are a server's kept sets, by the plan they were made for
// (its launcher.CgroupReuse).
type cgroupSpares struct {
	mu     sync.Mutex
	byPlan map[launcher.CgroupPlan][]*launcher.KeptCgroups
}

func newCgroupSpares() *cgroupSpares {
	return &cgroupSpares{byPlan: map[launcher.CgroupPlan][]*launcher.KeptCgroups{}}
}

// Take is a kept set made for pl, the last one kept first.
func (sp *cgroupSpares) Take(pl launcher.CgroupPlan) *launcher.KeptCgroups {
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

// Keep keeps s for the next sandbox of pl when checks 2-5 pass.
func (sp *cgroupSpares) Keep(pl launcher.CgroupPlan, s *launcher.KeptCgroups) bool {
	if !keepable(s.Paths) {
		return false
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.byPlan[pl] = append(sp.byPlan[pl], s)
	return true
}

// drain removes every kept set (at Close, once no sandbox is left).
func (sp *cgroupSpares) drain() {
	sp.mu.Lock()
	all := sp.byPlan
	sp.byPlan = map[launcher.CgroupPlan][]*launcher.KeptCgroups{}
	sp.mu.Unlock()
	for _, list := range all {
		for _, s := range list {
			s.Remove()
		}
	}
}

// keepable is checks 2-5 on a reaped sandbox's set (paths by
// controller, one for each of launcher.CgroupReused).
func keepable(paths map[string]string) bool {
	read := func(ctl, file string) string {
		b, err := os.ReadFile(filepath.Join(paths[ctl], file))
		if err != nil {
			return "unreadable"
		}
		return string(bytes.TrimSpace(b))
	}
	for ctl := range paths {
		// 2. empty.
		if read(ctl, "tasks") != "" {
			return false
		}
	}
	if read("pids", "pids.current") != "0" {
		return false
	}
	// 3. thawed.
	if read("freezer", "freezer.state") != "THAWED" {
		return false
	}
	// 4. clean.
	clean := false
	for _, line := range strings.Split(read("pids", "pids.events"), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "max" {
			clean = f[1] == "0"
		}
	}
	if !clean {
		return false
	}
	// 5. reset.
	if os.WriteFile(filepath.Join(paths["cpuacct"], "cpuacct.usage"), []byte("0"), 0) != nil {
		return false
	}
	n, err := strconv.ParseInt(read("cpuacct", "cpuacct.usage"), 10, 64)
	return err == nil && n == 0
}
