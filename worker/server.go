package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
)

// User property names (spec §2, §3, §13).
const (
	PropReplyTo   = "replyTo"
	PropStatusTo  = "statusTo"
	PropTimestamp = "timestamp"
	PropSignature = "signature"
	// PropProfileClamped is set on the reply of a call whose requested
	// sandbox_profile was looser than the tool's ceiling, to
	// "asked->used" (e.g. "standard->restrictive"). str's own; agents
	// ignore user properties they do not know.
	PropProfileClamped = "strProfileClamped"
)

// timeoutSlack is added to the tool's timeout for the sandbox's wall-clock
// limit (spec §3: timeout_seconds + 5 s).
const timeoutSlack = 5 * time.Second

// Options are a Server's collaborators.
type Options struct {
	Config    *Config
	Transport transport.Transport
	Sandboxes Sandboxes
	Store     artifacts.Store
	// Installer installs the packages manifest tools declare, at start-up
	// and at each reload (packages.go); nil = tools with a package are
	// run as they are (the import fails if it is missing).
	Installer *manifest.Installer
	Logger    *slog.Logger
	Metrics   *Metrics // nil = NewMetrics()
	// Profiles resolves profile names and orders them for the
	// tighten-only rule (a call runs with the stricter of its ceiling and
	// the request's profile); nil = the embedded profiles. `str worker` passes the
	// launcher's set.
	Profiles *profiles.Set
}

// Server serves tool invocations: one receive loop, MaxConcurrent
// executors fed by a bounded queue, a manifest watcher.
type Server struct {
	cfg      *Config
	tr       transport.Transport
	sb       Sandboxes
	store    artifacts.Store
	inst     *manifest.Installer
	pkgs     packageSet // where each declared package is (packages.go)
	log      *slog.Logger
	metrics  *Metrics
	profiles *profiles.Set
	base     string

	runnerPath string

	// templates are the per-tool templates (template.go); nil = none
	// (the Provider starts none).
	templates *templateSet

	// pool holds pre-started sandboxes (pool.go); nil = none.
	pool *warmPool
	// idle gives the memory of a burst of calls back once none has run
	// for a while (idle.go).
	idle *idleTrim
	// probe checks that the broker still delivers (probe.go); nil = off.
	probe *prober
	// out publishes the answers the receive loop gives (outbox.go).
	out *outbox

	// mu guards the manifest and the subscriptions: a reload holds it
	// while it changes subscriptions, the receive loop while it dispatches
	// one request, so no request is served against a half-applied reload.
	mu       sync.RWMutex
	manifest *manifest.Manifest
	subs     map[string]bool // invoke topics subscribed
	// subMu orders the changes of subscriptions: applyManifest's and
	// dropStaleSubscription's (taken before mu, never under it).
	subMu sync.Mutex

	queue    *fairQueue // accepted calls until an executor takes them (sched.go)
	inflight sync.Map   // request id and task id -> *queuedTask
	execCtx  context.Context
	execStop context.CancelCauseFunc
	execWG   sync.WaitGroup
	// replyCtx ends replyShutdownWindow after the shutdown grace period:
	// a reply still waiting for a broker that is gone is then reported
	// lost, so the broker cannot hold the shutdown.
	replyCtx  context.Context
	replyStop context.CancelCauseFunc

	limiter  *rateLimiter
	toolsSem chan struct{} // tools replies in flight (toolsinfo.go)
	replays  *replayGuard  // signatures accepted within SigningWindow
	auth     *authModes    // keys file and user tokens (auth.go)
	ready    *readiness    // faults and degradations for /readyz (readiness.go)
	init     *initState    // the init sub-protocol and the notice writer (init.go)
	stopping atomic.Bool   // no new work is taken
	stopped  atomic.Bool   // Run has returned
	serving  atomic.Bool   // Connect succeeded and not stopping
	// stopAt is when the shutdown grace period ended and running tools
	// were told to stop, stored before execStop (see cancelledBefore).
	stopAt atomic.Pointer[time.Time]
}

// Causes recorded when a task's context is cancelled.
var (
	errCancelRequested = errors.New("cancelled by a cancel message")
	errShutdown        = errors.New("worker shutting down")
)

