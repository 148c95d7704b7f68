package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/egress/helper"
	"github.com/securetoolruntime/str/launcher/statedir"
	"github.com/securetoolruntime/str/launcher/writeback"
	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// Sandbox is one created sandbox. Its lifecycle is Create → Start → Wait;
// Kill may be called at any time, from any goroutine.
type Sandbox struct {
	l      *Launcher
	plan   *Plan
	req    Request
	ctx    context.Context
	id     string
	cg     sandboxCgroup
	ids    *HostIDLease // root mode: this sandbox's host id block
	joined func()       // root mode, a joined user namespace: drops this sandbox's hold on its block (joinLease)

	// writeBacks: a capped `str run --workdir`'s state from L3 to L10.
	writeBacks []*writeback.Dir

	// The init's steps run in this process's own clone child, compiled
	// into prog at Start (nsinit.Program; L4).
	prog              *nsinit.Program
	pid               int                 // the child's pid: the init, then the tool
	pidfd             *os.File            // the child's (pidfd_open, non-blocking: the poller waits on it)
	procState         *exitState          // its wait status, once reaped
	copiers           sync.WaitGroup      // the child's stdio copies (a Request's non-file Stdin/Stdout/Stderr)
	listeners         map[string]*os.File // egress listeners from the init, by name
	reportR, reportW  *os.File
	started, finished chan struct{}
	startErr          error
	waitErr           error
	events            []nsinit.Event
	namespaces        map[string]uint64 // Request.RecordNamespaces: the init's namespace inodes, by /proc/PID/ns name
	awaiting          chan struct{}     // Request.AwaitCall: closed when the init waits at its step 10a
	earlyReady        chan struct{}     // Request.AwaitCall: closed when early holds the result (WaitResult)
	early             *Result
	awaitingOnce      sync.Once
	notify            chan *os.File // Child.SeccompListener: the template filter's listener (sub-step 19a), sent once

	mu            sync.Mutex
	begun         bool        // Start (or a Kill before it) has run: Create's resources are no longer Kill's to release
	timer         *time.Timer // the wall clock (L7): the idle limit until Arm, then the timeout
	armed         bool        // Arm has replaced the idle limit
	armedAt       time.Time   // when: a pre-built sandbox's wall time counts from it
	called        bool        // Call has run (once per sandbox)
	killed        bool        // kill has run: the sandbox is ending
	timedOut      bool
	cancelled     bool
	exited        bool
	violationKill bool            // on_violation: kill ended the sandbox
	egress        *helper.Session // the network policy's proxy, once the init handed over its listeners
	egressErr     error
	egressStopped bool // stopEgress ran (the session stays for NetworkReport)

	// warnings: the launcher's fallbacks taken at Create (no cgroup),
	// first in Result.Warnings.
	warnings []string

	t0      time.Time
	last    time.Time
	timings []Phase
	// setupTime sums the setup phases as they are marked
	// (launcherPhase.setup): Result.SetupTime.
	setupTime time.Duration
	result    *Result
}

// CancelGrace is how long a cancelled sandbox's tool (its PID 1) has
// between SIGINT and SIGKILL. A timeout kills at once.
const CancelGrace = 500 * time.Millisecond

