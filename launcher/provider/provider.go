// Package provider is the boundary between the launcher and a caller
// that runs tools in sandboxes (the worker): Provider and Box, and the
// launcher's own provider (New). It acts on the host only through
// package launcher and launcher/workdir.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/profiles"
)

// Provider is the launcher's API for a caller that runs tools in
// sandboxes (the worker): a Spec in, a Box out. The launcher owns the
// sandbox's whole host-side life: its work dir (made, capped, filled,
// handed to the tool's ids, removed: launcher/workdir), its cgroup, its ids,
// its descriptors, its clock. The caller chooses a profile and a timeout
// and puts its inputs in the work dir; it never mounts or chowns.
//
// A call may also run in a per-tool template (StartTemplate), through
// the same boundary: the template's sandbox is made from a Spec as a
// Box's is.
//
// Implementations: New (namespaces, seccomp, cgroups; no
// templates; a profile of another runtime class, gvisor, runs its calls
// cold under it: class.go), template.Provider (the same, with templates: root mode),
// and providers whose boxes are host processes (launcher/hostbox:
// SANDBOX_MODE=none; launchertest.Sandboxes for unit tests, which fakes
// templates too).
type Provider interface {
	// CheckProfile validates a profile name; an unknown name wraps
	// profiles.ErrUnknownProfile.
	CheckProfile(name string) error
	// Create makes the sandbox's work dir and reserves what it holds
	// before it runs (its cgroup, its host ids); nothing runs until
	// Box.Start. An error wrapping launcher.ErrInvalidRequest is a spec the
	// launcher refuses (a bind source missing, an unknown profile, a
	// timeout above the profile's); any other error is the host's. The
	// sandbox is killed when ctx ends. Every Box is released with
	// Release once it is gone (after Wait, or Kill when never started).
	Create(ctx context.Context, spec Spec) (Box, error)
	// CapsWorkDirs reports whether work dirs are size- and inode-capped
	// (root mode: a tmpfs of their own); else each is a plain directory
	// only the host filesystem bounds.
	CapsWorkDirs() bool
	// Templates reports whether StartTemplate starts templates; where
	// it does not, StartTemplate fails with ErrNoTemplates.
	Templates() bool
	// StartTemplate starts a per-tool template (launcher/template) and
	// returns once its runner said ready: spec's sandbox runs the
	// template runner with its control socket at fd 3. ctx is the
	// template's lifetime (its end kills it).
	StartTemplate(ctx context.Context, spec TemplateSpec) (Template, error)
}

// ErrNoTemplates: the provider starts no templates.
var ErrNoTemplates = errors.New("this provider starts no templates")

// TemplateSpec is one template as a caller asks for it: its sandbox
// (Spec: profile, command, environment, read-only binds, network; no
// work dir, timeout or credentials: a template's are per call), its
// tool's source hash (Template.Stale), where each call's work dir is
// mounted (TemplateCallOptions.WorkDir) and how long its import may take
// before the start fails (0: the launcher's default).
type TemplateSpec struct {
	Spec          Spec
	SourceHash    string
	WorkDirTarget string
	ReadyTimeout  time.Duration
}

// Template is a running per-tool template (launcher/template.Template:
// that package says what each method does).
type Template interface {
	Call(ctx context.Context, runnerArgs []byte, opts TemplateCallOptions) (*TemplateCallResult, error)
	CallWorkDir(spec workdir.Spec, uid, gid int) (*workdir.Dir, error)
	Done() <-chan struct{}
	Retired() error
	Why() TemplateRetireReason
	Stale(hash string) bool
	Pid() int
	Drain()
	Close()
}

// TemplateRetireReason is why a template takes no more calls
// (launcher/template lists them).
type TemplateRetireReason string

// TemplateCallOptions are one template call's own settings.
type TemplateCallOptions struct {
	// Timeout is the call's wall clock (0: the profile's).
	Timeout time.Duration
	// WorkDir, with the template's WorkDirTarget, makes the call's work
	// dir on the host once its host ids are known (the pair it runs as:
	// the directory must be writable by them) and returns its path; the
	// supervisor clones it (open_tree, no symlink followed, nosuid,nodev)
	// and the call mounts it at WorkDirTarget.
	WorkDir func(hostUID, hostGID int) (string, error)
	// Args, when set, gives the runner arguments after WorkDir has run
	// (they may name what it made); Call's runnerArgs is then ignored.
	Args func() ([]byte, error)
}

