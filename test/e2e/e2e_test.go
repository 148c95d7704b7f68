package e2e

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const replyWait = 60 * time.Second

// TestReplyShapes: every reply shape against golden JSON, status
// notifications included, over TCP with the real launcher.
func TestReplyShapes(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)

	id := a.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "hi"}, "user_id": "u-1", "session_id": "s-1"})
	checkGolden(t, "echo.json", id, a.reply(id, replyWait))
	a.mu.Lock()
	statuses := a.statuses[id]
	a.mu.Unlock()
	if len(statuses) != 1 {
		t.Fatalf("%d status notifications, want 1", len(statuses))
	}
	checkGolden(t, "status.json", id, statuses[0])

	id = a.invoke("failing_tool", nil)
	checkGolden(t, "tool_error.json", id, a.reply(id, replyWait))

	id = a.invoke("ghost", nil) // not subscribed: nobody answers
	a.noReply(id, 500*time.Millisecond)

	for tool, want := range map[string]string{"failing_tool": "EXECUTION_ERROR", "missing": "IMPORT_ERROR", "crash": "SANDBOX_FAILED"} {
		params := map[string]any{}
		if tool == "failing_tool" {
			params["args"] = map[string]any{"mode": "raise"}
		}
		if code, msg := errorCode(t, a.reply(a.invoke(tool, params), replyWait)); code != want {
			t.Errorf("%s: %s (%s), want %s", tool, code, msg, want)
		}
	}
	if r := a.reply(a.invoke("async_fetch", nil), replyWait); !strings.Contains(string(r), `"tool_result":{"results":["A","B","C"]}`) {
		t.Errorf("async tool: %s", r)
	}
	// The manifest's timeout (1 s) bounds the request's 300 s; the wall
	// clock limit is that + 5 s.
	id = a.invoke("short", map[string]any{"args": map[string]any{"seconds": 120}, "timeout_seconds": 300})
	checkGolden(t, "timeout.json", id, a.reply(id, replyWait))
}

func TestEscapeAttemptIsStopped(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	r := a.reply(a.invoke("escape_attempt", nil), replyWait)
	if !strings.Contains(string(r), `"all_blocked":true`) {
		t.Fatalf("escape not stopped: %s", r)
	}
	r = a.reply(a.invoke("execute_python", map[string]any{"args": map[string]any{"code": "import os\nresult = os.getuid()\nprint('hi')"}}), replyWait)
	if !strings.Contains(string(r), `"stdout":"hi\n"`) {
		t.Fatalf("execute_python: %s", r)
	}
}

// TestStatusLinesComplete: 2000 lines written as fast as the tool can,
// the last ones right before exit; all arrive, in order, before the reply.
func TestStatusLinesComplete(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	id := a.invoke("many_lines", map[string]any{"args": map[string]any{"n": 2000}})
	if r := a.reply(id, replyWait); !isSuccess(r) {
		t.Fatalf("reply %s", r)
	}
	got := a.status(id)
	if len(got) != 2000 {
		t.Fatalf("%d status lines, want 2000", len(got))
	}
	for i, s := range got {
		if s != fmt.Sprintf("line %d", i) {
			t.Fatalf("status %d is %q", i, s)
		}
	}
}