// New checks the options and builds a Server; Run starts it.
func New(opts Options) (*Server, error) {
	var missing []string
	if opts.Config == nil {
		missing = append(missing, "Config")
	}
	if opts.Transport == nil {
		missing = append(missing, "Transport")
	}
	if opts.Sandboxes == nil {
		missing = append(missing, "Sandboxes")
	}
	if opts.Store == nil {
		missing = append(missing, "Store")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("worker: missing options: %s", strings.Join(missing, ", "))
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	m := opts.Metrics
	if m == nil {
		m = NewMetrics()
	}
	cfg := opts.Config
	set := opts.Profiles
	if set == nil {
		var err error
		if set, err = profiles.Embedded(); err != nil {
			return nil, fmt.Errorf("worker: %w", err)
		}
	}
	if err := opts.Sandboxes.CheckProfile(cfg.DefaultProfile); err != nil {
		return nil, fmt.Errorf("worker: SANDBOX_DEFAULT_PROFILE %q: %w", cfg.DefaultProfile, err)
	}
	if _, err := set.Lookup(cfg.DefaultProfile); err != nil {
		return nil, fmt.Errorf("worker: SANDBOX_DEFAULT_PROFILE %q: %w", cfg.DefaultProfile, err)
	}
	auth, err := newAuthModes(cfg, log)
	if err != nil {
		return nil, err
	}
	execCtx, execStop := context.WithCancelCause(context.Background())
	replyCtx, replyStop := context.WithCancelCause(context.Background())
	s := &Server{
		cfg: cfg, tr: opts.Transport, sb: opts.Sandboxes, inst: opts.Installer,
		log: log, metrics: m, profiles: set, base: cfg.Base(),
		// Quotas per store user and session (ARTIFACT_*_MAX_*), in front
		// of whichever store: a refusal is that user's, never a fault.
		store: artifacts.WithQuota(opts.Store, cfg.ArtifactQuota),
		subs:  map[string]bool{},
		queue: newFairQueue(cfg.MaxConcurrent, cfg.MaxQueued,
			shareCaps{cfg.userMaxRunning(), cfg.userMaxQueued()}, shareCaps{cfg.keyMaxRunning(), cfg.keyMaxQueued()}),
		execCtx: execCtx, execStop: execStop,
		replyCtx: replyCtx, replyStop: replyStop,
		limiter:  newRateLimiter(cfg.RatePerMinute, cfg.RateBurst),
		idle:     newIdleTrim(idleTrimAfter, debug.FreeOSMemory),
		toolsSem: make(chan struct{}, maxToolsRepliesInFlight),
		replays:  newReplayGuard(),
		auth:     auth,
		ready:    newReadiness(log, m.Faults),
		init:     newInitState(cfg),
	}
	s.pool = newWarmPool(s)
	if opts.Sandboxes.Templates() {
		s.templates = newTemplateSet(s)
	}
	s.out = newOutbox(s)
	if cfg.ProbeInterval > 0 {
		s.probe = newProber(s)
	}
	return s, nil
}

// Ready reports whether the worker is connected, its broker delivers (the
// probe, when on) and it is taking work.
func (s *Server) Ready() bool {
	return s.serving.Load() && !s.stopping.Load() && s.tr.State() == transport.Connected && !s.probe.isDeaf()
}

// brokerState is /readyz's "broker": the transport's state, or "deaf"
// while the broker looks connected but the last probe was lost.
func (s *Server) brokerState() string {
	if s.probe.isDeaf() {
		return "deaf"
	}
	return s.tr.State().String()
}

// Topic helpers (spec §1, §14).
func (s *Server) invokeTopic(tool string) string { return s.base + "/sam_remote_tool/invoke/" + tool }
func (s *Server) removedTopic(tool string) string {
	return s.base + "/sam_remote_tool/removed/" + tool
}
func (s *Server) initTopic(tool string) string { return s.base + "/sam_remote_tool/init/" + tool }
func (s *Server) initRequestTopic(tool string) string {
	return s.base + "/sam_remote_tool/init_request/" + tool
}

// entryTopics are the topics subscribed for one manifest entry, served
// or unavailable (so that its calls are answered, not left to time out):
// its invoke topic and both generations' init request topics (init.go).
// An entry whose name cannot be one topic level has none.
func (s *Server) entryTopics(name string) []string {
	if !manifest.ValidToolName(name) {
		return nil
	}
	return []string{s.invokeTopic(name), s.initTopic(name), s.initRequestTopic(name)}
}
func (s *Server) cancelPattern() string    { return s.base + "/sam_remote_tool/cancel/>" }
func (s *Server) discoveryPattern() string { return s.base + "/discovery/>" }

// Run serves until ctx ends, then shuts down: it stops taking work
// (unsubscribes), rejects queued requests with RESOURCE_EXHAUSTED, lets
// running tools finish within ShutdownGrace, then kills them and replies
// CANCELLED. It returns after every taken request has been answered. A
// ctx that ends before the first broker connection is a clean stop (nil),
// not a failure.
func (s *Server) Run(ctx context.Context) error {
	defer s.stopped.Store(true)
	// 1. directories: stale work dirs from a crash removed, the runner
	// installed read-only, the site dir present.
	if err := s.prepareDirs(); err != nil {
		return err
	}
	// 2. fail closed: one real sandbox of the default profile, or no
	// start at all (SANDBOX_MODE=none skips it, loudly).
	if err := s.probeSandbox(ctx); err != nil {
		return err
	}
	s.warnUncappedWorkDirs()
	if ctx.Err() != nil {
		return nil
	}
	// 3. the manifest: a broken manifest file at startup is fatal (there
	// is no previous one to keep). Each entry that cannot work here (its
	// own problems in the manifest, module missing or unreadable by the
	// sandbox, unknown profile, its declared package not installable) is
	// logged; /readyz lists them, their calls are answered
	// TOOL_NOT_AVAILABLE with the reason, the others serve.
	m, err := manifest.Load(s.cfg.ManifestPath)
	if err != nil {
		return fmt.Errorf("worker: load manifest: %w", err)
	}
	s.mu.Lock()
	s.manifest = m
	s.mu.Unlock()
	if s.cfg.toolsDirGiven != "" && s.cfg.toolsDirGiven != s.cfg.ToolsDir {
		s.log.Info("TOOLS_PYTHON_DIR resolved against the working directory", "given", s.cfg.toolsDirGiven, "path", s.cfg.ToolsDir)
	}
	// The declared packages, each installed if missing (in a sandbox of
	// its own); a failure makes its tools unavailable, not the worker.
	s.installPackages(ctx, m, nil)
	if ctx.Err() != nil {
		return nil
	}
	s.logToolProblems(m)
	// 4. connect with every subscription inside the connect, so a request
	// published the moment the worker appears is not missed.
	subs := []string{s.cancelPattern(), s.discoveryPattern(), ToolsRequestTopic(s.cfg.Namespace)}
	if s.probe != nil {
		subs = append(subs, s.probe.pattern())
	}
	for _, name := range m.Entries() {
		for _, topic := range s.entryTopics(name) {
			subs = append(subs, topic)
			s.subs[topic] = true
		}
	}
	if err := s.tr.Connect(ctx, subs); err != nil {
		if ctx.Err() != nil {
			// SIGTERM before the first connection: nothing was taken.
			s.log.Info("worker stopped before connecting to the broker")
			return nil
		}
		return fmt.Errorf("worker: connect: %w", err)
	}
	s.serving.Store(true)
	// The newer generation's init broadcasts (spec §14), through the
	// notice writer: the receive loop never waits on them.
	s.startNotices()
	s.broadcastInits(m, m.Names())
	s.log.Info("worker serving", "namespace", s.cfg.Namespace, "worker_id", s.cfg.WorkerID,
		"tools", m.Names(), "max_concurrent", s.cfg.MaxConcurrent, "sandbox_mode", s.cfg.SandboxMode)
	// 5. executors, taking calls fairly across requesters (sched.go). A
	// queued task is claimed once: by the executor that takes it, or by
	// a cancel that answers it at once (see cancel).
	for i := 0; i < s.cfg.MaxConcurrent; i++ {
		s.execWG.Add(1)
		go func() {
			defer s.execWG.Done()
			for q := s.queue.take(); q != nil; q = s.queue.take() {
				s.metrics.Queued.Dec()
				if q.claimed.CompareAndSwap(false, true) {
					s.runTask(q.task)
				}
				s.queue.done(q)
			}
		}()
	}
	// The warm pool, after the probe and with the manifest's tools.
	s.pool.start()
	s.pool.configure(m)
	s.templates.configure(m)
	// 6. manifest hot reload.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	watcher := manifest.NewWatcher(s.cfg.ManifestPath, s.cfg.ReloadInterval, s.applyManifest,
		func(format string, a ...any) { s.log.Warn(fmt.Sprintf(format, a...)) })
	// A manifest that cannot be applied keeps the last good one serving:
	// /readyz reports it under "degraded" until the file is repaired.
	watcher.OnProblem = func(err error) { s.ready.setDegraded(degradedManifest, err) }
	go func() {
		defer close(watchDone)
		watcher.Run(watchCtx)
	}()
	// 6b. the resources a call needs (work dir, artifact store, audit
	// log), checked now and every resourceCheckInterval (readiness.go).
	s.checkResources(0)
	checksDone := make(chan struct{})
	go s.runResourceChecks(checksDone)
	defer close(checksDone)
	// 6c. the broker liveness probe (probe.go), until the receive loop
	// ends.
	probeCtx, stopProbe := context.WithCancel(context.Background())
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		if s.probe != nil {
			s.probe.run(probeCtx)
		}
	}()
	// 7. the receive loop.
	var loopErr error
	for {
		d, err := s.tr.Receive(ctx)
		if err != nil {
			if ctx.Err() == nil {
				loopErr = fmt.Errorf("worker: receive: %w", err)
			}
			break
		}
		s.dispatch(d, time.Now())
	}
	stopProbe()
	<-probeDone
	stopWatch()
	<-watchDone
	s.shutdown()
	return loopErr
}