// TemplateCallResult is one template call's outcome: the runner's
// result document and what the supervisor verified of the child before
// the call.
type TemplateCallResult struct {
	Document json.RawMessage
	Child    TemplateChildCheck
	TimedOut bool
	Wall     time.Duration
	// Network is what the call's egress session denied (C5).
	Network NetworkReport
	// KilledForViolation: the policy says on_violation: kill, and it
	// killed the call (Document is then empty).
	KilledForViolation bool
}

// TemplateChildCheck is what the supervisor verified of a call's child
// (C9).
type TemplateChildCheck struct {
	Pid        int               // host pid
	HostUID    int               // = HostGID: the pair's host id
	MappedID   int               // its id in the template's user namespace (the lower id of the call's uid_map as the call reads it)
	Namespaces map[string]uint64 // the child's 7, none the template's
	Filters    int               // Seccomp_filters: the template's + 1
}

// Request is the launcher Request of spec's sandbox, its work dir
// aside (Create makes it).
func (spec Spec) Request() launcher.Request {
	req := launcher.Request{Profile: spec.Profile, Argv: spec.Argv, Env: spec.Env, Timeout: spec.Timeout, Idle: spec.Idle,
		Stderr: spec.Stderr, ExtraFiles: spec.ExtraFiles, Network: spec.Network, Credentials: spec.Credentials}
	for _, d := range spec.ReadOnly {
		req.Binds = append(req.Binds, launcher.Bind{Source: d})
	}
	return req
}

// Spec is one sandbox as a caller that runs tools asks for it.
type Spec struct {
	// Profile is a profile name or trust-level alias ("" = "standard").
	Profile string
	// Timeout is the wall-clock limit from Start, at most the profile's
	// (a sandbox refuses more); 0 = the profile's.
	Timeout time.Duration
	// Idle, when > 0, makes a sandbox that waits unarmed (a pooled
	// one): killed (TimedOut) Idle after Start unless Arm gives it its
	// run's timeout first; Timeout is then only the ceiling Arm may ask.
	Idle time.Duration
	// Argv is the command; a path in it may be relative to the work dir
	// (the tool's cwd), e.g. workdir.RunnerDirName + "/" + workdir.RunnerArgsName.
	Argv []string
	Env  []string // added to the profile's environment
	// ReadOnly host directories bound at the same path.
	ReadOnly []string
	// Network narrows the profile's network policy; nil keeps it.
	Network *egress.Policy
	// Credentials are this call's secrets (Request.Credentials): the
	// sandbox sees their placeholders only.
	Credentials []egress.Credential
	// Stderr receives the sandbox's standard error; nil discards it.
	Stderr io.Writer
	// ExtraFiles become the tool's descriptors 3, 4, ...; every other
	// descriptor is closed. The caller keeps its copies and closes them
	// once Start has returned. Under a runtime class other than
	// namespaces none is passed (gVisor passes only stdio: class.go).
	ExtraFiles []*os.File
	// WorkDir says where the work dir is made.
	WorkDir workdir.Spec
}

// Box is one sandbox made by a Provider.
type Box interface {
	// WorkDir is the sandbox's work dir, made and filled by Create.
	WorkDir() *workdir.Dir
	// Start runs the command. On error the sandbox is released (its
	// cgroup and ids; Release still removes the work dir).
	Start() error
	// Wait returns after the whole sandbox is gone.
	Wait() (*Exit, error)
	// Kill ends the sandbox now, or releases one never started.
	Kill() error
	// Arm starts the wall clock of a sandbox that waits unarmed
	// (Spec.Idle): from now it is killed (TimedOut) after timeout, at
	// most Spec.Timeout. It fails for a sandbox created without Idle,
	// armed already, or ending (launcher.ErrEnded).
	Arm(timeout time.Duration) error
	// NetworkReport is what the network policy denied: so far while the
	// sandbox runs, all of it once Wait has returned. It is the one way
	// to the report (Exit carries none).
	NetworkReport() NetworkReport
	// Release removes the work dir (its tmpfs unmounted first). Call it
	// once, after Wait returned, or after Kill on a sandbox never started
	// or whose Start failed.
	Release() error
}

// Exit is how a sandbox ended.
type Exit struct {
	ExitCode   int
	Signal     int
	SignalName string
	TimedOut   bool
	OOMKilled  bool
	PidsLimit  bool
	Cancelled  bool
	// SetupError is set when the sandbox failed before the tool ran; its
	// message names the setup step.
	SetupError error
	// SetupTime is how long the sandbox took to set up (0 = unknown).
	SetupTime time.Duration
	// KilledForViolation says the network policy's on_violation: kill
	// ended the sandbox. What the policy denied is Box.NetworkReport (the
	// one path to it, before and after the end).
	KilledForViolation bool
}

