package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
)

// Per-tool templates (manifest `warm: template`, opt-in): a tool's calls
// are served by one pre-imported Python that forks each call into
// namespaces of its own (launcher/template; SECURITY.md "Per-tool
// templates"). The worker keeps one template per tool, made at the
// manifest's load (and at a reload that adds or changes the tool) and
// replaced when the launcher retires it (its recycling limits, a failed
// check, its process ended) or when the tool's module changes on disk.
// A call never waits for a template: every start runs in the background,
// and a call that finds no template ready runs cold at once (counted:
// str_worker_template_fallbacks_total{reason="not_ready"}, or
// "start_failed" when its last start failed). Before, the call that
// found a template dead waited for its replacement's import, up to a
// minute when that never said ready. A start that fails (the import
// fails or does not say ready within STR_TEMPLATE_START_TIMEOUT_SECONDS,
// the launcher refuses the template) and a template that ends or fails a
// check are restarted after a back-off (1 s doubling to 60 s, reset by a
// call the template serves), by a timer: a tool whose template cannot
// start or keeps dying costs one start a minute, not one a call. A
// template recycled after its calls or age is replaced at once, by the
// call that was its last. A call runs in a template only where it would
// get nothing less
// than a cold one: root mode (the templates lease host ids), a call of
// the tool's own function (not the init sub-protocol), and a tool
// without credentials (each call reads its secrets and gets placeholders
// of its own, in its environment: a template's environment is fixed at
// its start); any other call runs cold. A call's network is a cold
// call's: the egress proxy with the tool's policy on its own listeners
// (launcher/template C5), its denials in its reply.

// TemplateStarter starts per-tool templates: LauncherTemplates in root
// mode (`str worker` passes it); nil = no templates, every call cold.
type TemplateStarter interface {
	StartTemplate(ctx context.Context, tr template.Request) (Template, error)
}

// Template is a running per-tool template as the worker uses it: a
// *template.Template (package launcher/template says what each method
// does).
type Template interface {
	Call(ctx context.Context, runnerArgs []byte, opts template.CallOptions) (*template.CallResult, error)
	CallWorkDir(spec launcher.WorkDirSpec, uid, gid int) (*launcher.WorkDir, error)
	Retired() error
	Why() template.RetireReason
	Stale(hash string) bool
	Pid() int
	Drain()
	Close()
}

// LauncherTemplates is template.Start with l as a TemplateStarter.
func LauncherTemplates(l *launcher.Launcher) TemplateStarter { return launcherTemplates{l} }

type launcherTemplates struct{ l *launcher.Launcher }

func (lt launcherTemplates) StartTemplate(ctx context.Context, tr template.Request) (Template, error) {
	tpl, err := template.Start(ctx, lt.l, tr)
	if err != nil {
		return nil, err // never a typed nil in the interface
	}
	return tpl, nil
}

// templateWorkTarget is where a template call's work dir is mounted: a
// directory of its own under an otherwise empty one, as a cold call's
// work dir is alone in its parent (no other task's name is listed).
const templateWorkTarget = "/str/work"

// The reasons of str_worker_templates_retired_total: the launcher's
// (template.RetireReason: it served its calls, it is too old, a check at
// a fork order, of a child or of a slot's cgroup failed, its process
// ended; the worker's log has the launcher's words), and the worker's:
// the tool's module changed on disk, a manifest reload changed the tool's
// entry or removed the tool (retired at the reload), the worker shut
// down.
const (
	retiredSourceChanged = "source_changed"
	retiredEntryChanged  = "entry_changed"
	retiredRemoved       = "removed"
	retiredShutdown      = "shutdown"

	templateRetireReasons = string(template.RetiredCalls) + ", " + string(template.RetiredAge) + ", " +
		string(template.RetiredFailedCheck) + ", " + string(template.RetiredEnded) + ", " +
		retiredSourceChanged + ", " + retiredEntryChanged + ", " + retiredRemoved + ", " + retiredShutdown
)