// Phase is one timed setup phase, in milliseconds (launcher or nsinit side).
type Phase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// CreateFromPlan prepares a sandbox from an existing plan (Create does
// Plan + CreateFromPlan). The cgroup exists afterwards; nothing runs.
func (l *Launcher) CreateFromPlan(ctx context.Context, plan *Plan, req Request) (*Sandbox, error) {
	now := time.Now()
	s := &Sandbox{l: l, req: req, ctx: ctx, id: newCgroupID(), t0: now, last: now,
		started: make(chan struct{}), finished: make(chan struct{}), awaiting: make(chan struct{}), earlyReady: make(chan struct{}),
		notify: make(chan *os.File, 1)}
	if err := CheckRuntime(plan.Runtime, false); err != nil {
		return nil, err // only Run's one-shot runs another class
	}
	if len(req.ExtraFiles) != plan.Child.PassFDs {
		return nil, fmt.Errorf("%w: the plan passes %d descriptors to the tool, the request %d", ErrInvalidRequest, plan.Child.PassFDs, len(req.ExtraFiles))
	}
	// L1a. Root mode: lease this sandbox's host ids; the plan is copied so
	// a shared plan never carries one sandbox's ids into another.
	p := *plan
	if !p.Rootless {
		lease, err := leaseIDs(l.ids, l.idLeaseDir)
		if err != nil {
			// The hint follows the cause: an unwritable lease directory
			// (a read-only root file system) is not a full id range.
			hint := "all blocks in use: a larger STR_ID_RANGE=START:COUNT (or str line in /etc/subuid), or fewer concurrent sandboxes; see str doctor"
			if le := (*IDLeaseError)(nil); errors.As(err, &le) {
				hint = IDLeaseHint()
			}
			return nil, &StepError{Who: "launcher", Step: nsinit.StepLCgroup, Action: "lease host ids", Path: l.idLeaseDir,
				Detail: l.ids.String(), Msg: err.Error(), Err: err, Hint: hint}
		}
		s.ids = lease
		p.assignIDs(lease.base)
		// A sandbox that joins another's user namespace runs as that
		// sandbox's block: it holds the block too while it lives.
		if p.Child.Join != nil {
			if s.joined, err = joinLease(l.idLeaseDir, p.Child.Join.UserNS); err != nil {
				lease.Release()
				s.ids = nil
				return nil, err
			}
		}
	}
	s.plan = &p
	plan = &p

	// L1. The sandbox's cgroup, with its limits, before anything runs.
	if plan.Cgroup.Mode != CgroupNone {
		cg, err := l.createCgroup(s.id, plan)
		if err != nil {
			hint := "no writable cgroup? run as root, delegate a cgroup v2 subtree (systemd Delegate=yes), or set best_effort; see str doctor"
			if sde := (*statedir.Error)(nil); errors.As(err, &sde) {
				hint = statedir.HintFor(statedir.Dir(os.Getenv), err) // the cgroup's lock file, not the cgroup
			}
			se := &StepError{Who: "launcher", Step: nsinit.StepLCgroup, Action: "create cgroup", Path: l.cgroups.name(s.id),
				Detail: string(plan.Cgroup.Mode), Msg: err.Error(), Err: err, Hint: hint}
			if !plan.BestEffort {
				s.release()
				return nil, se
			}
			s.warnings = append(s.warnings, "best_effort: cgroup limits not applied (memory.max, cpu.max, pids.max): "+se.Error())
		} else {
			s.cg = cg
		}
	} else if w := plan.Cgroup.Warning(); w != "" {
		s.warnings = append(s.warnings, w) // never silently claimed: the result says it
	}
	for _, w := range s.warnings {
		l.log.Warn(w) // a worker's log (a worker replies with no warnings)
	}
	// L5. cgroup v1: the init's exec thread enters the cgroup itself
	// (nsinit step 12); its tasks files become writable by the init's
	// host ids, and nothing else of the cgroup does.
	if s.cg != nil {
		if err := cgroupSelfEntry(s.cg, plan); err != nil {
			s.release()
			return nil, err
		}
	}
	s.mark(phaseCgroup)

	// L2. The report socket (child -> launcher, SOCK_SEQPACKET: one
	// record per message, and the descriptors the child hands over as
	// SCM_RIGHTS; a pre-built sandbox's call the other way). Close-on-exec
	// here; the child moves its end above the tool's descriptors,
	// close-on-exec again, at its step 1. There is no config pipe: the
	// plan is compiled into the program the clone child runs (L4).
	var err error
	if s.reportR, s.reportW, err = SeqpacketPair("report", "report-init"); err != nil {
		s.release()
		return nil, &StepError{Who: "launcher", Step: nsinit.StepLPipes, Action: "socketpair", Path: "report", Detail: "AF_UNIX SOCK_SEQPACKET", Msg: err.Error(), Err: err}
	}

	return s, nil
}

