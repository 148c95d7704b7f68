package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

const warmE2EManifest = `version: 1
tools:
  traces: {module: warm_tools, function: traces, warm: 2, timeout_seconds: 60}
`

// labelledMetric reads one sample with its labels (as printed) from
// /metrics; 0 when absent.
func (w *workerProc) labelledMetric(sample string) float64 {
	w.t.Helper()
	_, body := w.get("/metrics")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	must(w.t, err)
	return v
}

func toolResult(t *testing.T, reply []byte) map[string]any {
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

// TestWarmPoolIsolation: a call served by a pooled sandbox writes to
// every writable place it has (work dir, output/, /tmp, /dev/shm, ...,
// its module's globals, os.environ) and leaves a background process
// running; the next call of the same tool, served by the other pooled
// sandbox (which existed, started and imported the tool, while the first
// call ran), finds none of it, nor does a call served by a sandbox of the
// refilled pool. Every sandbox serves exactly one call, and the worker
// leaves no work area and no process behind when it stops.
func TestWarmPoolIsolation(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	copyFile(t, "testdata/warm_tools.py", filepath.Join(e.tools, "warm_tools.py"))
	writeManifest(t, e.manifest, warmE2EManifest)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	poolFull := func() bool { return w.labelledMetric(`str_worker_warm_pool_size{tool="traces"}`) == 2 }
	waitFor(t, "the pool full", 60*time.Second, poolFull)
	hits := func() float64 { return w.labelledMetric(`str_worker_warm_hits_total{tool="traces"}`) }

	// 1. the traces.
	res := toolResult(t, a.reply(a.invoke("traces", map[string]any{"args": map[string]any{"mode": "leave"}}), 60*time.Second))
	var written []string
	for _, p := range res["written"].([]any) {
		written = append(written, p.(string))
	}
	firstDir := res["cwd"].(string)
	for _, want := range []string{"/tmp", "/dev/shm", firstDir, filepath.Join(firstDir, "output")} {
		if !contains(written, want) {
			t.Errorf("the first call could not write %s (wrote %v): the test proves nothing there", want, written)
		}
	}
	t.Logf("the first call wrote to %v and left process %v running", written, res["background_pid"])
	if hits() != 1 {
		t.Fatal("the first call was not served by a pooled sandbox")
	}
	// 2. the same tool, served warm twice more: by the sandbox pooled
	// beside the first one, then by one of the refilled pool.
	for i := 2; i <= 3; i++ {
		if i == 3 {
			waitFor(t, "the pool refilled", 60*time.Second, poolFull)
		}
		res := toolResult(t, a.reply(a.invoke("traces", nil), 60*time.Second))
		if found := res["found"].([]any); len(found) != 0 {
			t.Errorf("call %d found traces of the first call: %v", i, found)
		}
		if res["cwd"] == firstDir {
			t.Errorf("call %d ran in the first call's work dir %s", i, firstDir)
		}
		if got := hits(); got != float64(i) {
			t.Fatalf("call %d: hits = %v, want %v (not served by a pooled sandbox)", i, got, i)
		}
	}
	// 3. the first call's work dir is gone (removed after its reply).
	waitFor(t, "the first call's work dir removed", 30*time.Second, func() bool {
		_, err := os.Lstat(firstDir)
		return os.IsNotExist(err)
	})
	// 4. the worker stops: no work area, no process of a sandbox left.
	w.stop(syscall.SIGTERM)
	entries, err := os.ReadDir(e.work)
	must(t, err)
	for _, ent := range entries {
		t.Errorf("left in the work dir after the worker stopped: %s", ent.Name())
	}
	if procs := processesUnder(e.root); len(procs) > 0 {
		t.Errorf("processes left with their cwd under %s: %v", e.root, procs)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// processesUnder lists the processes whose working directory is under
// dir (a sandbox's tool runs in its work dir).
func processesUnder(dir string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err == nil && strings.HasPrefix(cwd, dir+"/") {
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			out = append(out, e.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
		}
	}
	return out
}

const warmReferenceManifest = `version: 1
tools:
  ref_sleeper: {module: e2e_tools, function: sleeper, warm: 2}
  ref_overrun: {module: e2e_tools, function: sleeper, warm: 1, timeout_seconds: 1}
  ref_inputs: {module: warm_tools, function: inputs, warm: 1}
`

// TestWarmPoolServesReferenceDefaults: calls carrying exactly the
// reference agent's defaults (sandbox_profile "standard", timeout_seconds
// 300: the standard profile's whole wall clock) are served by pooled
// sandboxes (the hit counter, and the worker's log of each claim with the
// wall clock it armed), because a pooled sandbox waits unarmed and claim
// arms the call's own deadline. A pooled call that overruns its armed
// deadline (the tool's manifest timeout of 1 s + 5 s, counted from the
// claim; the pooled sandboxes' idle limit is an hour here) is killed by
// its sandbox and answered timed_out: true. A pooled call given one
// artifact twice, in a list and alone, as the reference's agents pass it,
// gets it once in input/, under both parameters.
func TestWarmPoolServesReferenceDefaults(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	copyFile(t, "testdata/warm_tools.py", filepath.Join(e.tools, "warm_tools.py"))
	writeManifest(t, e.manifest, warmReferenceManifest)
	// The store's layout: {base}/{namespace}/{user}/{session}/{file}/{version}.
	for name, content := range map[string]string{"data.csv": "a,b\n1,2\n", "other.csv": "x\n"} {
		dir := filepath.Join(e.artifacts, "e2e", "u-1", "s-1", name)
		must(t, os.MkdirAll(dir, 0o755))
		must(t, os.WriteFile(filepath.Join(dir, "0"), []byte(content), 0o644))
		must(t, os.WriteFile(filepath.Join(dir, "0.meta"), []byte(`{"mime_type": "text/csv"}`), 0o644))
	}
	w := startWorker(t, e, 0, map[string]string{"STR_WARM_MAX_AGE_SECONDS": "3600"})
	a := newAgent(t, w.port)
	metric := func(name, tool string) float64 {
		return w.labelledMetric(name + `{tool="` + tool + `"}`)
	}
	waitFor(t, "the pools full and ready", 60*time.Second, func() bool {
		return metric("str_worker_warm_pool_ready", "ref_sleeper") == 2 && metric("str_worker_warm_pool_ready", "ref_overrun") == 1 &&
			metric("str_worker_warm_pool_ready", "ref_inputs") == 1
	})

	// 1. two calls with the reference's defaults, each served warm.
	for i := 1; i <= 2; i++ {
		params := map[string]any{"args": map[string]any{"seconds": 0}}
		for k, v := range referenceDefaults {
			params[k] = v
		}
		id := a.invoke("ref_sleeper", params)
		toolResult(t, a.reply(id, 60*time.Second))
		if hits, misses := metric("str_worker_warm_hits_total", "ref_sleeper"), metric("str_worker_warm_misses_total", "ref_sleeper"); hits != float64(i) || misses != 0 {
			t.Fatalf("call %d: hits %v, misses %v: the reference's call was not served by a pooled sandbox", i, hits, misses)
		}
		if !claimLogged(w.log.String(), id, 300*time.Second) {
			t.Errorf("call %d: no log of its claim arming 300s (standard's whole limit):\n%s", i, tail(w.log.String(), 30))
		}
	}

	// 2. one artifact in a list and alone, as the reference's agent
	// sends an artifact list argument and an artifact argument.
	params := map[string]any{
		"args": map[string]any{"files": []string{"data.csv", "other.csv"}, "primary": "data.csv"},
		"artifact_references": map[string]any{
			"files[0]": map[string]any{"filename": "data.csv", "version": 0},
			"files[1]": map[string]any{"filename": "other.csv", "version": nil},
			"primary":  map[string]any{"filename": "data.csv", "version": nil},
		},
	}
	for k, v := range referenceDefaults {
		params[k] = v
	}
	res := toolResult(t, a.reply(a.invoke("ref_inputs", params), 60*time.Second))
	text, _ := res["text"].(map[string]any)
	if text["files[0]"] != "a,b\n1,2\n" || text["primary"] != "a,b\n1,2\n" || text["files[1]"] != "x\n" {
		t.Errorf("inputs %v", res)
	}
	if got := fmt.Sprint(res["input"]); got != "[data.csv other.csv]" {
		t.Errorf("input/ holds %s, want data.csv once and other.csv", got)
	}
	if hits := metric("str_worker_warm_hits_total", "ref_inputs"); hits != 1 {
		t.Errorf("hits %v: the call with inputs was not served by a pooled sandbox", hits)
	}

	// 3. a pooled call that overruns its armed deadline.
	params = map[string]any{"args": map[string]any{"seconds": 3600}}
	for k, v := range referenceDefaults {
		params[k] = v
	}
	id := a.invoke("ref_overrun", params)
	reply := a.reply(id, 120*time.Second)
	if !strings.Contains(string(reply), `"timed_out":true`) {
		t.Fatalf("the overrunning call's reply is not a timeout: %s", reply)
	}
	if hits := metric("str_worker_warm_hits_total", "ref_overrun"); hits != 1 {
		t.Fatalf("hits %v: the overrunning call was not served by a pooled sandbox", hits)
	}
	if !claimLogged(w.log.String(), id, 6*time.Second) {
		t.Errorf("no log of the overrunning call's claim arming 6s:\n%s", tail(w.log.String(), 30))
	}
	if strings.Contains(w.log.String(), "could not take the call") {
		t.Errorf("a claim failed to arm:\n%s", tail(w.log.String(), 30))
	}
}

// claimLogged reports whether the worker's log says request id was served
// by a pooled sandbox armed with timeout.
func claimLogged(log, id string, timeout time.Duration) bool {
	for _, line := range strings.Split(log, "\n") {
		var l struct {
			Msg       string `json:"msg"`
			RequestID string `json:"id"`
			Timeout   any    `json:"timeout"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || l.Msg != "served by a pooled sandbox" || l.RequestID != id {
			continue
		}
		switch v := l.Timeout.(type) {
		case float64:
			return time.Duration(v) == timeout
		case string:
			d, err := time.ParseDuration(v)
			return err == nil && d == timeout
		}
	}
	return false
}
