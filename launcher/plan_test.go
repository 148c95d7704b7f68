package launcher

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/profiles/profileyaml"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// fakeFS is a host filesystem description for plans built without
// touching the machine: /lib and /lib64 are merged-usr symlinks.
type fakeInfo struct {
	name string
	mode fs.FileMode
}

func (f fakeInfo) Name() string       { return f.name }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return nil }

func fakeHost(uid int, cg CgroupMode) Host {
	links := map[string]string{"/lib": "usr/lib", "/lib64": "usr/lib64", "/bin": "usr/bin", "/sbin": "usr/sbin"}
	return Host{
		UID: uid, GID: uid, Root: uid == 0, Cgroup: cg,
		Lstat: func(p string) (fs.FileInfo, error) {
			if _, ok := links[p]; ok {
				return fakeInfo{p, fs.ModeSymlink}, nil
			}
			switch p {
			case "/usr", "/etc/ssl", "/work", "/data", "/etc/python3", "/etc/python3.11":
				return fakeInfo{p, fs.ModeDir}, nil
			case "/etc/resolv.conf", "/etc/hosts", "/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/mime.types":
				return fakeInfo{p, 0}, nil
			}
			return nil, &fs.PathError{Op: "lstat", Path: p, Err: fs.ErrNotExist}
		},
		Readlink: func(p string) (string, error) { return links[p], nil },
		Getenv:   func(k string) string { return map[string]string{"PYTHONUNBUFFERED": "1", "SECRET": "x"}[k] },
	}
}

func mustPlan(t *testing.T, profile string, req Request, host Host) *Plan {
	t.Helper()
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	p, err := set.Lookup(profile)
	if err != nil {
		t.Fatal(err)
	}
	if req.Argv == nil {
		req.Argv = []string{"/bin/true"}
	}
	pl, err := NewPlan(p, req, host, nil)
	if err != nil {
		t.Fatalf("plan %s: %v", profile, err)
	}
	return pl
}

func TestPlanNamespacesPerProfile(t *testing.T) {
	// Every namespace, always: a user namespace in root mode too, and a
	// network namespace whatever the policy.
	all := uintptr(unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWNET)
	cases := []struct {
		profile string
		uid     int
		flags   uintptr
	}{
		{"restrictive", 0, all}, {"confidential", 0, all}, {"standard", 0, all}, {"permissive", 0, all},
		{"restrictive", 1000, all}, {"standard", 1000, all},
	}
	for _, c := range cases {
		pl := mustPlan(t, c.profile, Request{}, fakeHost(c.uid, CgroupV1))
		if pl.CloneFlags != c.flags {
			t.Errorf("%s as uid %d: clone flags %v, want %#x", c.profile, c.uid, pl.CloneNames, c.flags)
		}
		if pl.Child.LoopbackUp != (c.flags&unix.CLONE_NEWNET != 0) {
			t.Errorf("%s: loopback up %v with its own netns %v", c.profile, pl.Child.LoopbackUp, c.flags&unix.CLONE_NEWNET != 0)
		}
	}
}

func TestPlanRootlessMapsCallerTo65534(t *testing.T) {
	pl := mustPlan(t, "restrictive", Request{}, fakeHost(1000, CgroupV1))
	want := []IDMap{{Inside: 65534, Outside: 1000, Size: 1}}
	if len(pl.UIDMappings) != 1 || pl.UIDMappings[0] != want[0] || pl.GIDMappings[0] != want[0] {
		t.Fatalf("rootless maps: uid %v gid %v", pl.UIDMappings, pl.GIDMappings)
	}
	if pl.Child.SetGroups || !pl.Rootless || pl.ToolUID != 1000 {
		t.Fatalf("rootless: setgroups %v rootless %v tool uid %d", pl.Child.SetGroups, pl.Rootless, pl.ToolUID)
	}
	// Root mode: the maps wait for a leased id block (assignIDs).
	root := mustPlan(t, "restrictive", Request{}, fakeHost(0, CgroupV1))
	if root.UIDMappings != nil || !root.Child.SetGroups || root.ToolUID != -1 || !root.UserNamespace {
		t.Fatalf("root mode: maps %v setgroups %v tool uid %d userns %v", root.UIDMappings, root.Child.SetGroups, root.ToolUID, root.UserNamespace)
	}
}