// Plan returns the sandbox's plan.
func (s *Sandbox) Plan() *Plan { return s.plan }

// Start clones the child that runs the plan. It returns once the child
// exists (the tool may not have started yet: setup errors are reported by
// Wait in Result.SetupError).
func (s *Sandbox) Start() error {
	s.mu.Lock()
	begun, killed := s.begun, s.killed
	s.begun = true
	s.mu.Unlock()
	switch {
	case killed:
		return fmt.Errorf("start sandbox %s: %w (killed before Start)", s.id, ErrEnded)
	case begun:
		return fmt.Errorf("%w: start sandbox %s: started already", ErrInvalidRequest, s.id)
	}
	go s.run()
	<-s.started
	return s.startErr
}

// run is the sandbox's life from L3 to L8. Its child is cloned by
// nsinit's cloner thread, which lives as long as the process (the
// parent-death signal follows that thread), so no thread is held here.
func (s *Sandbox) run() {
	defer close(s.finished)

	// L3. The bind sources, cloned on the host now (root mode): after
	// the caller's last change to them (a work dir's tmpfs) and right
	// before the child that attaches them exists. They follow the report
	// socket in the child's descriptors (nsinit.FirstTreeFD), where the
	// plan numbered them. Rootless there are none: the child clones each
	// source itself (its step 3).
	trees, mounts, wbs, err := cloneBindSources(s.plan.Child.Mounts, nsinit.FirstTreeFD(s.plan.Child.PassFDs), s.plan.owners(), s.plan.WorkDir)
	if err != nil {
		s.abort(err)
		return
	}
	s.plan.Child.Mounts = mounts
	s.writeBacks = wbs
	s.runDirect(trees)
}

// reaped records that the child is reaped: no timer or cancellation
// acts on it any more.
func (s *Sandbox) reaped(stopCtx func() bool) {
	s.mu.Lock()
	s.exited = true
	if s.timer != nil {
		s.timer.Stop()
	}
	s.mu.Unlock()
	stopCtx()
}

// cgroupSelfEntry is L5 (cgroup v1): the cgroup's tasks files made
// writable by the init's host ids and named in the plan, so the init's exec
// thread moves itself in (nsinit step 12). cgroup v2 has nothing to do:
// the init is born in its cgroup (L4).
func cgroupSelfEntry(cg sandboxCgroup, plan *Plan) error {
	uid, gid := plan.initHostIDs()
	tasks, err := cg.SelfEntry(uid, gid)
	if err != nil {
		return &StepError{Who: "launcher", Step: nsinit.StepLCgroupOwner, Action: "prepare cgroup self-entry", Path: cg.Path(),
			Detail: fmt.Sprintf("host ids %d:%d", uid, gid), Msg: err.Error(), Err: err}
	}
	plan.Child.CgroupTasks = tasks
	return nil
}

// startClock starts the wall clock (L7): a timeout kills the whole
// sandbox. A sandbox that waits unarmed (plan.Idle) gets its idle limit
// instead, until Arm replaces it with its timeout.
func (s *Sandbox) startClock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.plan.Idle > 0:
		s.timer = time.AfterFunc(s.plan.Idle, func() { s.kill(&s.timedOut) })
	case s.plan.Timeout > 0:
		s.timer = time.AfterFunc(s.plan.Timeout, func() { s.kill(&s.timedOut) })
	}
}

