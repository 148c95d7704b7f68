package launcher

import (
	"errors"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/nsinit"
)

func TestSetMounts(t *testing.T) {
	ms := []nsinit.Mount{
		{Kind: nsinit.MountBind, Source: "/usr", Target: "/usr", ReadOnly: true},
		{Kind: nsinit.MountProc, Target: "/proc"},
		{Kind: nsinit.MountDevNode, Source: "/dev/null", Target: "/dev/null"},
	}
	root := mustPlan(t, "standard", Request{Argv: []string{"true"}}, fakeHost(0, CgroupV2))
	if err := root.SetMounts(ms); err != nil {
		t.Fatal(err)
	}
	first := nsinit.FirstTreeFD(0)
	if got := []int{root.Child.Mounts[0].TreeFD, root.Child.Mounts[1].TreeFD, root.Child.Mounts[2].TreeFD}; got[0] != first || got[1] != 0 || got[2] != first+1 {
		t.Errorf("root mode tree fds %v, want %d 0 %d", got, first, first+1)
	}
	if ms[0].TreeFD != 0 {
		t.Error("SetMounts changed the caller's slice")
	}
	rootless := mustPlan(t, "standard", Request{Argv: []string{"true"}}, fakeHost(1000, CgroupV2))
	if err := rootless.SetMounts(ms); err != nil || rootless.Child.Mounts[0].TreeFD != 0 {
		t.Errorf("rootless: %v, tree fd %d (the init clones its sources itself)", err, rootless.Child.Mounts[0].TreeFD)
	}
	// An overlay's tree is the launcher's (root mode); rootless it is
	// refused with its reason, never left to the init to clone by path.
	ovl := []nsinit.Mount{{Kind: nsinit.MountBind, Source: "/usr", Target: "/o", Overlay: &nsinit.Overlay{Lower: []string{"/usr"}}}}
	if err := root.SetMounts(ovl); err != nil || root.Child.Mounts[0].TreeFD != first {
		t.Errorf("root mode overlay: %v, tree fd %d", err, root.Child.Mounts[0].TreeFD)
	}
	if err := rootless.SetMounts(ovl); !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "not supported rootless") {
		t.Errorf("rootless overlay: %v", err)
	}
	for _, bad := range [][]nsinit.Mount{
		{{Kind: nsinit.MountTmpfs, Target: "tmp"}},
		{{Kind: nsinit.MountTmpfs, Target: "/a/../b"}},
		make([]nsinit.Mount, nsinit.MaxBindSources+1),
	} {
		for i := range bad {
			if bad[i].Kind == "" {
				bad[i] = nsinit.Mount{Kind: nsinit.MountBind, Source: "/usr", Target: "/usr"}
			}
		}
		if err := root.SetMounts(bad); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("SetMounts(%d mounts, first %q): %v", len(bad), bad[0].Target, err)
		}
	}
}

func TestSetToolIDs(t *testing.T) {
	rootless := mustPlan(t, "standard", Request{Argv: []string{"id"}}, fakeHost(1000, CgroupV2))
	rootless.SetToolIDs(0, 5)
	if rootless.Child.UID != 0 || rootless.Child.GID != 5 || rootless.UIDMappings[0] != (IDMap{Inside: 0, Outside: 1000, Size: 1}) || rootless.GIDMappings[0].Inside != 5 {
		t.Errorf("rootless: uid %d gid %d maps %v %v", rootless.Child.UID, rootless.Child.GID, rootless.UIDMappings, rootless.GIDMappings)
	}
	root := mustPlan(t, "standard", Request{Argv: []string{"id"}}, fakeHost(0, CgroupV2))
	root.SetToolIDs(0, 0)
	root.assignIDs(200000)
	if root.ToolUID != 200000 || len(root.UIDMappings) != 1 || root.UIDMappings[0].Inside != 0 || root.UIDMappings[0].Outside != 200000 {
		t.Errorf("root: tool %d maps %v", root.ToolUID, root.UIDMappings)
	}
}
