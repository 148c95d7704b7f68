package resident

// The resident launcher (str serve): a root process that keeps K
// sandboxes per served profile pre-built, each one's init waiting at its
// step 10a, and hands one to each `str run` that connects to its socket.
//
// The socket is an authority, checked in this order (checks 1-7):
//
//  1. the socket file: in a directory root owns and no one else may
//     write (else refused), owned root:GROUP mode 0660 with --allow-group,
//     0666 with --allow-uid (SO_PEERCRED alone decides then), 0600
//     without either (the kernel's connect permission check uses the
//     caller's real groups), set in a private directory before a rename
//     publishes it: nothing done by path (socket.go);
//  2. SO_PEERCRED of every connection: uid 0, a listed uid, or a member
//     of the listed group (its primary gid, or the group's membership in
//     the user database); anything else is answered "refused" and closed,
//     at a bounded cost (refuse: its request never buffered, a few
//     answered at a time, a rate-limited log);
//  3. the request is planned by Launcher.Plan exactly as one-shot `str
//     run` plans it (profile lookup, tighten-only limits and network, the
//     caller's environment for the profile's passthrough names): a bad
//     request gets the same error text;
//  4. poolable: a served profile, and the call's plan equal to the
//     pre-built sandbox's but for argv, environment and a wall clock no
//     longer than the profile's (Arm). Binds, a work dir, lower limits or
//     a narrower network need another plan: "not_poolable", and the
//     client runs one-shot;
//  5. the call: Sandbox.Call arms the wall clock and hands argv, env and
//     the caller's three stdio descriptors to the init (its step 10a);
//     the server closes its copies at once;
//  6. the reply: the Result's Outcome (exit status, stderr text), and
//     the Result's JSON (as `str run --result` writes it) when asked; a
//     cancellation from the client, or the connection closing, ends the
//     sandbox as a cancelled one-shot run is ended;
//  7. the cgroup's removal, the ids' release and the refill, after the
//     reply: off the caller's critical path.
//
// Each pre-built sandbox is an ordinary sandbox of the Launcher given to
// New (its own namespaces, memory cgroup, leased host ids, fresh tmpfs
// root and /tmp) used for one call, never reused. Its v1 pids, cpu,
// cpuacct and freezer cgroups may be an earlier sandbox's, emptied and
// checked (cgroups.go).
//
// Which sandboxes are kept, claimed, retired and replaced is
// launcher/pool's policy (its doc.go), the worker's warm pool's too: a
// set of --pool per served profile, claimed only once its init awaits
// the call (ReadyOnly), retired at --idle (the sandbox's own idle limit,
// pool.Backstop later, is only a backstop), with the pool's backoff after
// a sandbox that could not be made or ended before its call.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/outcome"
	"github.com/securetoolruntime/str/launcher/pool"
	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// Options configure a resident launcher.
type Options struct {
	Socket   string   // the socket's path
	Profiles []string // the served profiles (names or trust levels)
	Pool     int      // pre-built sandboxes per profile (>= 1)
	// AllowUIDs may connect besides root; AllowGID's members (-1: none)
	// too.
	AllowUIDs []int
	AllowGID  int
	// Idle is a pre-built sandbox's max age: one not called by then is
	// retired and replaced (default DefaultIdle).
	Idle time.Duration
	// Log receives the server's log lines (nil: none).
	Log *slog.Logger
}

// requestDeadline bounds the wait for a connected caller's request.
const requestDeadline = 10 * time.Second

// DefaultIdle is how long a pre-built sandbox waits for a call
// before it is replaced.
const DefaultIdle = 10 * time.Minute

