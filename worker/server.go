package worker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

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
	// Installer installs manifest packages; nil = tools with a package
	// are run as they are (the import fails if it is missing).
	Installer *manifest.Installer
	Logger    *slog.Logger
	Metrics   *Metrics // nil = NewMetrics()
}

// Server serves tool invocations: one receive loop, MaxConcurrent
// executors fed by a bounded queue, a manifest watcher.
type Server struct {
	cfg     *Config
	tr      transport.Transport
	sb      Sandboxes
	store   artifacts.Store
	inst    *manifest.Installer
	log     *slog.Logger
	metrics *Metrics
	base    string

	runnerPath string

	// mu guards the manifest and the subscriptions: a reload holds it
	// while it changes subscriptions, the receive loop while it dispatches
	// one request, so no request is served against a half-applied reload.
	mu       sync.RWMutex
	manifest *manifest.Manifest
	subs     map[string]bool // invoke topics subscribed

	queue    chan *task
	inflight sync.Map // request id and task id -> *task
	execCtx  context.Context
	execStop context.CancelCauseFunc
	execWG   sync.WaitGroup

	limiter  *rateLimiter
	stopping atomic.Bool // no new work is taken
	stopped  atomic.Bool // Run has returned
	serving  atomic.Bool // Connect succeeded and not stopping
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
	if err := opts.Sandboxes.CheckProfile(cfg.DefaultProfile); err != nil {
		return nil, fmt.Errorf("worker: SANDBOX_DEFAULT_PROFILE %q: %w", cfg.DefaultProfile, err)
	}
	execCtx, execStop := context.WithCancelCause(context.Background())
	s := &Server{
		cfg: cfg, tr: opts.Transport, sb: opts.Sandboxes, store: opts.Store, inst: opts.Installer,
		log: log, metrics: m, base: cfg.Base(),
		subs:    map[string]bool{},
		queue:   make(chan *task, cfg.MaxQueued),
		execCtx: execCtx, execStop: execStop,
		limiter: newRateLimiter(cfg.RatePerMinute, cfg.RateBurst),
	}
	return s, nil
}

// Metrics returns the server's metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Ready reports whether the worker is connected and taking work.
func (s *Server) Ready() bool {
	return s.serving.Load() && !s.stopping.Load() && s.tr.State() == transport.Connected
}

// Topic helpers (spec §1).
func (s *Server) invokeTopic(tool string) string { return s.base + "/sam_remote_tool/invoke/" + tool }
func (s *Server) removedTopic(tool string) string {
	return s.base + "/sam_remote_tool/removed/" + tool
}
func (s *Server) cancelPattern() string    { return s.base + "/sam_remote_tool/cancel/>" }
func (s *Server) discoveryPattern() string { return s.base + "/discovery/>" }

// Run serves until ctx ends, then shuts down: it stops taking work
// (unsubscribes), rejects queued requests with RESOURCE_EXHAUSTED, lets
// running tools finish within ShutdownGrace, then kills them and replies
// CANCELLED. It returns after every taken request has been answered.
func (s *Server) Run(ctx context.Context) error {
	defer s.stopped.Store(true)
	// 1. directories: stale work dirs from a crash removed, the runner
	// installed read-only, the site dir present.
	if err := s.prepareDirs(); err != nil {
		return err
	}
	// 2. the manifest: a broken manifest at startup is fatal (there is no
	// previous one to keep).
	m, err := manifest.Load(s.cfg.ManifestPath)
	if err != nil {
		return fmt.Errorf("worker: load manifest: %w", err)
	}
	s.manifest = m
	// 3. connect with every subscription inside the connect, so a request
	// published the moment the worker appears is not missed.
	subs := []string{s.cancelPattern(), s.discoveryPattern()}
	for _, name := range sortedKeys(m.Tools) {
		topic := s.invokeTopic(name)
		subs = append(subs, topic)
		s.subs[topic] = true
	}
	if err := s.tr.Connect(ctx, subs); err != nil {
		return fmt.Errorf("worker: connect: %w", err)
	}
	s.serving.Store(true)
	s.log.Info("worker serving", "namespace", s.cfg.Namespace, "worker_id", s.cfg.WorkerID,
		"tools", sortedKeys(m.Tools), "max_concurrent", s.cfg.MaxConcurrent)
	// 4. executors.
	for i := 0; i < s.cfg.MaxConcurrent; i++ {
		s.execWG.Add(1)
		go func() {
			defer s.execWG.Done()
			for t := range s.queue {
				s.metrics.Queued.Dec()
				s.runTask(t)
			}
		}()
	}
	// 5. manifest hot reload.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		manifest.Watch(watchCtx, s.cfg.ManifestPath, s.cfg.ReloadInterval, s.applyManifest,
			func(format string, a ...any) { s.log.Warn(fmt.Sprintf(format, a...)) })
	}()
	// 6. the receive loop.
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
	stopWatch()
	<-watchDone
	s.shutdown()
	return loopErr
}

