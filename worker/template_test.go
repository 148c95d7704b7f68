package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher/launchertest"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/launcher/workdir"
)

// fakeTemplates starts templates (launchertest.Sandboxes.Template) whose templates' calls fail with
// callErr, before they ask for their work dir (as a call fails at C5).
// A start waits while block is set (a template that never says ready)
// and fails with startErr when that is set.
type fakeTemplates struct {
	callErr error

	mu              sync.Mutex
	block           chan struct{}
	startErr        error
	attempts        int // StartTemplate calls
	started, closed int // templates made; closed (or drained)
	calls           int
	retireAtCall    template.RetireReason // the next call retires its template (its last), then clears it
	last            *fakeTemplate
	// inCall, when set, is told of each call, which then waits for
	// release (a call in flight).
	inCall, release chan struct{}
}

func (f *fakeTemplates) StartTemplate(ctx context.Context, _ provider.TemplateSpec) (provider.Template, error) {
	f.mu.Lock()
	f.attempts++
	block := f.block
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.startErr != nil {
		return nil, f.startErr
	}
	f.started++
	f.last = &fakeTemplate{f: f, done: make(chan struct{})}
	return f.last, nil
}

// retire retires the last template made, as the launcher does (a
// failed check, its end, its limits).
func (f *fakeTemplates) retire(why template.RetireReason) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last.retireLocked(why)
}

type fakeTemplate struct {
	f       *fakeTemplates
	done    chan struct{}
	retired error // guarded by f.mu, with why
	why     template.RetireReason
	closed  bool
}

func (ft *fakeTemplate) retireLocked(why template.RetireReason) {
	if ft.retired == nil {
		ft.retired, ft.why = fmt.Errorf("%w: %s", template.ErrRetired, why), why
		close(ft.done)
	}
}

func (ft *fakeTemplate) Call(context.Context, []byte, template.CallOptions) (*template.CallResult, error) {
	ft.f.mu.Lock()
	inCall, release := ft.f.inCall, ft.f.release
	ft.f.mu.Unlock()
	if inCall != nil {
		inCall <- struct{}{}
		<-release
	}
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	ft.f.calls++
	if why := ft.f.retireAtCall; why != "" {
		ft.retireLocked(why)
		ft.f.retireAtCall = ""
	}
	return nil, ft.f.callErr
}

func (*fakeTemplate) CallWorkDir(workdir.Spec, int, int) (*workdir.Dir, error) {
	return nil, errors.New("fakeTemplate: no work dirs")
}

func (ft *fakeTemplate) Done() <-chan struct{} { return ft.done }

func (ft *fakeTemplate) Retired() error {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	return ft.retired
}

func (ft *fakeTemplate) Why() template.RetireReason {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	return ft.why
}

func (*fakeTemplate) Stale(string) bool { return false }
func (*fakeTemplate) Pid() int          { return 1 }

// Drain ends the fake as Close does (it has no calls in flight to wait for).
func (ft *fakeTemplate) Drain() { ft.Close() }

func (ft *fakeTemplate) Close() {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	ft.retireLocked(template.RetiredClosed)
	if !ft.closed {
		ft.closed = true
		ft.f.closed++
	}
}

// templateHarness is the package's harness with a warm: template tool
// (echo_tpl) served by templates from start.
func templateHarness(t *testing.T, f *fakeTemplates) *harness {
	t.Helper()
	h := newHarness(t, nil)
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, "  echo_tpl: {module: testtools, function: echo, warm: template}\n"...), 0o644))
	h.srv, err = New(Options{Config: h.cfg, Transport: h.bus.Client("worker-tpl", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{Template: f.StartTemplate},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	must(t, err)
	h.start()
	return h
}

// A template call whose egress listeners could not be made
// (template.ErrCallNetwork: nothing of the call reached the template's
// child) runs cold instead, is counted as such a fallback, and leaves
// the template in service: the next call goes to it again.
func TestTemplateCallNetworkFallsBack(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected: no listeners"))}
	h := templateHarness(t, f)
	waitLive(t, h, 1)
	for i := 0; i < 2; i++ {
		r := string(h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "cold"}})))
		if !strings.Contains(r, `"echo":"cold"`) {
			t.Fatalf("call %d: %s, want the tool's result from a cold sandbox", i, r)
		}
	}
	f.mu.Lock()
	started, calls, closed := f.started, f.calls, f.closed
	f.mu.Unlock()
	if started != 1 || calls != 2 || closed != 0 {
		t.Errorf("templates started %d, calls %d, closed %d: want one template that took both calls and stays", started, calls, closed)
	}
	page := metricsText(t, h)
	for _, want := range []string{`str_worker_template_fallbacks_total{reason="call_network_failed"} 2`} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(page, "str_worker_template"))
		}
	}
	if strings.Contains(page, `str_worker_template_calls_total{tool="echo_tpl"}`) {
		t.Errorf("a call that ran cold was counted as a template call:\n%s", grepLines(page, "str_worker_template"))
	}
}

