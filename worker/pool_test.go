package worker

import (
	"context"
	"encoding/json"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/runner"
)

// The pool's tests run the real runner in warm mode as plain processes
// (launchertest.Sandboxes): they exercise the pool's bookkeeping, the handover and
// the reply before teardown; the isolation of pooled sandboxes through
// the real launcher is test/e2e's TestWarmPoolIsolation.

const warmTools = `
import os, threading, time

CALLS = []
IMPORTED_PID = os.getpid()

def remember(ctx, mark="x"):
    seen = list(CALLS)
    CALLS.append(mark)
    ctx.send_status("remembering " + mark)
    return {"seen": seen, "pid": os.getpid(), "imported_pid": IMPORTED_PID,
            "cwd_files": sorted(os.listdir(".")), "version": 1}

def linger(ctx):
    # A non-daemon thread keeps the interpreter from exiting: the reply
    # must not wait for it.
    threading.Thread(target=time.sleep, args=(3600,)).start()
    ctx.send_status("lingering")
    ctx.save_artifact("out.txt", b"saved")
    return {"lingering": True}

def lines(ctx, n=200):
    for i in range(int(n)):
        ctx.send_status("line %d" % i)
    return {"n": n}

def nap(ctx, seconds=1.0):
    time.sleep(float(seconds))
    return {}

def echo_input(ctx, f):
    return {"f": ctx.load_artifact_text("f")}

def hold(ctx, path):
    # Runs until the test creates path.
    ctx.send_status("holding")
    while not os.path.exists(path):
        time.sleep(0.01)
    return {}
`

const warmManifest = `version: 1
tools:
  remember: {module: warmtools, function: remember, warm: 2, timeout_seconds: 60}
  linger: {module: warmtools, function: linger, warm: 1, timeout_seconds: 600}
  linger_cold: {module: warmtools, function: linger, timeout_seconds: 600}
  lines: {module: warmtools, function: lines, warm: 1, timeout_seconds: 60}
  nap: {module: warmtools, function: nap, warm: 1, timeout_seconds: 1}
  echo_input: {module: warmtools, function: echo_input, warm: 1, timeout_seconds: 60}
  hold: {module: warmtools, function: hold, warm: 1, timeout_seconds: 60}
  broken: {module: warmbroken, function: f, warm: 1, timeout_seconds: 60}
`

// newWarmHarness is the package harness with the pool's tools and
// manifest (mod may change the configuration).
func newWarmHarness(t *testing.T, mod func(*Config)) *harness {
	t.Helper()
	h := newHarness(t, func(c *Config) {
		c.WarmMemory = 64 << 30 // every tool's pool fits, unless mod says otherwise
		if mod != nil {
			mod(c)
		}
	})
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "warmtools.py"), []byte(warmTools), 0o644))
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "warmbroken.py"), []byte("raise RuntimeError('broken at import')\n"), 0o644))
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(warmManifest), 0o644))
	return h
}

// metricValue reads one sample (name with its labels, as printed) from
// /metrics; 0 when absent.
func metricValue(t *testing.T, h *harness, sample string) float64 {
	t.Helper()
	return sampleIn(t, metricsText(t, h), sample)
}

// sampleIn reads one sample from a scraped /metrics page; 0 when absent.
func sampleIn(t *testing.T, page, sample string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	must(t, err)
	return v
}

func waitPoolSize(t *testing.T, h *harness, tool string, n int) {
	t.Helper()
	sample := `str_worker_warm_pool_size{tool="` + tool + `"}`
	waitFor(t, sample+" = "+strconv.Itoa(n), func() bool { return metricValue(t, h, sample) == float64(n) })
}