// A leased block maps the init (inside 0) to its first id and the tool
// to its second; neither is host root or 65534.
func TestAssignIDs(t *testing.T) {
	pl := mustPlan(t, "restrictive", Request{}, fakeHost(0, CgroupV1))
	base := DefaultIDRange.Start + 2*7
	pl.assignIDs(base)
	want := []IDMap{{Inside: 0, Outside: base, Size: 1}, {Inside: 65534, Outside: base + 1, Size: 1}}
	if len(pl.UIDMappings) != 2 || pl.UIDMappings[0] != want[0] || pl.UIDMappings[1] != want[1] ||
		len(pl.GIDMappings) != 2 || pl.GIDMappings[1] != want[1] {
		t.Fatalf("maps uid %v gid %v, want %v", pl.UIDMappings, pl.GIDMappings, want)
	}
	if pl.ToolUID != base+1 || pl.ToolGID != base+1 {
		t.Fatalf("tool host ids %d:%d, want %d", pl.ToolUID, pl.ToolGID, base+1)
	}
}

func TestLoadIDRange(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "STR_ID_RANGE" {
				return v
			}
			return ""
		}
	}
	sub := filepath.Join(t.TempDir(), "subuid")
	if err := os.WriteFile(sub, []byte("alice:100000:65536\nstr:300000:64\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env, subuid string
		want        IDRange
		bad         bool
	}{
		{"", "/nonexistent", DefaultIDRange, false},
		{"", sub, IDRange{Start: 300000, Count: 64, Source: sub}, false},
		{"2000000:1000", sub, IDRange{Start: 2000000, Count: 1000, Source: "STR_ID_RANGE"}, false},
		{"1000:100", "", IDRange{}, true},        // overlaps normal accounts
		{"2000000:1", "", IDRange{}, true},       // holds no sandbox
		{"4294967000:1000", "", IDRange{}, true}, // past the last id
		{"x", "", IDRange{}, true},
	} {
		got, err := LoadIDRange(env(c.env), c.subuid, hostSpace)
		if c.bad != (err != nil) || (!c.bad && got != c.want) {
			t.Errorf("STR_ID_RANGE=%q subuid %s: %+v %v, want %+v bad=%v", c.env, c.subuid, got, err, c.want, c.bad)
		}
	}
}