// Server is a running resident launcher.
type Server struct {
	l     *launcher.Launcher
	opts  Options
	log   *slog.Logger
	ln    *net.UnixListener
	sock  *residentSocket
	ctx   context.Context
	stop  context.CancelFunc
	pools map[string]*residentPool // by the plan's profile name
	// prebuilt holds the pre-built sandboxes: a set per served profile.
	prebuilt *pool.Pool[string, *residentBox]
	// refusing holds a token per refused connection being answered;
	// refusals rate-limits their log (refuse).
	refusing chan struct{}
	refusals refusalLog
	// drainCgroups removes the v1 cgroups kept for reuse, at Close.
	drainCgroups func()
	wg           sync.WaitGroup
	once         sync.Once
}

// residentPool is one served profile: how its pre-built sandboxes are
// made (their set in Server.prebuilt is named by the profile).
type residentPool struct {
	r    *Server
	name string
	req  launcher.Request // the template request: AwaitCall, Idle
	tmpl *launcher.Plan   // its plan, before Create leases ids
}

// residentBox is one pre-built sandbox: a pool.Item.
type residentBox struct {
	sb     *launcher.Sandbox
	cancel context.CancelFunc // ends the sandbox as a cancellation (SIGINT, then SIGKILL)
	claim  *pool.Claimed[string, *residentBox]
}

func (b *residentBox) Ready() <-chan struct{} { return b.sb.AwaitingCall() }
func (b *residentBox) Ended() <-chan struct{} { return b.sb.Ended() }
func (b *residentBox) Kill()                  { _ = b.sb.Kill() }
func (b *residentBox) Release()               { b.cancel() }

// EndReason: Aged at its idle limit (TimedOut while unarmed), else it died.
func (b *residentBox) EndReason() pool.Reason {
	if res, err := b.sb.Wait(); err == nil && res.TimedOut {
		return pool.Aged
	}
	return pool.Died
}

// done: the call is over and the sandbox gone; its set may replace it.
func (b *residentBox) done() {
	if b.claim != nil {
		b.claim.Done()
	}
}