// probeTimeout bounds the start-up probe sandbox.
const probeTimeout = 30 * time.Second

// probeSandbox creates and runs one sandbox of the default profile
// (/bin/true in an empty work dir) through the same Sandboxes the calls
// use. If that fails the worker refuses to start: a worker that cannot
// isolate tools must not take any (fail closed). Only SANDBOX_MODE=none
// skips it, with a warning. A ctx that ends during the probe is a stop,
// not a failure. Runs after prepareDirs (the work base exists).
func (s *Server) probeSandbox(ctx context.Context) error {
	if s.cfg.SandboxMode == ModeNone {
		s.log.Warn("SANDBOX_MODE=none: TOOLS RUN WITHOUT ANY ISOLATION, as plain processes of the worker with its uid, " +
			"its files, its network and its environment; use it only for trusted tools on a host that cannot create sandboxes " +
			"(`str doctor` says why), never for tools that run model- or user-supplied code")
		return nil
	}
	fail := func(err error) error {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("worker: refusing to start: this host cannot create sandboxes "+
			"(start-up probe: /bin/true in a %q sandbox): %w; run `str doctor` to see what is missing and how to fix it "+
			"(only SANDBOX_MODE=none runs tools without isolation)", s.cfg.DefaultProfile, err)
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	// 1. a sandbox with its work dir, as a call's (root mode: capped, so
	// the probe checks the mount works too), removed afterwards; its
	// marker lets the next start-up sweep remove it if the worker dies
	// during the probe.
	spec := SandboxSpec{Profile: s.cfg.DefaultProfile, Argv: []string{"/bin/true"},
		WorkDir: workdir.Spec{Base: s.cfg.WorkDir, Prefix: probeDirPrefix},
		Timeout: s.sandboxTimeout(s.cfg.DefaultProfile, probeTimeout)}
	sb, err := s.sb.Create(pctx, spec)
	if err != nil {
		return fail(err)
	}
	defer sb.Release()
	// 2. start, wait.
	if err := sb.Start(); err != nil {
		return fail(err)
	}
	exit, err := sb.Wait()
	// 3. the verdict.
	switch {
	case err != nil:
		return fail(err)
	case exit.SetupError != nil:
		return fail(exit.SetupError)
	case exit.TimedOut:
		return fail(fmt.Errorf("the probe did not finish within %s", probeTimeout))
	case exit.ExitCode != 0 || exit.Signal != 0:
		return fail(fmt.Errorf("the probe ended with exit code %d (signal %d %s, out of memory %v, pids limit %v)",
			exit.ExitCode, exit.Signal, exit.SignalName, exit.OOMKilled, exit.PidsLimit))
	}
	s.log.Info("sandbox probe passed", "profile", s.cfg.DefaultProfile, "setup_ms", exit.SetupTime.Milliseconds())
	return nil
}

// prepareDirs runs at startup.
func (s *Server) prepareDirs() error {
	// 1. the work base exists, is not group/world writable and can be
	// traversed by the sandboxes' uids (modes set whatever the umask).
	if err := ensureDir(s.cfg.WorkDir, 0o711); err != nil {
		return fmt.Errorf("worker: create work dir %s: %w", s.cfg.WorkDir, err)
	}
	// 2. every task work dir left by a previous run (crash, SIGKILL) is
	// removed by the launcher: first the work dir tmpfs mounts it left
	// (their markers lie under them); then only real directories of a
	// generated name carrying str's marker: anything else under the base
	// (an operator's files, a symlink) is left alone.
	sw, err := workdir.SweepStale(s.cfg.WorkDir, callDirPrefix, warmDirPrefix, probeDirPrefix)
	for _, mp := range sw.Unmounted {
		s.log.Info("unmounted a stale work dir tmpfs", "path", mp)
	}
	for _, p := range sw.Removed {
		s.log.Info("removed stale work dir", "path", p)
	}
	for _, p := range sortedKeys(sw.Kept) {
		s.log.Warn("left alone under the work dir: not a str work dir", "path", p, "reason", sw.Kept[p])
	}
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	// 3. the runner, read-only.
	if err := ensureDir(s.cfg.RunnerDir, 0o755); err != nil {
		return fmt.Errorf("worker: create runner dir %s: %w", s.cfg.RunnerDir, err)
	}
	path, err := runner.Install(s.cfg.RunnerDir)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	s.runnerPath = path
	// The runner module's bytecode cache saves ~5 ms of CPU per call;
	// without it each call compiles the module, so a failure only warns.
	if _, err := runner.Compile(s.cfg.RunnerDir, s.cfg.PythonBin); err != nil {
		s.log.Warn("runner bytecode cache not written: every call compiles the runner", "error", err)
	}
	// 4. the package site dir.
	if err := ensureDir(s.cfg.SiteDir, 0o755); err != nil {
		return fmt.Errorf("worker: create site dir %s: %w", s.cfg.SiteDir, err)
	}
	return nil
}

// applyManifest is the reload callback: it installs the new manifest's
// declared packages, then applies it with the dispatch lock held, so subscriptions for added tools exist and those of removed tools
// are gone before the next request is dispatched.
func (s *Server) applyManifest(m *manifest.Manifest) error {
	// The new manifest's packages first, without the dispatch lock (an
	// installation may take minutes; requests keep being served).
	s.mu.RLock()
	added, _, changed := manifest.Diff(s.manifest, m)
	s.mu.RUnlock()
	s.installPackages(s.execCtx, m, append(added, changed...))
	s.subMu.Lock()
	defer s.subMu.Unlock()
	// Once the dispatch lock is released: the templates of tools that
	// left or changed are retired at the reload that applied, and those
	// of tools added or changed are started (in the background).
	applied := false
	defer func() {
		if applied {
			s.templates.configure(m)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping.Load() {
		return nil
	}
	added, removed, changed := manifest.Diff(s.manifest, m)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Subscription changes run in parallel: a transport may apply them
	// only between two receives, and takes all pending ones at once.
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		errs  []error
	)
	change := func(op func(context.Context, string) error, what, topic string, after func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := op(ctx, topic); err != nil {
				errMu.Lock()
				errs = append(errs, fmt.Errorf("%s %s: %w", what, topic, err))
				errMu.Unlock()
				return
			}
			if after != nil {
				after()
			}
		}()
	}
	// The topics to change are read from s.subs before the first change
	// starts: the changes write s.subs as they complete.
	var subscribe, unsubscribe []string
	for _, name := range added {
		for _, topic := range s.entryTopics(name) {
			if !s.subs[topic] { // a retry after a partial failure
				subscribe = append(subscribe, topic)
			}
		}
	}
	for _, name := range removed {
		for _, topic := range s.entryTopics(name) {
			if s.subs[topic] {
				unsubscribe = append(unsubscribe, topic)
			}
		}
	}
	var subsMu sync.Mutex
	for _, topic := range subscribe {
		change(s.tr.Subscribe, "subscribe", topic, func() { subsMu.Lock(); s.subs[topic] = true; subsMu.Unlock() })
	}
	for _, topic := range unsubscribe {
		change(s.tr.Unsubscribe, "unsubscribe", topic, func() { subsMu.Lock(); delete(s.subs, topic); subsMu.Unlock() })
	}
	wg.Wait()
	if len(errs) > 0 {
		// Keep the previous manifest: the watcher applies this content
		// again at the next poll and the failed subscriptions are retried.
		return errors.Join(errs...)
	}
	old := s.manifest
	s.manifest = m
	applied = true
	s.pool.configure(m)
	// Notices (spec §14), queued for the notice writer (no publish under
	// the lock): removed for each entry that left, init for each tool
	// that appeared or became servable.
	for _, name := range removed {
		if manifest.ValidToolName(name) {
			s.notify(s.removedTopic(name), EncodeRemovedNotice(name))
		}
	}
	var fresh []string
	for _, name := range append(append([]string(nil), added...), changed...) {
		if _, now := m.Tools[name]; now && (old == nil || old.Tools[name] == nil) {
			fresh = append(fresh, name)
		}
	}
	s.broadcastInits(m, fresh)
	if len(added)+len(removed)+len(changed) > 0 {
		s.log.Info("manifest reloaded", "added", added, "removed", removed, "changed", changed)
		s.logToolProblems(m)
	}
	return nil
}

// publish sends one worker message with the timestamp user property,
// waiting at most 30 s for the broker (and no longer than replyCtx: not
// past replyShutdownWindow after the shutdown grace period). Never called
// from the receive loop nor with a lock held.
func (s *Server) publish(topic string, payload []byte) error {
	ctx, cancel := context.WithTimeout(s.replyCtx, 30*time.Second)
	defer cancel()
	return s.tr.Publish(ctx, transport.Message{
		Topic: topic, Payload: payload,
		UserProperties: map[string]string{PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10)},
	})
}

