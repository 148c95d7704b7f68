package launcher

import (
	"os"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

func needV1(t *testing.T) {
	t.Helper()
	if why := v1TestSkip(); why != "" {
		mustwork.Skip(t, why)
	}
}

// keepAll is a CgroupReuse that keeps what it is offered, or nothing
// (refuse); the checks are launcher/resident's (TestV1Keepable).
type keepAll struct {
	refuse bool
	kept   []*KeptCgroups
}

func (k *keepAll) Take(CgroupPlan) *KeptCgroups { return nil }

func (k *keepAll) Keep(_ CgroupPlan, s *KeptCgroups) bool {
	if !k.refuse {
		k.kept = append(k.kept, s)
	}
	return !k.refuse
}

// A reaped sandbox's set is offered all or none: refused, the sandbox
// keeps all five cgroups and its lock; kept, the set holds the four
// reused ones and the lock, the sandbox only its memory cgroup, and
// removing both leaves nothing.
func TestV1OfferAllOrNone(t *testing.T) {
	needV1(t)
	sp := newCgroupSpace(t.TempDir())
	c, err := newCgroupV1(sp, newCgroupID(), CgroupPlan{PidsMax: 16}, nil)
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]string{}
	for ctl, p := range c.paths {
		all[ctl] = p
	}
	t.Cleanup(func() {
		for _, p := range all {
			_ = os.Remove(p)
		}
	})
	lock := c.lock

	c.offer(&keepAll{refuse: true}, CgroupPlan{PidsMax: 16})
	if len(c.paths) != len(all) || c.lock != lock {
		t.Fatalf("refused: the sandbox keeps %v (lock %v), want %v (lock %v)", c.paths, c.lock, all, lock)
	}

	k := &keepAll{}
	c.offer(k, CgroupPlan{PidsMax: 16})
	if len(k.kept) != 1 {
		t.Fatalf("kept %d sets, want 1", len(k.kept))
	}
	set := k.kept[0]
	if _, ok := set.Paths["memory"]; ok || len(set.Paths) != len(CgroupReused) || set.lock != lock {
		t.Fatalf("the kept set is %v (lock %v): want the %v cgroups and the sandbox's lock", set.Paths, set.lock, CgroupReused)
	}
	if _, ok := c.paths["memory"]; !ok || len(c.paths) != 1 || c.lock != nil {
		t.Fatalf("the sandbox keeps %v (lock %v), want only its memory cgroup, without the lock", c.paths, c.lock)
	}
	if err := c.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lock.path); err != nil {
		t.Fatalf("the memory cgroup's removal released the kept set's lock: %v", err)
	}
	set.Remove()
	for ctl, p := range all {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s cgroup %s left (%v)", ctl, p, err)
		}
	}
	if _, err := os.Stat(lock.path); !os.IsNotExist(err) {
		t.Errorf("lock file %s left (%v)", lock.path, err)
	}
}