// readReports reads the child's records, one per message, and keeps the
// descriptors of its "listeners" and "seccomp_listener" events.
func (s *Sandbox) readReports() {
	defer s.reportR.Close()
	// A buffer of its own per sandbox, not a pooled one (pooled, the
	// worker's RSS grew ~14 % over TestSoak's minute), grown to each
	// message's length (RecvMessage), so the few events of a sandbox need
	// one small buffer. A 256 KiB buffer made per sandbox zeroed 64 pages
	// that a resident launcher then copied (copy-on-write) while its
	// pre-built children waited.
	buf := make([]byte, 1024)
	oob := make([]byte, unix.CmsgSpace(4*64))
	rc, err := s.reportR.SyscallConn()
	if err != nil {
		return
	}
	for {
		n, oobn, _, err := RecvMessage(rc, &buf, oob, maxReportMessage)
		if err != nil || (n == 0 && oobn == 0) {
			return
		}
		var fds []int
		if oobn > 0 {
			if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
				for _, cm := range cms {
					if got, err := unix.ParseUnixRights(&cm); err == nil {
						fds = append(fds, got...)
					}
				}
			}
		}
		// The child's records: a failure (the operation's index and the
		// errno) or a warning, its listeners, a template filter's
		// listener, a pre-built sandbox's wait; anything else is no event.
		ev, ok := s.prog.Event(buf[:n])
		if !ok {
			CloseFDs(fds)
			continue
		}
		if ev.Type == "await_call" && s.plan.Child.AwaitCall {
			CloseFDs(fds)
			s.awaitingOnce.Do(func() { close(s.awaiting) })
			continue
		}
		if ev.Type == "seccomp_listener" && s.plan.Child.SeccompListener && len(fds) == 1 {
			select {
			case s.notify <- os.NewFile(uintptr(fds[0]), "seccomp listener"):
			default: // a second one: the init sends one only
				CloseFDs(fds)
			}
			continue
		}
		if ev.Type == "listeners" && len(fds) == len(ev.Listeners) && s.listeners == nil {
			s.listeners = map[string]*os.File{}
			for i, l := range ev.Listeners {
				s.listeners[l.Name] = os.NewFile(uintptr(fds[i]), l.Name)
			}
			s.startEgress()
			continue
		}
		CloseFDs(fds)
		s.events = append(s.events, ev)
	}
}

// CloseFDs closes descriptors received in a message (RecvMessage's).
func CloseFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// SeqpacketPair is a SOCK_SEQPACKET pair (close-on-exec) whose first end,
// ours, is non-blocking (the runtime's poller waits on it, so no thread
// blocks in a recvmsg and deadlines work) and whose second, the peer's
// (the init's report end, a template's Python side), stays blocking.
// name and peer name the two files.
func SeqpacketPair(name, peer string) (ours, theirs *os.File, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		CloseFDs(fds[:])
		return nil, nil, err
	}
	return os.NewFile(uintptr(fds[0]), name), os.NewFile(uintptr(fds[1]), peer), nil
}

// maxReportMessage is the longest report-socket message read whole (a
// longer one is truncated, and then no event).
const maxReportMessage = 256 << 10

// RecvMessage reads one message of a non-blocking SOCK_SEQPACKET socket
// through rc: its length first (MSG_PEEK|MSG_TRUNC gives it whole), then
// the message into *buf, grown to that length, at most limit bytes; the
// runtime's poller waits while there is none. flags has MSG_TRUNC or
// MSG_CTRUNC for a message cut short. The report reader reads the
// init's records so, and package launcher/template its templates' and
// calls' messages.
func RecvMessage(rc syscall.RawConn, buf *[]byte, oob []byte, limit int) (n, oobn, flags int, err error) {
	var rerr error
	recv := func(fd int, p, oob []byte, how int) {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(fd, p, oob, how)
			if rerr != unix.EINTR {
				return
			}
		}
	}
	if err = rc.Read(func(fd uintptr) bool {
		recv(int(fd), nil, nil, unix.MSG_PEEK|unix.MSG_TRUNC)
		if rerr != nil {
			return rerr != unix.EAGAIN // none yet: the poller waits
		}
		if want := min(max(n, 1), limit); want > len(*buf) {
			*buf = make([]byte, want)
		}
		recv(int(fd), *buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	}); err == nil {
		err = rerr
	}
	return n, oobn, flags, err
}

// exitState is the child's wait status and resource usage once reaped.
type exitState struct {
	ws syscall.WaitStatus
	ru syscall.Rusage
}