// waitPoolReady waits until n of tool's pooled sandboxes have a runner
// that imported the tool (str_worker_warm_pool_ready, which never exceeds
// the pool size).
func waitPoolReady(t *testing.T, h *harness, tool string, n int) {
	t.Helper()
	sample := `str_worker_warm_pool_ready{tool="` + tool + `"}`
	waitFor(t, sample+" = "+strconv.Itoa(n), func() bool {
		page := metricsText(t, h) // one scrape: both gauges are set under one lock
		ready, size := sampleIn(t, page, sample), sampleIn(t, page, `str_worker_warm_pool_size{tool="`+tool+`"}`)
		if ready > size {
			t.Fatalf("%s = %v above the pool size %v", sample, ready, size)
		}
		return ready == float64(n)
	})
}

// warmAreas lists the work areas under the work dir.
func warmAreas(t *testing.T, h *harness) []string {
	t.Helper()
	entries, err := os.ReadDir(h.cfg.WorkDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), warmDirPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func resultOf(t *testing.T, reply []byte) map[string]any {
	t.Helper()
	var r struct {
		Result *struct {
			ToolResult map[string]any `json:"tool_result"`
		} `json:"result"`
	}
	must(t, json.Unmarshal(reply, &r))
	if r.Result == nil {
		t.Fatalf("not a success: %s", reply)
	}
	return r.Result.ToolResult
}

// TestWarmPoolServesEachSandboxOnce: calls are served by pooled
// sandboxes (hits), each a fresh interpreter that imported the tool
// before the call (its pid is the one of the import) and has seen no
// other call, with the status lines relayed; the pool refills.
func TestWarmPoolServesEachSandboxOnce(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "remember", 2)
	waitPoolReady(t, h, "remember", 2)
	pids := map[float64]bool{}
	for i := 0; i < 3; i++ {
		id := h.send("remember", map[string]any{"args": map[string]any{"mark": "call" + strconv.Itoa(i)}})
		res := resultOf(t, h.reply(id))
		if seen := res["seen"].([]any); len(seen) != 0 {
			t.Errorf("call %d saw earlier calls: %v", i, seen)
		}
		if res["pid"] != res["imported_pid"] {
			t.Errorf("call %d: module imported by pid %v, called in pid %v", i, res["imported_pid"], res["pid"])
		}
		if pids[res["pid"].(float64)] {
			t.Errorf("call %d: pid %v served an earlier call", i, res["pid"])
		}
		pids[res["pid"].(float64)] = true
		if got := h.status(id); len(got) != 1 || got[0] != "remembering call"+strconv.Itoa(i) {
			t.Errorf("call %d: status %q", i, got)
		}
		// The work dir is the pooled sandbox's own work area.
		files := res["cwd_files"].([]any)
		if len(files) != 4 { // .str-workdir input output status.pipe (result.json comes later)
			t.Errorf("call %d: work area holds %v", i, files)
		}
		waitPoolSize(t, h, "remember", 2)
		waitPoolReady(t, h, "remember", 2)
	}
	if hits := metricValue(t, h, `str_worker_warm_hits_total{tool="remember"}`); hits != 3 {
		t.Errorf("hits = %v, want 3", hits)
	}
	if v := metricValue(t, h, `str_worker_warm_refill_seconds_count`); v < 2 {
		t.Errorf("refill observations = %v", v)
	}
	// Every pooled sandbox counts at the standard profile's 1Gi.
	waitFor(t, "memory held", func() bool {
		return metricValue(t, h, "str_worker_warm_memory_bytes") == float64(8<<30) // 8 pooled sandboxes
	})
}

// TestWarmPoolInputsAndArgs: inputs reach a pooled sandbox through the
// held input/ descriptor, even when the tool moved input/ away before the
// call.
func TestWarmPoolInputsAndArgs(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "echo_input", 1)
	id := h.send("echo_input", map[string]any{"preloaded_artifacts": map[string]any{
		"f": map[string]any{"filename": "f.txt", "content": "aGVsbG8=", "mime_type": "text/plain"}}})
	if res := resultOf(t, h.reply(id)); res["f"] != "hello" {
		t.Errorf("input = %v", res["f"])
	}
}

