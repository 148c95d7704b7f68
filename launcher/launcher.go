package launcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/helper"
	"github.com/securetoolruntime/str/launcher/intercept"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/launcher/statedir"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// StepError is the launcher's and nsinit's one error type: it names the
// step, the object and the cause.
type StepError = nsinit.StepError

// Options configure a Launcher.
type Options struct {
	// ProfileDir holds extra *.yaml profiles loaded next to the embedded
	// ones, decoded by Decoder.
	ProfileDir string
	// Decoder decodes an operator's YAML: ProfileDir, and the seccomp
	// policy files its profiles name. nil: there is none (the embedded
	// profiles and policies come decoded; a ProfileDir is then an error).
	Decoder Decoder
	// CgroupParent is the cgroup (v2: path below /sys/fs/cgroup) in
	// which sandbox cgroups are created; "" = automatic (see v2Base).
	CgroupParent string
	// LongLived: a worker or str serve, started rarely and running many
	// sandboxes. It sweeps a dead launcher's cgroups at its first sandbox
	// whatever the state directory's stamp says (sweepEvery).
	LongLived bool
	// RequireCgroup: an unprivileged caller without a cgroup it may write
	// is refused unless the profile is best_effort (Host.RequireCgroup).
	// str-worker sets it: a worker runs others' calls under the limits
	// its operator chose. STR_REQUIRE_CGROUP=1 sets it for any program.
	RequireCgroup bool
	Logger        *slog.Logger
}

// Decoder decodes an operator's YAML into the decoded form packages
// profiles and seccomp read: a profile directory into the JSON list
// profiles.Set.AddDecoded reads, a seccomp policy file into the JSON
// seccomp.ReadDecoded reads. There is one decoder (packages profileyaml
// and policyyaml): str-worker calls it in-process (profileyaml.Decoder);
// bin/str, which links no YAML, runs it as `str-worker decode-profiles
// DIR` and `str-worker decode-seccomp FILE`. An error's text is the
// decoder's own (the file, the line, every bad field).
type Decoder interface {
	DecodeProfileDir(dir string) ([]byte, error)
	DecodePolicyFile(file string) ([]byte, error)
}

// errNoDecoder: an operator's YAML without Options.Decoder.
var errNoDecoder = errors.New("no YAML decoder (launcher.Options.Decoder)")

// Launcher creates sandboxes. It is safe for concurrent use.
type Launcher struct {
	opts     Options
	profiles *profiles.Set
	host     Host
	log      *slog.Logger
	v2base   string

	// policyFiles caches compiled policy files by path.
	policyFiles sync.Map

	// cgroupMu serialises cgroup creation; cgroupReady is set once the
	// base is prepared. cgroups: this state directory's part of the
	// cgroup tree (cgroupSpace).
	cgroupMu    sync.Mutex
	cgroupReady bool
	cgroups     cgroupSpace
	// reuse: a resident launcher's reuse of v1 cgroups (cgroupreuse.go);
	// nil otherwise.
	reuse CgroupReuse

	// Root mode: the host id range sandboxes lease their ids from, and
	// where the leases are (IDLeaseDir).
	ids        IDRange
	idLeaseDir string

	// egress: this launcher's egress helper (a process of its own, started
	// at the first sandbox; package egress/helper), which serves every
	// sandbox's network policy and holds the TLS termination CA.
	egress helper.Client
}

