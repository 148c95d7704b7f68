package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher/launchertest"

	"github.com/securetoolruntime/str/internal/testfs"
	"github.com/securetoolruntime/str/worker/artifacts"
)

// The store's errors blame the worker's side: a full filesystem or quota
// is RESOURCE_EXHAUSTED, read-only, permissions and I/O errors are
// ARTIFACT_ERROR, never INVALID_REQUEST; an audit log failure is the
// audit log's fault, any other filesystem failure the store's.
func TestStoreErrorMapping(t *testing.T) {
	pathErr := func(errno syscall.Errno) error {
		return fmt.Errorf("artifacts: save /s/ns/u/s/f (step 5, data): %w", &os.PathError{Op: "write", Path: "/s/ns/u/s/f/.tmp-1", Err: errno})
	}
	audit := func(errno syscall.Errno) error {
		return fmt.Errorf("artifacts: save f version 0: %w", &artifacts.AuditError{Path: "/a/audit.jsonl", Op: "append", Err: errno})
	}
	for _, c := range []struct {
		name  string
		err   error
		code  Code
		fault string // "" = none
	}{
		{"ENOSPC", pathErr(syscall.ENOSPC), CodeResourceExhausted, faultArtifactStore},
		{"EDQUOT", pathErr(syscall.EDQUOT), CodeResourceExhausted, faultArtifactStore},
		{"EROFS", pathErr(syscall.EROFS), CodeArtifactError, faultArtifactStore},
		{"EACCES", pathErr(syscall.EACCES), CodeArtifactError, faultArtifactStore},
		{"EIO", pathErr(syscall.EIO), CodeArtifactError, faultArtifactStore},
		{"audit ENOSPC", audit(syscall.ENOSPC), CodeResourceExhausted, faultAuditLog},
		{"audit EROFS", audit(syscall.EROFS), CodeArtifactError, faultAuditLog},
		{"not found", fmt.Errorf("x: %w", artifacts.ErrNotFound), CodeArtifactError, ""},
	} {
		if got := storeErrorCode(c.err); got != c.code {
			t.Errorf("%s: code %s, want %s", c.name, got, c.code)
		}
		s := &Server{cfg: &Config{}, ready: newReadiness(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)}
		s.noteStoreFault(c.err)
		faults, _ := s.ready.snapshot()
		if c.fault == "" {
			if faults != nil {
				t.Errorf("%s: faults %v, want none", c.name, faults)
			}
			continue
		}
		if len(faults) != 1 || faults[c.fault] != c.err.Error() {
			t.Errorf("%s: faults %v, want %s = the error", c.name, faults, c.fault)
		}
	}
}