// TestWarmPoolMissAndFallback: a call asking a stricter profile than the
// pool's is served cold (a miss), as is one whose module changed on disk
// since the pool imported it (and it runs the new code).
func TestWarmPoolMissAndFallback(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "remember", 2)
	id := h.send("remember", map[string]any{"sandbox_profile": "restrictive"})
	resultOf(t, h.reply(id))
	if v := metricValue(t, h, `str_worker_warm_misses_total{tool="remember"}`); v != 1 {
		t.Errorf("misses = %v, want 1", v)
	}
	// The module changes: both pooled sandboxes imported the old one.
	path := filepath.Join(h.dir, "tools", "warmtools.py")
	// (another size: Python's bytecode cache trusts size and mtime in
	// whole seconds)
	must(t, os.WriteFile(path, []byte(strings.Replace(warmTools, `"version": 1`, `"version": 222`, 1)), 0o644))
	id = h.send("remember", nil)
	if res := resultOf(t, h.reply(id)); res["version"] != float64(222) {
		t.Errorf("served the old code: %v", res)
	}
	if v := metricValue(t, h, `str_worker_warm_discarded_total{reason="code_changed"}`); v != 2 {
		t.Errorf("discarded for changed code = %v, want 2", v)
	}
}

// TestWarmPoolImportErrorAtCall: a module that fails at import is
// reported to the call as IMPORT_ERROR, as a cold run reports it.
func TestWarmPoolImportErrorAtCall(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "broken", 1)
	code, msg := errorCode(t, h.reply(h.send("broken", nil)))
	if code != string(CodeImportError) || !strings.Contains(msg, "broken at import") {
		t.Errorf("got %s %q", code, msg)
	}
	if v := metricValue(t, h, `str_worker_warm_hits_total{tool="broken"}`); v != 1 {
		t.Errorf("hits = %v", v)
	}
}

// TestReplyBeforeTeardown: a tool whose interpreter cannot exit (a
// non-daemon thread sleeps for an hour) is answered as soon as its
// result is written, warm and cold, with its output stored; the sandbox
// is then killed and its work dir removed.
func TestReplyBeforeTeardown(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "linger", 1)
	for _, tool := range []string{"linger", "linger_cold"} {
		id := h.send(tool, nil)
		reply := h.reply(id) // without the done signal: no reply for an hour
		if res := resultOf(t, reply); res["lingering"] != true {
			t.Errorf("%s: %s", tool, reply)
		}
		if !strings.Contains(string(reply), `"created_artifacts":[{"filename":"out.txt"`) {
			t.Errorf("%s: output not stored: %s", tool, reply)
		}
		if got := h.status(id); len(got) != 1 || got[0] != "lingering" {
			t.Errorf("%s: status %q", tool, got)
		}
	}
	waitFor(t, "work dirs removed, the pool refilled", func() bool {
		entries, _ := os.ReadDir(h.cfg.WorkDir)
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "task-") {
				return false
			}
		}
		return len(warmAreas(t, h)) == 8 // every pool full again
	})
}

// TestWarmRefillAfterTheCall: a claimed sandbox is replaced once its
// call is over, not while the call runs (the refill would run beside it
// on the same CPUs): the pool's filler, run while the call holds, makes
// nothing for the tool; once the call is answered and torn down, the pool
// is full again.
func TestWarmRefillAfterTheCall(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolReady(t, h, "hold", 1)
	flag := filepath.Join(h.dir, "release")
	id := h.send("hold", map[string]any{"args": map[string]any{"path": flag}})
	waitFor(t, "the call running", func() bool { return len(h.status(id)) == 1 })
	p := h.srv.pool.p
	p.Fill() // every set that wants a sandbox now gets it
	st, _ := p.State("hold")
	if st.Idle != 0 || st.Building != 0 || st.Serving != 1 {
		t.Errorf("while the call runs: %d idle, %d being made, %d serving; want 0, 0, 1", st.Idle, st.Building, st.Serving)
	}
	must(t, os.WriteFile(flag, nil, 0o644))
	resultOf(t, h.reply(id))
	waitPoolReady(t, h, "hold", 1)
	if st, _ = p.State("hold"); st.Serving != 0 {
		t.Errorf("after the call: %d serving", st.Serving)
	}
	if hits := metricValue(t, h, `str_worker_warm_hits_total{tool="hold"}`); hits != 1 {
		t.Errorf("hits = %v, want 1", hits)
	}
}