// New plans every served profile, creates the socket (check 1)
// and starts filling the pools. Root only: the pre-built sandboxes lease
// host ids.
func New(l *launcher.Launcher, opts Options) (*Server, error) {
	if !l.Host().Root {
		return nil, errors.New("str serve runs as root (its sandboxes lease host ids)")
	}
	if opts.Pool < 1 {
		return nil, fmt.Errorf("%w: pool size %d: at least 1", launcher.ErrInvalidRequest, opts.Pool)
	}
	if opts.Idle <= 0 {
		opts.Idle = DefaultIdle
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	r := &Server{l: l, opts: opts, log: opts.Log, ctx: ctx, stop: stop, pools: map[string]*residentPool{},
		refusing: make(chan struct{}, maxRefusing)}
	r.prebuilt = pool.New(ctx, pool.Config[string, *residentBox]{
		Build: func(ctx context.Context, name string, _ pool.Spec[string]) (*residentBox, error) {
			return r.pools[name].build(ctx)
		},
		MaxAge:    opts.Idle,
		ReadyOnly: true, // one still starting may yet fail its setup, which its caller would get
		Failed: func(name string, _ pool.Spec[string], err error, retryIn time.Duration) {
			r.log.Error("str serve: build failed", "profile", name, "retry_in", retryIn, "error", err)
		},
		Died: func(name string, box *residentBox, retryIn time.Duration) {
			r.log.Error("str serve: a pre-built sandbox ended before its call", "profile", name, "retry_in", retryIn, "error", box.endError())
		},
	})
	want := map[string]pool.Spec[string]{}
	for _, name := range opts.Profiles {
		req := launcher.Request{Profile: name, AwaitCall: true, Idle: opts.Idle + pool.Backstop}
		pl, err := l.Plan(req)
		if err != nil {
			stop()
			return nil, fmt.Errorf("str serve: profile %s: %w", name, err)
		}
		if pl.Timeout <= 0 {
			stop()
			return nil, fmt.Errorf("str serve: profile %s has no timeout: a pre-built sandbox is armed with one", name)
		}
		r.pools[pl.Profile] = &residentPool{r: r, name: pl.Profile, req: req, tmpl: pl}
		want[pl.Profile] = pool.Spec[string]{Key: pl.Profile, Size: opts.Pool}
	}
	ln, sock, err := listenResident(opts)
	if err != nil {
		stop()
		return nil, err
	}
	r.ln, r.sock = ln, sock
	// Its sandboxes reuse their v1 pids, cpu, cpuacct and freezer
	// cgroups, one sandbox at a time (cgroups.go has the checks).
	spares := newCgroupSpares()
	l.ReuseCgroups(spares)
	r.drainCgroups = spares.drain
	r.prebuilt.Configure(want)
	r.prebuilt.Start()
	return r, nil
}

// Serve accepts connections until Close.
func (r *Server) Serve() error {
	for {
		c, err := r.ln.AcceptUnix()
		if err != nil {
			if r.ctx.Err() != nil {
				return nil
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return fmt.Errorf("str serve: accept: %w", err)
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer c.Close()
			r.handle(c)
		}()
	}
}

// Close stops accepting, kills the idle sandboxes and waits for the
// calls in flight and every sandbox to be gone.
func (r *Server) Close() { r.once.Do(r.close) }

func (r *Server) close() {
	// The pool first: no more builds, its idle sandboxes retired
	// (drained), not counted as deaths when the context below ends them.
	r.prebuilt.Stop()
	r.stop()
	r.ln.Close()
	// The name goes with the listener, so that no str run finds a socket
	// nobody accepts on (only if it is still ours: socket.go).
	r.sock.close()
	r.wg.Wait()
	r.prebuilt.Wait()
	r.drainCgroups()
}

// authorize is check 2.
func (r *Server) authorize(cred *unix.Ucred) error {
	if cred.Uid == 0 || slices.Contains(r.opts.AllowUIDs, int(cred.Uid)) {
		return nil
	}
	if g := r.opts.AllowGID; g >= 0 {
		if int(cred.Gid) == g {
			return nil
		}
		if u, err := user.LookupId(strconv.Itoa(int(cred.Uid))); err == nil {
			if gids, err := u.GroupIds(); err == nil && slices.Contains(gids, strconv.Itoa(g)) {
				return nil
			}
		}
	}
	return fmt.Errorf("str serve: uid %d (gid %d, pid %d) may not use %s: root, --allow-uid and members of --allow-group only", cred.Uid, cred.Gid, cred.Pid, r.opts.Socket)
}

// Bounds on what callers check 2 refuses may cost the server (issue 29,
// item 7: a refused user's flood had grown it from 13 to 206 MB and
// written 20,000 log lines in 8 s).
const (
	// maxRefusing refused connections may wait for their request at
	// once (a second each at most); any beyond are answered only from
	// what they already sent.
	maxRefusing = 64
	// refusalLogInterval: per uid, one log line per interval, carrying
	// the number of its refusals since the previous line that had none.
	refusalLogInterval = 10 * time.Second
	// refusalLogUIDs bounds the uids the log remembers; beyond, the
	// others share one count (overflowUID).
	refusalLogUIDs = 1024
	overflowUID    = ^uint32(0) // (uid_t)-1: never a process's uid
)

// refuse answers a caller check 2 turned away, at a bounded cost: a
// rate-limited log line, no buffer for its request, at most maxRefusing
// answered at a time.
func (r *Server) refuse(c *net.UnixConn, cred *unix.Ucred, why error) {
	r.refusals.note(r.log, cred, time.Now())
	// Its request is taken off the socket unread: a one-byte read of a
	// SOCK_SEQPACKET record dequeues all of it (the rest truncated), and
	// without a control buffer the kernel closes the descriptors it
	// carried rather than installing them here. It is read at all because
	// closing on unread data would reset the connection before the
	// caller reads why (a caller would take that for a server that died
	// during its call).
	var b [1]byte
	select {
	case r.refusing <- struct{}{}:
		defer func() { <-r.refusing }()
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		_, _, _, _, _ = c.ReadMsgUnix(b[:], nil)
	default:
		// maxRefusing wait already: no waiting, only a request already
		// queued is taken (a caller sends it right after connecting).
		if rc, err := c.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) { _, _, _, _, _ = unix.Recvmsg(int(fd), b[:], nil, unix.MSG_DONTWAIT) })
		}
	}
	reply(c, residentReply{typ: replyRefused, text: why.Error()})
}

