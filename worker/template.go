package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/launcher/pool"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
)

// Per-tool templates (manifest `warm: template`, opt-in): a tool's calls
// are served by one pre-imported Python that forks each call into
// namespaces of its own (launcher/template; SECURITY.md "Per-tool
// templates"). Their policy is launcher/pool's (doc.go: shared items),
// the one the warm pool and str serve follow: the worker's templates are
// a pool of shared items, a set of size 1 per tool and profile keyed as
// the warm pool's (the whole manifest entry and the profile), each
// template serving template.MaxCalls calls (retired "calls") for at most
// template.MaxAge ("age"); a template retired while calls run in it
// drains (they finish, then it ends). This file has what is the
// worker's: what a template item is, how a call is handed to it, which
// sets the manifest asks for, and the names of the counts.
//
// A template item's build starts the template in the background through
// the worker's Provider, the boundary of its cold and warm calls too
// (provider.Provider.StartTemplate: template.Provider in root mode, the
// plan, the sandbox, the tool's import; a Provider without templates
// leaves every call cold; launchertest fakes them); it is ready
// once the template said "ready", and it ends once the template is
// retired: by the pool (its calls, its age, its set's change, the
// shutdown), by the launcher (a failed check: "failed_check"; its process
// ended: "ended"), or when its start failed (the import failed or did not
// say ready within STR_TEMPLATE_START_TIMEOUT_SECONDS, the launcher
// refused the template: str_worker_template_start_failures_total). A
// failed start, a failed check and an end are deaths: the set's next
// start waits the pool's backoff (1 s doubling to 60 s, reset once a
// template of the set is ready), so a tool whose template cannot start
// or keeps dying costs one start a minute, not one a call. A claim
// retires a template whose tool's module changed on disk
// ("source_changed"); a manifest reload that changes a tool's entry or
// removes the tool retires its templates ("entry_changed", "removed").
//
// A call never waits for a template: a call that finds none ready runs
// cold at once (str_worker_template_fallbacks_total{reason="not_ready"},
// or "start_failed" while the backoff after a failed start runs). A call
// runs in a template only where it would get nothing less than a cold
// one: root mode (the templates lease host ids), a call of the tool's
// own function (not the init sub-protocol), and a tool without
// credentials (each call reads its secrets and gets placeholders of its
// own, in its environment: a template's environment is fixed at its
// start); any other call runs cold. A call's network is a cold call's:
// the egress proxy with the tool's policy on its own listeners
// (launcher/template C5), its denials in its reply.

// templateWorkTarget is where a template call's work dir is mounted: a
// directory of its own under an otherwise empty one, as a cold call's
// work dir is alone in its parent (no other task's name is listed).
const templateWorkTarget = "/str/work"

// The reasons of str_worker_templates_retired_total: the pool's (it
// served its calls, it is too old) and the launcher's (a check at a fork
// order, of a child or of a slot's cgroup failed; its process ended; the
// worker's log has the launcher's words), and the worker's: the tool's
// module changed on disk, a manifest reload changed the tool's entry or
// removed the tool (retired at the reload), the worker shut down.
const (
	retiredSourceChanged = "source_changed"
	retiredEntryChanged  = "entry_changed"
	retiredRemoved       = "removed"
	retiredShutdown      = "shutdown"

	templateRetireReasons = string(template.RetiredCalls) + ", " + string(template.RetiredAge) + ", " +
		string(template.RetiredFailedCheck) + ", " + string(template.RetiredEnded) + ", " +
		retiredSourceChanged + ", " + retiredEntryChanged + ", " + retiredRemoved + ", " + retiredShutdown
)

// startFailed is the end of a template item whose start failed (counted
// as a start failure, not a retirement).
const startFailed pool.Reason = "start_failed"

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
	fallbackStartFailed     = string(startFailed)
	fallbackRetired         = "retired_before_call"
	fallbackCallNetwork     = "call_network_failed"
	templateFallbackReasons = fallbackNotEligible + ", " + fallbackNotReady + ", " + fallbackStartFailed + ", " + fallbackRetired + ", " + fallbackCallNetwork
)

// templateBackoff is the pool's backoff for the templates (a test makes
// it long enough to observe).
var templateBackoff = [2]time.Duration{pool.BackoffFirst, pool.BackoffMax}