// New loads the profiles and looks at the host once.
func New(opts Options) (*Launcher, error) {
	set, err := profiles.Embedded()
	if err != nil {
		return nil, fmt.Errorf("launcher: embedded profiles: %w", err)
	}
	if opts.ProfileDir != "" {
		err := errNoDecoder
		var decoded []byte
		if opts.Decoder != nil {
			decoded, err = opts.Decoder.DecodeProfileDir(opts.ProfileDir)
		}
		if err == nil {
			err = set.AddDecoded(decoded)
		}
		if err != nil {
			return nil, fmt.Errorf("launcher: profiles from %s: %w", opts.ProfileDir, err)
		}
	}
	l := &Launcher{opts: opts, profiles: set, log: opts.Logger}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	root := procfs.RootMode()
	l.host = Host{UID: os.Geteuid(), GID: os.Getegid(), Root: root, Cgroup: detectCgroup(root, opts.CgroupParent), Getenv: os.Getenv}
	switch v := os.Getenv("STR_REQUIRE_CGROUP"); v {
	case "", "0":
		l.host.RequireCgroup = opts.RequireCgroup
	case "1":
		l.host.RequireCgroup = true
	default:
		return nil, fmt.Errorf("launcher: STR_REQUIRE_CGROUP=%q: 1 (an unprivileged str without a delegated cgroup refuses to run) or 0/unset", v)
	}
	var nofile unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile) == nil {
		l.host.NoFile = nofile.Cur
	}
	if err := statedir.Check(os.Getenv); err != nil {
		return nil, fmt.Errorf("launcher: %w", err)
	}
	l.cgroups = newCgroupSpace(statedir.Dir(os.Getenv)) // its cgroup locks
	l.idLeaseDir = IDLeaseDir
	if l.host.Root {
		space, err := ReadIDSpace()
		if err != nil {
			return nil, fmt.Errorf("launcher: id maps: %w", err)
		}
		if l.ids, err = LoadIDRange(os.Getenv, "/etc/subuid", space); err != nil {
			return nil, fmt.Errorf("launcher: host id range: %w (str doctor suggests a range that fits)", err)
		}
	}
	return l, nil
}

// IDRange is the host id range sandboxes lease from (root mode).
func (l *Launcher) IDRange() IDRange { return l.ids }

// Host returns what the launcher found out about this machine.
func (l *Launcher) Host() Host { return l.host }

// Profiles returns the loaded profiles.
func (l *Launcher) Profiles() *profiles.Set { return l.profiles }

// Plan validates a request against its profile and returns the concrete
// plan. Errors that are the caller's fault wrap ErrInvalidRequest.
func (l *Launcher) Plan(req Request) (*Plan, error) { return l.PlanFor(req, l.host.Getenv) }

// PlanFor is Plan for a caller whose environment getenv reads: the
// profile's passthrough names come from it, as they would to that
// caller's one-shot str run (str serve: package launcher/resident).
func (l *Launcher) PlanFor(req Request, getenv func(string) string) (*Plan, error) {
	host := l.host
	host.Getenv = getenv
	name := req.Profile
	if name == "" {
		name = "standard"
	}
	prof, err := l.profiles.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	var o profiles.Overrides
	if req.Timeout > 0 {
		o.Timeout = &req.Timeout
	}
	if req.Memory > 0 {
		q := profiles.Quantity(req.Memory)
		o.Memory = &q
	}
	if req.CPUs > 0 {
		q := profiles.Quantity(req.CPUs)
		o.CPUs = &q
	}
	if req.Pids > 0 {
		o.Pids = &req.Pids
	}
	o.Network = req.Network
	o.Runtime = req.Runtime
	tight, err := prof.Tighten(o)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	// Embedded policies come precompiled and self-checked (go generate);
	// an operator's policy file is compiled (and self-checked) once per
	// launcher.
	prog, err := l.SeccompProgram(tight.Seccomp)
	if err != nil {
		return nil, fmt.Errorf("launcher: profile %s: seccomp policy %q: %w", tight.Name, tight.Seccomp, err)
	}
	pl, err := NewPlan(tight, req, host, prog)
	if err != nil {
		return nil, err
	}
	pl.IDRange = l.ids
	// A wildcard host is checked against the public suffix list by the
	// egress helper (this program links no list: egress.PublicSuffix).
	if egress.NeedsSuffixList(pl.Network, req.Credentials) {
		if err := l.egress.Check(pl.Network, req.Credentials); errors.Is(err, helper.ErrRefused) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		} else if err != nil {
			return nil, fmt.Errorf("launcher: egress helper: %w", err)
		}
	}
	if err := l.planInterception(pl, req); err != nil {
		return nil, err
	}
	return pl, nil
}