// TestArtifactsFilesystemLayout: inputs preloaded, referenced from a
// fixture written in the reference layout (session- and user-scoped), and
// outputs laid out as the reference lays them out.
func TestArtifactsFilesystemLayout(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	// Reference layout: {base}/{basename(namespace)}/{user}/{session}/{file}/{N} + {N}.meta.
	fixture := func(rel string, versions ...string) {
		dir := filepath.Join(e.artifacts, "e2e", rel)
		must(t, os.MkdirAll(dir, 0o755))
		for v, content := range versions {
			must(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(v)), []byte(content), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(v)+".meta"), []byte(`{"mime_type": "text/plain"}`), 0o644))
		}
	}
	fixture("u-1/s-1/ref.txt", "v0", "v1")
	fixture("u-1/user/shared.txt", "from the user scope")
	// A version without its .meta is incomplete and not "latest".
	must(t, os.WriteFile(filepath.Join(e.artifacts, "e2e", "u-1/s-1/ref.txt/2"), []byte("partial"), 0o644))

	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	id := a.invoke("read_inputs", map[string]any{
		"preloaded_artifacts": map[string]any{"a": map[string]any{"filename": "inline.txt",
			"content": base64.StdEncoding.EncodeToString([]byte("inline")), "mime_type": "text/plain"}},
		"artifact_references": map[string]any{"b": map[string]any{"filename": "ref.txt"},
			"shared": map[string]any{"filename": "user:shared.txt"}},
	})
	r := a.reply(id, replyWait)
	want := `"tool_result":{"a":"inline","b":"v1","shared":"from the user scope"}`
	if !strings.Contains(string(r), want) {
		t.Fatalf("reply %s\nlacks %s", r, want)
	}
	if !strings.Contains(string(r), `"created_artifacts":[{"filename":"data.csv","version":0,"mime_type":"text/csv","size_bytes":4},{"filename":"result.txt","version":0,"mime_type":"text/plain","size_bytes":29}]`) {
		t.Fatalf("created_artifacts (the symlink must not be collected): %s", r)
	}
	for name, content := range map[string]string{"result.txt": "inline|v1|from the user scope", "data.csv": "x,y\n"} {
		dir := filepath.Join(e.artifacts, "e2e", "u-1", "s-1", name)
		b, err := os.ReadFile(filepath.Join(dir, "0"))
		must(t, err)
		meta, err := os.ReadFile(filepath.Join(dir, "0.meta"))
		must(t, err)
		mime := map[string]string{"result.txt": "text/plain", "data.csv": "text/csv"}[name]
		if string(b) != content || string(meta) != `{"mime_type": "`+mime+`"}` {
			t.Errorf("%s: %q meta %q", name, b, meta)
		}
	}
	if _, err := os.Lstat(filepath.Join(e.artifacts, "e2e", "u-1", "s-1", "evil.txt")); !os.IsNotExist(err) {
		t.Errorf("symlink output was stored: %v", err)
	}
	// A specific version, and a missing one.
	id = a.invoke("process_file", map[string]any{"artifact_references": map[string]any{"input_file": map[string]any{"filename": "ref.txt", "version": 0}}})
	if r := a.reply(id, replyWait); !isSuccess(r) {
		t.Fatalf("version 0: %s", r)
	}
	id = a.invoke("process_file", map[string]any{"artifact_references": map[string]any{"input_file": map[string]any{"filename": "ref.txt", "version": 7}}})
	if code, _ := errorCode(t, a.reply(id, replyWait)); code != "ARTIFACT_ERROR" {
		t.Fatalf("missing version: %s", code)
	}
	// The example tool with a preloaded input, against its golden reply.
	id = a.invoke("process_file", map[string]any{"session_id": "s-2", "preloaded_artifacts": map[string]any{"input_file": map[string]any{
		"filename": "data.txt", "content": base64.StdEncoding.EncodeToString([]byte("alpha\nbeta\ngamma\n"))}}})
	checkGolden(t, "process_file.json", id, a.reply(id, replyWait))
}