// templateItem is one template: a pool.Item, shared by its calls.
type templateItem struct {
	ready, ended chan struct{}
	cancel       context.CancelFunc // ends a start in progress (the template's lifetime)

	mu     sync.Mutex
	tpl    provider.Template // once started
	err    error             // its start's failure, before ended closes
	killed bool
}

func (it *templateItem) Ready() <-chan struct{} { return it.ready }

// Ended is the template's Done once it started (closed as the launcher
// retires it, before a call can take it), else the end of its start.
func (it *templateItem) Ended() <-chan struct{} {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.tpl != nil {
		return it.tpl.Done()
	}
	return it.ended
}

// EndReason maps the launcher's reason to the pool's (a failed check, an
// end, a failed start: deaths).
func (it *templateItem) EndReason() pool.Reason {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.tpl == nil {
		return startFailed
	}
	switch why := it.tpl.Why(); why {
	case template.RetiredCalls:
		return pool.Calls
	case template.RetiredAge:
		return pool.Aged
	case template.RetiredEnded:
		return pool.Died
	default:
		return pool.Reason(why)
	}
}

// Kill ends a start in progress, or drains the template (the pool kills
// a shared item once no call runs in it).
func (it *templateItem) Kill() {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.killed {
		return
	}
	it.killed = true
	if it.tpl == nil {
		it.cancel() // the start fails: its sandbox is killed
		return
	}
	go it.tpl.Drain()
}

// Release waits for the template to be gone (its calls in flight finish
// first) and what it holds freed.
func (it *templateItem) Release() {
	if tpl, _ := it.started(); tpl != nil {
		tpl.Drain()
	}
	it.cancel()
}

// started is the template, or its start's failure.
func (it *templateItem) started() (provider.Template, error) {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.tpl, it.err
}

// templateSet is the worker's templates: a pool of shared items, one set
// per tool and profile.
type templateSet struct {
	s       *Server
	metrics *templateMetrics
	p       *pool.Pool[warmKey, *templateItem]

	mu   sync.Mutex                    // the sets wanted
	want map[string]pool.Spec[warmKey] // by templateKey
}

func newTemplateSet(s *Server) *templateSet {
	ts := &templateSet{s: s, metrics: &templateMetrics{m: s.metrics, live: map[string]int{}, drained: map[string]string{}},
		want: map[string]pool.Spec[warmKey]{}}
	ts.p = pool.New(context.Background(), pool.Config[warmKey, *templateItem]{
		Build:        ts.build,
		MaxAge:       template.MaxAge,
		Uses:         template.MaxCalls,
		ReadyOnly:    true,
		BackoffFirst: templateBackoff[0],
		BackoffMax:   templateBackoff[1],
		Metrics:      ts.metrics,
		Died: func(name string, it *templateItem, retryIn time.Duration) {
			tool, profile, _ := strings.Cut(name, "\x00")
			tpl, err := it.started()
			if tpl == nil {
				s.log.Warn("a template could not be started: the tool's calls run cold", "tool", tool, "profile", profile,
					"retry_in_ms", retryIn.Milliseconds(), "error", err)
				return
			}
			s.log.Info("template retired", "tool", tool, "pid", tpl.Pid(), "why", tpl.Retired().Error(), "retry_in_ms", retryIn.Milliseconds())
		},
	})
	return ts
}