func ack(log *slog.Logger, d *transport.Delivery) {
	if d.Ack != nil {
		if err := d.Ack(); err != nil {
			log.Warn("ack failed", "topic", d.Topic, "error", err)
		}
	}
}

// reject answers a request that will not run and acks it once the answer
// is published. replyTo "" means the request may not be answered (its
// replyTo was not authenticated, or belongs to another requester): it is
// logged, counted and acked only. It never waits for the broker: the
// answer goes to the outbox (outbox.go), so the receive loop, which calls
// it, sometimes under s.mu, goes on at once.
func (s *Server) reject(d *transport.Delivery, replyTo, id, tool string, e *Error, log *slog.Logger) {
	s.metrics.Errors.WithLabelValues(string(e.Code)).Inc()
	s.metrics.Invocations.WithLabelValues(toolLabel(tool), string(e.Code)).Inc()
	if replyTo == "" {
		log.Warn("request refused, not answered (its replyTo is not authenticated as the requester's)", "code", e.Code, "error", e.Message)
		ack(log, d)
		return
	}
	log.Warn("request rejected", "code", e.Code, "error", e.Message)
	shown := &Error{Code: e.Code, Message: s.forAgent(e.Message, ""), Data: e.Data}
	sent := func(err error) {
		if err != nil {
			s.metrics.RepliesLost.Inc()
			log.Error("publishing the error reply failed: reply lost", "reply_to", replyTo, "code", e.Code, "error", err)
		}
		ack(log, d)
	}
	if !s.out.post(replyTo, EncodeError(id, shown), sent) {
		s.metrics.RepliesLost.Inc()
		log.Error("outbox full or closed: error reply not sent, reply lost", "reply_to", replyTo, "code", e.Code,
			"max_bytes", outboxMaxBytes, "max_destinations", outboxMaxDests)
		ack(log, d)
	}
}