// TestManifestChangesWhileServing: add, remove, break.
func TestManifestChangesWhileServing(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	if !isSuccess(a.reply(a.invoke("echo_tool", nil), replyWait)) {
		t.Fatal("echo before reload")
	}
	// Add echo_two, remove failing_tool.
	changed := strings.Replace(e2eManifest, "  failing_tool: {module: example_tools, function: failing_tool}\n",
		"  echo_two: {module: example_tools, function: echo_tool}\n", 1)
	writeManifest(t, e.manifest, changed)
	select {
	case tool := <-a.removed:
		if tool != "failing_tool" {
			t.Fatalf("removed %s", tool)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("no removed/failing_tool within 3 s")
	}
	if r := a.reply(a.invoke("echo_two", nil), replyWait); !isSuccess(r) {
		t.Fatalf("added tool: %s", r)
	}
	a.noReply(a.invoke("failing_tool", nil), time.Second)
	// A broken manifest keeps the previous one.
	writeManifest(t, e.manifest, "version: 1\ntools:\n  echo_two: {module: example_tools}\n  bad: [1\n")
	// Once the watcher has seen it (a loaded machine may take more than
	// its 200 ms poll), the previous manifest still serves.
	waitFor(t, "the broken manifest logged", 30*time.Second, func() bool { return strings.Contains(w.log.String(), "keeping the previous") })
	if r := a.reply(a.invoke("echo_two", nil), replyWait); !isSuccess(r) {
		t.Fatalf("after a broken manifest: %s", r)
	}
}

func TestCancellation(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	id := a.invoke("sleeper", map[string]any{"args": map[string]any{"seconds": 120}})
	waitFor(t, "the tool running", 30*time.Second, func() bool { return len(a.status(id)) > 0 })
	must(t, a.c.Publish(t.Context(), messageTo(a.base+"/sam_remote_tool/cancel/"+id)))
	code, _ := errorCode(t, a.reply(id, replyWait))
	if code != "CANCELLED" {
		t.Fatalf("code %s", code)
	}
	waitFor(t, "work dir removed", 10*time.Second, func() bool {
		entries, _ := os.ReadDir(e.work)
		return len(entries) == 0
	})
}

// TestFiftySimultaneous: 50 requests at once, concurrency 4: none lost,
// never more than 4 running (the worker's high-water gauge).
func TestFiftySimultaneous(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	// One user here: every slot may be its (STR_USER_MAX_RUNNING).
	w := startWorker(t, e, 0, map[string]string{"SANDBOX_MAX_CONCURRENT": "4", "STR_USER_MAX_RUNNING": "4"})
	a := newAgent(t, w.port)
	var ids []string
	for i := 0; i < 50; i++ {
		ids = append(ids, a.invoke("sleeper", map[string]any{"args": map[string]any{"seconds": 0.3}}))
	}
	for _, id := range ids {
		if r := a.reply(id, 3*replyWait); !isSuccess(r) {
			t.Errorf("%s: %s", id, r)
		}
	}
	if m := w.metric("str_worker_running_executions_max"); m != 4 {
		t.Errorf("running max %v, want 4", m)
	}
	if q := w.metric("str_worker_queued_executions"); q != 0 {
		t.Errorf("queued %v after all replies", q)
	}
}

// TestHostileRequests: each gets its code and the worker keeps serving.
func TestHostileRequests(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, map[string]string{"STR_MAX_PAYLOAD_BYTES": "65536"})
	a := newAgent(t, w.port)
	raw := func(payload string) []byte {
		id := newID("raw")
		a.publishInvoke("echo_tool", id, []byte(payload))
		return a.reply(id, replyWait)
	}
	if r := string(raw(`{"jsonrpc":"2.0","id":"x","method":"sam_remote_tool/invoke","params":`)); !strings.HasPrefix(r, `{"jsonrpc":"2.0","id":"unknown","error":{"code":"INVALID_REQUEST"`) {
		t.Errorf("bad JSON: %s", r)
	}
	if code, _ := errorCode(t, raw(`{"jsonrpc":"2.0","id":"x","method":"sam_remote_tool/invoke","params":{"tool_name":"echo_tool"}}`)); code != "INVALID_REQUEST" {
		t.Errorf("missing fields: %s", code)
	}
	big := `{"jsonrpc":"2.0","id":"x","method":"sam_remote_tool/invoke","params":{"pad":"` + strings.Repeat("A", 70000) + `"}}`
	if code, msg := errorCode(t, raw(big)); code != "INVALID_REQUEST" || !strings.Contains(msg, "exceeds the limit") {
		t.Errorf("oversized: %s %s", code, msg)
	}
	hostile := []map[string]any{
		{"task_id": "../../escape"},
		{"task_id": "a/b"},
		{"user_id": "../other-user"},
		{"session_id": "../../../../etc"},
		{"artifact_references": map[string]any{"input_file": map[string]any{"filename": "../../../etc/passwd"}}},
		{"preloaded_artifacts": map[string]any{"input_file": map[string]any{"filename": "/etc/cron.d/x", "content": ""}}},
		{"sandbox_profile": "no-such-profile"},
	}
	for _, p := range hostile {
		if code, msg := errorCode(t, a.reply(a.invoke("process_file", p), replyWait)); code != "INVALID_REQUEST" {
			t.Errorf("%v: %s %s", p, code, msg)
		}
	}
	if entries, _ := os.ReadDir(e.work); len(entries) != 0 {
		t.Errorf("work dir has entries: %v", entries)
	}
	if r := a.reply(a.invoke("echo_tool", nil), replyWait); !isSuccess(r) || !w.alive() {
		t.Fatalf("not serving after hostile requests: %s", r)
	}
}