// counts is fakeTemplates' counters.
func (f *fakeTemplates) counts() (started, calls, closed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.started, f.calls, f.closed
}

// waitLive waits until the worker holds n templates in service (they
// start in the background: at the manifest's load, or after a call found
// none).
func waitLive(t *testing.T, h *harness, n int) {
	t.Helper()
	want := fmt.Sprintf("str_worker_templates_live %d\n", n)
	waitFor(t, strings.TrimSpace(want), func() bool { return strings.Contains(metricsText(t, h), want) })
}

// A template the launcher retired is replaced at the tool's next call
// and counted under the launcher's reason (calls, age, failed_check,
// ended), not one reason for all.
func TestTemplateRetiredReason(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected"))}
	h := templateHarness(t, f)
	call := func() { h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "m"}})) }
	for i, why := range []template.RetireReason{template.RetiredCalls, template.RetiredFailedCheck} {
		waitFor(t, fmt.Sprintf("template %d started", i+1), func() bool { started, _, _ := f.counts(); return started == i+1 })
		waitLive(t, h, 1)
		call()
		f.retire(why)
		call() // finds it retired: a new one, started in the background
		waitFor(t, "the replacement started", func() bool { started, _, _ := f.counts(); return started == i+2 })
		page := metricsText(t, h)
		if want := `str_worker_templates_retired_total{reason="` + string(why) + `"} 1`; !strings.Contains(page, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(page, "str_worker_templates_retired"))
		}
	}
	if started, _, _ := f.counts(); started != 3 {
		t.Errorf("%d templates started, want 3 (the first, and one after each retirement)", started)
	}
}

// A manifest reload that removes a tool retires its template at the
// reload (removed), not at the end of its age; one that changes a tool's
// entry retires that tool's (entry_changed).
func TestTemplateRetiredAtReload(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected"))}
	h := templateHarness(t, f)
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	two := string(m) + "  echo_tpl2: {module: testtools, function: echo, warm: template}\n"
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(two), 0o644))
	waitFor(t, "echo_tpl2 in the manifest", func() bool {
		h.srv.mu.RLock()
		defer h.srv.mu.RUnlock()
		return h.srv.manifest.Tools["echo_tpl2"] != nil
	})
	// Both started ahead of any call: echo_tpl at the start, echo_tpl2
	// at the reload that added it.
	waitLive(t, h, 2)
	if started, _, closed := f.counts(); started != 2 || closed != 0 {
		t.Fatalf("%d templates started, %d closed: want 2 and 0", started, closed)
	}
	// echo_tpl removed, echo_tpl2's entry changed.
	next := strings.Replace(string(m), "  echo_tpl: {module: testtools, function: echo, warm: template}\n", "", 1) +
		"  echo_tpl2: {module: testtools, function: echo, warm: template, timeout_seconds: 7}\n"
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(next), 0o644))
	waitFor(t, "both templates closed at the reload", func() bool { _, _, closed := f.counts(); return closed == 2 })
	// echo_tpl2's new entry gets a template of its own.
	waitFor(t, "echo_tpl2's new template", func() bool { started, _, _ := f.counts(); return started == 3 })
	waitLive(t, h, 1)
	page := metricsText(t, h)
	for _, want := range []string{`str_worker_templates_retired_total{reason="removed"} 1`, `str_worker_templates_retired_total{reason="entry_changed"} 1`, "str_worker_templates_live 1"} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(page, "str_worker_templates"))
		}
	}
}