// The reasons of str_worker_template_fallbacks_total: a warm: template
// tool's call that ran in a sandbox of its own because it may not run in
// a template (templateEligible: no templates in this mode, the init
// sub-protocol, a tool with credentials), no template could be started,
// its template was retired before the call reached it and the next one
// could not take it, or the call's egress listeners could not be made in
// its namespace (template.ErrCallNetwork: nothing of the call had reached
// the template's child; the template serves the next call).
//
// And the worker's own, for a call that found no ready template (it never
// waits for one): its template is being started or restarted
// (not_ready: at the manifest's load, after the previous one was retired,
// or in the back-off after it ended or failed a check), or its last start
// failed and the back-off has not ended (start_failed).
const (
	fallbackNotEligible     = "not_eligible"
	fallbackNotReady        = "not_ready"
	fallbackStartFailed     = "start_failed"
	fallbackRetired         = "retired_before_call"
	fallbackCallNetwork     = "call_network_failed"
	templateFallbackReasons = fallbackNotEligible + ", " + fallbackNotReady + ", " + fallbackStartFailed + ", " + fallbackRetired + ", " + fallbackCallNetwork
)

// The back-off after a failed template start, or a template that ended
// or failed a check: the next start templateBackoffFirst later, doubling
// at each failure in a row up to templateBackoffMax; a call the template
// serves resets it.
// (Variables: a test makes the back-off long enough to observe.)
var (
	templateBackoffFirst = time.Second
	templateBackoffMax   = time.Minute
)

// templateBackoff is the wait after the failures-th failed start in a
// row (failures >= 1).
func templateBackoff(failures int) time.Duration {
	return min(templateBackoffFirst<<min(failures-1, 16), templateBackoffMax)
}

// templateSet is the worker's templates, by tool name and profile.
type templateSet struct {
	start   TemplateStarter
	metrics *Metrics
	// ctx is every template's lifetime, cancelled by closeAll: a start in
	// progress ends with it (its sandbox is killed), not at its timeout.
	ctx    context.Context
	cancel context.CancelFunc
	starts sync.WaitGroup // one per start in progress

	mu     sync.Mutex
	by     map[string]*toolTemplate
	closed bool
}

func newTemplateSet(start TemplateStarter, m *Metrics) *templateSet {
	ctx, cancel := context.WithCancel(context.Background())
	return &templateSet{start: start, metrics: m, ctx: ctx, cancel: cancel, by: map[string]*toolTemplate{}}
}

// toolTemplate is one tool's template under one profile: the one in
// service (tpl), or none yet with a start in progress or a back-off.
type toolTemplate struct {
	tool    manifest.Tool // the entry it is made for
	profile string
	hash    string   // its module's source (sourceHash) when its start began
	tpl     Template // in service; nil while none is ready
	// starting: a start runs in the background (startTemplateLocked).
	starting bool
	// failures: failed starts, ends and failed checks in a row; the next
	// start runs at retryAt (retry's timer); startFailed: the last
	// failure was a start's.
	failures    int
	retryAt     time.Time
	retry       *time.Timer
	startFailed bool
}

// failLocked counts a failure of tt's template (ts.mu held) and arms the
// restart after the back-off.
func (s *Server) failLocked(name, key string, tt *toolTemplate, start bool) time.Duration {
	ts := s.templates
	tt.failures++
	tt.startFailed = start
	wait := templateBackoff(tt.failures)
	tt.retryAt = time.Now().Add(wait)
	if tt.retry != nil {
		tt.retry.Stop()
	}
	tt.retry = time.AfterFunc(wait, func() {
		ts.mu.Lock()
		defer ts.mu.Unlock()
		// Only if nothing replaced it meanwhile: a call may have started
		// one, a reload removed the tool, the worker shut down.
		if !ts.closed && ts.by[key] == tt && tt.tpl == nil && !tt.starting {
			s.startTemplateLocked(name, key, tt)
		}
	})
	return wait
}

// served: tpl, the template of key, served a call: its failures in a
// row are over.
func (ts *templateSet) served(key string, tpl Template) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if tt := ts.by[key]; tt != nil && tt.tpl == tpl {
		tt.failures = 0
	}
}