// build starts a template of the set name in the background: the item is
// ready once the template said ready, ended once it is retired.
func (ts *templateSet) build(ctx context.Context, name string, spec pool.Spec[warmKey]) (*templateItem, error) {
	s := ts.s
	key := spec.Key
	tool := key.tool
	argv := []string{"--template", "3", tool.Module, tool.Function}
	if tool.ClassName != "" {
		argv = append(argv, tool.ClassName)
	}
	sbSpec := s.sandboxSpec(key.profile, callDirPrefix, 0, nil, key.networkPolicy(), &tool)
	tspec := provider.TemplateSpec{
		Spec:       provider.Spec{Profile: sbSpec.Profile, Argv: s.runnerArgv(-1, argv...), Env: sbSpec.Env, ReadOnly: sbSpec.ReadOnly, Network: sbSpec.Network},
		SourceHash: s.sourceHash(&tool), WorkDirTarget: templateWorkTarget, ReadyTimeout: s.cfg.TemplateStartTimeout,
	}
	ctx, cancel := context.WithCancel(ctx)
	it := &templateItem{ready: make(chan struct{}), ended: make(chan struct{}), cancel: cancel}
	toolName, _, _ := strings.Cut(name, "\x00")
	go func() {
		t0 := time.Now()
		tpl, err := s.sb.StartTemplate(ctx, tspec)
		it.mu.Lock()
		it.tpl, it.err = tpl, err
		killed := it.killed
		it.mu.Unlock()
		switch {
		case err != nil:
			close(it.ended)
			return
		case killed:
			tpl.Close() // retired while it started
		default:
			s.log.Info("template started", "tool", toolName, "profile", key.profile, "pid", tpl.Pid(), "start_ms", time.Since(t0).Milliseconds())
			close(it.ready)
		}
		<-tpl.Done()
		close(it.ended)
	}()
	return it, nil
}

// configure makes the sets follow manifest m: one per tool served by
// templates, under the tool's own profile (the one its calls run in
// unless a request asks another), started ahead of any call; the sets a
// call's other profile made (templateFor) stay while the tool's entry
// does. The templates of tools that left or changed are retired.
func (ts *templateSet) configure(m *manifest.Manifest) {
	if ts == nil {
		return
	}
	ts.p.Start()
	if m == nil {
		return
	}
	s := ts.s
	ts.mu.Lock()
	defer ts.mu.Unlock()
	want := map[string]pool.Spec[warmKey]{}
	for key, spec := range ts.want {
		name, profile, _ := strings.Cut(key, "\x00")
		if tool := m.Tools[name]; tool != nil && s.templateTool(tool) && newWarmKey(tool, profile) == spec.Key {
			want[key] = spec
		}
	}
	for _, name := range m.Names() {
		tool := m.Tools[name]
		if !s.templateTool(tool) {
			continue
		}
		profile := tool.SandboxProfile
		if profile == "" {
			profile = s.cfg.DefaultProfile
		}
		if _, err := s.profiles.Lookup(profile); err != nil {
			continue
		}
		want[templateKey(name, profile)] = pool.Spec[warmKey]{Key: newWarmKey(tool, profile), Size: 1}
	}
	ts.setLocked(want, func(key string) string {
		if name, _, _ := strings.Cut(key, "\x00"); m.Tools[name] == nil {
			return retiredRemoved
		}
		return retiredEntryChanged
	})
}

// setLocked configures the pool with want (ts.mu held); why names the
// retirement of a set that changes or goes.
func (ts *templateSet) setLocked(want map[string]pool.Spec[warmKey], why func(key string) string) {
	for key, old := range ts.want {
		if spec, ok := want[key]; !ok || spec != old {
			ts.metrics.drainedWhy(key, why(key))
		}
	}
	ts.want = want
	ts.p.Configure(want)
}

// templateTool: tool's calls may run in templates (see templateEligible),
// and it has no problem (a tool with one: its calls are refused).
func (s *Server) templateTool(tool *manifest.Tool) bool {
	return tool.Template && tool.Credentials == nil && s.toolProblem(tool) == nil
}

// stop retires every template (a call in flight in one finishes first)
// and ends the starts in progress; wait returns once they are gone.
func (ts *templateSet) stop() {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	for key := range ts.want {
		ts.metrics.drainedWhy(key, retiredShutdown)
	}
	ts.mu.Unlock()
	ts.p.Stop()
}

func (ts *templateSet) wait() {
	if ts != nil {
		ts.p.Wait()
	}
}

// templateMetrics feeds the worker's template counts from the pool's.
type templateMetrics struct {
	m *Metrics

	mu      sync.Mutex
	live    map[string]int    // ready templates by set
	drained map[string]string // the reason of a set's retirement at a reload or the shutdown
}

func (tm *templateMetrics) drainedWhy(key, why string) {
	tm.mu.Lock()
	tm.drained[key] = why
	tm.mu.Unlock()
}

func (tm *templateMetrics) Hit(string)  {}
func (tm *templateMetrics) Miss(string) {}