// NetworkReport is what a sandbox's network policy denied, aggregated
// and capped (Dropped counts the distinct denials the cap left out), with
// the short text block an agent can show its model.
type NetworkReport struct {
	Violations []egress.Event
	Dropped    int
	Summary    string
}

// New returns l's own Provider.
func New(l *launcher.Launcher) Provider { return launcherProvider{l} }

type launcherProvider struct{ l *launcher.Launcher }

func (p launcherProvider) CheckProfile(name string) error {
	prof, err := p.l.Profiles().Lookup(name)
	if err != nil {
		return err
	}
	// A runtime class this worker cannot run: its tools are unavailable
	// with the reason (launcher.ErrRuntimeUnavailable), never run weaker.
	// Another class's calls run cold (class.go).
	return launcher.CheckRuntime(prof.RuntimeClass(), true)
}

// CapsWorkDirs: root mode mounts a capped tmpfs per work dir.
func (p launcherProvider) CapsWorkDirs() bool { return p.l.Host().Root }

// Templates: none (template.Provider adds them).
func (launcherProvider) Templates() bool { return false }

func (launcherProvider) StartTemplate(context.Context, TemplateSpec) (Template, error) {
	return nil, ErrNoTemplates
}

// Create is, in order: L9 (1) the work dir itself, since the plan binds
// it; L1-L2 (plan, ids, cgroup, pipes: CreateFromPlan); L9 (2-6) its
// tmpfs capped by the profile, owned by the leased ids, and filled. The
// tmpfs is mounted before L3 (at Start) clones the bind sources, so the
// sandbox gets the capped tmpfs, never the directory under it.
func (p launcherProvider) Create(ctx context.Context, spec Spec) (Box, error) {
	// L9 (1). the dir and its marker.
	wd, err := workdir.New(spec.WorkDir)
	if err != nil {
		return nil, err
	}
	// L1-L2.
	// WorkdirLive: the work dir is capped already (L9's own tmpfs, with
	// the runner's files on a second one an overlay would not show).
	req := spec.Request()
	req.Workdir, req.WorkdirLive = wd.Path, true
	pl, err := p.l.Plan(req)
	if err == nil && pl.Runtime != profiles.RuntimeNamespaces {
		// Another class (gvisor): the one dispatch point (class.go).
		box, err := p.createClass(ctx, spec, wd, req, pl.Runtime)
		if err != nil {
			wd.Remove()
		}
		return box, err
	}
	var sb *launcher.Sandbox
	if err == nil {
		sb, err = p.l.CreateFromPlan(ctx, pl, req)
	}
	if err != nil {
		wd.Remove()
		return nil, err
	}
	// L9 (2-6). cap (root mode), fill, hand to the tool's ids.
	var capacity *profiles.WorkDir
	uid, gid := -1, -1
	if pl := sb.Plan(); !pl.Rootless {
		capacity = &pl.WorkDir
		uid, gid = pl.ToolUID, pl.ToolGID
	}
	if err := wd.Fill(capacity, uid, gid); err != nil {
		sb.Kill()
		wd.Remove()
		return nil, err
	}
	return &launcherBox{sb: sb, wd: wd}, nil
}

// launcherBox is a launcher Sandbox with the work dir made for it.
type launcherBox struct {
	sb *launcher.Sandbox
	wd *workdir.Dir
}

func (b *launcherBox) WorkDir() *workdir.Dir { return b.wd }

func (b *launcherBox) Start() error {
	if err := b.sb.Start(); err != nil {
		b.sb.Kill()
		return err
	}
	return nil
}

func (b *launcherBox) Kill() error                     { return b.sb.Kill() }
func (b *launcherBox) Arm(timeout time.Duration) error { return b.sb.Arm(timeout) }
func (b *launcherBox) Release() error                  { return b.wd.Remove() }

// NetworkReport is the egress session's record: live while the sandbox
// runs, the final one (taken at its teardown) once it is torn down
// (Sandbox.NetworkReport keeps it).
func (b *launcherBox) NetworkReport() NetworkReport {
	ev, dropped, summary := b.sb.NetworkReport()
	return NetworkReport{Violations: ev, Dropped: dropped, Summary: summary}
}

func (b *launcherBox) Wait() (*Exit, error) {
	r, err := b.sb.Wait()
	if err != nil {
		return nil, err
	}
	e := &Exit{
		ExitCode: r.ExitCode, Signal: r.Signal, SignalName: r.SignalName,
		TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, PidsLimit: r.PidsLimit, Cancelled: r.Cancelled,
		KilledForViolation: r.KilledForViolation,
		SetupTime:          r.SetupTime,
	}
	if r.SetupError != nil {
		e.SetupError = r.SetupError
	}
	return e, nil
}
