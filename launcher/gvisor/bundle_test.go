package gvisor

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/nsinit"
)

func testSpec() Spec {
	return Spec{
		Network: egress.Policy{Mode: egress.Isolated},
		Limits:  Limits{Enforce: true, MemoryMax: 1 << 29, CPUQuotaUs: 100000, CPUPeriodUs: 100000, PidsMax: 32},
		Child: nsinit.Config{
			Hostname: "sandbox", UID: 65534, GID: 65534, Argv: []string{"python3", "-c", "pass"},
			Env: []string{"PATH=/usr/bin:/bin"}, Workdir: "/work",
			Rlimits: []nsinit.Rlimit{{Name: "RLIMIT_NOFILE", Value: 128}},
			Mounts: []nsinit.Mount{
				{Kind: nsinit.MountBind, Source: "/usr", Target: "/usr", ReadOnly: true},
				{Kind: nsinit.MountSymlink, Source: "usr/lib", Target: "/lib"},
				{Kind: nsinit.MountFile, Target: "/etc/passwd", Mode: 0o644, Contents: "root:x:0:0::/:/bin/false\n"},
				{Kind: nsinit.MountTmpfs, Target: "/tmp", Data: "size=1024,mode=1777"},
				{Kind: nsinit.MountBind, Source: "/srv/work", Target: "/work"},
				{Kind: nsinit.MountTmpfs, Target: "/dev", Data: "size=64k,mode=0755"},
				{Kind: nsinit.MountDevNode, Source: "/dev/null", Target: "/dev/null"},
				{Kind: nsinit.MountSymlink, Source: "/proc/self/fd", Target: "/dev/fd"},
				{Kind: nsinit.MountProc, Target: "/proc"},
				{Kind: nsinit.MountTmpfs, Target: "/var/run/secrets", ReadOnly: true, Data: "size=4k,mode=0755"},
			},
		},
	}
}

// The bundle is the plan's: a read-only empty root, the binds read-only
// but the work dir, the generated files bound read-only from the bundle,
// gVisor's own /dev, no capabilities, the plan's ids, rlimits and cwd,
// and the cgroup limits with the Sentry's allowance on pids.
func TestBundleFromPlan(t *testing.T) {
	cfg, files, links, err := Bundle(testSpec(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Root.Readonly || cfg.Process.User != (User{65534, 65534}) || cfg.Process.Cwd != "/work" || !cfg.Process.NoNewPrivileges {
		t.Errorf("root %+v, user %+v, cwd %q", cfg.Root, cfg.Process.User, cfg.Process.Cwd)
	}
	if len(cfg.Process.Capabilities.Bounding)+len(cfg.Process.Capabilities.Permitted) != 0 {
		t.Errorf("capabilities kept: %+v", cfg.Process.Capabilities)
	}
	var got []string
	for _, m := range cfg.Mounts {
		got = append(got, m.Destination+" "+m.Type+" "+m.Source+" "+strings.Join(m.Options, ","))
	}
	want := []string{
		"/usr bind /usr rbind,ro",
		"/etc/passwd bind files/0 bind,ro",
		"/tmp tmpfs tmpfs nosuid,nodev,size=1024,mode=1777",
		"/work bind /srv/work rbind,rw",
		"/proc proc proc ",
		"/var/run/secrets tmpfs tmpfs nosuid,nodev,size=4k,mode=0755,ro",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mounts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(files) != 1 || files[0].Name != "files/0" || links["lib"] != "usr/lib" || len(links) != 1 {
		t.Errorf("files %+v, links %v", files, links)
	}
	r := cfg.Linux.Resources
	if r == nil || r.Memory.Limit != 1<<29 || r.Memory.Swap != 1<<29 || r.Pids.Limit != 32+SentryTasks || cfg.Linux.CgroupsPath != "/str-gvisor/s1" {
		t.Errorf("resources %+v, cgroups path %q", r, cfg.Linux.CgroupsPath)
	}
	if len(cfg.Process.Rlimits) != 1 || cfg.Process.Rlimits[0] != (Rlimit{"RLIMIT_NOFILE", 128, 128}) {
		t.Errorf("rlimits %+v", cfg.Process.Rlimits)
	}
}

// What this increment cannot run is refused, every reason at once, and
// never run some other way.
func TestBundleRefuses(t *testing.T) {
	s := testSpec()
	s.Network.Mode = egress.AllowEgress
	s.Rootless = true
	s.Child.Mounts = append(s.Child.Mounts, nsinit.Mount{Kind: nsinit.MountMqueue, Target: "/dev/mqueue"})
	_, _, _, err := Bundle(s, "s1")
	if !errors.Is(err, ErrUnsupported) {
		t.Fatalf("err %v, want ErrUnsupported", err)
	}
	for _, w := range []string{"network policy allow_egress", "not root", "mount kind mqueue"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
	s = testSpec()
	s.Limits.Enforce = false
	cfg, _, _, err := Bundle(s, "s1")
	if err != nil || cfg.Linux.Resources != nil || cfg.Linux.CgroupsPath != "" {
		t.Errorf("no cgroup: %v, %+v", err, cfg)
	}
}

// A work dir the namespaces class would cap or map is said to be bound
// live.
func TestWarningsWorkDirLive(t *testing.T) {
	s := testSpec()
	if w := Warnings(s); len(w) != 0 {
		t.Errorf("warnings %v", w)
	}
	s.Child.Mounts[4].WriteBack = true
	if w := Warnings(s); len(w) != 1 || !strings.Contains(w[0], "work dir /srv/work bound live") {
		t.Errorf("warnings %v", w)
	}
}