// toolLabel is a tool name as a metric label: "-" for none, truncated
// (only subscribed topics reach dispatch, so the names are the
// manifest's plus stale subscriptions, which are dropped on first use).
func toolLabel(tool string) string {
	if tool == "" {
		return "-"
	}
	return truncateName(tool)
}

// dispatch handles one delivery in the receive loop.
func (s *Server) dispatch(d *transport.Delivery, received time.Time) {
	switch {
	case strings.HasPrefix(d.Topic, s.base+"/sam_remote_tool/init_request/"):
		s.dispatchInit(d, initNewer, strings.TrimPrefix(d.Topic, s.base+"/sam_remote_tool/init_request/"), received)
	case strings.HasPrefix(d.Topic, s.base+"/sam_remote_tool/init/"):
		s.dispatchInit(d, initOlder, strings.TrimPrefix(d.Topic, s.base+"/sam_remote_tool/init/"), received)
	case strings.HasPrefix(d.Topic, s.base+"/sam_remote_tool/invoke/"):
		s.dispatchInvoke(d, strings.TrimPrefix(d.Topic, s.base+"/sam_remote_tool/invoke/"), received)
	case strings.HasPrefix(d.Topic, s.base+"/sam_remote_tool/cancel/"):
		s.cancel(d, strings.TrimPrefix(d.Topic, s.base+"/sam_remote_tool/cancel/"), received)
		ack(s.log, d)
	case d.Topic == ToolsRequestTopic(s.cfg.Namespace):
		s.toolsRequest(d, received)
	case s.probe != nil && s.probe.isProbe(d.Topic):
		s.probe.arrived(d.Topic)
		ack(s.log, d)
	default:
		// discovery and anything else: ignored.
		s.log.Debug("ignored message", "topic", d.Topic)
		ack(s.log, d)
	}
}