func (tm *templateMetrics) Built(name string, _ time.Duration) {
	tool, _, _ := strings.Cut(name, "\x00")
	tm.m.TemplatesStarted.WithLabelValues(tool).Inc()
}

func (tm *templateMetrics) BuildFailed(string) {} // a build only starts the template: its failure is its item's end

func (tm *templateMetrics) Retired(name string, r pool.Reason) {
	tool, _, _ := strings.Cut(name, "\x00")
	why := string(r)
	switch r {
	case startFailed:
		tm.m.TemplateStartFailures.WithLabelValues(tool).Inc()
		return
	case pool.Aged:
		why = string(template.RetiredAge)
	case pool.Died:
		why = string(template.RetiredEnded)
	case pool.Drained:
		tm.mu.Lock()
		why = tm.drained[name]
		tm.mu.Unlock()
		if why == "" {
			why = retiredShutdown
		}
	}
	tm.m.TemplatesRetired.WithLabelValues(why).Inc()
}

func (tm *templateMetrics) Idle(name string, _, ready int) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	tm.live[name] = ready
	tm.liveLocked()
}

func (tm *templateMetrics) Gone(name string) {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	delete(tm.live, name)
	tm.liveLocked()
}

func (tm *templateMetrics) liveLocked() {
	n := 0
	for _, ready := range tm.live {
		n += ready
	}
	tm.m.TemplatesLive.Set(float64(n))
}

func (tm *templateMetrics) Held(int64) {}

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

// templateKey is the name of the set of tool name's template under
// profile.
func templateKey(name, profile string) string { return name + "\x00" + profile }

// templateFor claims a use of the tool's template for this call's
// profile, or returns nil and why there is none ready (a fallback
// reason): it never waits for one. The pool's claim retires a template
// that is retired, too old, used up or whose module changed; a call
// under a profile (or an entry) the sets do not have yet makes its set,
// started in the background.
func (s *Server) templateFor(t *task) (*pool.Claimed[warmKey, *templateItem], string) {
	ts := s.templates
	hash := s.sourceHash(t.tool)
	name := templateKey(t.req.ToolName, t.profile)
	key := newWarmKey(t.tool, t.profile)
	c := ts.p.Claim(name, key, func(it *templateItem) pool.Reason {
		if it.tpl.Stale(hash) {
			return retiredSourceChanged
		}
		return ""
	})
	if c != nil {
		return c, ""
	}
	ts.mu.Lock()
	if spec, ok := ts.want[name]; !ok || spec.Key != key {
		want := maps.Clone(ts.want)
		want[name] = pool.Spec[warmKey]{Key: key, Size: 1}
		ts.setLocked(want, func(string) string { return retiredEntryChanged })
	}
	ts.mu.Unlock()
	if st, _ := ts.p.State(name); st.Backoff == startFailed {
		return nil, fallbackStartFailed
	}
	return nil, fallbackNotReady
}

// executeTemplate runs t in its tool's template (handled false: run it
// cold instead). Its work dir is made for the call's host ids once the
// launcher knows them, mounted in the call at templateWorkTarget; the
// runner's arguments name it there. The runner's result document comes
// back on the call's socket and is decoded as a cold call's result file
// is (runner.DecodeResult), never written into the work dir.
func (s *Server) executeTemplate(t *task) (outcome, func(), bool) {
	claim, why := s.templateFor(t)
	if claim == nil {
		t.log.Info("no template ready: the call runs cold", "reason", why)
		s.metrics.TemplateFallbacks.WithLabelValues(why).Inc()
		return outcome{}, nil, false
	}
	tpl := claim.Item.tpl
	var (
		wd    *workdir.Dir
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
			if wd, err = tpl.CallWorkDir(workdir.Spec{Base: s.cfg.WorkDir, Prefix: callDirPrefix}, uid, gid); err != nil {
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
			a := s.runnerArgs(t, &workdir.Dir{Path: templateWorkTarget, StatusPipe: inside(wd.StatusPipe), Result: inside(wd.Result), Output: inside(wd.Output)}, in, meta)
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
	// The use is over: a template retired meanwhile (this call was its
	// last, its set changed) ends now; its replacement was started at
	// its retirement, not at the next call.
	claim.Done()
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
