package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// BaseProfile is the profile an installation sandbox is planned on (its
// mounts, limits and seccomp policy; the network is the installation's
// own).
const BaseProfile = "standard"

// DefaultTimeout bounds an installation when the spec gives none.
const DefaultTimeout = 10 * time.Minute

// Spec is one package installation.
type Spec struct {
	// Python is the interpreter the tools run with (absolute path); pip
	// runs as "Python -I -m pip".
	Python string
	// Requirement is a distribution name with optional PEP 440 specifiers
	// ("pyfiglet", "requests>=2,<3").
	Requirement string
	// Target is an existing, empty host directory (absolute, clean): pip
	// --target. It is bound writable at the same path.
	Target string
	// WheelsDir is a host directory of wheels (and sdists) bound read-only:
	// pip --no-index --find-links. Exactly one of WheelsDir and IndexURL.
	WheelsDir string
	// IndexURL is a PEP 503 simple index (http or https).
	IndexURL string
	// ExtraHosts are more hosts (port 443) the index's files are served
	// from, e.g. files.pythonhosted.org for pypi.org.
	ExtraHosts []string
	// AllowBuilds lets pip build source distributions (their build code
	// then runs in this sandbox); by default only wheels are installed.
	AllowBuilds bool
	// Timeout bounds the run; 0 = DefaultTimeout.
	Timeout time.Duration
	// Output receives pip's standard output and error.
	Output io.Writer
}

// Result is how an installation ended.
type Result struct {
	Sandbox *launcher.Result
	// Network is the policy the sandbox had (for the caller's log).
	Network egress.Policy
}

