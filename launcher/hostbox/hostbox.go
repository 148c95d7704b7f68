package hostbox

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/workdir"
)

// New makes a Box that runs spec's command as a plain child process of
// the caller, WITHOUT ANY ISOLATION (see the package doc), and its work
// dir (plain directories, uncapped). env is the whole environment
// (nothing of the caller's is inherited). cred, when set, is the ids the
// process runs as (root only), and the work dir is handed to them as a
// sandbox's is.
func New(ctx context.Context, spec provider.Spec, env []string, cred *syscall.Credential) (provider.Box, error) {
	if spec.Timeout < 0 || spec.Idle < 0 {
		return nil, invalid("timeout %s, idle limit %s: must not be negative", spec.Timeout, spec.Idle)
	}
	if len(spec.Argv) == 0 {
		return nil, invalid("no command")
	}
	uid, gid := -1, -1
	if cred != nil {
		uid, gid = int(cred.Uid), int(cred.Gid)
	}
	wd, err := workdir.MakeUncapped(spec.WorkDir, uid, gid)
	if err != nil {
		return nil, err
	}
	return &hostBox{ctx: ctx, spec: spec, env: env, cred: cred, wd: wd}, nil
}

// errNotStarted is Wait's error for a box never started.
var errNotStarted = errors.New("the sandbox was not started")

// invalid marks an error as the caller's (launcher.ErrInvalidRequest).
func invalid(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{launcher.ErrInvalidRequest}, a...)...)
}

type hostBox struct {
	ctx  context.Context
	spec provider.Spec
	env  []string
	cred *syscall.Credential
	wd   *workdir.Dir
	p    *hostProc
}

func (b *hostBox) WorkDir() *workdir.Dir { return b.wd }
func (b *hostBox) NetworkReport() provider.NetworkReport {
	return provider.NetworkReport{}
}
func (b *hostBox) Release() error { return b.wd.Remove() }

func (b *hostBox) Start() error {
	cmd := exec.Command(b.spec.Argv[0], b.spec.Argv[1:]...)
	cmd.Dir = b.wd.Path
	cmd.Env = b.env
	cmd.Stderr = b.spec.Stderr
	cmd.ExtraFiles = b.spec.ExtraFiles
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: b.cred}
	p, err := startHostProc(b.ctx, cmd, b.spec.Timeout, b.spec.Idle)
	if err != nil {
		return fmt.Errorf("host process: start %s: %w", b.spec.Argv[0], err)
	}
	b.p = p
	return nil
}

func (b *hostBox) Wait() (*provider.Exit, error) {
	if b.p == nil {
		return nil, errNotStarted
	}
	return b.p.wait()
}

func (b *hostBox) Kill() error {
	if b.p == nil {
		return nil
	}
	return b.p.kill()
}

func (b *hostBox) Arm(timeout time.Duration) error {
	if b.p == nil {
		return invalid("arm: not started")
	}
	return b.p.arm(timeout)
}

// startHostProc starts cmd (in a process group of its own) and kills the
// group at timeout (TimedOut) or when ctx ends (Cancelled). With idle > 0
// it waits unarmed: killed (TimedOut) at idle unless arm comes first,
// with timeout the most arm may ask.
func startHostProc(ctx context.Context, cmd *exec.Cmd, timeout, idle time.Duration) (*hostProc, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &hostProc{cmd: cmd, done: make(chan struct{}), limit: timeout, unarmed: idle > 0}
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
		// A process that has already exited (not yet reaped) ended on its
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

type hostProc struct {
	cmd   *exec.Cmd
	done  chan struct{}
	limit time.Duration // the most arm may ask (0 = no limit)

	mu                  sync.Mutex
	timer               *time.Timer // the idle limit while unarmed, then the timeout
	unarmed             bool
	timedOut, cancelled bool
}

func (p *hostProc) mark(b *bool) {
	p.mu.Lock()
	*b = true
	p.mu.Unlock()
	p.kill()
}

// arm: see Box.Arm (the same checks as Sandbox.Arm).
func (p *hostProc) arm(timeout time.Duration) error {
	if timeout <= 0 || (p.limit > 0 && timeout > p.limit) {
		return invalid("arm: timeout %s asked, at most %s allowed", timeout, p.limit)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.unarmed:
		return invalid("arm: the process was not started to wait unarmed, or is armed already")
	case p.timedOut || p.cancelled || !p.timer.Stop():
		return fmt.Errorf("arm: %w (its idle limit ran out, or it was cancelled)", launcher.ErrEnded)
	}
	select {
	case <-p.done:
		return fmt.Errorf("arm: %w (the process has exited)", launcher.ErrEnded)
	default:
	}
	p.unarmed = false
	p.timer = time.AfterFunc(timeout, func() { p.mark(&p.timedOut) })
	return nil
}

// exited reports whether the process has exited, reaped or not (waitid
// with WNOWAIT leaves a zombie for wait).
func (p *hostProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
	}
	// Linux zeroes info when no child is waitable; ECHILD: wait has
	// reaped it already.
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, p.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
	return errors.Is(err, unix.ECHILD) || (err == nil && info.Signo == int32(unix.SIGCHLD))
}

// kill kills the whole process group.
func (p *hostProc) kill() error {
	return syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
}

// wait returns when the process has exited; its process group is killed
// first, so nothing it started outlives it (as with a sandbox).
func (p *hostProc) wait() (*provider.Exit, error) {
	err := p.cmd.Wait()
	close(p.done)
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.mu.Lock()
	defer p.mu.Unlock()
	e := &provider.Exit{TimedOut: p.timedOut, Cancelled: p.cancelled}
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