// refusalLog rate-limits check 2's log lines per uid.
type refusalLog struct {
	mu    sync.Mutex
	byUID map[uint32]*refusalCount
}

type refusalCount struct {
	logged     time.Time // the uid's last line
	suppressed int       // its refusals since, without a line
}

// note logs cred's refusal at now, unless its uid had a line within
// refusalLogInterval: then it only counts it. It reports whether it
// logged.
func (rl *refusalLog) note(log *slog.Logger, cred *unix.Ucred, now time.Time) bool {
	rl.mu.Lock()
	if rl.byUID == nil {
		rl.byUID = map[uint32]*refusalCount{}
	}
	uid := cred.Uid
	e := rl.byUID[uid]
	if e == nil && len(rl.byUID) >= refusalLogUIDs {
		// Forget the uids whose last line is older than the interval
		// (their uncounted refusals with them); still full, the new uid
		// shares the overflow count.
		for u, old := range rl.byUID {
			if now.Sub(old.logged) >= refusalLogInterval {
				delete(rl.byUID, u)
			}
		}
		if len(rl.byUID) >= refusalLogUIDs {
			uid = overflowUID
			e = rl.byUID[uid]
		}
	}
	if e != nil && now.Sub(e.logged) < refusalLogInterval {
		e.suppressed++
		rl.mu.Unlock()
		return false
	}
	if e == nil {
		e = &refusalCount{}
		rl.byUID[uid] = e
	}
	suppressed := e.suppressed
	e.logged, e.suppressed = now, 0
	rl.mu.Unlock()
	log.Warn("str serve: refused", "uid", cred.Uid, "gid", cred.Gid, "pid", cred.Pid, "overflow", uid == overflowUID,
		"refused_unlogged", suppressed, "log_interval", refusalLogInterval.String())
	return true
}

// reply sends the one answer of a connection.
func reply(c *net.UnixConn, rep residentReply) { _, _ = c.Write(rep.encode()) }