// planInterception adds to a plan what a sandbox needs when its egress
// terminates TLS (package intercept: the CA bundle, the variables that
// point clients at it, NAME=placeholder for each credential; the values
// stay in the request). A credential that is invalid or outside the
// policy's allowed_hosts, or a mount hiding the bundle, is the caller's
// fault.
func (l *Launcher) planInterception(pl *Plan, req Request) error {
	if !egress.Terminates(pl.Network, req.Credentials) {
		return nil
	}
	if err := intercept.Check(pl.Network, req.Credentials, pl.Child.Mounts); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	caPEM, err := l.egress.CACert()
	if err != nil {
		return fmt.Errorf("launcher: egress CA: %w", err)
	}
	mounts, env, err := intercept.Add(pl.Child.Mounts, pl.Child.Env, req.Credentials, caPEM)
	if err != nil {
		return fmt.Errorf("launcher: egress CA: %w", err)
	}
	pl.Child.Mounts, pl.Child.Env = mounts, env
	return nil
}

// SeccompProgram returns the compiled policy a profile names: an embedded
// one by name, or a policy file by absolute path (compiled once per
// launcher).
func (l *Launcher) SeccompProgram(name string) (*seccomp.Program, error) {
	if !filepath.IsAbs(name) {
		return seccomp.CompileEmbedded(name)
	}
	if v, ok := l.policyFiles.Load(name); ok {
		return v.(*seccomp.Program), nil
	}
	p, err := l.SeccompPolicy(name)
	if err != nil {
		return nil, err
	}
	prog, err := p.Compile()
	if err != nil {
		return nil, err
	}
	l.policyFiles.Store(name, prog)
	return prog, nil
}

// SeccompPolicy returns the policy a profile names: an embedded one by
// name (decoded at go generate), or a policy file by absolute path,
// decoded by the Decoder.
func (l *Launcher) SeccompPolicy(name string) (*seccomp.Policy, error) {
	if !filepath.IsAbs(name) {
		return seccomp.Load(name)
	}
	if l.opts.Decoder == nil {
		return nil, fmt.Errorf("seccomp: policy file %s: %w", name, errNoDecoder)
	}
	data, err := l.opts.Decoder.DecodePolicyFile(name)
	if err != nil {
		return nil, err
	}
	return seccomp.ReadDecoded(data, name)
}

// Run creates, starts and waits for one sandbox.
func (l *Launcher) Run(ctx context.Context, req Request) (*Result, error) {
	plan, err := l.Plan(req)
	if err != nil {
		return nil, err
	}
	if plan.Runtime != profiles.RuntimeNamespaces {
		return l.RunClass(ctx, plan, req) // gvisor: runtimes.go
	}
	s, err := l.CreateFromPlan(ctx, plan, req)
	if err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s.Wait()
}

// Create plans the sandbox and creates its cgroup; nothing runs until
// Start. A sandbox that is never started must be released with Kill.
func (l *Launcher) Create(ctx context.Context, req Request) (*Sandbox, error) {
	plan, err := l.Plan(req)
	if err != nil {
		return nil, err
	}
	return l.CreateFromPlan(ctx, plan, req)
}

// createCgroup makes the sandbox's cgroup according to the plan's mode.
// The first call also finds (v2: prepares) the base; a call sweeps the
// cgroups of this state directory's launchers that were SIGKILLed when
// one is due (sweepDue; a long-lived launcher's first call too).
// Commands that start no sandbox never touch the cgroup tree. It holds
// cgroupMu throughout.
func (l *Launcher) createCgroup(id string, pl *Plan) (sandboxCgroup, error) {
	l.cgroupMu.Lock()
	defer l.cgroupMu.Unlock()
	first := !l.cgroupReady
	if first {
		if pl.Cgroup.Mode == CgroupV2 {
			p, err := v2Base(l.opts.CgroupParent)
			if err != nil {
				return nil, err
			}
			if err := prepareV2Base(p); err != nil {
				return nil, err
			}
			l.v2base = p
		}
		l.cgroupReady = true
	}
	if sweepDue(l.cgroups, time.Now()) || (first && l.opts.LongLived) {
		sweep(l.cgroups, cgroupBases(pl.Cgroup.Mode, l.v2base))
	}
	switch pl.Cgroup.Mode {
	case CgroupV2:
		return newCgroupV2(l.cgroups, l.v2base, id, pl.Cgroup)
	case CgroupV1:
		var spare *KeptCgroups
		if l.reuse != nil {
			spare = l.reuse.Take(pl.Cgroup)
		}
		return newCgroupV1(l.cgroups, id, pl.Cgroup, spare)
	}
	return nil, errors.New("no cgroup hierarchy")
}