// signal sends sig to the sandbox's PID 1 while it is not reaped (s.mu
// held, s.exited false): through its pidfd, so never to a pid reused
// since.
func (s *Sandbox) signal(sig syscall.Signal) {
	if s.pidfd == nil {
		return
	}
	if rc, err := s.pidfd.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.PidfdSendSignal(int(fd), sig, nil, 0) })
	}
}

// interrupt is a cancellation: SIGINT to the tool (PID 1 of the sandbox:
// only a signal it handles reaches it), SIGKILL after CancelGrace.
func (s *Sandbox) interrupt() {
	s.mu.Lock()
	if s.exited {
		s.mu.Unlock()
		return
	}
	s.cancelled = true
	s.signal(syscall.SIGINT)
	s.mu.Unlock()
	select {
	case <-s.finished:
	case <-time.After(CancelGrace):
		s.kill(nil)
	}
}

// kill marks why and kills the sandbox's PID 1 and its cgroup.
func (s *Sandbox) kill(why *bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exited {
		return
	}
	if why != nil {
		*why = true
	}
	s.killed = true
	s.signal(syscall.SIGKILL)
	if s.cg != nil {
		_ = s.cg.Kill()
	}
}

// Kill ends the sandbox now. Safe to call at any time, from any
// goroutine. Before Start it releases everything Create made (the report
// socket, the cgroup, the id lease) at once, not when the
// garbage collector gets to the descriptors; Start and Arm then return
// ErrEnded and Wait the same error. During Start it waits until the child
// exists (or its start failed) and kills it.
func (s *Sandbox) Kill() error {
	s.mu.Lock()
	if !s.begun {
		s.begun, s.killed = true, true
		s.mu.Unlock()
		s.abort(fmt.Errorf("sandbox %s: %w (killed before Start)", s.id, ErrEnded))
		close(s.finished)
		return nil
	}
	s.mu.Unlock()
	<-s.started
	s.kill(nil)
	return nil
}

// ErrEnded is returned by Arm for a sandbox that is gone or being
// killed (its idle limit ran out, Kill, a cancellation): it cannot serve
// a run.
var ErrEnded = errors.New("the sandbox has ended")

// Arm starts the wall clock of a sandbox created to wait unarmed
// (Request.Idle): from now on it is killed (Result.TimedOut) after
// timeout, instead of at its idle limit. It is called once, after Start,
// when the sandbox is handed its run (a pooled sandbox claimed by a
// call). In order:
//
//  1. the sandbox waits unarmed (plan.Idle > 0) and has started;
//  2. timeout tightens only: > 0 and at most the plan's timeout (a run
//     never gets more wall clock than its profile allows, whenever it
//     starts);
//  3. not armed already, not ending (killed, cancelled, exited), and its
//     idle timer stopped before it fired; else ErrEnded, and the sandbox
//     is left to its end;
//  4. the new timer.
//
// RLIMIT_CPU is not reset: the kernel counts it from the process's start,
// so CPU the tool used while waiting (a pooled Python's imports) is
// charged to its run, as a cold run's own imports are.
func (s *Sandbox) Arm(timeout time.Duration) error {
	// 1.
	if s.plan.Idle <= 0 {
		return fmt.Errorf("%w: arm sandbox %s: it was not created to wait unarmed (Request.Idle is 0): its wall clock runs from Start", ErrInvalidRequest, s.id)
	}
	select {
	case <-s.started:
	default:
		return fmt.Errorf("%w: arm sandbox %s: not started", ErrInvalidRequest, s.id)
	}
	if s.startErr != nil {
		return fmt.Errorf("arm sandbox %s: %w: %w", s.id, ErrEnded, s.startErr)
	}
	// 2.
	if timeout <= 0 || (s.plan.Timeout > 0 && timeout > s.plan.Timeout) {
		return fmt.Errorf("%w: arm sandbox %s: timeout %s asked, profile %s allows more than 0 and at most %s (overrides may only tighten)",
			ErrInvalidRequest, s.id, timeout, s.plan.Profile, s.plan.Timeout)
	}
	// 3.
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.armed:
		return fmt.Errorf("%w: arm sandbox %s: armed already", ErrInvalidRequest, s.id)
	case s.killed || s.exited || s.cancelled:
		return fmt.Errorf("arm sandbox %s: %w", s.id, ErrEnded)
	case !s.timer.Stop():
		// Fired: its kill waits for the lock we hold.
		return fmt.Errorf("arm sandbox %s: %w (its idle limit of %s ran out)", s.id, ErrEnded, s.plan.Idle)
	}
	// 4.
	s.armed, s.armedAt = true, time.Now()
	s.timer = time.AfterFunc(timeout, func() { s.kill(&s.timedOut) })
	return nil
}