func (s *Server) dispatchInvoke(d *transport.Delivery, topicTool string, received time.Time) {
	// Names from the wire are truncated wherever they are repeated (log
	// attributes, messages, metric labels).
	shownTool := truncateName(topicTool)
	log := s.log.With("tool", shownTool)
	// 1. no replyTo: nobody to answer; log and ack.
	replyTo := d.UserProperties[PropReplyTo]
	if replyTo == "" {
		log.Warn("invoke request without replyTo ignored", "topic", truncateName(d.Topic), "id", truncateName(LenientID(d.Payload, s.cfg.MaxPayloadBytes)))
		ack(log, d)
		return
	}
	// 2. replyTo (and statusTo) are reply topics of the protocol in this
	// namespace, never a request topic: else nobody may be answered.
	agent, problem := s.replyTopicAgent(replyTo, "response")
	statusTo, statusAgent := d.UserProperties[PropStatusTo], ""
	if problem == "" && statusTo != "" {
		if statusAgent, problem = s.replyTopicAgent(statusTo, "status"); problem != "" {
			problem = "statusTo: " + problem
		}
	}
	if problem != "" {
		s.metrics.Errors.WithLabelValues(string(CodeInvalidRequest)).Inc()
		log.Warn("invoke request refused, not answered: its replyTo/statusTo is not a reply topic of the protocol",
			"reply_to", truncateName(replyTo), "status_to", truncateName(statusTo), "problem", problem,
			"id", truncateName(LenientID(d.Payload, s.cfg.MaxPayloadBytes)))
		ack(log, d)
		return
	}
	// 3. signature (str-sign-v2 with the shared secret, str-sign-v3 with a
	// key of the keys file: payload, topic, routing and identifying user
	// properties, timestamp within the window, no replay), before
	// anything else is believed (§13), and replyTo bound to the signer's
	// agent. Without both, replyTo is not authenticated: when any
	// identity mode is on, such a request is never answered (answerTo "").
	answerTo := replyTo
	if s.authConfigured() && !s.signing() {
		answerTo = ""
	}
	var key *signingKey
	if s.signing() {
		var e *Error
		if key, e = s.checkSignature(d, received); e != nil {
			s.reject(d, "", LenientID(d.Payload, s.cfg.MaxPayloadBytes), topicTool, e, log)
			return
		}
		// The reply topics are the signer's agent's (auth.go replyBound).
		if e = s.replyBound(d, key, agent, statusAgent); e != nil {
			s.reject(d, "", LenientID(d.Payload, s.cfg.MaxPayloadBytes), topicTool, e, log)
			return
		}
	}
	// 4. parse and validate.
	req, id, perr := ParseRequest(d.Payload, ParseLimits{MaxPayloadBytes: s.cfg.MaxPayloadBytes})
	if perr != nil {
		s.reject(d, answerTo, id, topicTool, perr, log.With("id", truncateName(id)))
		return
	}
	log = log.With("id", truncateName(req.ID), "task_id", req.TaskID, "user_id", req.UserID)
	if req.ToolName != topicTool {
		s.reject(d, answerTo, id, topicTool, errorf(CodeInvalidRequest,
			"params.tool_name %q does not match the topic's tool %q", truncateName(req.ToolName), shownTool), log)
		return
	}
	// 5. who is asking (auth.go): the signed identity equal to the
	// request's, what the key may claim, the user's token.
	who, e := s.verifyInvoke(d, key, req, received)
	if e != nil {
		s.reject(d, answerTo, id, topicTool, e, log)
		return
	}
	log = log.With("requester", who.key(), "verified_by", who.Via)
	// 6. the tool, under the dispatch lock (a reload is either fully
	// applied or not at all).
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.stopping.Load() {
		s.reject(d, replyTo, id, topicTool, errorf(CodeResourceExhausted, "worker is shutting down"), log)
		return
	}
	tool := s.manifest.Tools[topicTool]
	if reason, bad := s.manifest.Unavailable[topicTool]; bad {
		// Subscribed so that its callers learn why at once.
		s.reject(d, replyTo, id, topicTool, unavailableEntryError(topicTool, reason), log)
		return
	}
	if tool == nil {
		// Unsubscribed before the answer, so that a caller who retries on
		// the answer does not reach this worker again; both off the
		// receive loop and outside mu (issue 18 §4: a slow broker delays
		// this answer only).
		e := errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker", shownTool)
		go func() {
			s.dropStaleSubscription(d.Topic, topicTool, log)
			s.reject(d, replyTo, id, topicTool, e, log)
		}()
		return
	}
	// 7. per-requester rate limit.
	if !s.limiter.allow(who.key(), received) {
		s.reject(d, replyTo, id, topicTool, errorf(CodeResourceExhausted, "rate limit for user %q exceeded", req.UserID), log)
		return
	}
	// 8. profile (the stricter of the ceiling and the request's) and
	// timeout (bounded by the manifest).
	c, perr := s.choose(tool, req)
	if perr != nil {
		s.reject(d, replyTo, id, topicTool, perr, log)
		return
	}
	if c.clamped != "" {
		log.Debug("the request's sandbox profile was clamped to the tool's ceiling", "clamped", c.clamped, "reason", c.reason)
	}
	// 9. one execution per task id and per request id at a time. A
	// duplicate from another requester is not answered: its replyTo is
	// the live request's (copied to inject an error into it).
	t := &task{
		req: req, who: who, tool: tool, profile: c.profile, clamped: c.clamped, timeout: c.timeout, sandboxTimeout: c.sandboxTimeout,
		replyTo: replyTo, statusTo: statusTo,
		received: received, delivery: d, log: log.With("profile", c.profile),
	}
	if s.cfg.SandboxMode == ModeNone {
		t.log = t.log.With("sandbox_mode", "NONE: this tool runs WITHOUT ISOLATION")
		t.log.Warn("SANDBOX_MODE=none: running the tool as a plain process of the worker, without any sandbox")
	}
	t.ctx, t.cancel = context.WithCancelCause(artifacts.WithRequester(s.execCtx, who.key(), who.Via))
	q := &queuedTask{task: t}
	if live, dup := s.inflight.LoadOrStore("task:"+req.TaskID, q); dup {
		t.cancel(nil)
		s.reject(d, sameRequester(live, who, replyTo), id, topicTool, errorf(CodeInvalidRequest, "task %q is already being executed", req.TaskID), log)
		return
	}
	if live, dup := s.inflight.LoadOrStore("id:"+req.ID, q); dup {
		s.inflight.Delete("task:" + req.TaskID)
		t.cancel(nil)
		s.reject(d, sameRequester(live, who, replyTo), id, topicTool, errorf(CodeInvalidRequest, "request id %q is already being executed", truncateName(req.ID)), log)
		return
	}
	// 10. queue, bounded for the worker and for each requester (sched.go).
	s.metrics.Queued.Inc()
	if e := s.queue.admit(q); e != nil {
		s.metrics.Queued.Dec()
		s.forget(t)
		t.cancel(nil)
		if e.perRequester {
			log = log.With("requester", who.key())
		}
		s.reject(d, replyTo, id, topicTool, errorf(CodeResourceExhausted, "%s", e.msg), log)
		return
	}
	log.Debug("request queued")
}

// sameRequester is replyTo when the live task a duplicate collides with
// is the same requester's, else "": a duplicate from another requester
// is not answered, since its replyTo is the live request's.
func sameRequester(live any, who requester, replyTo string) string {
	if q, ok := live.(*queuedTask); ok && q.who.key() == who.key() {
		return replyTo
	}
	return ""
}

