package worker

import (
	"context"
	"encoding/json"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/worker/artifacts"
)

// Tools of the output tests.
const outputTools = `
import os

def big_outputs(ctx, n=1, mb=1):
    out = os.path.dirname(ctx.save_artifact("small.txt", b"x"))
    for i in range(int(n)):
        with open(os.path.join(out, "big%d.bin" % i), "wb") as f:
            f.truncate(int(mb) << 20)
    return {"ok": True}

def odd_outputs(ctx):
    out = os.path.dirname(ctx.save_artifact("page.html", b"<script>alert(1)</script>", "text/html"))
    ctx.save_artifact("pic.svg", b"<svg/>", "image/svg+xml; charset=utf-8")
    ctx.save_artifact("ok.json", b"{}", "application/json")
    for name in ["rlo\u202etxt.exe", "zw\u200b.txt", "iso\u2066.txt", "bom\ufeff.txt", "file.txt", "\ufb01le.txt"]:
        with open(os.path.join(out, name), "wb") as f:
            f.write(name.encode())
    refused = []
    for name in ["a\u202eb.txt", "z\u200d.txt"]:
        try:
            ctx.save_artifact(name, b"x")
        except ValueError:
            refused.append(name)
    return {"runner_refused": refused}

def two_outputs(ctx):
    ctx.save_artifact_text("x.txt", "original")
    ctx.save_artifact_text("y.txt", "kept")
    return {"ok": True}
`

const outputManifest = `  big_outputs: {module: outtools, function: big_outputs}
  odd_outputs: {module: outtools, function: odd_outputs}
  two_outputs: {module: outtools, function: two_outputs}
`

// newOutputHarness is the execution harness with the output tests' tools
// and a filesystem artifact store (the one deployments use).
func newOutputHarness(t *testing.T, mod func(*Config), opts func(*Options)) *harness {
	t.Helper()
	h := newExecHarness(t, mod, nil)
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "outtools.py"), []byte(outputTools), 0o644))
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, outputManifest...), 0o644))
	st, err := artifacts.NewFilesystem(filepath.Join(h.dir, "store"), h.cfg.Namespace)
	must(t, err)
	h.store = st
	o := Options{Config: h.cfg, Transport: h.bus.Client("worker-out", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	if opts != nil {
		opts(&o)
	}
	h.srv, err = New(o)
	must(t, err)
	return h
}

// TestLargeOutputsAreStreamed: four outputs of 24 MiB each are saved
// without the worker allocating memory in proportion to them (issue 16
// §6: they were read whole, 96 MB of outputs took the worker to 742 MB).
// The bound is the Go heap's total allocation over the call, far below
// the outputs' size and far above what a streamed save allocates.
func TestLargeOutputsAreStreamed(t *testing.T) {
	const n, mb = 4, 24
	h := newOutputHarness(t, nil, nil)
	h.start()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	reply := h.reply(h.send("big_outputs", map[string]any{"args": map[string]any{"n": n, "mb": mb}}))
	runtime.ReadMemStats(&after)
	var r struct {
		Result struct {
			Created []CreatedArtifact `json:"created_artifacts"`
		}
	}
	must(t, json.Unmarshal(reply, &r))
	if len(r.Result.Created) != n+1 {
		t.Fatalf("reply %s", reply)
	}
	for _, c := range r.Result.Created {
		if c.Filename != "small.txt" && c.SizeBytes != mb<<20 {
			t.Fatalf("created %+v", c)
		}
	}
	a, err := h.store.Load(context.Background(), "u1", "s1", "big3.bin", nil)
	must(t, err)
	if len(a.Data) != mb<<20 {
		t.Fatalf("stored %d bytes", len(a.Data))
	}
	total := int64(n * mb << 20)
	if grew := int64(after.TotalAlloc - before.TotalAlloc); grew > total/4 {
		t.Fatalf("the worker allocated %d bytes while saving %d bytes of outputs: outputs are not streamed", grew, total)
	}
}

// outputReply is the part of a reply the output tests read.
type outputReply struct {
	Result struct {
		ToolResult json.RawMessage   `json:"tool_result"`
		Created    []CreatedArtifact `json:"created_artifacts"`
		Skipped    []SkippedOutput   `json:"skipped_outputs"`
	}
}

// TestInvisibleAndMergingNames: output names with bidirectional or
// zero-width characters are skipped with the reason (and the runner's
// ctx.save_artifact refuses them); two names that are one after NFKC are
// saved once and the other reported; a request naming such a file is
// INVALID_REQUEST, and the worker keeps serving.
func TestInvisibleAndMergingNames(t *testing.T) {
	for _, c := range []struct{ name, why string }{{"a\u202ab", "bidirectional override"}, {"a\u202eb", "bidirectional override"},
		{"a\u2066b", "bidirectional isolate"}, {"a\u2069b", "bidirectional isolate"}, {"a\u200bb", "zero-width"},
		{"a\u200db", "zero-width"}, {"a\u2060b", "zero-width"}, {"\ufeffab", "zero-width"}, {"user:\u202e.txt", "bidirectional"}} {
		if err := artifacts.CheckFilename(c.name); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("%q: %v, want refused as %s", c.name, err, c.why)
		}
	}
	h := newOutputHarness(t, nil, nil)
	h.start()
	var r outputReply
	reply := h.reply(h.send("odd_outputs", nil))
	must(t, json.Unmarshal(reply, &r))
	skipped := map[string]string{}
	for _, s := range r.Result.Skipped {
		skipped[s.Filename] = s.Reason
	}
	for name, why := range map[string]string{"rlo\u202etxt.exe": "bidirectional override", "zw\u200b.txt": "zero-width",
		"iso\u2066.txt": "bidirectional isolate", "bom\ufeff.txt": "zero-width", "\ufb01le.txt": `"file.txt" after NFKC normalisation`} {
		if !strings.Contains(skipped[name], why) {
			t.Errorf("%q: skipped reason %q, want %q (reply %s)", name, skipped[name], why, reply)
		}
	}
	created := map[string]CreatedArtifact{}
	for _, c := range r.Result.Created {
		created[c.Filename] = c
	}
	if len(created) != 4 || created["file.txt"].Filename == "" {
		t.Fatalf("created %+v, want page.html, pic.svg, ok.json and file.txt", r.Result.Created)
	}
	if a, err := h.store.Load(context.Background(), "u1", "s1", "file.txt", nil); err != nil || a.Version != 0 || string(a.Data) != "file.txt" {
		t.Fatalf("file.txt: %+v %v: want one version, the ASCII name's bytes", a, err)
	}
	if !strings.Contains(string(r.Result.ToolResult), `"runner_refused": ["a\u202eb.txt", "z\u200d.txt"]`) &&
		!strings.Contains(string(r.Result.ToolResult), `"runner_refused":["a\u202eb.txt","z\u200d.txt"]`) {
		t.Errorf("the runner's ctx.save_artifact accepted an invisible character: %s", r.Result.ToolResult)
	}
	// Active mime types fall back to the extension's by default.
	for name, want := range map[string]string{"page.html": "application/octet-stream", "pic.svg": "application/octet-stream", "ok.json": "application/json"} {
		if c := created[name]; c.MimeType != want || c.ActiveMimeType {
			t.Errorf("%s: %+v, want mime type %s, not marked", name, c, want)
		}
	}
	// A request naming a file with an override: INVALID_REQUEST.
	code, msg := errorCode(t, h.reply(h.send("echo_input", map[string]any{"args": map[string]any{"f": "in\u202etxt.exe"},
		"artifact_references": map[string]any{"f": map[string]any{"filename": "in\u202etxt.exe", "version": nil}}})))
	if code != string(CodeInvalidRequest) || !strings.Contains(msg, "bidirectional override") {
		t.Fatalf("request filename with U+202E: %s %s", code, msg)
	}
	if reply := h.reply(h.send("echo", nil)); strings.Contains(string(reply), `"error"`) {
		t.Fatalf("not serving after the refusal: %s", reply)
	}
}