// handle serves one connection: checks 2-7 of the list above.
func (r *Server) handle(c *net.UnixConn) {
	// 2. Who is calling.
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || credErr != nil {
		return
	}
	if err := r.authorize(cred); err != nil {
		r.refuse(c, cred, err)
		return
	}

	// The request and the caller's stdio.
	bp := requestBufs.Get().(*[]byte)
	defer requestBufs.Put(bp)
	buf := *bp
	oob := make([]byte, unix.CmsgSpace(4*(nsinit.CallFDs+1)))
	// A caller that connects and sends nothing holds no goroutine for
	// long (nor Close).
	_ = c.SetReadDeadline(time.Now().Add(requestDeadline))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	stdio, fdErr := parseStdio(oob[:oobn])
	defer func() {
		for _, f := range stdio {
			if f != nil {
				f.Close()
			}
		}
	}()
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		reply(c, residentReply{typ: replyNotPoolable, text: fmt.Sprintf("request larger than %d bytes", len(buf))})
		return
	}
	if fdErr != nil {
		reply(c, residentReply{typ: replyFailed, text: "str serve: " + fdErr.Error()})
		return
	}
	req, err := decodeResidentRequest(buf[:n])
	if errors.Is(err, errResidentVersion) {
		reply(c, residentReply{typ: replyNotPoolable, text: err.Error()})
		return
	}
	if err != nil {
		reply(c, residentReply{typ: replyFailed, text: "str serve: " + err.Error()})
		return
	}

	// 3. The plan one-shot str run would make for this caller.
	environ := map[string]string{}
	for _, kv := range req.Environ {
		// A key's first entry counts, as Go's os.Getenv reads it (the
		// Go client sends os.Environ, which has no duplicates).
		if k, v, ok := strings.Cut(kv, "="); ok {
			if _, dup := environ[k]; !dup {
				environ[k] = v
			}
		}
	}
	lreq := launcher.Request{Profile: req.Profile, Argv: req.Argv, Env: req.Env, Timeout: req.Timeout}
	pl, err := r.l.PlanFor(lreq, func(k string) string { return environ[k] })
	if err != nil {
		reply(c, residentReply{typ: replyFailed, text: err.Error()})
		return
	}

	// 4. Poolable?
	p := r.pools[pl.Profile]
	if p == nil {
		reply(c, residentReply{typ: replyNotPoolable, text: fmt.Sprintf("profile %s is not served here", pl.Profile)})
		return
	}
	if why := p.differs(pl); why != "" {
		reply(c, residentReply{typ: replyNotPoolable, text: why})
		return
	}
	// The call must fit the form the pool's sandboxes take it in
	// (nsinit.EncodeCall's).
	if _, err := nsinit.EncodeCall(pl.Child.Argv, pl.Child.Env); err != nil {
		reply(c, residentReply{typ: replyNotPoolable, text: "a pre-built sandbox cannot take this call: " + err.Error()})
		return
	}

	// 5. The call, on a pre-built sandbox (one built now if none is
	// ready: still no client-side sandbox start).
	box, err := p.callBox(pl, stdio)
	if err != nil {
		// No sandbox got the call (a build failed, or the send did), so
		// the command has not run: the caller may run it one-shot.
		r.log.Warn("str serve: no pre-built sandbox for a call", "profile", p.name, "error", err)
		reply(c, residentReply{typ: replyNotPoolable, text: err.Error()})
		return
	}
	for i, f := range stdio {
		f.Close() // the init holds them now; ours must not keep a pipe open
		stdio[i] = nil
	}

	// 6. Cancellation (a message, or the connection closing), then the
	// reply.
	go func() {
		b := make([]byte, 256)
		for {
			n, err := c.Read(b)
			if err != nil || n == 0 {
				box.cancel()
				return
			}
			if string(b[:n]) == residentCancelMsg {
				box.cancel()
				return
			}
		}
	}()
	res, err := box.sb.WaitResult()
	box.cancel()
	if err != nil {
		reply(c, residentReply{typ: replyFailed, text: err.Error()})
	} else {
		reply(c, resultReply(res, req.WantResult))
	}
	// 7. The rest of the teardown (the cgroup's removal, the ids'
	// release) and the refill, after the reply.
	<-box.sb.Ended()
	box.done()
}

// resultReply is a result's reply: its Outcome, and its JSON as `str run
// --result` writes it when the caller asked.
func resultReply(res *launcher.Result, withJSON bool) residentReply {
	rep := residentReply{typ: replyResult}
	rep.status, rep.text = outcome.Of(res)
	if withJSON {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return residentReply{typ: replyFailed, text: "str serve: the result: " + err.Error()}
		}
		rep.result = append(b, '\n')
	}
	return rep
}

// requestBufs holds the receive buffers of requests (argv, --env and the
// caller's environ: at most four times a call's MaxCallBytes): reused, not
// a fresh 512 KiB zeroed per call (perf: 8 % of str serve's CPU).
var requestBufs = sync.Pool{New: func() any { b := make([]byte, nsinit.MaxCallBytes*4); return &b }}