// TestWarmStatusLinesBeforeReply: every status line a pooled sandbox's
// tool wrote is relayed before the reply.
func TestWarmStatusLinesBeforeReply(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "lines", 1)
	id := h.send("lines", map[string]any{"args": map[string]any{"n": 500}})
	h.reply(id)
	got := h.status(id)
	if len(got) != 500 || got[0] != "line 0" || got[499] != "line 499" {
		t.Errorf("%d status lines before the reply", len(got))
	}
}

// TestWarmTimeoutCountsFromTheCall: a pooled sandbox's call gets its own
// timeout (the sandbox's wall clock started earlier).
func TestWarmTimeoutCountsFromTheCall(t *testing.T) {
	h := newWarmHarness(t, nil)
	h.start()
	waitPoolSize(t, h, "nap", 1)
	reply := h.reply(h.send("nap", map[string]any{"args": map[string]any{"seconds": 30}}))
	if !strings.Contains(string(reply), `"timed_out":true`) {
		t.Errorf("not a timeout: %s", reply)
	}
	if v := metricValue(t, h, `str_worker_warm_hits_total{tool="nap"}`); v != 1 {
		t.Errorf("hits = %v", v)
	}
}

// TestWarmPoolBudgetReloadShutdown: the memory budget caps the pool; a
// manifest change drains and refills the changed tool only; the shutdown
// leaves no work area behind.
func TestWarmPoolBudgetReloadShutdown(t *testing.T) {
	h := newWarmHarness(t, func(c *Config) { c.WarmMemory = 2 << 30 })
	h.start()
	// Sets fill by tool name: echo_input (broken and linger come first:
	// broken 1Gi + echo_input 1Gi = the budget).
	waitPoolSize(t, h, "broken", 1)
	waitPoolSize(t, h, "echo_input", 1)
	if v := metricValue(t, h, "str_worker_warm_memory_bytes"); v != 2<<30 {
		t.Errorf("memory held = %v", v)
	}
	if n := len(warmAreas(t, h)); n != 2 {
		t.Errorf("%d work areas with a budget for 2", n)
	}
	// Reload: broken is dropped, echo_input changes (its timeout).
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(`version: 1
tools:
  echo_input: {module: warmtools, function: echo_input, warm: 1, timeout_seconds: 30}
`), 0o644))
	waitFor(t, "drained", func() bool { return metricValue(t, h, `str_worker_warm_discarded_total{reason="drained"}`) == 2 })
	waitPoolSize(t, h, "echo_input", 1)
	waitFor(t, "one work area", func() bool { return len(warmAreas(t, h)) == 1 })
	h.stop()
	if areas := warmAreas(t, h); len(areas) != 0 {
		t.Errorf("work areas left after shutdown: %v", areas)
	}
}

// TestWarmPoolAged: idle sandboxes older than the max age are replaced.
func TestWarmPoolAged(t *testing.T) {
	h := newWarmHarness(t, func(c *Config) { c.WarmMaxAge = 1e9 }) // 1 s
	h.start()
	waitFor(t, "an aged sandbox replaced", func() bool {
		return metricValue(t, h, `str_worker_warm_discarded_total{reason="aged"}`) >= 1
	})
	waitPoolSize(t, h, "remember", 2)
}