// queuedTask is a task between dispatch and its answer. claimed decides,
// once, who answers it: the executor that dequeues it (and runs it), or
// a cancel that arrives while it waits (and answers CANCELLED at once).
type queuedTask struct {
	*task
	claimed atomic.Bool
}

// choice is what choose decides for one call.
type choice struct {
	profile string        // the profile the call runs with, as named in the manifest, config or request
	clamped string        // "asked->used" when the request asked for a looser profile; "" otherwise
	reason  string        // why it was clamped
	timeout time.Duration // the tool's timeout, without timeoutSlack
	// sandboxTimeout is the wall clock of the call's sandbox: timeout +
	// timeoutSlack (spec §3) fitted to the profile by
	// launcher.FitTimeout, computed here once per call.
	sandboxTimeout time.Duration
}

// choose returns the profile and the timeout of one call.
//
// The profile's ceiling is the manifest tool's profile, else the worker
// default (SANDBOX_DEFAULT_PROFILE). The call runs with the stricter of
// the ceiling and the request's profile (profiles.Set.Clamp holds the
// order): a looser request is clamped to the ceiling, never refused (spec
// §2; reference agents ask for "standard" on every call) and never
// honoured. An unknown name from the request is the caller's fault
// (INVALID_REQUEST), a ceiling the worker cannot use is the worker's
// (TOOL_NOT_AVAILABLE). The timeout is the request's (else
// DEFAULT_TIMEOUT_SECONDS) bounded by the manifest's.
func (s *Server) choose(tool *manifest.Tool, req *Request) (choice, *Error) {
	// 1. the ceiling.
	ceiling := tool.SandboxProfile
	if ceiling == "" {
		ceiling = s.cfg.DefaultProfile
	}
	prof, err := s.profiles.Lookup(ceiling)
	if err != nil {
		return choice{}, errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker: its sandbox profile %q cannot be used here", tool.Name, ceiling)
	}
	// 2. the request's profile: the stricter of it and the ceiling.
	c := choice{profile: ceiling}
	if asked := req.SandboxProfile; asked != "" {
		askedProf, err := s.profiles.Lookup(asked)
		if err != nil {
			return choice{}, errorf(CodeInvalidRequest, "sandbox profile %q (from the request): %v", truncateName(asked), err)
		}
		used, clamped, reason, err := s.profiles.Clamp(asked, ceiling)
		if err != nil {
			// Both names were found just above: a worker fault.
			return choice{}, errorf(CodeInternalError, "sandbox profile %q (from the request) under the ceiling %q: %v", truncateName(asked), ceiling, err)
		}
		c.profile = used
		if used == asked {
			prof = askedProf
		}
		if clamped {
			c.clamped, c.reason = asked+"->"+used, reason
		}
	}
	// 3. the timeout, and the sandbox's wall clock from it.
	c.timeout = s.cfg.DefaultTimeout
	if req.TimeoutSet {
		c.timeout = time.Duration(req.TimeoutSeconds * float64(time.Second))
	}
	if limit := manifestTimeout(tool); c.timeout > limit {
		c.timeout = limit
	}
	c.sandboxTimeout = launcher.FitTimeout(prof, c.timeout+timeoutSlack)
	return c, nil
}

// manifestTimeout is the tool's upper bound (default 300 s).
func manifestTimeout(tool *manifest.Tool) time.Duration {
	if tool.TimeoutSeconds > 0 {
		return time.Duration(tool.TimeoutSeconds) * time.Second
	}
	return 300 * time.Second
}

// availableNow is checked when an executor takes a queued task, before
// anything is created for it: the manifest may have dropped or changed the
// tool while it waited, and its module may have become unreadable. A
// changed tool gets its profile and timeout chosen again (a tightened
// ceiling applies to calls already queued).
func (s *Server) availableNow(t *task) *Error {
	s.mu.RLock()
	cur := s.manifest.Tools[t.req.ToolName]
	reason, bad := s.manifest.Unavailable[t.req.ToolName]
	s.mu.RUnlock()
	if cur == nil {
		if bad {
			return unavailableEntryError(t.req.ToolName, reason)
		}
		return errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker (removed from the manifest while the request was queued)", truncateName(t.req.ToolName))
	}
	if !cur.Equal(t.tool) {
		c, e := s.choose(cur, t.req)
		if e != nil {
			return e
		}
		t.tool, t.profile, t.clamped, t.timeout, t.sandboxTimeout = cur, c.profile, c.clamped, c.timeout, c.sandboxTimeout
		t.log.Info("the tool changed in the manifest while the request was queued; running the new definition", "profile", c.profile, "clamped", c.clamped)
	}
	if err := s.toolProblem(cur); err != nil {
		t.log.Error("tool cannot work on this worker", "error", err)
		return notHereError(cur.Name, err)
	}
	return nil
}