// Two leases never share a block while held; a released block whose
// recorded holder is gone is leased again.
func TestLeaseIDs(t *testing.T) {
	dir := t.TempDir()
	r := IDRange{Start: 5000000, Count: 4}
	a, err := leaseIDs(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := leaseIDs(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	if a.base == b.base {
		t.Fatalf("two live leases share block %d", a.base)
	}
	if _, err := leaseIDs(r, dir); !errors.Is(err, ErrNoFreeIDs) || !strings.Contains(err.Error(), "all 2 blocks") {
		t.Fatalf("a third lease of a 2-block range: %v", err)
	}
	a.Record(os.Getpid()) // our uid is not in the block: not a holder
	a.Release()
	c, err := leaseIDs(r, dir)
	if err != nil || c.base != a.base {
		t.Fatalf("released block not leased again: %v", err)
	}
	b.Release()
	c.Release()
	if names := dirNames(t, dir); len(names) != 0 {
		t.Fatalf("lease files left after every lease was released: %v (the directory must stay at the live concurrency)", names)
	}
}

// Ranges that overlap with other starts (two instances' STR_ID_RANGE, an
// odd start among them) lease one id at most once between them: a lease
// file names its block's first id, and blocks start at even ids.
func TestLeaseIDsOverlappingRanges(t *testing.T) {
	dir := t.TempDir()
	ranges := []IDRange{{Start: 5000000, Count: 8}, {Start: 5000002, Count: 8}, {Start: 5000001, Count: 9}, {Start: 5000004, Count: 2}}
	held := map[int]string{} // id -> the range that leased it
	var leases []*HostIDLease
	for {
		got := false
		for _, r := range ranges {
			l, err := leaseIDs(r, dir)
			if errors.Is(err, ErrNoFreeIDs) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			got = true
			leases = append(leases, l)
			for id := l.base; id < l.base+IDsPerSandbox; id++ {
				if by, dup := held[id]; dup {
					t.Fatalf("id %d leased by range %s and again by range %s", id, by, r)
				}
				held[id] = r.String()
			}
			if l.base < r.Start || l.base+IDsPerSandbox > r.Start+r.Count {
				t.Fatalf("range %s leased block %d-%d outside it", r, l.base, l.base+IDsPerSandbox-1)
			}
		}
		if !got {
			break
		}
	}
	// Together the ranges cover 5000000-5000009: 5 whole even blocks.
	if len(leases) != 5 {
		t.Fatalf("%d blocks leased, want the 5 of 5000000-5000009: %v", len(leases), held)
	}
	for _, l := range leases {
		l.Release()
	}
	if _, err := parseRange("5000001:2"); err == nil {
		t.Fatal("range 5000001:2 holds no even block, accepted")
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestPlanReferenceNumbers(t *testing.T) {
	type nums struct {
		as, cpu, fsize, nofile, nproc uint64
		mem, quota, pids              int64
	}
	want := map[string]nums{
		"restrictive": {512 << 20, 60, 64 << 20, 128, 32, 512 << 20, 100000, 32},
		"standard":    {1 << 30, 300, 256 << 20, 512, 128, 1 << 30, 200000, 128},
		"permissive":  {4 << 30, 600, 1 << 30, 1024, 512, 4 << 30, 400000, 512},
	}
	for name, w := range want {
		pl := mustPlan(t, name, Request{}, fakeHost(0, CgroupV2))
		got := map[string]uint64{}
		for _, r := range pl.Child.Rlimits {
			got[r.Name] = r.Value
		}
		if got["RLIMIT_AS"] != w.as || got["RLIMIT_CPU"] != w.cpu || got["RLIMIT_FSIZE"] != w.fsize ||
			got["RLIMIT_NOFILE"] != w.nofile || got["RLIMIT_NPROC"] != w.nproc || got["RLIMIT_CORE"] != 0 {
			t.Errorf("%s rlimits %v", name, got)
		}
		c := pl.Cgroup
		if c.MemoryMax != w.mem || c.SwapMax != 0 || c.CPUQuotaUs != w.quota || c.CPUPeriodUs != 100000 || c.PidsMax != w.pids {
			t.Errorf("%s cgroup %+v", name, c)
		}
	}
}

func TestPlanMountsOrderAndFlags(t *testing.T) {
	pl := mustPlan(t, "standard", Request{Workdir: "/work", Binds: []Bind{{Source: "/data", Target: "/tmp/data/in"}}}, fakeHost(0, CgroupV1))
	pos := map[string]int{}
	for i, m := range pl.Child.Mounts {
		pos[m.Target] = i
		if m.Kind == nsinit.MountBind && m.Target != "/work" && !m.ReadOnly {
			t.Errorf("bind %s is writable", m.Target)
		}
	}
	for _, order := range [][2]string{{"/tmp", "/tmp/data/in"}, {"/usr", "/etc/passwd"}, {"/dev", "/dev/null"}, {"/dev", "/dev/pts"}} {
		a, okA := pos[order[0]]
		b, okB := pos[order[1]]
		if !okA || !okB || a > b {
			t.Errorf("%s must be mounted before %s (positions %d %v, %d %v)", order[0], order[1], a, okA, b, okB)
		}
	}
	// Merged-usr symlinks are recreated, not bound.
	for _, m := range pl.Child.Mounts {
		if m.Target == "/lib" && (m.Kind != nsinit.MountSymlink || m.Source != "usr/lib") {
			t.Errorf("/lib: %+v, want symlink to usr/lib", m)
		}
	}
	if pl.Child.Workdir != "/work" {
		t.Errorf("workdir %q", pl.Child.Workdir)
	}
	for _, must := range []string{"/proc", "/dev/shm", "/var/run/secrets", "/etc/passwd", "/etc/group"} {
		if _, ok := pos[must]; !ok {
			t.Errorf("plan lacks %s", must)
		}
	}
}

func TestPlanEnvironmentRebuilt(t *testing.T) {
	pl := mustPlan(t, "standard", Request{Env: []string{"FOO=bar"}}, fakeHost(0, CgroupV1))
	env := strings.Join(pl.Child.Env, " ")
	for _, w := range []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "TMPDIR=/tmp", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1", "FOO=bar"} {
		if !strings.Contains(env, w) {
			t.Errorf("env lacks %s: %s", w, env)
		}
	}
	if strings.Contains(env, "SECRET") {
		t.Errorf("caller environment leaked: %s", env)
	}
	rpl := mustPlan(t, "restrictive", Request{}, fakeHost(0, CgroupV1))
	if strings.Contains(strings.Join(rpl.Child.Env, " "), "PYTHONUNBUFFERED") {
		t.Errorf("restrictive passes PYTHONUNBUFFERED through: %v", rpl.Child.Env)
	}
}

func TestPlanCollectsEveryProblem(t *testing.T) {
	set, _ := profiles.Embedded()
	p, _ := set.Lookup("standard")
	_, err := NewPlan(p, Request{
		Workdir: "relative/dir",
		Binds:   []Bind{{Source: "/nonexistent"}, {Source: "/data", Target: "/proc/x"}},
		Env:     []string{"NOEQUALS"},
	}, fakeHost(0, CgroupNone), nil)
	if err == nil {
		t.Fatal("no error")
	}
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("not ErrInvalidRequest: %v", err)
	}
	for _, w := range []string{"no command", "relative/dir", "/nonexistent", "/proc/x", "NOEQUALS", "no writable cgroup"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q:\n%v", w, err)
		}
	}
}

func TestPlanTimeoutOnlyShortens(t *testing.T) {
	pl := mustPlan(t, "restrictive", Request{Timeout: 5 * time.Second}, fakeHost(0, CgroupV1))
	if pl.Timeout != 5*time.Second {
		t.Fatalf("timeout %v", pl.Timeout)
	}
	pl = mustPlan(t, "restrictive", Request{Timeout: time.Hour}, fakeHost(0, CgroupV1))
	if pl.Timeout != 60*time.Second {
		t.Fatalf("a longer request timeout must not extend the profile's: %v", pl.Timeout)
	}
}

// The launcher refuses loosening before anything is created.
func TestLauncherPlanRefusesLoosening(t *testing.T) {
	l := &Launcher{host: fakeHost(0, CgroupV1)}
	var err error
	if l.profiles, err = profiles.Embedded(); err != nil {
		t.Fatal(err)
	}
	_, err = l.Plan(Request{Profile: "restrictive", Argv: []string{"/bin/true"}, Memory: 2 << 30, Network: &egress.Policy{Mode: egress.AllowEgress}})
	if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "memory") || !strings.Contains(err.Error(), "network") {
		t.Fatalf("loosening: %v", err)
	}
	_, err = l.Plan(Request{Profile: "no-such", Argv: []string{"/bin/true"}})
	if !errors.Is(err, ErrInvalidRequest) || !errors.Is(err, profiles.ErrUnknownProfile) {
		t.Fatalf("unknown profile: %v", err)
	}
	pl, err := l.Plan(Request{Profile: "untrusted", Argv: []string{"/bin/true"}})
	if err != nil || pl.Profile != "restrictive" || len(pl.Child.Seccomp) == 0 {
		t.Fatalf("alias untrusted: %v %+v", err, pl)
	}
}