// TestRunnerFilenameRuleIsGos: the runner's save_artifact refuses exactly
// the names the worker's artifacts.CheckFilename refuses.
func TestRunnerFilenameRuleIsGos(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	dir := t.TempDir()
	if _, err := runner.Install(dir); err != nil {
		t.Fatal(err)
	}
	names := []string{
		"ok.txt", "a\tb", "a\nb", "a\x00b", "a..b", "..", ".", "\uff0e\uff0e", "\uff0e", "a\uff0fb", "a\\b", "/abs",
		"\uff0fabs", strings.Repeat("x", 255), strings.Repeat("x", 256), strings.Repeat("é", 127) + "x",
		strings.Repeat("é", 128), "a\xffb", "\xed\xa0\x80", "user:", "user:..", "user:x", "user:a/b",
		"user:" + strings.Repeat("x", 255), "user:" + strings.Repeat("x", 256), "del\x7f", "c1\u0085", "",
		"ﬁle.txt", "\u2024\u2024",
	}
	// The names travel as hex; Python decodes them with surrogateescape,
	// as os.listdir would present undecodable bytes.
	var hexNames []string
	for _, n := range names {
		hexNames = append(hexNames, strings.TrimSpace(strconv.QuoteToASCII(n)))
	}
	script := `import sys, json
sys.path.insert(0, sys.argv[1])
import _str_runner as r
names = [bytes.fromhex(h).decode("utf-8", "surrogateescape") for h in sys.argv[2:]]
print(json.dumps([r._unsafe_filename_reason(n) for n in names]))
`
	args := []string{"-I", "-c", script, dir}
	for _, n := range names {
		args = append(args, hexOf(n))
	}
	out, err := exec.Command(python, args...).Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var reasons []*string
	must(t, json.Unmarshal(out, &reasons))
	if len(reasons) != len(names) {
		t.Fatalf("%d answers for %d names", len(reasons), len(names))
	}
	for i, n := range names {
		goErr := artifacts.CheckFilename(n)
		if (goErr == nil) != (reasons[i] == nil) {
			py := "accepted"
			if reasons[i] != nil {
				py = *reasons[i]
			}
			t.Errorf("%s (valid UTF-8 %v): Go %v, runner %s", hexNames[i], utf8.ValidString(n), goErr, py)
		}
	}
}

func hexOf(s string) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		b = append(b, digits[s[i]>>4], digits[s[i]&15])
	}
	return string(b)
}

// armingSandboxes wraps launchertest.Sandboxes: it records the wall clock of every
// sandbox created (Timeout, Idle) and every Arm.
type armingSandboxes struct {
	launchertest.Sandboxes
	mu    sync.Mutex
	specs []SandboxSpec // Profile, Argv, Timeout and Idle of each
	arms  []time.Duration
}

func (as *armingSandboxes) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	c, err := as.Sandboxes.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	as.mu.Lock()
	as.specs = append(as.specs, SandboxSpec{Profile: spec.Profile, Argv: spec.Argv, Timeout: spec.Timeout, Idle: spec.Idle})
	as.mu.Unlock()
	return armingCreated{c, as}, nil
}

type armingCreated struct {
	Sandbox
	as *armingSandboxes
}

func (c armingCreated) Arm(d time.Duration) error {
	c.as.mu.Lock()
	c.as.arms = append(c.as.arms, d)
	c.as.mu.Unlock()
	return c.Sandbox.Arm(d)
}

func (as *armingSandboxes) seen() ([]SandboxSpec, []time.Duration) {
	as.mu.Lock()
	defer as.mu.Unlock()
	return slices.Clone(as.specs), slices.Clone(as.arms)
}

