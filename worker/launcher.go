package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/profiles"
)

// LauncherSandboxes runs each execution in a fresh sandbox of the
// launcher (namespaces, pivot_root, seccomp, cgroup).
type LauncherSandboxes struct {
	L *launcher.Launcher
}

// NewLauncherSandboxes wraps a launcher.
func NewLauncherSandboxes(l *launcher.Launcher) *LauncherSandboxes {
	return &LauncherSandboxes{L: l}
}

// CheckProfile looks the name up; unknown names wrap ErrUnknownProfile.
func (ls *LauncherSandboxes) CheckProfile(name string) error {
	if _, err := ls.L.Profiles().Lookup(name); err != nil {
		if errors.Is(err, profiles.ErrUnknownProfile) {
			return fmt.Errorf("%w: %w", ErrUnknownProfile, err)
		}
		return err
	}
	return nil
}

// Create plans the sandbox and creates it (cgroup, host ids); nothing
// runs until Start. The wall-clock limit is the spec's, already within
// the profile's (Server.callTimeout); the launcher's plan refuses one
// that is not (a request never loosens a profile).
func (ls *LauncherSandboxes) Create(ctx context.Context, spec SandboxSpec) (CreatedSandbox, error) {
	// 1. the request.
	req := launcher.Request{Profile: spec.Profile, Argv: spec.Argv, Env: spec.Env, Workdir: spec.Workdir,
		Timeout: spec.Timeout, Idle: spec.Idle, Stderr: spec.Stderr, ExtraFiles: spec.ExtraFiles, Network: spec.Network}
	for _, p := range spec.ReadOnly {
		req.Binds = append(req.Binds, launcher.Bind{Source: p})
	}
	// 2. create (plan, cgroup, the sandbox's own host ids).
	sb, err := ls.L.Create(ctx, req)
	if err != nil {
		if errors.Is(err, launcher.ErrInvalidRequest) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSandboxRequest, err)
		}
		return nil, err
	}
	return createdSandbox{sb}, nil
}

// createdSandbox is a launcher sandbox before Start.
type createdSandbox struct{ sb *launcher.Sandbox }

func (c createdSandbox) Owner() (int, int) { return c.sb.ToolOwner() }
func (c createdSandbox) Kill() error       { return c.sb.Kill() }

// Start starts the sandbox; a sandbox that fails to start is killed
// (released) before the error is returned.
func (c createdSandbox) Start() (RunningSandbox, error) {
	if err := c.sb.Start(); err != nil {
		c.sb.Kill()
		return nil, err
	}
	return launcherSandbox(c), nil
}

type launcherSandbox struct{ sb *launcher.Sandbox }

func (s launcherSandbox) Kill() error { return s.sb.Kill() }

func (s launcherSandbox) Arm(timeout time.Duration) error { return s.sb.Arm(timeout) }

func (s launcherSandbox) NetworkReport() NetworkReport {
	ev, dropped, summary := s.sb.NetworkReport()
	return NetworkReport{Violations: ev, Dropped: dropped, Summary: summary}
}

func (s launcherSandbox) Wait() (*SandboxExit, error) {
	r, err := s.sb.Wait()
	if err != nil {
		return nil, err
	}
	e := &SandboxExit{
		ExitCode: r.ExitCode, Signal: r.Signal, SignalName: r.SignalName,
		TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, PidsLimit: r.PidsLimit, Cancelled: r.Cancelled,
		Network:            NetworkReport{Violations: r.Violations, Dropped: r.ViolationsDropped, Summary: r.ViolationSummary},
		KilledForViolation: r.KilledForViolation,
	}
	if r.SetupError != nil {
		e.SetupError = r.SetupError
	}
	e.SetupTime = setupTime(r.Timings)
	return e, nil
}

// setupTime is how long a sandbox took to set up, from its timings. Every
// phase is a duration (one convention, launcher's and init's alike);
// setup is the launcher's phases before the run plus the init's (which
// fall inside the launcher's "run"), not the run itself or the teardown.
func setupTime(phases []launcher.Phase) time.Duration {
	var ms float64
	for _, ph := range phases {
		if ph.Name != "launcher_run" && ph.Name != "launcher_teardown" {
			ms += ph.Ms
		}
	}
	return time.Duration(ms * float64(time.Millisecond))
}
