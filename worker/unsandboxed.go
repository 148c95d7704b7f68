package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// Unsandboxed runs each tool as a plain child process of the worker,
// WITHOUT ANY ISOLATION: the tool has the worker's uid, files, network and
// capabilities. It is what SANDBOX_MODE=none selects, explicitly, for
// trusted tools on a host that cannot create sandboxes (the reference's
// "direct" mode); the worker says so at start-up and on every call's log
// lines. What it keeps: the profile's wall-clock timeout (capped as the
// launcher caps it), the profile's fixed environment plus the call's (never
// the worker's own environment, which holds its secrets), its own process
// group killed as a whole at the end.
type Unsandboxed struct {
	// Profiles resolves profile names (the tighten-only rule still
	// applies to names even though nothing enforces the limits).
	Profiles *profiles.Set
}

// CheckProfile looks the name up; unknown names wrap ErrUnknownProfile.
func (u Unsandboxed) CheckProfile(name string) error {
	if _, err := u.Profiles.Lookup(name); err != nil {
		return fmt.Errorf("%w: %w", ErrUnknownProfile, err)
	}
	return nil
}

// Create checks the profile, the timeout and the work dir; nothing runs
// until Start. As the launcher's plan: Timeout 0 is the profile's, and
// one above the profile's is refused (Server.callTimeout keeps within it).
func (u Unsandboxed) Create(ctx context.Context, spec SandboxSpec) (CreatedSandbox, error) {
	prof, err := u.Profiles.Lookup(spec.Profile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSandboxRequest, err)
	}
	limit := time.Duration(prof.Timeout)
	switch {
	case spec.Timeout < 0 || spec.Idle < 0:
		return nil, fmt.Errorf("%w: timeout %s, idle limit %s: must not be negative", ErrInvalidSandboxRequest, spec.Timeout, spec.Idle)
	case limit > 0 && spec.Timeout > limit:
		return nil, fmt.Errorf("%w: timeout %s asked, profile %s allows at most %s", ErrInvalidSandboxRequest, spec.Timeout, prof.Name, limit)
	case spec.Timeout == 0:
		spec.Timeout = limit
	}
	if _, err := os.Stat(spec.Workdir); err != nil {
		return nil, fmt.Errorf("%w: work dir: %w", ErrInvalidSandboxRequest, err)
	}
	env := make([]string, 0, len(prof.Env.Set)+len(spec.Env))
	for _, k := range sortedKeys(prof.Env.Set) {
		env = append(env, k+"="+prof.Env.Set[k])
	}
	return &unsandboxedCreated{ctx: ctx, spec: spec, env: append(env, spec.Env...)}, nil
}

type unsandboxedCreated struct {
	ctx  context.Context
	spec SandboxSpec
	env  []string
}

// Owner is the worker itself.
func (c *unsandboxedCreated) Owner() (int, int) { return os.Geteuid(), os.Getegid() }
func (c *unsandboxedCreated) Kill() error       { return nil }

func (c *unsandboxedCreated) Start() (RunningSandbox, error) {
	spec := c.spec
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Workdir
	cmd.Env = c.env
	cmd.Stderr = spec.Stderr
	p, err := startProcess(c.ctx, cmd, spec.Timeout, spec.Idle)
	if err != nil {
		return nil, fmt.Errorf("SANDBOX_MODE=none: start %s: %w", spec.Argv[0], err)
	}
	return p, nil
}

// startProcess starts cmd in a process group of its own and kills the
// group at timeout (TimedOut) or when ctx ends (Cancelled). With idle > 0
// it waits unarmed: killed (TimedOut) at idle unless Arm comes first,
// with timeout the most Arm may ask. It is how SANDBOX_MODE=none runs a
// tool, and the unit tests' host double too.
func startProcess(ctx context.Context, cmd *exec.Cmd, timeout, idle time.Duration) (*unsandboxedProc, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &unsandboxedProc{cmd: cmd, done: make(chan struct{}), limit: timeout, unarmed: idle > 0}
	clock := timeout
	if p.unarmed {
		clock = idle
	}
	if clock > 0 { // 0: no wall clock (a profile without a timeout)
		p.mu.Lock()
		p.timer = time.AfterFunc(clock, func() { p.mark(&p.timedOut) })
		p.mu.Unlock()
	}
	stopCtx := context.AfterFunc(ctx, func() {
		// A tool that has already exited (not yet reaped) ended on its
		// own: it is not marked cancelled.
		if !p.exited() {
			p.mark(&p.cancelled)
		}
	})
	go func() {
		<-p.done
		stopCtx()
		p.mu.Lock()
		if p.timer != nil {
			p.timer.Stop()
		}
		p.mu.Unlock()
	}()
	return p, nil
}

type unsandboxedProc struct {
	cmd   *exec.Cmd
	done  chan struct{}
	limit time.Duration // the most Arm may ask (0 = no limit)

	mu                  sync.Mutex
	timer               *time.Timer // the idle limit while unarmed, then the timeout
	unarmed             bool
	timedOut, cancelled bool
}

func (p *unsandboxedProc) mark(b *bool) {
	p.mu.Lock()
	*b = true
	p.mu.Unlock()
	p.Kill()
}

// Arm: see RunningSandbox.Arm (the launcher's Sandbox.Arm, same checks).
func (p *unsandboxedProc) Arm(timeout time.Duration) error {
	if timeout <= 0 || (p.limit > 0 && timeout > p.limit) {
		return fmt.Errorf("%w: arm: timeout %s asked, at most %s allowed", ErrInvalidSandboxRequest, timeout, p.limit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.unarmed:
		return fmt.Errorf("%w: arm: the process was not started to wait unarmed, or is armed already", ErrInvalidSandboxRequest)
	case p.timedOut || p.cancelled || !p.timer.Stop():
		return errors.New("arm: the process has ended (its idle limit ran out, or it was cancelled)")
	}
	select {
	case <-p.done:
		return errors.New("arm: the process has exited")
	default:
	}
	p.unarmed = false
	p.timer = time.AfterFunc(timeout, func() { p.mark(&p.timedOut) })
	return nil
}

// exited reports whether the tool has exited, reaped or not (waitid
// with WNOWAIT leaves a zombie for Wait).
func (p *unsandboxedProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
	}
	// Linux zeroes info when no child is waitable; ECHILD: Wait has
	// reaped it already.
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
	return errors.Is(err, unix.ECHILD) || (err == nil && info.Signo == int32(unix.SIGCHLD))
}

// Kill kills the tool's whole process group.
func (p *unsandboxedProc) Kill() error {
	return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// Wait returns when the tool has exited; its process group is killed
// first, so nothing it started outlives it (as with the launcher).
func (p *unsandboxedProc) Wait() (*SandboxExit, error) {
	err := p.cmd.Wait()
	close(p.done)
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.mu.Lock()
	defer p.mu.Unlock()
	e := &SandboxExit{TimedOut: p.timedOut, Cancelled: p.cancelled}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		ws := ee.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			e.Signal = int(ws.Signal())
			e.SignalName = "SIG" + ws.Signal().String()
			e.ExitCode = 128 + e.Signal
		} else {
			e.ExitCode = ws.ExitStatus()
		}
	} else if err != nil {
		return nil, err
	}
	return e, nil
}
