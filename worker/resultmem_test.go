package worker

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher/launchertest"
)

// bigResultTool returns a result of mib MiB ("x" * mib MiB in a string).
const bigResultTool = `
def big(ctx, mib=1):
    return {"blob": "x" * (int(mib) << 20)}
`

// heapObjects is the bytes of heap objects, live or not yet collected
// (runtime/metrics: no stop-the-world, unlike ReadMemStats).
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// Large results are not copied on their way through the worker (issue
// 29 item 7: four 15 MiB results peaked at 327 MB in a worker). Four
// calls at once each return 15 MiB; the worker reads each result.json,
// checks the result and writes the reply around it, in the buffer it read
// it into. The heap, sampled while the calls run, may hold per call that
// buffer and the reply the bus delivered to the test's agent (a copy of
// the bus's, held until the test has them all): two results' worth, plus
// half a result of slack. Before, each result was copied some seven
// times on its way (read, decoded, compacted, encoded), each copy grown
// by doubling: 3.05-3.55x the results' total; now 1.5-2.0x.
func TestLargeResultsPeakMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four tools of 15 MiB results")
	}
	const calls, mib = 4, 15
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = calls })
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "bigtool.py"), []byte(bigResultTool), 0o644))
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, "  big: {module: bigtool, function: big}\n"...), 0o644))
	h.srv, err = New(Options{Config: h.cfg, Transport: h.bus.Client("worker-big", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	must(t, err)
	h.start()
	// A small call first: the runner's files, the code paths warm.
	h.reply(h.send("big", map[string]any{"args": map[string]any{"mib": 1}}))

	runtime.GC()
	base := heapObjects()
	var peak uint64
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak = max(peak, heapObjects())
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	ids := make([]string, calls)
	for i := range ids {
		ids[i] = h.send("big", map[string]any{"args": map[string]any{"mib": mib}})
	}
	var wg sync.WaitGroup
	replies := make([][]byte, calls)
	for i, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); replies[i] = h.reply(id) }()
	}
	wg.Wait()
	close(stop)
	<-sampled
	for i, r := range replies {
		if len(r) < mib<<20 {
			t.Fatalf("call %d: a reply of %d bytes, want the %d MiB result: %.300s", i, len(r), mib, r)
		}
	}
	results := uint64(calls * mib << 20)
	growth := peak - min(peak, base)
	t.Logf("heap objects: %.1f MiB before, peak %.1f MiB (+%.1f MiB) for %d results of %d MiB (%.2fx their total)",
		float64(base)/(1<<20), float64(peak)/(1<<20), float64(growth)/(1<<20), calls, mib, float64(growth)/float64(results))
	if limit := results * 5 / 2; growth > limit {
		t.Errorf("the heap grew by %s for %s of results: more than %s (a buffer a call, the agent's copy, half a result)", fmtMiB(growth), fmtMiB(results), fmtMiB(limit))
	}
}

func fmtMiB(n uint64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