// AwaitingCall is closed once a pre-built sandbox's init waits for its
// call (step 10a): everything but the call's own steps is done. It never
// closes for a sandbox whose setup failed (Ended does).
func (s *Sandbox) AwaitingCall() <-chan struct{} { return s.awaiting }

// SeccompListener delivers, once, the listener of the sandbox's filter
// when its plan asked for one (Child.SeccompListener: a per-tool
// template's, handed over at the init's sub-step 19a; package
// launcher/template answers its notifications).
func (s *Sandbox) SeccompListener() <-chan *os.File { return s.notify }

// Ended is closed once the sandbox is gone and Wait's result is ready.
func (s *Sandbox) Ended() <-chan struct{} { return s.finished }

// Call hands a pre-built sandbox (Request.AwaitCall) its one call. In
// order:
//
//  1. the sandbox was created to await a call, and had none yet;
//  2. its wall clock is armed with timeout (Arm: tighten-only, at most
//     the profile's; ErrEnded for a sandbox that is ending), so the
//     clock runs before the tool can;
//  3. argv, the whole environment and the caller's stdin, stdout and
//     stderr go to the init in one message on the report socket (its
//     step 10a dup3s them onto 0-2, then resolves the tool and runs
//     every step up to the execve as a one-shot run does). A send that
//     fails kills the sandbox.
//
// The launcher's plan for the call (Launcher.Plan of the caller's
// request) is what builds argv and env: the caller decides that this
// sandbox's plan is the call's (str serve compares them).
func (s *Sandbox) Call(argv, env []string, stdio [nsinit.CallFDs]*os.File, timeout time.Duration) error {
	// 1.
	if !s.plan.Child.AwaitCall {
		return fmt.Errorf("%w: call sandbox %s: it was not created to await a call (Request.AwaitCall)", ErrInvalidRequest, s.id)
	}
	s.mu.Lock()
	called := s.called
	s.called = true
	s.mu.Unlock()
	if called {
		return fmt.Errorf("%w: call sandbox %s: it had its call already", ErrInvalidRequest, s.id)
	}
	data, err := nsinit.EncodeCall(argv, env)
	if err != nil {
		return fmt.Errorf("%w: call sandbox %s: %v", ErrInvalidRequest, s.id, err)
	}
	<-s.started // the program exists once the clone did
	if s.prog != nil {
		s.prog.SetCallTool(argv[0])
	}
	// 2.
	if err := s.Arm(timeout); err != nil {
		return err
	}
	// 3. Through the socket's own file (SyscallConn), so its descriptor
	// cannot be closed and reused under the send.
	var fds [nsinit.CallFDs]int
	for i, f := range stdio {
		if f == nil {
			return fmt.Errorf("%w: call sandbox %s: stdio descriptor %d missing", ErrInvalidRequest, s.id, i)
		}
		fds[i] = int(f.Fd())
	}
	rc, err := s.reportR.SyscallConn()
	if err == nil {
		werr := rc.Write(func(fd uintptr) bool {
			err = unix.Sendmsg(int(fd), data, unix.UnixRights(fds[:]...), nil, 0)
			return err != unix.EAGAIN // no room yet (the socket is non-blocking): the poller waits
		})
		if err == nil {
			err = werr
		}
	}
	runtime.KeepAlive(stdio)
	if err != nil {
		s.kill(nil)
		return &StepError{Who: "launcher", Step: nsinit.StepAwaitCall, Action: "send call", Path: "report socket", Detail: "SCM_RIGHTS", Msg: err.Error(), Err: err}
	}
	return nil
}

