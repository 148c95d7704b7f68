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
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
)

// Per-tool templates (manifest `warm: template`, opt-in): a tool's calls
// are served by one pre-imported Python that forks each call into
// namespaces of its own (launcher/template.go; SECURITY.md "Per-tool
// templates"). The worker keeps one template per tool, made at the
// tool's first call and replaced when the launcher retires it (its
// recycling limits, a failed check) or when the tool's module changes on
// disk. A call runs in a template only where it would get nothing less
// than a cold one: root mode (the templates lease host ids), a call of
// the tool's own function (not the init sub-protocol), and a tool
// without credentials (each call reads its secrets and gets placeholders
// of its own, in its environment: a template's environment is fixed at
// its start); any other call runs cold. A call's network is a cold
// call's: the egress proxy with the tool's policy on its own listeners
// (launcher C5), its denials in its reply.

// TemplateStarter starts per-tool templates: LauncherTemplates in root
// mode (`str worker` passes it); nil = no templates, every call cold.
type TemplateStarter interface {
	StartTemplate(ctx context.Context, tr launcher.TemplateRequest) (Template, error)
}

// Template is a running per-tool template as the worker uses it: a
// *launcher.Template (launcher/template.go says what each method does).
type Template interface {
	Call(ctx context.Context, runnerArgs []byte, opts launcher.CallOptions) (*launcher.CallResult, error)
	CallWorkDir(spec launcher.WorkDirSpec, uid, gid int) (*launcher.WorkDir, error)
	Retired() error
	Why() launcher.RetireReason
	Stale(hash string) bool
	Pid() int
	Drain()
	Close()
}

// LauncherTemplates is l's StartTemplate as a TemplateStarter.
func LauncherTemplates(l *launcher.Launcher) TemplateStarter { return launcherTemplates{l} }

type launcherTemplates struct{ l *launcher.Launcher }

func (lt launcherTemplates) StartTemplate(ctx context.Context, tr launcher.TemplateRequest) (Template, error) {
	tpl, err := lt.l.StartTemplate(ctx, tr)
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
// (launcher.RetireReason: it served its calls, it is too old, a check at
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

	templateRetireReasons = string(launcher.RetiredCalls) + ", " + string(launcher.RetiredAge) + ", " +
		string(launcher.RetiredFailedCheck) + ", " + string(launcher.RetiredEnded) + ", " +
		retiredSourceChanged + ", " + retiredEntryChanged + ", " + retiredRemoved + ", " + retiredShutdown
)

// The reasons of str_worker_template_fallbacks_total: a warm: template
// tool's call that ran in a sandbox of its own because it may not run in
// a template (templateEligible: no templates in this mode, the init
// sub-protocol, a tool with credentials), no template could be started,
// its template was retired before the call reached it and the next one
// could not take it, or the call's egress listeners could not be made in
// its namespace (launcher.ErrCallNetwork: nothing of the call had reached
// the template's child; the template serves the next call).
const (
	fallbackNotEligible     = "not_eligible"
	fallbackStartFailed     = "start_failed"
	fallbackRetired         = "retired_before_call"
	fallbackCallNetwork     = "call_network_failed"
	templateFallbackReasons = fallbackNotEligible + ", " + fallbackStartFailed + ", " + fallbackRetired + ", " + fallbackCallNetwork
)

// templateSet is the worker's templates, by tool name.
type templateSet struct {
	start   TemplateStarter
	metrics *Metrics
	mu      sync.Mutex
	by      map[string]*toolTemplate
}

type toolTemplate struct {
	tpl  Template
	tool manifest.Tool // the entry it was made for
}

// closeAll closes every template (the worker's shutdown).
func (ts *templateSet) closeAll() {
	if ts == nil {
		return
	}
	ts.mu.Lock()
	all := ts.by
	ts.by = map[string]*toolTemplate{}
	ts.metrics.TemplatesLive.Set(0)
	ts.mu.Unlock()
	for _, tt := range all {
		ts.metrics.TemplatesRetired.WithLabelValues(retiredShutdown).Inc()
		tt.tpl.Close()
	}
}

