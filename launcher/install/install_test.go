package install

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// TestPlanInstall: what an installation sandbox runs and reaches, per
// source (issue 18 §1).
func TestPlanInstall(t *testing.T) {
	base := Spec{Python: "/usr/bin/python3", Requirement: "pyfiglet>=1.0,<2", Target: "/site/.staging-pyfiglet-1"}

	// The wheels folder: isolated, read-only, wheels only.
	spec := base
	spec.WheelsDir = "/tools/wheels"
	req, network, err := Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/usr/bin/python3", "-I", "-m", "pip", "install", "--isolated", "--no-input", "--disable-pip-version-check",
		"--no-cache-dir", "--no-warn-script-location", "--progress-bar", "off", "--target", "/site/.staging-pyfiglet-1",
		"--only-binary=:all:", "--no-index", "--find-links", "/tools/wheels", "--", "pyfiglet>=1.0,<2"}
	if !slices.Equal(req.Argv, want) {
		t.Errorf("argv %q\nwant %q", req.Argv, want)
	}
	if network.Mode != egress.Isolated {
		t.Errorf("network %+v, want isolated", network)
	}
	if wb := []launcher.Bind{{Source: "/site/.staging-pyfiglet-1", Writable: true}, {Source: "/tools/wheels"}}; !slices.Equal(req.Binds, wb) {
		t.Errorf("binds %+v, want %+v", req.Binds, wb)
	}
	if req.Profile != BaseProfile || req.Timeout != DefaultTimeout || req.Workdir != "" {
		t.Errorf("request %+v", req)
	}

	// An index on a loopback address: restricted to that address and
	// port; builds allowed on request.
	spec = base
	spec.IndexURL, spec.AllowBuilds = "http://127.0.0.1:8080/simple/", true
	req, network, err = Plan(spec)
	if err != nil {
		t.Fatal(err)
	}
	if network.Mode != egress.Restricted || !slices.Equal(network.AllowedCIDRs, []string{"127.0.0.1/32"}) ||
		!slices.Equal(network.AllowedPorts, []int{8080}) || len(network.AllowedHosts) != 0 {
		t.Errorf("network %+v", network)
	}
	if slices.Contains(req.Argv, "--only-binary=:all:") || !slices.Contains(req.Argv, "http://127.0.0.1:8080/simple/") ||
		!slices.Contains(req.Argv, "http://"+egress.ProxyAddr) || len(req.Binds) != 1 {
		t.Errorf("argv %q binds %+v", req.Argv, req.Binds)
	}

	// A named index and the hosts its files come from.
	spec = base
	spec.IndexURL, spec.ExtraHosts = "https://pypi.org/simple", []string{"files.pythonhosted.org"}
	if _, network, err = Plan(spec); err != nil {
		t.Fatal(err)
	}
	if network.Mode != egress.Restricted || !slices.Equal(network.AllowedHosts, []string{"pypi.org", "files.pythonhosted.org"}) ||
		!slices.Equal(network.AllowedPorts, []int{443}) || len(network.AllowedCIDRs) != 0 {
		t.Errorf("network %+v", network)
	}

	// Refused, every problem at once.
	bad := Spec{Python: "python3", Requirement: "--index-url=http://evil", Target: "site/x", WheelsDir: "/w", IndexURL: "http://u:p@h/"}
	_, _, err = Plan(bad)
	if !errors.Is(err, launcher.ErrInvalidRequest) {
		t.Fatalf("Plan(bad) = %v", err)
	}
	for _, w := range []string{`interpreter "python3"`, `requirement "--index-url=http://evil"`, `target "site/x"`, "both a wheels folder"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error lacks %q: %v", w, err)
		}
	}
	for _, c := range []struct {
		mod  func(*Spec)
		want string
	}{
		{func(s *Spec) {}, "neither a wheels folder nor an index"},
		{func(s *Spec) { s.IndexURL = "http://u:p@h/" }, "without credentials"},
		{func(s *Spec) { s.IndexURL = "file:///etc" }, "want http(s)"},
		{func(s *Spec) { s.Requirement = "a b" }, "not a distribution name"},
		{func(s *Spec) { s.Requirement = "a;rm -rf /" }, "not a distribution name"},
		{func(s *Spec) { s.IndexURL, s.ExtraHosts = "https://pypi.org/simple", []string{"*.evil"} }, "want a host name"},
		{func(s *Spec) { s.WheelsDir = "/site" }, "overlap"},
	} {
		s := base
		c.mod(&s)
		if _, _, err := Plan(s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", s, err, c.want)
		}
	}
}