// A profile from the operator's directory may name a seccomp policy file;
// it is compiled (libseccomp, self-checked) once per launcher, and an
// unchanged copy of an embedded policy compiles to the same program.
func TestPolicyFileCompiled(t *testing.T) {
	dir := t.TempDir()
	pol, err := os.ReadFile("../seccomp/policies/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	polFile := filepath.Join(dir, "mine.yaml")
	if err := os.WriteFile(polFile, pol, 0o644); err != nil {
		t.Fatal(err)
	}
	prof, err := os.ReadFile("../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.NewReplacer("name: restrictive", "name: mine", "aliases: [untrusted]", "aliases: []",
		"seccomp: restrictive", "seccomp: "+polFile).Replace(string(prof))
	pdir := filepath.Join(dir, "profiles")
	if err := os.Mkdir(pdir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir, "mine.yaml"), []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := New(Options{ProfileDir: pdir, Decoder: profileyaml.Decoder{}})
	if err != nil {
		t.Fatal(err)
	}
	mine, err := l.Plan(Request{Profile: "mine", Argv: []string{"/bin/true"}})
	if err != nil {
		t.Fatal(err)
	}
	emb, err := l.Plan(Request{Profile: "restrictive", Argv: []string{"/bin/true"}})
	if err != nil {
		t.Fatal(err)
	}
	if mine.Child.SeccompPolicy != "restrictive" || !bytes.Equal(mine.Child.Seccomp, emb.Child.Seccomp) || len(mine.Seccomp) == 0 {
		t.Fatalf("policy file %s: policy %q, %d bytes, %d rule views; embedded: %d bytes",
			polFile, mine.Child.SeccompPolicy, len(mine.Child.Seccomp), len(mine.Seccomp), len(emb.Child.Seccomp))
	}
	if _, ok := l.policyFiles.Load(polFile); !ok {
		t.Fatal("the compiled policy file is not cached")
	}
}

// The egress listeners follow the policy: proxy and DNS always, capture
// ports for what proxy-unaware clients may reach; the tool's environment
// points at the proxy, and resolv.conf at the stub.
func TestPlanEgressListeners(t *testing.T) {
	names := func(pl *Plan) []string {
		var n []string
		for _, l := range pl.Child.Listen {
			n = append(n, l.Name+"="+l.Network+"/"+l.Addr)
		}
		return n
	}
	iso := mustPlan(t, "restrictive", Request{}, fakeHost(0, CgroupV1))
	if got := strings.Join(names(iso), " "); got != "proxy=tcp/127.0.0.1:3128 dns-udp=udp/127.0.0.1:53 dns-tcp=tcp/127.0.0.1:53" {
		t.Fatalf("isolated listeners: %s", got)
	}
	std := mustPlan(t, "standard", Request{}, fakeHost(0, CgroupV1))
	if got := strings.Join(names(std), " "); !strings.Contains(got, "capture-80=tcp/0.0.0.0:80") || !strings.Contains(got, "capture-443=tcp/0.0.0.0:443") {
		t.Fatalf("allow_egress listeners: %s", got)
	}
	if !slices.Contains(std.Child.Env, "HTTPS_PROXY=http://127.0.0.1:3128") || !slices.Contains(iso.Child.Env, "STR_NETWORK=isolated") ||
		slices.ContainsFunc(iso.Child.Env, func(e string) bool { return strings.HasPrefix(e, "HTTPS_PROXY=") }) {
		t.Fatalf("environment: standard %v isolated %v", std.Child.Env, iso.Child.Env)
	}
	var resolv string
	for _, m := range std.Child.Mounts {
		if m.Target == "/etc/resolv.conf" {
			resolv = m.Contents
		}
	}
	if resolv != egress.ResolvConf() {
		t.Fatalf("/etc/resolv.conf: %q", resolv)
	}
}

// TestFitTimeout pins the one place a sandbox's wall clock meets its
// profile's: asked, at most the profile's, 0 = the profile's, and a
// profile without a timeout keeps what was asked. The plan's Timeout is
// FitTimeout's for every row (the plan does not fit a second way).
func TestFitTimeout(t *testing.T) {
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	restrictive, _ := set.Lookup("restrictive") // timeout: 60s
	unbounded := *restrictive
	unbounded.Timeout = 0
	for _, c := range []struct {
		prof  *profiles.Profile
		asked time.Duration
		want  time.Duration
	}{
		{restrictive, 0, 60 * time.Second},
		{restrictive, 5 * time.Second, 5 * time.Second},
		{restrictive, 60 * time.Second, 60 * time.Second},
		{restrictive, 65 * time.Second, 60 * time.Second},
		{&unbounded, 0, 0},
		{&unbounded, time.Hour, time.Hour},
	} {
		if got := FitTimeout(c.prof, c.asked); got != c.want {
			t.Errorf("FitTimeout(timeout %v, asked %v) = %v, want %v", c.prof.Timeout, c.asked, got, c.want)
		}
		if c.asked > time.Duration(c.prof.Timeout) && c.prof.Timeout > 0 {
			continue // the plan takes a tightened profile: Tighten refused this one before
		}
		pl, err := NewPlan(c.prof, Request{Argv: []string{"/bin/true"}, Timeout: c.asked}, fakeHost(0, CgroupV1), nil)
		if err != nil {
			t.Fatal(err)
		}
		if pl.Timeout != c.want {
			t.Errorf("plan timeout %v for asked %v, want FitTimeout's %v", pl.Timeout, c.asked, c.want)
		}
	}
}

// planLauncher is a Launcher that only plans (embedded profiles, a
// root-mode fake host): no privilege needed.
func planLauncher(t testing.TB) *Launcher {
	t.Helper()
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	return &Launcher{profiles: set, host: fakeHost(0, CgroupV1), log: slog.New(slog.DiscardHandler)}
}

// TestPlanAwaitCall: a pre-built sandbox's plan has no command, waits
// unarmed and tells the init to await its call (step 10a); any other
// combination is refused, and a plain request still needs a command.
func TestPlanAwaitCall(t *testing.T) {
	l := planLauncher(t)
	pl, err := l.Plan(Request{Profile: "restrictive", AwaitCall: true, Idle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if !pl.Child.AwaitCall || len(pl.Child.Argv) != 0 || pl.Idle != time.Minute {
		t.Fatalf("await_call %v argv %q idle %v", pl.Child.AwaitCall, pl.Child.Argv, pl.Idle)
	}
	for _, req := range []Request{
		{Profile: "restrictive", AwaitCall: true},
		{Profile: "restrictive", AwaitCall: true, Idle: time.Minute, Argv: []string{"/bin/true"}},
		{Profile: "restrictive"},
	} {
		if _, err := l.Plan(req); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%+v: %v, want ErrInvalidRequest", req, err)
		}
	}
	if pl, err := l.Plan(Request{Profile: "restrictive", Argv: []string{"/bin/true"}}); err != nil || pl.Child.AwaitCall {
		t.Errorf("a one-shot plan: await_call %v, %v", pl != nil && pl.Child.AwaitCall, err)
	}
}

// Without a cgroup this caller may write: an unprivileged caller's plan
// runs without the limits and says so (plan, warning), unless the
// operator requires a cgroup (then only best_effort runs); root's stays
// an error unless best_effort, as before.
func TestPlanWithoutCgroup(t *testing.T) {
	set, _ := profiles.Embedded()
	std, _ := set.Lookup("standard")
	be := *std
	be.BestEffort = true
	unlimited := *std
	unlimited.Rlimits.AS = profiles.UnlimitedAS
	for _, c := range []struct {
		name    string
		uid     int
		require bool
		p       *profiles.Profile
		want    string // Unenforced, or "error"
	}{
		{"rootless", 65534, false, std, "not delegated to uid 65534"},
		{"rootless, required", 65534, true, std, "error"},
		{"rootless, required, best_effort", 65534, true, &be, "not delegated to uid 65534"},
		{"root", 0, false, std, "error"},
		{"root, best_effort", 0, false, &be, "no writable cgroup hierarchy (best_effort)"},
		{"rootless, rlimits.as unlimited", 65534, false, &unlimited, "error"},
	} {
		host := fakeHost(c.uid, CgroupNone)
		host.RequireCgroup = c.require
		pl, err := NewPlan(c.p, Request{Argv: []string{"/bin/true"}}, host, nil)
		if c.want == "error" {
			if err == nil || !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "cgroup") {
				t.Errorf("%s: want a cgroup error, got %v", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if pl.Cgroup.Mode != CgroupNone || pl.Cgroup.Unenforced != c.want {
			t.Errorf("%s: cgroup %+v, want unenforced %q", c.name, pl.Cgroup, c.want)
		}
		if w := pl.Cgroup.Warning(); !strings.Contains(w, c.want) || !strings.Contains(w, "str doctor") || !strings.Contains(w, "not applied") {
			t.Errorf("%s: warning %q", c.name, w)
		}
	}
	// With a cgroup there is nothing to warn about.
	if w := mustPlan(t, "standard", Request{}, fakeHost(65534, CgroupV1)).Cgroup.Warning(); w != "" {
		t.Errorf("a plan with its cgroup warns: %q", w)
	}
}

// TestSetCallerSeccomp: a caller's own filters (str bwrap's) replace the
// profile's policy unless the profile's caller_seccomp is stack; no
// caller's filter leaves the profile's in place.
func TestSetCallerSeccomp(t *testing.T) {
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	p, err := set.Lookup("nesting")
	if err != nil {
		t.Fatal(err)
	}
	prog, err := seccomp.CompileEmbedded(p.Seccomp)
	if err != nil {
		t.Fatal(err)
	}
	caller := [][]byte{make([]byte, 8), make([]byte, 16)}
	for _, c := range []struct {
		mode    string
		progs   [][]byte
		keepsIt bool
	}{{"", caller, false}, {profiles.CallerSeccompReplace, caller, false}, {profiles.CallerSeccompStack, caller, true}, {"", nil, true}} {
		q := *p
		q.CallerSeccomp = c.mode
		pl, err := NewPlan(&q, Request{Argv: []string{"/bin/true"}}, fakeHost(0, CgroupV1), prog)
		if err != nil {
			t.Fatal(err)
		}
		pl.SetCallerSeccomp(c.progs)
		kept := pl.Child.SeccompPolicy == "nesting" && len(pl.Child.Seccomp) > 0
		if kept != c.keepsIt || len(pl.Child.ExtraSeccomp) != len(c.progs) {
			t.Errorf("caller_seccomp %q, %d filters: profile's kept %v, %d caller's; want kept %v", c.mode, len(c.progs), kept, len(pl.Child.ExtraSeccomp), c.keepsIt)
		}
	}
}

// The caller's network (str bwrap, a line without --unshare-net) is a
// plan without CLONE_NEWNET, lo, listeners or proxy variables, granted
// only under a profile whose share_caller_network is allow; a request
// that does not ask (str run, the worker) always has its own namespace.
func TestPlanCallerNetwork(t *testing.T) {
	for _, c := range []struct {
		profile string
		ask     bool
		shared  bool
	}{
		{"standard", true, true}, {"permissive", true, true},
		{"restrictive", true, false}, {"confidential", true, false},
		{"standard", false, false}, {"permissive", false, false},
	} {
		for _, uid := range []int{0, 1000} {
			pl := mustPlan(t, c.profile, Request{Argv: []string{"true"}, CallerNetwork: c.ask}, fakeHost(uid, CgroupV2))
			proxyVars := slices.ContainsFunc(pl.Child.Env, func(kv string) bool {
				return strings.HasPrefix(kv, "HTTP_PROXY=") || strings.HasPrefix(kv, "STR_NETWORK=")
			})
			ownNet := pl.CloneFlags&unix.CLONE_NEWNET != 0
			if pl.CallerNetwork != c.shared || ownNet == c.shared || pl.Child.LoopbackUp == c.shared ||
				(len(pl.Child.Listen) == 0) != c.shared || proxyVars == c.shared || slices.Contains(pl.CloneNames, "CLONE_NEWNET") == c.shared {
				t.Errorf("%s, asked %v, uid %d: caller network %v, CLONE_NEWNET %v, lo up %v, %d listeners, proxy variables %v; want shared %v",
					c.profile, c.ask, uid, pl.CallerNetwork, ownNet, pl.Child.LoopbackUp, len(pl.Child.Listen), proxyVars, c.shared)
			}
		}
	}
}

// A block a joiner holds (joinLease's marker for a live launcher) is not
// leased again after its own holder released it; once the joiner's
// launcher is gone its marker is stale, removed, and the block leased.
func TestLeaseIDsHonoursJoiners(t *testing.T) {
	dir := t.TempDir()
	r := IDRange{Start: 5000000, Count: 2} // one block
	a, err := leaseIDs(r, dir)
	if err != nil {
		t.Fatal(err)
	}
	marks := filepath.Join(dir, strconv.Itoa(a.base)+".join")
	if err := os.Mkdir(marks, 0o700); err != nil {
		t.Fatal(err)
	}
	mark := filepath.Join(marks, strconv.Itoa(os.Getpid())) // a live launcher
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a.Release()
	if _, err := leaseIDs(r, dir); !errors.Is(err, ErrNoFreeIDs) {
		t.Fatalf("a block a live joiner holds was leased: %v", err)
	}
	// A dead launcher: a reaped child's pid.
	cmd := exec.Command("/bin/true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(mark, filepath.Join(marks, strconv.Itoa(cmd.Process.Pid))); err != nil {
		t.Fatal(err)
	}
	b, err := leaseIDs(r, dir)
	if err != nil || b.base != a.base {
		t.Fatalf("a block whose joiner is gone was not leased again: %v", err)
	}
	b.Release()
	if _, err := os.Stat(marks); !os.IsNotExist(err) {
		t.Fatalf("the stale joiner's markers were left: %v", err)
	}
}
