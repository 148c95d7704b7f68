package planfmt

import (
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
)

// A bind says who clones its source: the launcher on the host (root mode,
// a tree descriptor; launcher's TestPlanTreeDescriptors checks the plan
// numbers them) or the init (rootless, TreeFD 0).
func TestDescribeMountSaysWhoClones(t *testing.T) {
	for _, c := range []struct {
		m    nsinit.Mount
		want string
	}{
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/work", Target: "/work", NoFollow: true, WriteBack: true, TreeFD: 9},
			"bind rw /work -> /work, recursive, nosuid,nodev (no symlink) (capped: an overlay whose upper layer is a tmpfs of the profile's work_dir; the tool's changes are copied back at step L10); cloned on the host by the launcher (init fd 9)"},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/usr", Target: "/usr", ReadOnly: true},
			"bind ro /usr -> /usr, recursive, nosuid,nodev; cloned by the init"},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/opt", Target: "/opt", ReadOnly: true, Optional: true, TreeFD: nsinit.SourceAbsent},
			"bind ro /opt -> /opt, recursive, nosuid,nodev (optional); absent, skipped"},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/dev", Target: "/dev", Devices: true},
			"bind rw /dev -> /dev, recursive, nosuid (devices usable: --dev-bind); cloned by the init"},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/b", Target: "/o", TreeFD: 7, Overlay: &nsinit.Overlay{Lower: []string{"/b", "/a"}}},
			"overlay rw -> /o, lower /b:/a (top first), upper a tmpfs of the launcher's, capped like the work dir, nosuid,nodev; made on the host by the launcher (init fd 7)"},
		{nsinit.Mount{Kind: nsinit.MountBind, Source: "/b", Target: "/o", TreeFD: 7, ReadOnly: true, Overlay: &nsinit.Overlay{Lower: []string{"/b", "/a"}}},
			"overlay ro -> /o, lower /b:/a (top first), upper none, nosuid,nodev; made on the host by the launcher (init fd 7)"},
	} {
		if got := describeMount(c.m); got != c.want {
			t.Errorf("describeMount(%s):\n got %s\nwant %s", c.m.Target, got, c.want)
		}
	}
}

// A plan without its cgroup says so where the limits would be, and what
// still holds.
func TestPlanSaysCgroupNotEnforced(t *testing.T) {
	pl := &launcher.Plan{Timeout: time.Second, Cgroup: launcher.CgroupPlan{Mode: launcher.CgroupNone,
		MemoryMax: 1 << 30, CPUQuotaUs: 200000, CPUPeriodUs: 100000, PidsMax: 128, Unenforced: "not delegated to uid 65534"}}
	out := Plan(pl, profiles.FormatBytes)
	for _, want := range []string{"cgroup: none (not delegated to uid 65534): limits not enforced", "pids.max 128", "RLIMIT_NPROC", "ends its pid namespace"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "the cgroup is killed") {
		t.Errorf("a plan without a cgroup kills one:\n%s", out)
	}
}