// requirementRE is compiled at its first use, not at every str start
// (package init: 2.5 % of a `str run --serve` client's CPU, perf).
var requirementRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\s*(===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+(\s*,\s*(===|==|!=|~=|>=|<=|>|<)\s*[A-Za-z0-9.*+!_-]+)*)?$`)
})

// Plan checks spec (I1) and returns the sandbox request and its network
// policy (I2). Problems wrap launcher.ErrInvalidRequest, all at once.
func Plan(spec Spec) (launcher.Request, egress.Policy, error) {
	var problems []error
	bad := func(format string, a ...any) {
		problems = append(problems, fmt.Errorf("%w: install: "+format, append([]any{launcher.ErrInvalidRequest}, a...)...))
	}
	absClean := func(what, p string) bool {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || p == "/" {
			bad("%s %q must be an absolute, clean path other than /", what, p)
			return false
		}
		return true
	}
	// I1. the spec.
	absClean("interpreter", spec.Python)
	if !requirementRE().MatchString(spec.Requirement) {
		bad("requirement %q is not a distribution name with optional version specifiers", spec.Requirement)
	}
	absClean("target", spec.Target)
	switch {
	case spec.WheelsDir != "" && spec.IndexURL != "":
		bad("both a wheels folder (%s) and an index (%s): give one", spec.WheelsDir, spec.IndexURL)
	case spec.WheelsDir == "" && spec.IndexURL == "":
		bad("neither a wheels folder nor an index to install %s from", spec.Requirement)
	case spec.WheelsDir != "":
		if absClean("wheels folder", spec.WheelsDir) && (launcher.PathUnder(spec.Target, spec.WheelsDir) || launcher.PathUnder(spec.WheelsDir, spec.Target)) {
			bad("target %s and wheels folder %s overlap", spec.Target, spec.WheelsDir)
		}
	}
	// I2. the network.
	network := egress.Policy{Mode: egress.Isolated}
	if spec.IndexURL != "" {
		var err error
		if network, err = indexPolicy(spec.IndexURL, spec.ExtraHosts); err != nil {
			bad("%v", err)
		}
	}
	if len(problems) > 0 {
		return launcher.Request{}, egress.Policy{}, errors.Join(problems...)
	}
	argv := []string{spec.Python, "-I", "-m", "pip", "install",
		"--isolated", "--no-input", "--disable-pip-version-check", "--no-cache-dir",
		"--no-warn-script-location", "--progress-bar", "off", "--target", spec.Target}
	if !spec.AllowBuilds {
		// Wheels only: building an sdist runs its build code.
		argv = append(argv, "--only-binary=:all:")
	}
	binds := []launcher.Bind{{Source: spec.Target, Writable: true}}
	if spec.WheelsDir != "" {
		argv = append(argv, "--no-index", "--find-links", spec.WheelsDir)
		binds = append(binds, launcher.Bind{Source: spec.WheelsDir})
	} else {
		// The proxy named explicitly: pip would otherwise honour NO_PROXY
		// (loopback names) and bypass it for an index on a loopback
		// address; every byte goes through the policy's proxy.
		argv = append(argv, "--proxy", "http://"+egress.ProxyAddr, "--index-url", spec.IndexURL)
	}
	argv = append(argv, "--", spec.Requirement)
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	req := launcher.Request{Profile: BaseProfile, Argv: argv, Binds: binds, Timeout: timeout,
		Env: []string{"PYTHONDONTWRITEBYTECODE=1"}, Stdout: spec.Output, Stderr: spec.Output}
	return req, network, nil
}

// indexPolicy is the restricted policy that reaches the index URL's host
// and port only (and extra file hosts on 443). An IP-literal host is
// reachable only through an explicit /32 (/128) prefix.
func indexPolicy(raw string, extra []string) (egress.Policy, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return egress.Policy{}, fmt.Errorf("index URL %q: %v", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		return egress.Policy{}, fmt.Errorf("index URL %q: want http(s)://host[:port]/path without credentials", raw)
	}
	port := 443
	if u.Scheme == "http" {
		port = 80
	}
	if ps := u.Port(); ps != "" {
		if port, err = strconv.Atoi(ps); err != nil || port < 1 || port > 65535 {
			return egress.Policy{}, fmt.Errorf("index URL %q: port %q", raw, ps)
		}
	}
	p := egress.Policy{Mode: egress.Restricted, AllowedPorts: []int{port}, OnViolation: "report"}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		p.AllowedCIDRs = []string{netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()).String()}
	} else {
		p.AllowedHosts = []string{u.Hostname()}
	}
	for _, h := range extra {
		if net.ParseIP(h) != nil || strings.ContainsAny(h, "*/:") {
			return egress.Policy{}, fmt.Errorf("extra package host %q: want a host name", h)
		}
		p.AllowedHosts = append(p.AllowedHosts, h)
		if port != 443 {
			p.AllowedPorts = append(p.AllowedPorts, 443)
		}
	}
	if err := p.Validate(); err != nil {
		return egress.Policy{}, fmt.Errorf("index URL %q: network policy: %w", raw, err)
	}
	return p, nil
}

// planSandbox is I3: the base profile with the installation's network,
// set by the installation itself (not a caller's override: a restricted
// policy with an index on a private or loopback address is no narrowing
// of the base profile's allow_egress, and an installation may take longer
// than one tool call). host and program are the launcher's
// (Launcher.Host, Launcher.SeccompProgram).
func planSandbox(set *profiles.Set, host launcher.Host, program func(string) (*seccomp.Program, error), req launcher.Request, network egress.Policy) (*launcher.Plan, error) {
	prof, err := set.Lookup(BaseProfile)
	if err != nil {
		return nil, fmt.Errorf("launcher: install: %w", err)
	}
	tight, err := prof.Tighten(profiles.Overrides{})
	if err != nil {
		return nil, fmt.Errorf("launcher: install: %w", err)
	}
	tight.Network = network
	tight.Timeout = profiles.Duration(req.Timeout)
	prog, err := program(tight.Seccomp)
	if err != nil {
		return nil, fmt.Errorf("launcher: install: seccomp policy %q: %w", tight.Seccomp, err)
	}
	return launcher.NewPlan(tight, req, host, prog)
}

// PlanSandbox is Plan plus the sandbox's plan on l (what `str profile
// show` would print for it).
func PlanSandbox(l *launcher.Launcher, spec Spec) (*launcher.Plan, launcher.Request, error) {
	req, network, err := Plan(spec)
	if err != nil {
		return nil, launcher.Request{}, err
	}
	pl, err := planSandbox(l.Profiles(), l.Host(), l.SeccompProgram, req, network)
	if err != nil {
		return nil, req, err
	}
	pl.IDRange = l.IDRange()
	return pl, req, nil
}

