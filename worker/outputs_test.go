package worker

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
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
`

const outputManifest = `  big_outputs: {module: outtools, function: big_outputs}
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
	o := Options{Config: h.cfg, Transport: h.bus.Client("worker-out", h.cfg.QueueName()), Sandboxes: hostSandboxes{},
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
