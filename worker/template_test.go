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

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/launchertest"
)

// fakeTemplates is a TemplateStarter whose templates' calls fail with
// callErr, before they ask for their work dir (as a call fails at C5).
type fakeTemplates struct {
	callErr error

	mu              sync.Mutex
	started, closed int
	calls           int
	retired         error
	why             launcher.RetireReason
}

func (f *fakeTemplates) StartTemplate(context.Context, launcher.TemplateRequest) (Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.started++
	return fakeTemplate{f}, nil
}

type fakeTemplate struct{ f *fakeTemplates }

func (ft fakeTemplate) Call(context.Context, []byte, launcher.CallOptions) (*launcher.CallResult, error) {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	ft.f.calls++
	return nil, ft.f.callErr
}

func (fakeTemplate) CallWorkDir(launcher.WorkDirSpec, int, int) (*launcher.WorkDir, error) {
	return nil, errors.New("fakeTemplate: no work dirs")
}

func (ft fakeTemplate) Retired() error {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	return ft.f.retired
}

func (ft fakeTemplate) Why() launcher.RetireReason {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	return ft.f.why
}

func (fakeTemplate) Stale(string) bool { return false }
func (fakeTemplate) Pid() int          { return 1 }

// Drain ends the fake as Close does (it has no calls in flight to wait for).
func (ft fakeTemplate) Drain() { ft.Close() }

func (ft fakeTemplate) Close() {
	ft.f.mu.Lock()
	defer ft.f.mu.Unlock()
	ft.f.closed++
}

// templateHarness is the package's harness with a warm: template tool
// (echo_tpl) served by templates from start.
func templateHarness(t *testing.T, start TemplateStarter) *harness {
	t.Helper()
	h := newHarness(t, nil)
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, "  echo_tpl: {module: testtools, function: echo, warm: template}\n"...), 0o644))
	h.srv, err = New(Options{Config: h.cfg, Transport: h.bus.Client("worker-tpl", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)), Templates: start})
	must(t, err)
	h.start()
	return h
}

// A template call whose egress listeners could not be made
// (launcher.ErrCallNetwork: nothing of the call reached the template's
// child) runs cold instead, is counted as such a fallback, and leaves
// the template in service: the next call goes to it again.
func TestTemplateCallNetworkFallsBack(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", launcher.ErrCallNetwork, errors.New("injected: no listeners"))}
	h := templateHarness(t, f)
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

// A template the launcher retired is replaced at the tool's next call
// and counted under the launcher's reason (calls, age, failed_check,
// ended), not one reason for all.
func TestTemplateRetiredReason(t *testing.T) {
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", launcher.ErrCallNetwork, errors.New("injected"))}
	h := templateHarness(t, f)
	call := func() { h.reply(h.send("echo_tpl", map[string]any{"args": map[string]any{"message": "m"}})) }
	for _, why := range []launcher.RetireReason{launcher.RetiredCalls, launcher.RetiredFailedCheck} {
		call()
		f.mu.Lock()
		f.retired, f.why = fmt.Errorf("%w: %s", launcher.ErrTemplateRetired, why), why
		f.mu.Unlock()
		call() // finds it retired: a new one
		f.mu.Lock()
		f.retired, f.why = nil, ""
		f.mu.Unlock()
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
	f := &fakeTemplates{callErr: fmt.Errorf("template call: %w: %w", launcher.ErrCallNetwork, errors.New("injected"))}
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
	for _, tool := range []string{"echo_tpl", "echo_tpl2"} {
		h.reply(h.send(tool, map[string]any{"args": map[string]any{"message": "m"}}))
	}
	if started, _, closed := f.counts(); started != 2 || closed != 0 {
		t.Fatalf("%d templates started, %d closed: want 2 and 0", started, closed)
	}
	// echo_tpl removed, echo_tpl2's entry changed.
	next := strings.Replace(string(m), "  echo_tpl: {module: testtools, function: echo, warm: template}\n", "", 1) +
		"  echo_tpl2: {module: testtools, function: echo, warm: template, timeout_seconds: 7}\n"
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(next), 0o644))
	waitFor(t, "both templates closed at the reload", func() bool { _, _, closed := f.counts(); return closed == 2 })
	page := metricsText(t, h)
	for _, want := range []string{`str_worker_templates_retired_total{reason="removed"} 1`, `str_worker_templates_retired_total{reason="entry_changed"} 1`, "str_worker_templates_live 0"} {
		if !strings.Contains(page, want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(page, "str_worker_templates"))
		}
	}
}