// TestReconnectAfterBrokerRestart: `str broker` restarted on the same
// port; the worker (and the agent) reconnect, re-subscribe and serve.
func TestReconnectAfterBrokerRestart(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	port := freePort(t)
	b := startDevBroker(t, port)
	// Cleanups run last first: the worker (registered by startWorker)
	// stops while the broker is still up, then the broker.
	t.Cleanup(func() { b.Process.Signal(syscall.SIGTERM); b.Wait() })
	w := startWorker(t, e, port, nil)
	a := newAgent(t, port)
	if r := a.reply(a.invoke("echo_tool", nil), replyWait); !isSuccess(r) {
		t.Fatalf("before restart: %s", r)
	}
	b.Process.Signal(syscall.SIGTERM)
	b.Wait()
	w.waitReady(false)
	b = startDevBroker(t, port)
	w.waitReady(true)
	// The agent reconnects on its own schedule; a request published before
	// its subscriptions are back gets lost (no persistence), so retry.
	var mu sync.Mutex
	ok := false
	deadline := time.Now().Add(30 * time.Second)
	for !ok && time.Now().Before(deadline) {
		id := a.invoke("echo_tool", nil)
		select {
		case r := <-a.replyChan(id):
			mu.Lock()
			ok = isSuccess(r)
			mu.Unlock()
		case <-time.After(2 * time.Second):
		}
	}
	if !ok {
		t.Fatal("no successful invocation after the broker restart")
	}
}

// TestInvokeCLI: `str invoke` against the embedded broker.
func TestInvokeCLI(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	in := filepath.Join(e.root, "in.txt")
	must(t, os.WriteFile(in, []byte("one\ntwo\n"), 0o644))
	out, err := exec.Command(strBin, "invoke", "process_file", "--broker", "127.0.0.1:"+strconv.Itoa(w.port),
		"--namespace", "e2e/", "--artifact", "input_file="+in).CombinedOutput()
	if err != nil {
		t.Fatalf("str invoke: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 3 || lines[0] != "status: Loading input file..." || lines[1] != "status: Processing 2 lines..." ||
		!strings.Contains(lines[2], `"tool_result":{"status":"success","lines":2}`) {
		t.Fatalf("output:\n%s", out)
	}
	cmd := exec.Command(strBin, "invoke", "failing_tool", "--broker", "127.0.0.1:"+strconv.Itoa(w.port), "--namespace", "e2e/")
	out, err = cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), `"code":"TOOL_ERROR"`) {
		t.Fatalf("failing tool: %v\n%s", err, out)
	}
	var reply map[string]any
	must(t, json.Unmarshal([]byte(strings.TrimSpace(string(out))), &reply))
}