// TestWarmClaimArmsTheCallsWallClock: a reference agent's call
// (sandbox_profile "standard", timeout_seconds 300: the profile's whole
// limit) is served by a pooled sandbox. The pooled sandboxes wait unarmed
// (an idle limit, no timeout); claim arms the one it takes with the
// call's wall clock, the same one a cold call of that request gets from
// its start (300 s + 5 s within standard's 300 s). Before arming, such a
// call never fit a pooled sandbox's remaining wall clock and ran cold.
func TestWarmClaimArmsTheCallsWallClock(t *testing.T) {
	h := newWarmHarness(t, nil)
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(`version: 1
tools:
  whole: {module: warmtools, function: remember, warm: 1, timeout_seconds: 300}
  whole_cold: {module: warmtools, function: remember, timeout_seconds: 300}
`), 0o644))
	as := &armingSandboxes{}
	h.rebuild(as, nil)
	h.start()
	waitPoolReady(t, h, "whole", 1)
	reference := map[string]any{"sandbox_profile": "standard", "timeout_seconds": 300}

	resultOf(t, h.reply(h.send("whole", reference)))
	if hits, misses := metricValue(t, h, `str_worker_warm_hits_total{tool="whole"}`), metricValue(t, h, `str_worker_warm_misses_total{tool="whole"}`); hits != 1 || misses != 0 {
		t.Fatalf("hits %v misses %v: the reference's call was not served warm", hits, misses)
	}
	resultOf(t, h.reply(h.send("whole_cold", reference)))

	specs, arms := as.seen()
	if len(arms) != 1 || arms[0] != 300*time.Second {
		t.Errorf("arms %v, want one of 300s (standard's whole limit)", arms)
	}
	var pooled, cold int
	for _, s := range specs {
		switch {
		case s.Argv[0] == "/bin/true": // the start-up probe
		case s.Idle > 0:
			pooled++
			if s.Idle != h.cfg.WarmMaxAge+time.Minute || s.Timeout != 0 {
				t.Errorf("a pooled sandbox created with timeout %v, idle %v: want none (the profile's ceiling) and max age + 1m", s.Timeout, s.Idle)
			}
		default:
			cold++
			if s.Timeout != 300*time.Second {
				t.Errorf("the cold call's timeout %v, want the armed one, 300s", s.Timeout)
			}
		}
	}
	if pooled < 1 || cold != 1 {
		t.Errorf("%d pooled and %d cold sandboxes created, want at least 1 and 1", pooled, cold)
	}
}

// TestWarmCallRunsThroughShutdown: a call running in a pooled sandbox
// when the shutdown begins finishes within the grace period and gets its
// result. Stopping the pool kills its idle sandboxes only; it used to
// cancel the launcher context of the handed-over ones too, and the call
// was answered CANCELLED "by a cancel request".
func TestWarmCallRunsThroughShutdown(t *testing.T) {
	h := newWarmHarness(t, func(c *Config) { c.ShutdownGrace = 2 * time.Minute })
	release := filepath.Join(h.dir, "release")
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "holdtools.py"), []byte(`import os, time

def hold(ctx, until):
    ctx.send_status("holding")
    while not os.path.exists(until):
        time.sleep(0.05)
    return {"held": True}
`), 0o644))
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte("version: 1\ntools:\n  hold: {module: holdtools, function: hold, warm: 1, timeout_seconds: 120}\n"), 0o644))
	h.start()
	waitPoolReady(t, h, "hold", 1)
	id := h.send("hold", map[string]any{"args": map[string]any{"until": release}})
	waitFor(t, "the call running in the pooled sandbox", func() bool { return len(h.status(id)) > 0 })
	if n := metricValue(t, h, `str_worker_warm_hits_total{tool="hold"}`); n != 1 {
		t.Fatalf("warm hits = %v: the call did not take the pooled sandbox", n)
	}
	h.cancel()
	// The pool is stopped while the call still holds (it has no idle
	// sandbox to drain: the claimed one is replaced after its call).
	waitFor(t, "the pool stopped", h.srv.pool.p.Stopped)
	must(t, os.WriteFile(release, nil, 0o644))
	var r struct {
		Result map[string]any
		Error  *struct{ Code, Message string }
	}
	reply := h.reply(id)
	must(t, json.Unmarshal(reply, &r))
	if r.Error != nil || r.Result == nil {
		t.Fatalf("a call running at shutdown, within the grace: %s", reply)
	}
	must(t, <-h.done)
	h.cancel = nil
}