// Run runs pip for spec in a sandbox of l's own (I1-I6). The error is
// set when the sandbox could not run or pip failed; the target then holds
// whatever pip left, taken back (I6) like a success.
func Run(ctx context.Context, l *launcher.Launcher, spec Spec) (out *Result, err error) {
	// I1-I3.
	pl, req, err := PlanSandbox(l, spec)
	if err != nil {
		return nil, err
	}
	out = &Result{Network: pl.Network}
	if err := checkEmptyDir(spec.Target); err != nil {
		return out, fmt.Errorf("launcher: install %s: step I1 check target %s is an empty directory: %w", spec.Requirement, spec.Target, err)
	}
	// I4.
	sb, err := l.CreateFromPlan(ctx, pl, req)
	if err != nil {
		return out, err
	}
	uid, gid := sb.Plan().ToolUID, sb.Plan().ToolGID
	if err := os.Lchown(spec.Target, uid, gid); err != nil {
		sb.Kill()
		return out, fmt.Errorf("launcher: install %s: step I4 hand target %s to the sandbox's uid %d:%d: %w", spec.Requirement, spec.Target, uid, gid, err)
	}
	// I6 on every path from here.
	defer func() {
		if rerr := reclaimTree(spec.Target, l.Host().UID, l.Host().GID); rerr != nil {
			err = errors.Join(err, fmt.Errorf("launcher: install %s: step I6 take back target %s: %w", spec.Requirement, spec.Target, rerr))
		}
	}()
	// I5.
	if err = sb.Start(); err != nil {
		sb.Kill()
		return out, err
	}
	res, err := sb.Wait()
	if err != nil {
		return out, err
	}
	out.Sandbox = res
	switch {
	case res.SetupError != nil:
		err = res.SetupError
	case res.TimedOut:
		err = fmt.Errorf("launcher: install %s: pip did not finish within %s", spec.Requirement, req.Timeout)
	case res.ExitCode != 0:
		err = fmt.Errorf("launcher: install %s: pip exited with status %d", spec.Requirement, res.ExitCode)
	}
	if err != nil && len(res.Violations) > 0 {
		// What pip tried to reach and the policy refused: the usual cause
		// of "no matching distribution" behind a restricted index.
		var denied []string
		for _, v := range res.Violations {
			host := v.Host
			if host == "" {
				host = v.IP
			}
			denied = append(denied, fmt.Sprintf("%s (%s)", net.JoinHostPort(host, strconv.Itoa(v.Port)), v.Reason))
		}
		err = fmt.Errorf("%w; the installation's network policy (%s) denied %s", err, out.Network.Mode, strings.Join(denied, ", "))
	}
	return out, err
}

// under reports whether path is dir or below it.

func checkEmptyDir(p string) error {
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return errors.New("not a directory")
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	if names, _ := f.Readdirnames(1); len(names) > 0 {
		return errors.New("not empty")
	}
	return nil
}

// reclaimTree is I6: the tree under root (which the sandbox's uid owned)
// becomes the launcher's and read-only to everyone else. It never follows
// a symlink (Lchown; symlinks keep their mode), removes FIFOs, sockets
// and devices, and clears setuid/setgid bits.
func reclaimTree(root string, uid, gid int) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		t := d.Type()
		switch {
		case t&fs.ModeSymlink != 0:
			return os.Lchown(p, uid, gid)
		case t.IsDir(), t.IsRegular():
		default:
			return os.Remove(p)
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		// chmod after chown: chown may clear setuid, never the other way
		mode := fi.Mode().Perm() &^ 0o022
		if t.IsDir() {
			mode |= 0o755
		} else {
			mode |= 0o444
			if mode&0o100 != 0 {
				mode |= 0o111
			}
		}
		return unix.Fchmodat(unix.AT_FDCWD, p, uint32(mode), 0)
	})
}
