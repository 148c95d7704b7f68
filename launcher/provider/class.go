package provider

// A call whose profile asks for a runtime class other than namespaces
// (gvisor: docs/runtimes.md) runs in a classBox: the same work dir
// (made, capped, filled by launcher/workdir), the plan's own mounts,
// limits, timeout and cancel, run once under the class by
// Launcher.RunClass. It is cold only: a pre-built sandbox (Spec.Idle:
// the warm pool; templates) is refused with the reason, never made
// under namespaces instead.

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/profiles"
)

// createClass is Create for a plan whose class is not namespaces. The
// tool gets no ExtraFiles: gVisor passes it only its standard streams,
// so its descriptor 3 is closed (the worker's done pipe is a hint the
// runner drops when the descriptor is not a pipe; the worker then takes
// the result at the sandbox's end).
func (p launcherProvider) createClass(ctx context.Context, spec Spec, wd *workdir.Dir, req launcher.Request, class string) (Box, error) {
	if spec.Idle > 0 {
		return nil, &launcher.RuntimeError{Class: class, Reason: "a pre-built sandbox (the worker's warm pool): this class runs cold calls only in this str"}
	}
	req.ExtraFiles = nil
	pl, err := p.l.Plan(req)
	if err != nil {
		return nil, err
	}
	if err := launcher.CheckClass(pl, req); err != nil {
		return nil, err
	}
	// The work dir as the namespaces class's root mode makes it (a capped
	// tmpfs), owned by the tool's uid in gVisor's kernel: no user
	// namespace maps it, so the host sees that uid on what it writes.
	var capacity *profiles.WorkDir
	if !pl.Rootless {
		capacity = &pl.WorkDir
	}
	if err := wd.Fill(capacity, int(pl.Child.UID), int(pl.Child.GID)); err != nil {
		return nil, err
	}
	runCtx, kill := context.WithCancel(ctx)
	return &classBox{l: p.l, pl: pl, req: req, wd: wd, ctx: runCtx, kill: kill, ended: make(chan struct{})}, nil
}

// classBox is one sandbox of a class other than namespaces.
type classBox struct {
	l    *launcher.Launcher
	pl   *launcher.Plan
	req  launcher.Request
	wd   *workdir.Dir
	ctx  context.Context // the caller's, and Kill's: its end is a cancel
	kill context.CancelFunc

	mu      sync.Mutex
	started bool
	ended   chan struct{} // closed when the run returned; res and err set
	res     *launcher.Result
	err     error
}

func (b *classBox) WorkDir() *workdir.Dir { return b.wd }

func (b *classBox) Start() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started {
		return errors.New("sandbox started already")
	}
	select {
	case <-b.ctx.Done():
		return launcher.ErrEnded
	default:
	}
	b.started = true
	go func() {
		b.res, b.err = b.l.RunClass(b.ctx, b.pl, b.req)
		b.kill()
		close(b.ended)
	}()
	return nil
}

// Wait: a run that failed before the tool ran (runsc's own failure) is
// the Exit's SetupError, as the namespaces class's init reports one.
func (b *classBox) Wait() (*Exit, error) {
	<-b.ended
	if b.err != nil {
		return &Exit{SetupError: b.err}, nil
	}
	r := b.res
	return &Exit{ExitCode: r.ExitCode, Signal: r.Signal, SignalName: r.SignalName,
		TimedOut: r.TimedOut, Cancelled: r.Cancelled, SetupTime: r.SetupTime}, nil
}

// Kill is a cancel: the tool gets SIGINT, then SIGKILL after
// launcher.CancelGrace (launcher/gvisor). A box never started is
// released at once.
func (b *classBox) Kill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kill()
	if !b.started {
		b.started = true
		close(b.ended)
	}
	return nil
}

func (b *classBox) Arm(time.Duration) error {
	return errors.New("provider: not a sandbox that waits unarmed (this class runs cold calls only)")
}

// NetworkReport is empty: the class runs the isolated network only, in
// its own stack (gVisor's), which records no attempts.
func (b *classBox) NetworkReport() NetworkReport { return NetworkReport{} }

func (b *classBox) Release() error { return b.wd.Remove() }
