package worker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/profiles"
)

// LauncherSandboxes runs each execution in a fresh sandbox of the
// launcher (namespaces, pivot_root, seccomp, cgroup).
type LauncherSandboxes struct {
	L *launcher.Launcher

	mu     sync.Mutex
	owners map[string][2]int // profile -> uid, gid
}

// NewLauncherSandboxes wraps a launcher.
func NewLauncherSandboxes(l *launcher.Launcher) *LauncherSandboxes {
	return &LauncherSandboxes{L: l, owners: map[string][2]int{}}
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

// ToolOwner returns (and caches) the tool's host uid/gid under profile.
func (ls *LauncherSandboxes) ToolOwner(profile string) (int, int, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if o, ok := ls.owners[profile]; ok {
		return o[0], o[1], nil
	}
	uid, gid, err := ls.L.ToolOwner(profile)
	if err != nil {
		return 0, 0, err
	}
	ls.owners[profile] = [2]int{uid, gid}
	return uid, gid, nil
}

// Start creates and starts the sandbox. The wall-clock limit asked for is
// capped at the profile's own (a request never loosens a profile).
func (ls *LauncherSandboxes) Start(ctx context.Context, spec SandboxSpec) (RunningSandbox, error) {
	// 1. the request.
	prof, err := ls.L.Profiles().Lookup(spec.Profile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSandboxRequest, err)
	}
	timeout := spec.Timeout
	if limit := time.Duration(prof.Timeout); limit > 0 && timeout > limit {
		timeout = limit
	}
	req := launcher.Request{Profile: spec.Profile, Argv: spec.Argv, Env: spec.Env, Workdir: spec.Workdir, Timeout: timeout}
	for _, p := range spec.ReadOnly {
		req.Binds = append(req.Binds, launcher.Bind{Source: p})
	}
	// 2. create (plan + cgroup), then start.
	sb, err := ls.L.Create(ctx, req)
	if err != nil {
		if errors.Is(err, launcher.ErrInvalidRequest) {
			return nil, fmt.Errorf("%w: %w", ErrInvalidSandboxRequest, err)
		}
		return nil, err
	}
	if err := sb.Start(); err != nil {
		sb.Kill()
		return nil, err
	}
	return launcherSandbox{sb}, nil
}

type launcherSandbox struct{ sb *launcher.Sandbox }

func (s launcherSandbox) Kill() error { return s.sb.Kill() }

func (s launcherSandbox) Wait() (*SandboxExit, error) {
	r, err := s.sb.Wait()
	if err != nil {
		return nil, err
	}
	e := &SandboxExit{
		ExitCode: r.ExitCode, Signal: r.Signal, SignalName: r.SignalName,
		TimedOut: r.TimedOut, OOMKilled: r.OOMKilled, PidsLimit: r.PidsLimit, Cancelled: r.Cancelled,
	}
	if r.SetupError != nil {
		e.SetupError = r.SetupError
	}
	var setup float64
	for _, ph := range r.Timings {
		setup += ph.Ms
	}
	e.SetupTime = time.Duration(setup * float64(time.Millisecond))
	return e, nil
}
