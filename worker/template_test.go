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

func (fakeTemplate) Stale(string) bool { return false }
func (fakeTemplate) Pid() int          { return 1 }

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