// A fault or degradation is set with the error seen, replaced by a new
// one, cleared by nil; each change is logged once, a repeat is not.
func TestReadinessSetClear(t *testing.T) {
	logs := &logBuffer{}
	m := NewMetrics()
	r := newReadiness(slog.New(slog.NewJSONHandler(logs, nil)), m.Faults)
	if f, d := r.snapshot(); f != nil || d != nil {
		t.Fatalf("new: %v %v", f, d)
	}
	// str_worker_faults follows every change, each name present from the start.
	gauges := func(what, want string) {
		t.Helper()
		var got []string
		for l := range strings.Lines(string(m.Registry.Text())) {
			if strings.HasPrefix(l, "str_worker_faults{") {
				got = append(got, strings.TrimSpace(l))
			}
		}
		if g := strings.Join(got, "\n"); g != want {
			t.Errorf("%s: str_worker_faults:\n%s\nwant:\n%s", what, g, want)
		}
	}
	gauges("new", `str_worker_faults{kind="degraded",name="manifest"} 0
str_worker_faults{kind="fault",name="artifact_audit_log"} 0
str_worker_faults{kind="fault",name="artifact_store"} 0
str_worker_faults{kind="fault",name="work_dir"} 0`)
	r.setFault(faultWorkDir, errors.New("work dir /w: no space left on device"))
	r.setFault(faultWorkDir, errors.New("work dir /w: no space left on device"))
	r.setDegraded(degradedManifest, errors.New("invalid manifest"))
	f, d := r.snapshot()
	if f[faultWorkDir] != "work dir /w: no space left on device" || d[degradedManifest] != "invalid manifest" || len(f) != 1 || len(d) != 1 {
		t.Fatalf("set: %v %v", f, d)
	}
	gauges("set", `str_worker_faults{kind="degraded",name="manifest"} 1
str_worker_faults{kind="fault",name="artifact_audit_log"} 0
str_worker_faults{kind="fault",name="artifact_store"} 0
str_worker_faults{kind="fault",name="work_dir"} 1`)
	f[faultArtifactStore] = "changed by the caller"
	if f2, _ := r.snapshot(); len(f2) != 1 {
		t.Fatal("snapshot shares its map")
	}
	r.setFault(faultWorkDir, errors.New("work dir /w: read-only file system"))
	r.setFault(faultWorkDir, nil)
	r.setDegraded(degradedManifest, nil)
	r.setDegraded(degradedManifest, nil)
	if f, d := r.snapshot(); f != nil || d != nil {
		t.Fatalf("cleared: %v %v", f, d)
	}
	gauges("cleared", `str_worker_faults{kind="degraded",name="manifest"} 0
str_worker_faults{kind="fault",name="artifact_audit_log"} 0
str_worker_faults{kind="fault",name="artifact_store"} 0
str_worker_faults{kind="fault",name="work_dir"} 0`)
	out := logs.String()
	for what, n := range map[string]int{
		`"msg":"worker fault (see /readyz)","fault":"work_dir"`:             2, // set, changed
		`"msg":"worker fault cleared","fault":"work_dir"`:                   1,
		`"msg":"worker degradation (see /readyz)","degradation":"manifest"`: 1,
		`"msg":"worker degradation cleared","degradation":"manifest"`:       1,
	} {
		if got := strings.Count(out, what); got != n {
			t.Errorf("%d log lines with %s, want %d:\n%s", got, what, n, out)
		}
	}
	var nilR *readiness
	nilR.setFault(faultWorkDir, errors.New("x")) // must not panic
	if f, d := nilR.snapshot(); f != nil || d != nil {
		t.Error("nil readiness reports something")
	}
}

type readyzBody struct {
	OK       bool              `json:"ok"`
	Faults   map[string]string `json:"faults"`
	Degraded map[string]string `json:"degraded"`
	// Unavailable is unavailable_tools.
	Unavailable map[string]string `json:"unavailable_tools"`
}

func readyz(t *testing.T, h *harness) (int, readyzBody) {
	t.Helper()
	hs := httptest.NewServer(h.srv.Handler())
	defer hs.Close()
	resp, err := hs.Client().Get(hs.URL + "/readyz")
	must(t, err)
	defer resp.Body.Close()
	var b readyzBody
	must(t, json.NewDecoder(resp.Body).Decode(&b))
	return resp.StatusCode, b
}

// The artifact store's filesystem full: an output is answered
// RESOURCE_EXHAUSTED, /readyz is 503 naming artifact_store (and the
// audit log beside it) with the errno seen, a call without outputs
// succeeds; space freed, /readyz is 200 again and outputs are saved.
func TestReadyzArtifactStoreFull(t *testing.T) {
	h := newHarness(t, nil)
	base := filepath.Join(h.dir, "store")
	testfs.Tmpfs(t, base, "size=1m,mode=0755")
	st, _, err := artifacts.Open(artifacts.Settings{Type: "filesystem", BasePath: base, Namespace: h.cfg.Namespace})
	must(t, err)
	h.store = st
	h.rebuild(nil, nil)
	h.start()
	if code, b := readyz(t, h); code != 200 || b.Faults != nil {
		t.Fatalf("readyz before: %d %+v", code, b)
	}
	testfs.FillBytes(t, filepath.Join(base, "filler"))
	code, msg := errorCode(t, h.reply(h.send("big_output", nil)))
	if code != "RESOURCE_EXHAUSTED" || !strings.Contains(msg, "no space left on device") {
		t.Errorf("an output on a full store: %s %s", code, msg)
	}
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Error("a call without outputs failed while the store is full")
	}
	hc, b := readyz(t, h)
	if hc != 503 || b.OK || !strings.Contains(b.Faults[faultArtifactStore], base) || !strings.Contains(b.Faults[faultArtifactStore], "no space left on device") {
		t.Errorf("readyz with the store full: %d %+v", hc, b)
	}
	must(t, os.Remove(filepath.Join(base, "filler")))
	time.Sleep(resourceCheckMinAge) // the next /readyz checks again
	if hc, b := readyz(t, h); hc != 200 || b.Faults != nil {
		t.Errorf("readyz after freeing space: %d %+v", hc, b)
	}
	if _, ok := shapeResult(h.reply(h.send("big_output", nil))); !ok {
		t.Error("an output after freeing space failed")
	}
}