// parseStdio takes exactly the three stdio descriptors of a request.
func parseStdio(oob []byte) ([nsinit.CallFDs]*os.File, error) {
	var out [nsinit.CallFDs]*os.File
	var fds []int
	if cms, err := unix.ParseSocketControlMessage(oob); err == nil {
		for _, cm := range cms {
			if got, err := unix.ParseUnixRights(&cm); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	for i, fd := range fds {
		if i < nsinit.CallFDs {
			out[i] = os.NewFile(uintptr(fd), "stdio"+strconv.Itoa(i))
		} else {
			unix.Close(fd)
		}
	}
	if len(fds) != nsinit.CallFDs {
		return out, fmt.Errorf("a request carries %d descriptors (stdin, stdout, stderr), got %d", nsinit.CallFDs, len(fds))
	}
	return out, nil
}

// differs is check 4: "" when the call's plan is the pre-built one's but
// for what a call carries (argv, environment; a wall clock at most the
// profile's, which Arm sets), else what differs.
func (p *residentPool) differs(pl *launcher.Plan) string {
	a, b := *pl, *p.tmpl
	a.Child.Argv, b.Child.Argv = nil, nil
	a.Child.Env, b.Child.Env = nil, nil
	a.Child.AwaitCall, a.Idle = b.Child.AwaitCall, b.Idle
	a.Timeout = b.Timeout
	switch {
	case !reflect.DeepEqual(a.Cgroup, b.Cgroup):
		return "the cgroup limits differ from the profile's (--memory, --cpus or --pids)"
	case !reflect.DeepEqual(a.Network, b.Network) || !reflect.DeepEqual(a.Child.Listen, b.Child.Listen):
		return "the network policy differs from the profile's (--net, --allow-*)"
	case !reflect.DeepEqual(a.Child.Mounts, b.Child.Mounts) || a.Child.Workdir != b.Child.Workdir:
		return "the mounts differ from the profile's (binds or a work dir)"
	case !reflect.DeepEqual(a, b):
		return "the plan differs from the pre-built sandbox's"
	}
	return ""
}

// callBox claims a ready sandbox of the profile (or builds one) and
// hands it the call. One that ended meanwhile (its idle limit, a crash)
// is dropped and the next tried.
func (p *residentPool) callBox(pl *launcher.Plan, stdio [nsinit.CallFDs]*os.File) (*residentBox, error) {
	for {
		var box *residentBox
		if c := p.r.prebuilt.Claim(p.name, p.name, nil); c != nil {
			box = c.Item
			box.claim = c
		} else {
			var err error
			if box, err = p.buildNow(); err != nil {
				return nil, err
			}
		}
		err := box.sb.Call(pl.Child.Argv, pl.Child.Env, stdio, pl.Timeout)
		if err == nil {
			return box, nil
		}
		box.cancel()
		_, _ = box.sb.Wait()
		box.done()
		if !errors.Is(err, launcher.ErrEnded) {
			return nil, err
		}
	}
}

// build makes and starts one pre-built sandbox (the pool's Build); its
// init awaits the call on its own (AwaitingCall).
func (p *residentPool) build(ctx context.Context) (*residentBox, error) {
	ctx, cancel := context.WithCancel(ctx)
	sb, err := p.r.l.CreateFromPlan(ctx, p.tmpl, p.req)
	if err != nil {
		cancel()
		return nil, err
	}
	if err := sb.Start(); err != nil {
		cancel()
		return nil, err
	}
	return &residentBox{sb: sb, cancel: cancel}, nil
}

// buildNow builds one for a call that found none ready, outside the
// pool, and waits until its init awaits the call (or the sandbox ended:
// its setup error).
func (p *residentPool) buildNow() (*residentBox, error) {
	box, err := p.build(p.r.ctx)
	if err != nil {
		return nil, err
	}
	select {
	case <-box.sb.AwaitingCall():
		return box, nil
	case <-box.sb.Ended():
		box.cancel()
		return nil, fmt.Errorf("str serve: profile %s: a pre-built sandbox ended before its call: %v", p.name, box.endError())
	}
}

// endError is why an ended sandbox ended: its setup error, if any.
func (b *residentBox) endError() error {
	res, err := b.sb.Wait()
	if err == nil && res.SetupError != nil {
		err = res.SetupError
	}
	return errOr(err, errors.New("no setup error reported"))
}