// Wait blocks until the whole sandbox is gone and its cgroup removed.
func (s *Sandbox) Wait() (*Result, error) {
	<-s.started
	if s.startErr != nil {
		return nil, s.startErr
	}
	<-s.finished
	return s.result, nil
}

func (s *Sandbox) collect() *Result {
	r := &Result{Warnings: slices.Clone(s.warnings)}
	ps := s.procState
	for _, ev := range s.events {
		switch ev.Type {
		case "warning":
			r.Warnings = append(r.Warnings, ev.Message)
		case "error":
			r.SetupError = ev.Error
		}
	}
	// The child is the init until its execve and the tool after it: its
	// wait status is the tool's (or the init's 125/126/127 after an error).
	if ps != nil {
		switch ws := ps.ws; {
		case ws.Signaled():
			r.Signal = int(ws.Signal())
			r.ExitCode = 128 + r.Signal
		case ws.Exited():
			r.ExitCode = ws.ExitStatus()
		}
		r.CPUTimeMs = float64(time.Duration(ps.ru.Utime.Nano()+ps.ru.Stime.Nano())) / 1e6
		r.PeakMemoryBytes = ps.ru.Maxrss * 1024
	}
	if r.Signal != 0 {
		r.SignalName = unix.SignalName(syscall.Signal(r.Signal))
	}
	s.mu.Lock()
	r.TimedOut, r.Cancelled, r.KilledForViolation = s.timedOut, s.cancelled, s.violationKill
	s.mu.Unlock()
	s.stopEgress(r)

	if s.cg != nil {
		if !s.cg.Empty() {
			_ = s.cg.Kill()
		}
		st := s.cg.Stats()
		if st.PeakMemory > 0 {
			r.PeakMemoryBytes = st.PeakMemory
		}
		if st.CPUNanos > 0 {
			r.CPUTimeMs = float64(st.CPUNanos) / 1e6
		}
		r.OOMKilled = st.OOMKills > 0
		r.PidsLimit = st.PidsMax > 0
	}
	if s.waitErr != nil && r.SetupError == nil && ps == nil {
		r.SetupError = &StepError{Who: "launcher", Step: nsinit.StepLTeardown, Action: "wait init", Msg: s.waitErr.Error(), Err: s.waitErr}
	}
	// A pre-built sandbox's result is complete here: the tool was PID 1,
	// so its reaping ended every process of its pid namespace, and the
	// cgroup has been read. It is published now (WaitResult), so str
	// serve replies before the rest of L8 (the cgroup's removal, the ids'
	// release), which then only frees resources; its failures are logged.
	early := s.plan != nil && s.plan.Child.AwaitCall && s.writeBacks == nil
	if early {
		s.publishEarly(r)
	}
	if c, ok := s.cg.(*cgroupV1); ok && s.l.reuse != nil {
		c.offer(s.l.reuse, s.plan.Cgroup)
	}
	if s.cg != nil {
		if err := s.cg.Delete(); err != nil {
			w := fmt.Sprintf("remove cgroup %s: %v", s.cg.Path(), err)
			r.Warnings = append(r.Warnings, w)
			if early {
				s.l.log.Warn(w)
			}
		}
		s.cg = nil
	}
	s.mark(phaseTeardown)
	s.writeBack(r)
	// The host ids go back last: the copy back may write as them.
	s.ids.Release()
	s.ids = nil
	s.releaseJoined()
	r.WallTimeMs = s.wallTimeMs()
	r.Resident = s.plan != nil && s.plan.Child.AwaitCall
	r.Timings = s.timings
	r.SetupTime = s.setupTime
	return r
}