// TestPlanInstallSandbox: the installation's plan is the base profile's
// with the installation's network, and the target is its only writable
// host path.
func TestPlanInstallSandbox(t *testing.T) {
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	// This machine's paths, planned as root mode on cgroup v2 (planning
	// touches nothing).
	host := launcher.Host{UID: 0, GID: 0, Root: true, Cgroup: launcher.CgroupV2, Getenv: os.Getenv}
	target := filepath.Join(t.TempDir(), ".staging-x")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	req, network, err := Plan(Spec{Python: "/usr/bin/python3", Requirement: "x==1", Target: target,
		IndexURL: "http://10.1.2.3:3141/root/pypi/+simple/"})
	if err != nil {
		t.Fatal(err)
	}
	pl, err := planSandbox(set, host, seccomp.CompileEmbedded, req, network)
	if err != nil {
		t.Fatal(err)
	}
	if pl.Profile != BaseProfile || pl.Timeout != DefaultTimeout || !slices.Equal(pl.Child.Argv, req.Argv) {
		t.Errorf("plan %s, timeout %s, argv %q", pl.Profile, pl.Timeout, pl.Child.Argv)
	}
	if pl.Network.Mode != egress.Restricted || !slices.Equal(pl.Network.AllowedCIDRs, []string{"10.1.2.3/32"}) || !slices.Equal(pl.Network.AllowedPorts, []int{3141}) {
		t.Errorf("plan network %+v", pl.Network)
	}
	if !slices.Contains(pl.Child.Env, "HTTPS_PROXY=http://"+egress.ProxyAddr) {
		t.Errorf("env %q: pip finds the proxy through HTTPS_PROXY", pl.Child.Env)
	}
	var writable []string
	for _, m := range pl.Child.Mounts {
		if m.Kind == nsinit.MountBind && !m.ReadOnly {
			writable = append(writable, m.Source)
		}
	}
	if !slices.Equal(writable, []string{target}) {
		t.Errorf("writable host binds %q, want only the target", writable)
	}
}

// TestReclaimTree: after an installation the target is the launcher's,
// nothing in it is writable by others or setuid, and FIFOs are removed;
// symlinks are not followed.
func TestReclaimTree(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(outside, nil, 0o600))
	must(os.MkdirAll(filepath.Join(root, "pkg", "sub"), 0o777))
	must(os.WriteFile(filepath.Join(root, "pkg", "mod.py"), nil, 0o666))
	must(os.WriteFile(filepath.Join(root, "pkg", "tool"), nil, 0o4777))
	must(os.Symlink(outside, filepath.Join(root, "pkg", "link")))
	must(unix.Mkfifo(filepath.Join(root, "pkg", "fifo"), 0o666))
	must(os.Chmod(filepath.Join(root, "pkg", "sub"), 0o777))
	must(reclaimTree(root, os.Geteuid(), os.Getegid()))
	for p, want := range map[string]os.FileMode{"pkg": 0o755 | fs.ModeDir, "pkg/sub": 0o755 | fs.ModeDir, "pkg/mod.py": 0o644, "pkg/tool": 0o755} {
		fi, err := os.Lstat(filepath.Join(root, p))
		must(err)
		if fi.Mode() != want {
			t.Errorf("%s: mode %s, want %s", p, fi.Mode(), want)
		}
	}
	if _, err := os.Lstat(filepath.Join(root, "pkg", "fifo")); !os.IsNotExist(err) {
		t.Errorf("the FIFO is still there: %v", err)
	}
	if fi, _ := os.Stat(outside); fi.Mode().Perm() != 0o600 {
		t.Errorf("the symlink's target changed: %s", fi.Mode())
	}
}