// drop takes the template under key out of service for reason (ts.mu
// held): its calls in flight finish first.
func (ts *templateSet) drop(key string, tt *toolTemplate, reason string) {
	ts.metrics.TemplatesRetired.WithLabelValues(reason).Inc()
	delete(ts.by, key)
	ts.metrics.TemplatesLive.Set(float64(len(ts.by)))
	go tt.tpl.Drain() // its calls in flight finish first, then it ends
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
		switch now := m.Tools[name]; {
		case now == nil:
			ts.drop(key, tt, retiredRemoved)
		case !tt.tool.Equal(now):
			ts.drop(key, tt, retiredEntryChanged)
		}
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

// templateFor returns the tool's template for this call's profile,
// starting one when there is none, it was retired, its manifest entry
// changed or its module's source did.
func (s *Server) templateFor(t *task) (Template, error) {
	ts := s.templates
	hash := s.sourceHash(t.tool)
	key := t.req.ToolName + "\x00" + t.profile
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if tt, ok := ts.by[key]; ok {
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
			return tt.tpl, nil
		}
		ts.drop(key, tt, reason)
	}
	argv := []string{"--template", "3", t.tool.Module, t.tool.Function}
	if t.tool.ClassName != "" {
		argv = append(argv, t.tool.ClassName)
	}
	spec := s.sandboxSpec(t.profile, callDirPrefix, t.sandboxTimeout, nil, t.tool.Network, t.tool)
	req := launcher.Request{Profile: spec.Profile, Argv: s.runnerArgv(-1, argv...), Env: spec.Env, Network: spec.Network}
	for _, d := range spec.ReadOnly {
		req.Binds = append(req.Binds, launcher.Bind{Source: d})
	}
	tpl, err := ts.start.StartTemplate(context.Background(), launcher.TemplateRequest{Request: req, SourceHash: hash, WorkDirTarget: templateWorkTarget})
	if err != nil {
		return nil, err
	}
	ts.by[key] = &toolTemplate{tpl: tpl, tool: *t.tool}
	ts.metrics.TemplatesStarted.WithLabelValues(t.req.ToolName).Inc()
	ts.metrics.TemplatesLive.Set(float64(len(ts.by)))
	t.log.Info("template started", "tool", t.req.ToolName, "pid", tpl.Pid())
	return tpl, nil
}

// executeTemplate runs t in its tool's template (handled false: run it
// cold instead). Its work dir is made for the call's host ids once the
// launcher knows them, mounted in the call at templateWorkTarget; the
// runner's arguments name it there. The runner's result document comes
// back on the call's socket and is decoded as a cold call's result file
// is (runner.DecodeResult), never written into the work dir.
func (s *Server) executeTemplate(t *task) (outcome, func(), bool) {
	tpl, err := s.templateFor(t)
	if err != nil {
		t.log.Warn("no template: the call runs cold", "error", err)
		s.metrics.TemplateFallbacks.WithLabelValues(fallbackStartFailed).Inc()
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
	opts := launcher.CallOptions{
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
	var tooLarge *launcher.AnswerTooLargeError
	if err == nil || wd != nil { // it reached the template: served there, whatever its outcome
		s.metrics.TemplateCalls.WithLabelValues(t.req.ToolName).Inc()
	}
	switch {
	case perr != nil:
		return s.errorOutcome(t, perr), teardown, true
	case err != nil && errors.Is(err, launcher.ErrTemplateRetired) && wd == nil:
		// Retired before this call reached it: the next template serves
		// it, or a cold sandbox.
		teardown()
		s.metrics.TemplateFallbacks.WithLabelValues(fallbackRetired).Inc()
		return outcome{}, nil, false
	case err != nil && errors.Is(err, launcher.ErrCallNetwork) && wd == nil:
		// Its listeners could not be made: a cold sandbox makes its own
		// (nothing of the call had reached the template's child).
		teardown()
		t.log.Warn("the template call's network could not be set up: the call runs cold", "error", err)
		s.metrics.TemplateFallbacks.WithLabelValues(fallbackCallNetwork).Inc()
		return outcome{}, nil, false
	case err != nil && errors.As(err, &tooLarge):
		return s.tooLargeResult(t, "the template call's answer", tooLarge.Size), teardown, true
	case err != nil && errors.Is(err, launcher.ErrCallOutOfMemory):
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