// publishEarly makes a copy of r, with its wall time and timings so
// far, WaitResult's answer.
func (s *Sandbox) publishEarly(r *Result) {
	e := *r
	e.Warnings = slices.Clone(r.Warnings)
	e.Timings = slices.Clone(s.timings)
	e.SetupTime = s.setupTime
	e.Resident = true
	e.WallTimeMs = s.wallTimeMs()
	s.early = &e
	close(s.earlyReady)
}

// wallTimeMs is the sandbox's wall time so far: from Create, or for a
// pre-built sandbox (Request.AwaitCall) from its call, once it has one
// (the run starts at its call, not at its build).
func (s *Sandbox) wallTimeMs() float64 {
	s.mu.Lock()
	from := s.t0
	if s.plan != nil && s.plan.Child.AwaitCall && !s.armedAt.IsZero() {
		from = s.armedAt
	}
	s.mu.Unlock()
	return float64(time.Since(from).Microseconds()) / 1000
}

// WaitResult is Wait for a pre-built sandbox (Request.AwaitCall): it
// returns as soon as the result is complete, before the cgroup is
// removed and the host ids released (Ended says when they are).
// Other sandboxes: Wait.
func (s *Sandbox) WaitResult() (*Result, error) {
	<-s.started
	if s.startErr != nil {
		return nil, s.startErr
	}
	select {
	case <-s.earlyReady:
		return s.early, nil
	case <-s.finished:
		return s.result, nil
	}
}

// writeBack is step L10: what the tool changed in a capped work dir,
// copied back now that every process of the sandbox is gone (none can
// change the upper layer under the copy).
func (s *Sandbox) writeBack(r *Result) {
	for _, wb := range s.writeBacks {
		r.WriteBack = wb.CopyBack()
	}
	s.writeBacks = nil
	if r.WriteBack != nil {
		s.mark(phaseWriteBack)
	}
}

// launcherPhase is one of a sandbox's timed phases, with whether it is
// setup (Exit.SetupTime counts it) or not (the run, the teardown).
type launcherPhase struct {
	name  string
	setup bool
}

var (
	phaseCgroup    = launcherPhase{"launcher_cgroup", true}
	phaseClone     = launcherPhase{"launcher_clone", true}
	phaseInit      = launcherPhase{"nsinit_setup", true} // the init's steps, clone (or call) to execve
	phaseRun       = launcherPhase{"launcher_run", false}
	phaseTeardown  = launcherPhase{"launcher_teardown", false}
	phaseWriteBack = launcherPhase{"launcher_write_back", false}
)

// mark ends phase ph: its duration is the time since the previous mark.
// Every phase is a duration, so a sum of phases is a total (the init's
// arrives between clone and run: addPhase).
func (s *Sandbox) mark(ph launcherPhase) {
	now := time.Now()
	s.addPhase(ph, now.Sub(s.last))
	s.last = now
}

// addPhase records phase ph as lasting d.
func (s *Sandbox) addPhase(ph launcherPhase, d time.Duration) {
	s.timings = append(s.timings, Phase{Name: ph.name, Ms: float64(d.Microseconds()) / 1000})
	if ph.setup {
		s.setupTime += d.Truncate(time.Microsecond)
	}
}

// abort ends a sandbox whose child never ran, err its Start's error:
// the report socket closed and Create's resources released.
func (s *Sandbox) abort(err error) {
	s.reportW.Close()
	s.reportR.Close()
	s.release()
	s.startErr = err
	close(s.started)
}

// release removes the cgroup and id lease of a sandbox that never ran.
func (s *Sandbox) release() {
	for _, wb := range s.writeBacks {
		wb.Close()
	}
	s.writeBacks = nil
	if s.cg != nil {
		_ = s.cg.Delete()
		s.cg = nil
	}
	s.ids.Release()
	s.ids = nil
	s.releaseJoined()
}

// releaseJoined drops the joined block's marker (joinLease), if any.
func (s *Sandbox) releaseJoined() {
	if s.joined != nil {
		s.joined()
		s.joined = nil
	}
}

// cloneDetail names the plan's clone flags for a clone's error.
func cloneDetail(pl *Plan) string { return strings.Join(pl.CloneNames, "|") }