// dropStaleSubscription unsubscribes an invoke topic of a tool that is
// not in the manifest (spec §4 TOOL_NOT_AVAILABLE), unless a reload has
// brought the tool back meanwhile. It holds subMu, not mu: a reload
// waits for it, the receive loop does not.
func (s *Server) dropStaleSubscription(topic, tool string, log *slog.Logger) {
	s.subMu.Lock()
	defer s.subMu.Unlock()
	s.mu.RLock()
	back := s.manifest.Tools[tool] != nil
	s.mu.RUnlock()
	if back {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.tr.Unsubscribe(ctx, topic); err != nil {
		log.Warn("unsubscribing a tool that is not available failed", "topic", truncateName(topic), "error", err)
		return
	}
	s.mu.Lock()
	delete(s.subs, topic)
	s.mu.Unlock()
}

// cancelledBefore reports whether t's cancellation (a cancel message, or
// the shutdown's stop after the grace period) was asked before at, the
// moment its result was complete. Each cause's time is stored before the
// context is cancelled, so a cancelled context has one; a cause without
// a time (none is expected) counts as before.
func (s *Server) cancelledBefore(t *task, at time.Time) bool {
	cause := context.Cause(t.ctx)
	if cause == nil {
		return false
	}
	when := t.cancelAt.Load()
	if errors.Is(cause, errShutdown) {
		when = s.stopAt.Load()
	}
	return when == nil || when.Before(at)
}

// stopTools cancels every running tool with errShutdown. The time is
// stored first (only the first time), so cancelledBefore can tell a
// result complete before the stop from one the stop cut short.
func (s *Server) stopTools() {
	now := time.Now()
	s.stopAt.CompareAndSwap(nil, &now)
	s.execStop(errShutdown)
}

func (s *Server) forget(t *task) {
	s.inflight.Delete("task:" + t.req.TaskID)
	s.inflight.Delete("id:" + t.req.ID)
}

// cancel handles a message on .../cancel/{correlation_id}: the id is the
// request's JSON-RPC id (or its task id); a payload may also name the
// task id in "task_id" or "params.task_id". When an identity mode is on,
// the cancel is authenticated by the same rules as an invoke (auth.go
// verifyCancel) and honoured only from the requester that started the
// task; without one, any cancel is (the reference's model). A running
// sandbox is killed (the executor answers CANCELLED); a queued request
// is claimed and answered CANCELLED at once, by a goroutine of its own
// (the reply may wait for the broker), and the executor that later
// dequeues it skips it.
func (s *Server) cancel(d *transport.Delivery, id string, now time.Time) {
	// 1. who is asking.
	who, checked, e := s.verifyCancel(d, now)
	if e != nil {
		s.metrics.Errors.WithLabelValues(string(e.Code)).Inc()
		s.log.Warn("cancel refused", "correlation_id", truncateName(id), "code", e.Code, "error", e.Message)
		return
	}
	// 2. the task, by request id or task id.
	keys := []string{"id:" + id, "task:" + id}
	if tid := cancelTaskID(d.Payload); tid != "" {
		keys = append(keys, "task:"+tid)
	}
	for _, k := range keys {
		if v, ok := s.inflight.Load(k); ok {
			q := v.(*queuedTask)
			// 3. only its own requester may cancel it.
			if checked && q.who.key() != who.key() {
				s.metrics.Errors.WithLabelValues(string(CodeAuthenticationFailed)).Inc()
				q.log.Warn("cancel from another requester refused", "correlation_id", truncateName(id),
					"cancel_requester", who.key(), "cancel_verified_by", who.Via)
				return
			}
			q.log.Info("cancel requested", "correlation_id", truncateName(id))
			now := time.Now()
			q.cancelAt.CompareAndSwap(nil, &now)
			q.cancel(errCancelRequested)
			if q.claimed.CompareAndSwap(false, true) {
				if s.queue.remove(q) {
					s.metrics.Queued.Dec()
				}
				// Answered CANCELLED (its context is done) away from the
				// receive loop: the reply may wait for the broker
				// (publishReply retries). One goroutine per queued call
				// at most: a call is claimed once. The shutdown waits
				// for it (execWG); the receive loop, the only caller,
				// has ended before the shutdown's wait.
				s.execWG.Add(1)
				go func() {
					defer s.execWG.Done()
					s.runTask(q.task)
				}()
			}
			return
		}
	}
	s.log.Info("cancel for no running task ignored", "correlation_id", truncateName(id))
}

// shutdown: stop taking work, reject what is queued, let running tools
// finish within the grace period, then kill and answer the rest.
func (s *Server) shutdown() {
	// 1. stop taking work: no dispatch after this, invoke topics dropped.
	s.mu.Lock()
	s.stopping.Store(true)
	s.serving.Store(false)
	// In parallel: a transport may apply subscription changes only
	// between two receives, and takes all pending ones at once.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	var wg sync.WaitGroup
	for topic := range s.subs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.tr.Unsubscribe(ctx, topic); err != nil {
				s.log.Warn("unsubscribe at shutdown failed", "topic", topic, "error", err)
			}
		}()
	}
	wg.Wait()
	cancel()
	s.mu.Unlock()
	// The warm pool stops filling and kills its idle sandboxes; the
	// templates are retired (a call in flight in one finishes first).
	s.pool.stop()
	s.templates.stop()
	// 2. queued requests are answered RESOURCE_EXHAUSTED: the queue hands
	// them back as it closes, and the executors take nothing more (one
	// that took a call just before answers it the same way: stopping).
	for _, q := range s.queue.close() {
		s.metrics.Queued.Dec()
		if q.claimed.CompareAndSwap(false, true) {
			s.runTask(q.task)
		}
	}
	// 3. grace period for running tools, then kill.
	done := make(chan struct{})
	go func() { s.execWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownGrace):
		s.log.Warn("shutdown grace period over: stopping running tools", "grace", s.cfg.ShutdownGrace)
		s.stopTools()
		// The stopped tools' replies, and any reply waiting for the
		// broker, get replyShutdownWindow; then they are reported lost.
		lost := time.AfterFunc(replyShutdownWindow, func() { s.replyStop(errShutdown) })
		<-done
		lost.Stop()
	}
	s.stopTools()
	s.idle.stop()
	// 4. every pooled sandbox gone and its work area removed; the queued
	// rejections (outbox.go), notices and init replies sent (init.go),
	// each path waiting at most replyShutdownWindow for the broker.
	s.pool.wait()
	s.templates.wait()
	s.out.close(replyShutdownWindow)
	s.stopNotices()
	s.log.Info("worker stopped")
}