// closeAll closes every template and ends the starts in progress (the
// worker's shutdown).
func (ts *templateSet) closeAll() {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	all := ts.by
	ts.by = map[string]*toolTemplate{}
	ts.closed = true
	ts.metrics.TemplatesLive.Set(0)
	ts.mu.Unlock()
	ts.cancel() // a start in progress: its sandbox is killed, the start fails
	for _, tt := range all {
		if tt.retry != nil {
			tt.retry.Stop()
		}
		if tt.tpl != nil {
			ts.metrics.TemplatesRetired.WithLabelValues(retiredShutdown).Inc()
			tt.tpl.Close()
		}
	}
	ts.starts.Wait()
}

// liveLocked sets the live gauge (ts.mu held).
func (ts *templateSet) liveLocked() {
	n := 0
	for _, tt := range ts.by {
		if tt.tpl != nil {
			n++
		}
	}
	ts.metrics.TemplatesLive.Set(float64(n))
}

// drop takes the template of tt out of service for reason (ts.mu held):
// its calls in flight finish first. tt stays, without a template.
func (ts *templateSet) drop(tt *toolTemplate, reason string) {
	ts.metrics.TemplatesRetired.WithLabelValues(reason).Inc()
	tpl := tt.tpl
	tt.tpl = nil
	ts.liveLocked()
	go tpl.Drain() // its calls in flight finish first, then it ends
}

// retireGone retires, at a manifest reload, the templates of the tools m
// no longer has (removed) or whose entry it changed (entry_changed),
// rather than leaving them, unused, to the end of their age.
func (ts *templateSet) retireGone(m *manifest.Manifest) {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for key, tt := range ts.by {
		name, _, _ := strings.Cut(key, "\x00")
		reason := ""
		switch now := m.Tools[name]; {
		case now == nil:
			reason = retiredRemoved
		case !tt.tool.Equal(now):
			reason = retiredEntryChanged
		default:
			continue
		}
		if tt.tpl != nil {
			ts.drop(tt, reason)
		}
		if tt.retry != nil {
			tt.retry.Stop()
		}
		// A start in progress for the old entry closes what it makes
		// (its entry is no longer in ts.by).
		delete(ts.by, key)
	}
}

// templateEligible: the call may run in a template (see above).
func (s *Server) templateEligible(t *task) bool {
	return s.templates != nil && t.tool.Template && t.mode != runner.ModeInit && s.cfg.SandboxMode != ModeNone && t.tool.Credentials == nil
}