// Uncapped work dirs (SANDBOX_MODE=none-like host sandboxes) on a full
// filesystem: RESOURCE_EXHAUSTED, /readyz names work_dir; freed, clear.
func TestReadyzWorkDirFull(t *testing.T) {
	h := newHarness(t, nil)
	testfs.Tmpfs(t, h.cfg.WorkDir, "size=256k,mode=0711")
	h.start()
	testfs.FillBytes(t, filepath.Join(h.cfg.WorkDir, "filler"))
	code, msg := errorCode(t, h.reply(h.send("echo", nil)))
	if code != "RESOURCE_EXHAUSTED" || !strings.Contains(msg, "no disk space") {
		t.Errorf("a call with the work dir full: %s %s", code, msg)
	}
	hc, b := readyz(t, h)
	if hc != 503 || !strings.Contains(b.Faults[faultWorkDir], h.cfg.WorkDir) || !strings.Contains(b.Faults[faultWorkDir], "no space left on device") {
		t.Errorf("readyz with the work dir full: %d %+v", hc, b)
	}
	must(t, os.Remove(filepath.Join(h.cfg.WorkDir, "filler")))
	time.Sleep(resourceCheckMinAge)
	if hc, b := readyz(t, h); hc != 200 || b.Faults != nil {
		t.Errorf("readyz after freeing space: %d %+v", hc, b)
	}
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Error("a call after freeing space failed")
	}
}

// A manifest replaced by garbage: the last good one serves, /readyz is
// 200 with degraded.manifest; repaired, the degradation is gone.
func TestReadyzManifestDegraded(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte("tools: [[[ garbage"), 0o644))
	var b readyzBody
	waitFor(t, "degraded.manifest", func() bool {
		var code int
		code, b = readyz(t, h)
		return code == 200 && strings.Contains(b.Degraded[degradedManifest], "invalid manifest")
	})
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Error("the last good manifest stopped serving")
	}
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(testManifest), 0o644))
	waitFor(t, "degradation cleared", func() bool {
		code, b := readyz(t, h)
		return code == 200 && b.Degraded == nil
	})
}

// bindCheckingSandboxes refuses a spec whose read-only bind source is
// missing, as the launcher does (ErrInvalidSandboxRequest), after running
// before: the window between the executor's availableNow check and the
// sandbox's creation.
type bindCheckingSandboxes struct {
	launchertest.Sandboxes
	before func()
}

func (b bindCheckingSandboxes) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	b.before()
	for _, p := range spec.ReadOnly {
		if _, err := os.Lstat(p); err != nil {
			return nil, fmt.Errorf("%w: bind source %s: %w", ErrInvalidSandboxRequest, p, err)
		}
	}
	return b.Sandboxes.Create(ctx, spec)
}

// A sandbox refusing a call's spec is the worker's side, never the
// caller's: the tools dir gone after the executor looked is
// TOOL_NOT_AVAILABLE, another bind source gone (the runner dir) is
// SANDBOX_FAILED. INVALID_REQUEST was answered before.
func TestSandboxRefusalBlamesWorker(t *testing.T) {
	for _, c := range []struct {
		name, code string
		remove     func(h *harness) string
	}{
		{"tools dir", "TOOL_NOT_AVAILABLE", func(h *harness) string { return h.cfg.ToolsDir }},
		{"runner dir", "SANDBOX_FAILED", func(h *harness) string { return h.cfg.RunnerDir }},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			var armed atomic.Bool
			h.rebuild(bindCheckingSandboxes{before: func() {
				if armed.Load() {
					p := c.remove(h)
					must(t, os.RemoveAll(p+".away"))
					must(t, os.Rename(p, p+".away"))
				}
			}}, nil)
			h.start()
			armed.Store(true)
			code, msg := errorCode(t, h.reply(h.send("echo", nil)))
			if code != c.code {
				t.Errorf("%s removed before the sandbox's creation: %s %s, want %s", c.name, code, msg, c.code)
			}
		})
	}
}