// A call never waits for a template. The template ended (its process
// killed) and its replacement never says ready: the next calls run cold
// at once (not_ready), one start runs meanwhile, not one a call; once it
// is ready, the template serves the tool's calls again.
func TestTemplateDeadCallRunsColdAtOnce(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected"))}
	h := templateHarness(t, f)
	waitLive(t, h, 1)
	block := make(chan struct{})
	f.mu.Lock()
	f.block = block
	f.mu.Unlock()
	f.retire(template.RetiredEnded)
	for i := 0; i < 3; i++ {
		r := string(h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "cold"}})))
		if !strings.Contains(r, `"echo":"cold"`) {
			t.Fatalf("call %d: %s, want the tool's result from a cold sandbox", i, r)
		}
	}
	page := metricsText(t, h)
	for _, want := range []string{`str_worker_template_fallbacks_total{reason="not_ready"} 3`, `str_worker_templates_retired_total{reason="ended"} 1`, "str_worker_templates_live 0"} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(page, "str_worker_template"))
		}
	}
	// The replacement starts after the back-off of an ended template (1 s).
	waitFor(t, "the replacement's start", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.attempts == 2 })
	f.mu.Lock()
	attempts, calls := f.attempts, f.calls
	f.block = nil
	f.mu.Unlock()
	if attempts != 2 || calls != 0 {
		t.Errorf("%d starts, %d template calls: want 2 starts (the first and one replacement, still waiting) and no call", attempts, calls)
	}
	close(block) // the replacement says ready
	waitLive(t, h, 1)
	h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "warm"}}))
	if _, calls, _ := f.counts(); calls != 1 {
		t.Errorf("%d template calls after the replacement was ready, want 1", calls)
	}
}

// A failed start backs off: the tool's calls run cold (start_failed) and
// start nothing until the back-off ends.
func TestTemplateStartFailureBacksOff(t *testing.T) {
	old := templateBackoff
	t.Cleanup(func() { templateBackoff = old })
	templateBackoff = [2]time.Duration{time.Hour, 2 * time.Hour} // no retry within the test
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected")),
		startErr: errors.New("injected: the runner's import failed")}
	h := templateHarness(t, f)
	waitFor(t, "the first start failed", func() bool {
		return strings.Contains(metricsText(t, h), `str_worker_template_start_failures_total{tool="echo_tpl"} 1`)
	})
	for i := 0; i < 3; i++ {
		if r := string(h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "cold"}}))); !strings.Contains(r, `"echo":"cold"`) {
			t.Fatalf("call %d: %s, want the tool's result from a cold sandbox", i, r)
		}
	}
	if page := metricsText(t, h); !strings.Contains(page, `str_worker_template_fallbacks_total{reason="start_failed"} 3`) {
		t.Errorf("metrics lack start_failed 3:\n%s", grepLines(page, "str_worker_template"))
	}
	f.mu.Lock()
	attempts := f.attempts
	f.mu.Unlock()
	if attempts != 1 {
		t.Errorf("%d starts during the back-off, want 1", attempts)
	}
}

// A template retired by the call it served (its last: recycled after its
// calls or age) is replaced at once, in the background, not at the
// tool's next call (which would run cold meanwhile).
func TestTemplateRenewedAfterItsLastCall(t *testing.T) {
	f := &fakeTemplates{}
	f.callErr = fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected"))
	h := templateHarness(t, f)
	waitLive(t, h, 1)
	f.mu.Lock()
	f.retireAtCall = template.RetiredCalls
	f.mu.Unlock()
	// The fake's calls fail before they reach the child (ErrCallNetwork):
	// a cold sandbox answers. The template retired itself at the call.
	h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "last"}}))
	if _, calls, _ := f.counts(); calls != 1 {
		t.Fatalf("%d template calls, want 1", calls)
	}
	waitFor(t, "the replacement started without another call", func() bool { started, _, _ := f.counts(); return started == 2 })
	waitLive(t, h, 1)
	if page := metricsText(t, h); !strings.Contains(page, `str_worker_templates_retired_total{reason="calls"} 1`) {
		t.Errorf("metrics lack the retirement:\n%s", grepLines(page, "str_worker_template"))
	}
}

// A template retired while a call runs in it (here: its tool removed by
// a manifest reload) drains: the call finishes, then the template ends.
func TestTemplateDrainsAtReload(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", template.ErrCallNetwork, errors.New("injected")),
		inCall: make(chan struct{}), release: make(chan struct{})}
	h := templateHarness(t, f)
	waitLive(t, h, 1)
	replied := make(chan string, 1)
	go func() {
		replied <- string(h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "m"}})))
	}()
	<-f.inCall
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(strings.Replace(string(m), "  echo_tpl: {module: testtools, function: echo, warm: template}\n", "", 1)), 0o644))
	waitFor(t, "the retirement at the reload", func() bool {
		return strings.Contains(metricsText(t, h), `str_worker_templates_retired_total{reason="removed"} 1`)
	})
	if _, _, closed := f.counts(); closed != 0 {
		t.Fatalf("the template was closed while its call ran")
	}
	close(f.release)
	if r := <-replied; !strings.Contains(r, `"echo":"m"`) {
		t.Errorf("the call's reply: %s", r)
	}
	waitFor(t, "the template closed once its call was over", func() bool { _, _, closed := f.counts(); return closed == 1 })
}