// sourceHash is the tool's module file's sha256 ("" if unreadable: the
// call then fails its import as a cold one would).
func (s *Server) sourceHash(tool *manifest.Tool) string {
	b, err := os.ReadFile(filepath.Join(s.cfg.ToolsDir, strings.ReplaceAll(tool.Module, ".", "/")+".py"))
	if err != nil {
		return ""
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// templateKey is the key of tool name's template under profile.
func templateKey(name, profile string) string { return name + "\x00" + profile }

// prestartTemplates starts, in the background, the template of every
// tool of m that is served by one (under the tool's own profile, the one
// its calls run in unless a request asks another) and has none, so that
// its first call finds it ready.
func (s *Server) prestartTemplates(m *manifest.Manifest) {
	ts := s.templates
	if ts == nil || m == nil || s.cfg.SandboxMode == ModeNone {
		return
	}
	for _, name := range m.Names() {
		tool := m.Tools[name]
		if !tool.Template || tool.Credentials != nil || s.toolProblem(tool) != nil {
			continue // not eligible (templateEligible); a tool with a problem: its calls are refused
		}
		profile := tool.SandboxProfile
		if profile == "" {
			profile = s.cfg.DefaultProfile
		}
		if _, err := s.profiles.Lookup(profile); err != nil {
			continue
		}
		hash := s.sourceHash(tool)
		ts.mu.Lock()
		if key := templateKey(name, profile); ts.by[key] == nil && !ts.closed {
			tt := &toolTemplate{tool: *tool, profile: profile, hash: hash}
			ts.by[key] = tt
			s.startTemplateLocked(name, key, tt)
		}
		ts.mu.Unlock()
	}
}

// templateFor returns the tool's template for this call's profile, or
// nil and why there is none ready (a fallback reason): it never waits
// for one. A template retired, stale (its module's source changed) or
// made for another entry of the tool is taken out of service; when there
// is none, a start begins in the background unless one runs or the
// back-off after a failed one has not ended.
func (s *Server) templateFor(t *task) (Template, string) {
	ts := s.templates
	hash := s.sourceHash(t.tool)
	key := templateKey(t.req.ToolName, t.profile)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		return nil, fallbackNotReady // the worker is shutting down: its templates are closed
	}
	tt := ts.by[key]
	if tt != nil && tt.tpl != nil {
		var reason string
		switch retired := tt.tpl.Retired(); {
		case retired != nil:
			reason = string(tt.tpl.Why())
			t.log.Info("template retired", "tool", t.req.ToolName, "pid", tt.tpl.Pid(), "why", retired.Error())
		case tt.tpl.Stale(hash):
			reason = retiredSourceChanged
		case !tt.tool.Equal(t.tool):
			reason = retiredEntryChanged
		default:
			return tt.tpl, ""
		}
		s.dropLocked(t.req.ToolName, key, tt, reason)
	}
	if tt == nil || tt.hash != hash || !tt.tool.Equal(t.tool) {
		// None yet, or a start (or back-off) for another version of the
		// tool: this one starts afresh (a start in progress for the old
		// one closes what it makes).
		tt = &toolTemplate{tool: *t.tool, profile: t.profile, hash: hash}
		ts.by[key] = tt
	}
	switch {
	case tt.starting:
		return nil, fallbackNotReady
	case time.Now().Before(tt.retryAt) && tt.startFailed:
		return nil, fallbackStartFailed
	case time.Now().Before(tt.retryAt):
		return nil, fallbackNotReady // restarted by its timer
	}
	s.startTemplateLocked(t.req.ToolName, key, tt)
	return nil, fallbackNotReady
}

// dropLocked takes tt's template out of service for reason (ts.mu held):
// one that ended or failed a check counts as a failure (its restart
// waits the back-off); one recycled, stale or replaced does not.
func (s *Server) dropLocked(name, key string, tt *toolTemplate, reason string) {
	s.templates.drop(tt, reason)
	switch template.RetireReason(reason) {
	case template.RetiredEnded, template.RetiredFailedCheck:
		s.failLocked(name, key, tt, false)
	}
}

// renewTemplate takes old, the tool's template for t's profile, retired,
// out of service and starts its replacement in the background (unless a
// start runs, the back-off has not ended, or the tool's module or entry
// changed since: the next call's templateFor sees to those).
func (s *Server) renewTemplate(t *task, old Template) {
	ts := s.templates
	hash := s.sourceHash(t.tool)
	key := templateKey(t.req.ToolName, t.profile)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	tt := ts.by[key]
	if ts.closed || tt == nil || tt.tpl != old {
		return // already replaced
	}
	s.dropLocked(t.req.ToolName, key, tt, string(old.Why()))
	t.log.Info("template retired", "tool", t.req.ToolName, "pid", old.Pid(), "why", old.Retired().Error())
	if tt.starting || time.Now().Before(tt.retryAt) || tt.hash != hash || !tt.tool.Equal(t.tool) {
		return // its timer, or the next call's templateFor, starts the next one
	}
	s.startTemplateLocked(t.req.ToolName, key, tt)
}

// startTemplateLocked starts tt's template in the background (ts.mu
// held): once ready it serves the tool's next calls; a failure sets the
// back-off. A start whose entry was replaced or removed meanwhile, or
// that ends after the shutdown began, closes what it made.
func (s *Server) startTemplateLocked(name, key string, tt *toolTemplate) {
	ts := s.templates
	argv := []string{"--template", "3", tt.tool.Module, tt.tool.Function}
	if tt.tool.ClassName != "" {
		argv = append(argv, tt.tool.ClassName)
	}
	spec := s.sandboxSpec(tt.profile, callDirPrefix, 0, nil, tt.tool.Network, &tt.tool)
	req := launcher.Request{Profile: spec.Profile, Argv: s.runnerArgv(-1, argv...), Env: spec.Env, Network: spec.Network}
	for _, d := range spec.ReadOnly {
		req.Binds = append(req.Binds, launcher.Bind{Source: d})
	}
	tr := template.Request{Request: req, SourceHash: tt.hash, WorkDirTarget: templateWorkTarget, ReadyTimeout: s.cfg.TemplateStartTimeout}
	tt.starting = true
	ts.starts.Add(1)
	go func() {
		defer ts.starts.Done()
		t0 := time.Now()
		tpl, err := ts.start.StartTemplate(ts.ctx, tr)
		ts.mu.Lock()
		tt.starting = false
		current := !ts.closed && ts.by[key] == tt
		var retryIn time.Duration
		switch {
		case err != nil:
			ts.metrics.TemplateStartFailures.WithLabelValues(name).Inc()
			if current {
				retryIn = s.failLocked(name, key, tt, true)
			}
		case current:
			// Its failures count on until it serves a call: a template
			// that starts and dies at once keeps backing off.
			tt.tpl, tt.retryAt = tpl, time.Time{}
			ts.metrics.TemplatesStarted.WithLabelValues(name).Inc()
			ts.liveLocked()
		}
		ts.mu.Unlock()
		switch {
		case err != nil:
			s.log.Warn("a template could not be started: the tool's calls run cold", "tool", name, "profile", tt.profile,
				"start_ms", time.Since(t0).Milliseconds(), "retry_in_ms", retryIn.Milliseconds(), "error", err)
		case !current:
			tpl.Close() // made for an entry that is gone, or after the shutdown began
		default:
			s.log.Info("template started", "tool", name, "profile", tt.profile, "pid", tpl.Pid(), "start_ms", time.Since(t0).Milliseconds())
		}
	}()
}

// executeTemplate runs t in its tool's template (handled false: run it
// cold instead). Its work dir is made for the call's host ids once the
// launcher knows them, mounted in the call at templateWorkTarget; the
// runner's arguments name it there. The runner's result document comes
// back on the call's socket and is decoded as a cold call's result file
// is (runner.DecodeResult), never written into the work dir.
func (s *Server) executeTemplate(t *task) (outcome, func(), bool) {
	tpl, why := s.templateFor(t)
	if tpl == nil {
		t.log.Info("no template ready: the call runs cold", "reason", why)
		s.metrics.TemplateFallbacks.WithLabelValues(why).Inc()
		return outcome{}, nil, false
	}
	var (
		wd    *launcher.WorkDir
		relay *statusRelay
		paths map[string]string
		meta  map[string]runner.ArtifactMeta
		perr  *Error
	)
	inside := func(p string) string {
		if rel, err := filepath.Rel(wd.Path, p); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(templateWorkTarget, rel)
		}
		return p
	}
	opts := template.CallOptions{
		Timeout: t.sandboxTimeout,
		WorkDir: func(uid, gid int) (string, error) {
			var err error
			if wd, err = tpl.CallWorkDir(launcher.WorkDirSpec{Base: s.cfg.WorkDir, Prefix: callDirPrefix}, uid, gid); err != nil {
				return "", err
			}
			// Its name says nothing of the task: this line ties them together.
			t.log = t.log.With("work_dir", filepath.Base(wd.Path))
			t.log.Info("work dir made", "path", wd.Path, "template", true)
			if paths, meta, perr = s.writeInputs(t, wd.Path, -1); perr != nil {
				return "", perr
			}
			// The FIFO's read end before the tool runs (its open would block).
			if relay, err = s.startStatusRelay(t, wd.StatusPipe); err != nil {
				return "", err
			}
			return wd.Path, nil
		},
		Args: func() ([]byte, error) {
			in := map[string]string{}
			for k, p := range paths {
				in[k] = inside(p)
			}
			a := s.runnerArgs(t, &launcher.WorkDir{Path: templateWorkTarget, StatusPipe: inside(wd.StatusPipe), Result: inside(wd.Result), Output: inside(wd.Output)}, in, meta)
			return runner.EncodeArgs(a)
		},
	}
	teardown := func() {
		if relay != nil {
			relay.finish()
		}
		if wd != nil {
			if err := wd.Remove(); err != nil {
				t.log.Error("removing the work dir failed", "path", wd.Path, "error", err)
			}
		}
	}
	res, err := tpl.Call(t.ctx, nil, opts)
	if err == nil {
		s.templates.served(templateKey(t.req.ToolName, t.profile), tpl)
	}
	if tpl.Retired() != nil {
		// This call was its last (recycled after its calls or age, or a
		// failed check): the replacement starts now, not at the next call.
		s.renewTemplate(t, tpl)
	}
	var tooLarge *template.AnswerTooLargeError
	if err == nil || wd != nil { // it reached the template: served there, whatever its outcome
		s.metrics.TemplateCalls.WithLabelValues(t.req.ToolName).Inc()
	}
	switch {
	case perr != nil:
		return s.errorOutcome(t, perr), teardown, true
	case err != nil && errors.Is(err, template.ErrRetired) && wd == nil:
		// Retired before this call reached it: the next template serves
		// it, or a cold sandbox.
		teardown()
		s.metrics.TemplateFallbacks.WithLabelValues(fallbackRetired).Inc()
		return outcome{}, nil, false
	case err != nil && errors.Is(err, template.ErrCallNetwork) && wd == nil:
		// Its listeners could not be made: a cold sandbox makes its own
		// (nothing of the call had reached the template's child).
		teardown()
		t.log.Warn("the template call's network could not be set up: the call runs cold", "error", err)
		s.metrics.TemplateFallbacks.WithLabelValues(fallbackCallNetwork).Inc()
		return outcome{}, nil, false
	case err != nil && errors.As(err, &tooLarge):
		return s.tooLargeResult(t, "the template call's answer", tooLarge.Size), teardown, true
	case err != nil && errors.Is(err, template.ErrCallOutOfMemory):
		return s.errorOutcome(t, oomKilled(t, "")), teardown, true
	case err != nil:
		if cause := context.Cause(t.ctx); cause != nil {
			return s.errorOutcome(t, cancelledError(cause)), teardown, true
		}
		return s.errorOutcome(t, errorf(CodeSandboxFailed, "template call: %v", err)), teardown, true
	case res.TimedOut:
		return outcome{payload: EncodeTimeout(t.req.ID, time.Since(t.received)), label: "timeout"}, teardown, true
	case res.KilledForViolation:
		return s.errorOutcome(t, s.killedForViolation(t, res.Network)), teardown, true
	}
	doneAt := time.Now()
	if relay != nil {
		relay.drain()
	}
	// Decoded from memory: nothing is written into the work dir, where
	// the tool could have put a symlink in its place. Classified as a
	// cold call's result file is (classify.go): too large or nested too
	// deeply is the tool's fault.
	if n := len(res.Document); n > s.maxReplyBytes() {
		return s.tooLargeResult(t, "the template call's answer", int64(n)), teardown, true
	}
	parsed, err := runner.DecodeResult(res.Document, int64(s.maxReplyBytes()))
	if e := nestedTooDeeply(err); e != nil {
		return s.errorOutcome(t, e), teardown, true
	}
	if err != nil {
		return s.errorOutcome(t, errorf(CodeSandboxFailed, "unusable result (template call): %v", err)), teardown, true
	}
	out := s.resultOutcome(t, parsed, wd.Path, doneAt.Sub(t.received), res.Network)
	out.exitedAt = doneAt
	t.log.Info("tool finished", "execution_ms", doneAt.Sub(t.received).Milliseconds(), "template", true, "host_uid", res.Child.HostUID)
	return out, teardown, true
}