// prepareDirs runs at startup.
func (s *Server) prepareDirs() error {
	// 1. the work base exists and is not group/world writable.
	if err := os.MkdirAll(s.cfg.WorkDir, 0o711); err != nil {
		return fmt.Errorf("worker: create work dir %s: %w", s.cfg.WorkDir, err)
	}
	// 2. every task work dir left by a previous run (crash, SIGKILL) is
	// removed. Only real directories carrying str's marker count: anything
	// else under the base (an operator's files, a symlink) is left alone.
	entries, err := os.ReadDir(s.cfg.WorkDir)
	if err != nil {
		return fmt.Errorf("worker: read work dir %s: %w", s.cfg.WorkDir, err)
	}
	for _, e := range entries {
		p := filepath.Join(s.cfg.WorkDir, e.Name())
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue
		}
		if fi, err := os.Lstat(filepath.Join(p, WorkDirMarker)); err != nil || !fi.Mode().IsRegular() {
			s.log.Warn("left alone under the work dir: not a str work dir", "path", p)
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("worker: remove stale work dir %s: %w", p, err)
		}
		s.log.Info("removed stale work dir", "path", p)
	}
	// 3. the runner, read-only.
	if err := os.MkdirAll(s.cfg.RunnerDir, 0o755); err != nil {
		return fmt.Errorf("worker: create runner dir %s: %w", s.cfg.RunnerDir, err)
	}
	path, err := runner.Install(s.cfg.RunnerDir)
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	s.runnerPath = path
	// 4. the package site dir.
	if err := os.MkdirAll(s.cfg.SiteDir, 0o755); err != nil {
		return fmt.Errorf("worker: create site dir %s: %w", s.cfg.SiteDir, err)
	}
	return nil
}

// applyManifest is the reload callback: it runs with the dispatch lock
// held, so subscriptions for added tools exist and those of removed tools
// are gone before the next request is dispatched.
func (s *Server) applyManifest(m *manifest.Manifest) error {
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
	var subsMu sync.Mutex
	for _, name := range added {
		topic := s.invokeTopic(name)
		change(s.tr.Subscribe, "subscribe", topic, func() { subsMu.Lock(); s.subs[topic] = true; subsMu.Unlock() })
	}
	for _, name := range removed {
		topic := s.invokeTopic(name)
		change(s.tr.Unsubscribe, "unsubscribe", topic, func() { subsMu.Lock(); delete(s.subs, topic); subsMu.Unlock() })
	}
	wg.Wait()
	for _, name := range removed {
		if err := s.publish(s.removedTopic(name), []byte(fmt.Sprintf(`{"tool_name":%q}`, name))); err != nil {
			s.log.Warn("publishing tool removal failed", "tool", name, "error", err)
		}
	}
	if len(errs) > 0 {
		// Keep the previous manifest: the watcher applies this content
		// again at the next poll and the failed subscriptions are retried.
		return errors.Join(errs...)
	}
	s.manifest = m
	if len(added)+len(removed)+len(changed) > 0 {
		s.log.Info("manifest reloaded", "added", added, "removed", removed, "changed", changed)
	}
	return nil
}