// TestActiveMimeTypesKept: with ARTIFACT_ACTIVE_MIME_TYPES=keep a tool's
// active mime type is stored as chosen and marked in the reply.
func TestActiveMimeTypesKept(t *testing.T) {
	h := newOutputHarness(t, func(c *Config) { c.ActiveMimeTypes = "keep" }, nil)
	h.start()
	var r outputReply
	must(t, json.Unmarshal(h.reply(h.send("odd_outputs", nil)), &r))
	want := map[string]CreatedArtifact{
		"page.html": {MimeType: "text/html", ActiveMimeType: true},
		"pic.svg":   {MimeType: "image/svg+xml; charset=utf-8", ActiveMimeType: true},
		"ok.json":   {MimeType: "application/json"},
	}
	for _, c := range r.Result.Created {
		if w, ok := want[c.Filename]; ok && (c.MimeType != w.MimeType || c.ActiveMimeType != w.ActiveMimeType) {
			t.Errorf("%s: %+v, want %+v", c.Filename, c, w)
		}
	}
	a, err := h.store.Load(context.Background(), "u1", "s1", "page.html", nil)
	must(t, err)
	if a.MimeType != "text/html" {
		t.Fatalf("stored as %q", a.MimeType)
	}
}

// swapStore is a store whose quota check, step 3 of saveOutputs (after
// the outputs were checked, before they are saved), replaces every file
// matching glob with a symlink to target: what a process the tool left
// behind can do in that window (the hostile battery's
// output_symlink_swap races for it).
type swapStore struct {
	artifacts.Store
	glob, target string
	swapped      []string
}

func (s *swapStore) CheckQuota(context.Context, string, string, []string, []int64) error {
	m, _ := filepath.Glob(s.glob)
	for _, p := range m {
		tmp := p + ".lnk"
		if err := os.Symlink(s.target, tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
		s.swapped = append(s.swapped, p)
	}
	return nil
}

// TestOutputSwappedForSymlinkAfterCheck: an output that became a symlink
// between its check and its save is skipped as a symlink found at the
// check is (never followed, nothing of its target read), and the other
// outputs are saved: not an ARTIFACT_ERROR that loses the whole call.
func TestOutputSwappedForSymlinkAfterCheck(t *testing.T) {
	h := newOutputHarness(t, nil, nil)
	target := filepath.Join(t.TempDir(), "host-secret")
	must(t, os.WriteFile(target, []byte("host secret"), 0o644))
	sw := &swapStore{Store: h.store, glob: filepath.Join(h.cfg.WorkDir, "*", "output", "x.txt"), target: target}
	h.store = sw
	h.srv.store = sw
	h.start()
	reply := h.reply(h.send("two_outputs", nil))
	if len(sw.swapped) != 1 {
		t.Fatalf("the quota check swapped %q (glob %s): the seam this test needs is gone; reply %s", sw.swapped, sw.glob, reply)
	}
	var r outputReply
	must(t, json.Unmarshal(reply, &r))
	if len(r.Result.Created) != 1 || r.Result.Created[0].Filename != "y.txt" {
		t.Fatalf("created %+v, want y.txt alone (reply %s)", r.Result.Created, reply)
	}
	if _, err := h.store.Load(context.Background(), "u1", "s1", "x.txt", nil); err == nil {
		t.Fatal("x.txt was stored: the symlink swapped in was followed")
	}
}
