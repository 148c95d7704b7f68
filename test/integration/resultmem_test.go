package integration

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/syncbuf"
)

// A worker's memory for large results stays near their size (issue 29
// item 7: four 15 MiB results at once peaked at 327 MB in a worker). The
// worker talks to a str broker of its own process (so the broker's
// copies are not the worker's); four calls at once return 15 MiB each.
// Its peak RSS (VmHWM) may grow by at most twice the results' total from
// what it was after a warm-up call: now ~1x (the reply is written around
// the result in the buffer it was read into), before ~3x (each result
// copied some seven times on its way).
func TestWorkerLargeResultsRSS(t *testing.T) {
	needRoot(t)
	const calls, mib = 4, 15
	dir, tools := templateWorkerDir(t, "str-it-bigres-")
	if err := os.WriteFile(filepath.Join(tools, "big.py"), []byte("def big(ctx, mib=1):\n    return {\"blob\": \"x\" * (int(mib) << 20)}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte("version: 1\ntools:\n  big: {module: big, function: big, timeout_seconds: 120, sandbox_profile: standard}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	port, health := freeTCPPort(t), freeTCPPort(t)
	token := filepath.Join(dir, "broker.token")
	broker := exec.Command(strBin, "broker", "--listen", "127.0.0.1:"+strconv.Itoa(port), "--token-file", token)
	blog := &syncbuf.Buffer{}
	broker.Stdout, broker.Stderr = blog, blog
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = broker.Process.Signal(syscall.SIGTERM); _ = broker.Wait() })
	if !eventually(time.Minute, func() bool { _, err := os.Stat(token); return err == nil }) {
		t.Fatalf("the broker wrote no token file:\n%s", blog.String())
	}
	worker := exec.Command(strBin, "worker")
	worker.Env = []string{"PATH=" + os.Getenv("PATH"), "HEALTH_PORT=" + strconv.Itoa(health), "STR_LOG_LEVEL=warn",
		"SAM_NAMESPACE=it/", "MANIFEST_PATH=" + manifest, "TOOLS_PYTHON_DIR=" + tools,
		"SANDBOX_WORK_DIR=" + filepath.Join(dir, "work"), "STR_RUNNER_DIR=" + filepath.Join(dir, "runner"), "STR_SITE_DIR=" + filepath.Join(dir, "site"),
		"ARTIFACT_SERVICE_TYPE=filesystem", "ARTIFACT_BASE_PATH=" + filepath.Join(dir, "artifacts"),
		"DEV_BROKER_HOST=127.0.0.1", "DEV_BROKER_PORT=" + strconv.Itoa(port), "DEV_BROKER_TOKEN_FILE=" + token}
	wlog := &syncbuf.Buffer{}
	worker.Stdout, worker.Stderr = wlog, wlog
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = worker.Process.Signal(syscall.SIGTERM); _ = worker.Wait() })
	if !eventually(90*time.Second, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}) {
		t.Fatalf("the worker was not ready:\n%s", wlog.String())
	}
	// str worker execs str-worker: the process whose memory is measured.
	pid := worker.Process.Pid
	call := func(n int) (int, string) {
		cmd := exec.Command(strBin, "invoke", "big", "--broker", "127.0.0.1:"+strconv.Itoa(port), "--token-file", token,
			"--namespace", "it/", "--args", fmt.Sprintf(`{"mib": %d}`, n), "--wait", "3m")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run()
		return out.Len(), out.String()
	}
	if n, out := call(1); n < 1<<20 {
		t.Fatalf("the warm-up call: %.2000s\nworker log:\n%s", out, wlog.String())
	}
	before := vmHWM(t, pid)
	var wg sync.WaitGroup
	sizes := make([]int, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out string
			if sizes[i], out = call(mib); sizes[i] < mib<<20 {
				t.Errorf("call %d: %.2000s", i, out)
			}
		}()
	}
	wg.Wait()
	after := vmHWM(t, pid)
	results := int64(calls * mib << 20)
	t.Logf("worker VmHWM: %d KiB after the warm-up, %d KiB after %d calls of %d MiB at once (+%.2fx their total)",
		before>>10, after>>10, calls, mib, float64(after-before)/float64(results))
	if after-before > 2*results {
		t.Errorf("the worker's peak RSS grew by %d MiB for %d MiB of results: more than twice their size", (after-before)>>20, results>>20)
	}
}

// vmHWM is pid's peak resident set size, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