// publish sends one worker message with the timestamp user property.
func (s *Server) publish(topic string, payload []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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

// reject answers a request that will not run and acks it.
func (s *Server) reject(d *transport.Delivery, replyTo, id, tool string, e *Error, log *slog.Logger) {
	s.metrics.Errors.WithLabelValues(string(e.Code)).Inc()
	s.metrics.Invocations.WithLabelValues(toolLabel(tool), string(e.Code)).Inc()
	log.Warn("request rejected", "code", e.Code, "error", e.Message)
	if err := s.publish(replyTo, EncodeError(id, e)); err != nil {
		log.Error("publishing the error reply failed", "reply_to", replyTo, "error", err)
	}
	ack(log, d)
}

// toolLabel keeps metric label cardinality bounded for unknown tools.
func toolLabel(tool string) string {
	if tool == "" {
		return "-"
	}
	return tool
}

// dispatch handles one delivery in the receive loop.
func (s *Server) dispatch(d *transport.Delivery, received time.Time) {
	switch {
	case strings.HasPrefix(d.Topic, s.base+"/sam_remote_tool/invoke/"):
		s.dispatchInvoke(d, strings.TrimPrefix(d.Topic, s.base+"/sam_remote_tool/invoke/"), received)
	case strings.HasPrefix(d.Topic, s.base+"/sam_remote_tool/cancel/"):
		s.cancel(strings.TrimPrefix(d.Topic, s.base+"/sam_remote_tool/cancel/"), d.Payload)
		ack(s.log, d)
	default:
		// discovery and anything else: ignored.
		s.log.Debug("ignored message", "topic", d.Topic)
		ack(s.log, d)
	}
}

func (s *Server) dispatchInvoke(d *transport.Delivery, topicTool string, received time.Time) {
	log := s.log.With("tool", topicTool)
	// 1. no replyTo: nobody to answer; log and ack.
	replyTo := d.UserProperties[PropReplyTo]
	if replyTo == "" {
		log.Warn("invoke request without replyTo ignored", "topic", d.Topic, "id", LenientID(d.Payload, s.cfg.MaxPayloadBytes))
		ack(log, d)
		return
	}
	// 2. signature over the exact payload bytes, before anything else is
	// believed (§13).
	if s.cfg.SigningSecret != "" {
		if e := checkSignature(s.cfg.SigningSecret, d.Payload, d.UserProperties[PropSignature]); e != nil {
			s.reject(d, replyTo, LenientID(d.Payload, s.cfg.MaxPayloadBytes), topicTool, e, log)
			return
		}
	}
	// 3. parse and validate.
	req, id, perr := ParseRequest(d.Payload, ParseLimits{MaxPayloadBytes: s.cfg.MaxPayloadBytes})
	if perr != nil {
		s.reject(d, replyTo, id, topicTool, perr, log.With("id", id))
		return
	}
	log = log.With("id", req.ID, "task_id", req.TaskID, "user_id", req.UserID)
	if req.ToolName != topicTool {
		s.reject(d, replyTo, id, topicTool, errorf(CodeInvalidRequest,
			"params.tool_name %q does not match the topic's tool %q", req.ToolName, topicTool), log)
		return
	}
	// 4. the tool, under the dispatch lock (a reload is either fully
	// applied or not at all).
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.stopping.Load() {
		s.reject(d, replyTo, id, topicTool, errorf(CodeResourceExhausted, "worker is shutting down"), log)
		return
	}
	tool := s.manifest.Tools[topicTool]
	if tool == nil {
		s.reject(d, replyTo, id, topicTool, errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker", topicTool), log)
		s.dropStaleSubscription(d.Topic, log)
		return
	}
	// 5. per-user rate limit.
	if !s.limiter.allow(req.UserID, received) {
		s.reject(d, replyTo, id, topicTool, errorf(CodeResourceExhausted, "rate limit for user %q exceeded", req.UserID), log)
		return
	}
	// 6. profile: manifest, else request, else worker default; unknown
	// names are refused, never replaced.
	profile, source := tool.SandboxProfile, "manifest"
	if profile == "" {
		profile, source = req.SandboxProfile, "request"
	}
	if profile == "" {
		profile, source = s.cfg.DefaultProfile, "worker default"
	}
	if err := s.sb.CheckProfile(profile); err != nil {
		s.reject(d, replyTo, id, topicTool, errorf(CodeInvalidRequest, "sandbox profile %q (from the %s): %v", profile, source, err), log)
		return
	}
	// 7. timeout: the request's (or the worker default) bounded by the
	// manifest's.
	timeout := s.cfg.DefaultTimeout
	if req.TimeoutSet {
		timeout = time.Duration(req.TimeoutSeconds * float64(time.Second))
	}
	if limit := manifestTimeout(tool); timeout > limit {
		timeout = limit
	}
	// 8. one execution per task id and per request id at a time.
	t := &task{
		req: req, tool: tool, profile: profile, timeout: timeout,
		replyTo: replyTo, statusTo: d.UserProperties[PropStatusTo],
		received: received, delivery: d, log: log.With("profile", profile),
	}
	t.ctx, t.cancel = context.WithCancelCause(s.execCtx)
	if _, dup := s.inflight.LoadOrStore("task:"+req.TaskID, t); dup {
		t.cancel(nil)
		s.reject(d, replyTo, id, topicTool, errorf(CodeInvalidRequest, "task %q is already being executed", req.TaskID), log)
		return
	}
	if _, dup := s.inflight.LoadOrStore("id:"+req.ID, t); dup {
		s.inflight.Delete("task:" + req.TaskID)
		t.cancel(nil)
		s.reject(d, replyTo, id, topicTool, errorf(CodeInvalidRequest, "request id %q is already being executed", req.ID), log)
		return
	}
	// 9. queue, bounded.
	select {
	case s.queue <- t:
		s.metrics.Queued.Inc()
		log.Debug("request queued")
	default:
		s.forget(t)
		t.cancel(nil)
		s.reject(d, replyTo, id, topicTool, errorf(CodeResourceExhausted,
			"worker queue is full (%d running, %d waiting)", s.cfg.MaxConcurrent, s.cfg.MaxQueued), log)
	}
}

// manifestTimeout is the tool's upper bound (default 300 s).
func manifestTimeout(tool *manifest.Tool) time.Duration {
	if tool.TimeoutSeconds > 0 {
		return time.Duration(tool.TimeoutSeconds) * time.Second
	}
	return 300 * time.Second
}

// dropStaleSubscription unsubscribes an invoke topic of a tool that is
// not in the manifest (spec §4 TOOL_NOT_AVAILABLE). Called under s.mu.
func (s *Server) dropStaleSubscription(topic string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.tr.Unsubscribe(ctx, topic); err != nil {
		log.Warn("unsubscribing a tool that is not available failed", "topic", topic, "error", err)
	}
}

func (s *Server) forget(t *task) {
	s.inflight.Delete("task:" + t.req.TaskID)
	s.inflight.Delete("id:" + t.req.ID)
}

// cancel handles a message on .../cancel/{correlation_id}: the id is the
// request's JSON-RPC id (or its task id); a payload may also name the
// task id in "task_id" or "params.task_id".
func (s *Server) cancel(id string, payload []byte) {
	keys := []string{"id:" + id, "task:" + id}
	if tid := cancelTaskID(payload); tid != "" {
		keys = append(keys, "task:"+tid)
	}
	for _, k := range keys {
		if v, ok := s.inflight.Load(k); ok {
			t := v.(*task)
			t.log.Info("cancel requested", "correlation_id", id)
			t.cancel(errCancelRequested)
			return
		}
	}
	s.log.Info("cancel for no running task ignored", "correlation_id", id)
}

// checkSignature verifies the hex HMAC-SHA256 of payload.
func checkSignature(secret string, payload []byte, sig string) *Error {
	if sig == "" {
		return errorf(CodeAuthenticationFailed, "request signature missing (user property %q)", PropSignature)
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return errorf(CodeAuthenticationFailed, "request signature is not hex")
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(payload)
	if !hmac.Equal(got, mac.Sum(nil)) {
		return errorf(CodeAuthenticationFailed, "request signature does not match the payload")
	}
	return nil
}

// Sign returns the hex HMAC-SHA256 signature of payload (for clients).
func Sign(secret string, payload []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(payload)
	return hex.EncodeToString(mac.Sum(nil))
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
	// 2. queued requests are answered RESOURCE_EXHAUSTED (executors do the
	// same for any they pick up from now on).
	close(s.queue)
	for t := range s.queue {
		s.metrics.Queued.Dec()
		s.runTask(t)
	}
	// 3. grace period for running tools, then kill.
	done := make(chan struct{})
	go func() { s.execWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.ShutdownGrace):
		s.log.Warn("shutdown grace period over: stopping running tools", "grace", s.cfg.ShutdownGrace)
		s.execStop(errShutdown)
		<-done
	}
	s.execStop(errShutdown)
	s.log.Info("worker stopped")
}

// rateLimiter is a per-user token bucket; nil when off.
type rateLimiter struct {
	mu      sync.Mutex
	rate    float64 // tokens per second
	burst   float64
	buckets map[string]*bucket
	sweep   time.Time
}

type bucket struct {
	tokens float64
	last   time.Time
}

func newRateLimiter(perMinute float64, burst int) *rateLimiter {
	if perMinute <= 0 {
		return nil
	}
	b := float64(burst)
	if b <= 0 {
		b = perMinute
	}
	return &rateLimiter{rate: perMinute / 60, burst: b, buckets: map[string]*bucket{}}
}

func (r *rateLimiter) allow(user string, now time.Time) bool {
	if r == nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Forget full buckets now and then so idle users cost nothing.
	if now.Sub(r.sweep) > time.Minute {
		for u, b := range r.buckets {
			if b.tokens+now.Sub(b.last).Seconds()*r.rate >= r.burst {
				delete(r.buckets, u)
			}
		}
		r.sweep = now
	}
	b := r.buckets[user]
	if b == nil {
		b = &bucket{tokens: r.burst, last: now}
		r.buckets[user] = b
	}
	b.tokens += now.Sub(b.last).Seconds() * r.rate
	if b.tokens > r.burst {
		b.tokens = r.burst
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
