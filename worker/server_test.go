package worker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher/launchertest"
	"github.com/securetoolruntime/str/launcher/workdir"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/memory"
)

const testTools = `
import os, time

def echo(ctx, message="Hello"):
    ctx.send_status("echoing")
    return {"echo": message, "none": None}

def plain(message):
    return message

def nothing(ctx):
    return None

def many_lines(ctx, n=300):
    for i in range(int(n)):
        ctx.send_status("line %d" % i)
    return {"n": n}

def sleeper(ctx, seconds=1.0):
    ctx.send_status("sleeping")
    time.sleep(float(seconds))
    return {"slept": seconds}

def boom(ctx):
    raise ValueError("kaboom")

def tool_error(ctx):
    raise ctx.ToolError("bad input, says the tool")

def files(ctx, input_file, other):
    a = ctx.load_artifact_text("input_file")
    b = ctx.load_artifact_text("other")
    ctx.save_artifact("out.txt", (a + "|" + b).encode())
    ctx.save_artifact("data.json", b'{"k": 1}')
    out = os.path.dirname(ctx.save_artifact("z.bin", b"\x00\x01"))
    os.symlink("/etc/passwd", os.path.join(out, "link.txt"))
    os.mkdir(os.path.join(out, "subdir"))
    with open(os.path.join(out, "subdir", "hidden.txt"), "w") as f:
        f.write("not collected")
    os.mkfifo(os.path.join(out, "fifo.txt"))
    return {"a": a, "b": b}

def big_output(ctx):
    ctx.save_artifact("big.bin", b"x" * 4096)
    return {}
`

const testManifest = `version: 1
tools:
  echo: {module: testtools, function: echo}
  plain: {module: testtools, function: plain}
  nothing: {module: testtools, function: nothing}
  many_lines: {module: testtools, function: many_lines}
  sleeper: {module: testtools, function: sleeper}
  short: {module: testtools, function: sleeper, timeout_seconds: 1}
  boom: {module: testtools, function: boom}
  tool_error: {module: testtools, function: tool_error}
  missing: {module: testtools, function: does_not_exist}
  files: {module: testtools, function: files}
  big_output: {module: testtools, function: big_output}
  restricted: {module: testtools, function: echo, sandbox_profile: restrictive}
`

type harness struct {
	t        *testing.T
	dir      string
	cfg      *Config
	srv      *Server
	store    artifacts.Store
	client   transport.Transport
	bus      *memory.Bus
	cancel   context.CancelFunc
	done     chan error
	mu       sync.Mutex
	statuses map[string][]string // correlation id -> status texts
	replies  map[string]chan []byte
	other    chan *transport.Delivery
}

func newHarness(t *testing.T, mod func(*Config)) *harness {
	t.Helper()
	dir := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(dir, "tools"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "tools", "testtools.py"), []byte(testTools), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "manifest.yaml"), []byte(testManifest), 0o644))
	cfg, err := LoadConfig(nil, envOf(map[string]string{
		"SAM_NAMESPACE": "test/ns/", "DEV_BROKER_HOST": "unused", "HEALTH_PORT": "0",
		"MANIFEST_PATH": filepath.Join(dir, "manifest.yaml"), "TOOLS_PYTHON_DIR": filepath.Join(dir, "tools"),
		"SANDBOX_WORK_DIR": filepath.Join(dir, "work"), "STR_RUNNER_DIR": filepath.Join(dir, "runner"),
		"STR_SITE_DIR": filepath.Join(dir, "site"), "STR_MANIFEST_POLL_MS": "100", "SHUTDOWN_GRACE_SECONDS": "5",
	}), io.Discard)
	must(t, err)
	if mod != nil {
		mod(cfg)
	}
	h := &harness{t: t, dir: dir, cfg: cfg, bus: memory.NewBus(), statuses: map[string][]string{},
		replies: map[string]chan []byte{}, other: make(chan *transport.Delivery, 100),
		store: artifacts.NewMemory(cfg.Namespace)}
	h.srv, err = New(Options{Config: cfg, Transport: h.bus.Client("worker", cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	must(t, err)
	return h
}

func (h *harness) start() {
	t := h.t
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	// The agent is connected before the worker starts: it sees the
	// worker's start-up notices (init broadcasts).
	h.client = h.bus.Client("agent", "")
	must(t, h.client.Connect(context.Background(), []string{
		h.cfg.Base() + "/sam_remote_tool/response/>", h.cfg.Base() + "/sam_remote_tool/status/>",
		h.cfg.Base() + "/sam_remote_tool/removed/>", h.cfg.Base() + "/sam_remote_tool/init/>"}))
	go func() { h.done <- h.srv.Run(ctx) }()
	go h.receive()
	waitFor(t, "worker ready", h.srv.Ready)
	t.Cleanup(func() { h.stop() })
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		h.t.Error("Run did not return")
	}
	h.client.Close()
}

func (h *harness) receive() {
	for {
		d, err := h.client.Receive(context.Background())
		if err != nil {
			return
		}
		parts := strings.Split(d.Topic, "/")
		corr := parts[len(parts)-1]
		switch {
		case strings.Contains(d.Topic, "/status/"):
			var st struct {
				Params struct {
					StatusText string `json:"status_text"`
				} `json:"params"`
			}
			json.Unmarshal(d.Payload, &st)
			h.mu.Lock()
			h.statuses[corr] = append(h.statuses[corr], st.Params.StatusText)
			h.mu.Unlock()
		case strings.Contains(d.Topic, "/response/"):
			h.replyChan(corr) <- d.Payload
		default:
			h.other <- d
		}
	}
}

func (h *harness) replyChan(id string) chan []byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.replies[id]
	if c == nil {
		c = make(chan []byte, 4)
		h.replies[id] = c
	}
	return c
}

func (h *harness) status(id string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.statuses[id]...)
}

var idSeq struct {
	sync.Mutex
	n int
}

func nextID() string {
	idSeq.Lock()
	defer idSeq.Unlock()
	idSeq.n++
	return fmt.Sprintf("req-%d", idSeq.n)
}

// send publishes an invoke for tool with extra params; it returns the id.
func (h *harness) send(tool string, params map[string]any) string {
	id := nextID()
	p := map[string]any{"task_id": "task-" + id, "tool_name": tool, "app_name": "app", "user_id": "u1", "session_id": "s1"}
	for k, v := range params {
		if v == nil {
			delete(p, k)
		} else {
			p[k] = v
		}
	}
	payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": MethodInvoke, "params": p})
	h.sendRaw(tool, id, payload, nil)
	return id
}

func (h *harness) sendRaw(tool, id string, payload []byte, props map[string]string) {
	base := h.cfg.Base()
	up := map[string]string{PropReplyTo: base + "/sam_remote_tool/response/app/" + id,
		PropStatusTo: base + "/sam_remote_tool/status/app/" + id}
	for k, v := range props {
		if v == "" {
			delete(up, k)
		} else {
			up[k] = v
		}
	}
	must(h.t, h.client.Publish(context.Background(), transport.Message{
		Topic: base + "/sam_remote_tool/invoke/" + tool, Payload: payload, UserProperties: up}))
}

func (h *harness) reply(id string) []byte {
	h.t.Helper()
	select {
	case r := <-h.replyChan(id):
		return r
	case <-time.After(60 * time.Second):
		h.t.Fatalf("no reply to %s", id)
		return nil
	}
}

var execTimeRE = regexp.MustCompile(`"execution_time_ms":\d+`)

// shape replaces the execution time so replies compare with goldens.
func shape(b []byte) string { return execTimeRE.ReplaceAllString(string(b), `"execution_time_ms":0`) }

func errorCode(t *testing.T, reply []byte) (string, string) {
	t.Helper()
	var r struct {
		Error *struct{ Code, Message string }
	}
	must(t, json.Unmarshal(reply, &r))
	if r.Error == nil {
		t.Fatalf("not an error reply: %s", reply)
	}
	return r.Error.Code, r.Error.Message
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestInvokeShapes(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	cases := []struct {
		tool string
		args map[string]any
		want string
	}{
		{"echo", map[string]any{"message": "hi <&>"}, `{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"echo":"hi <&>","none":null},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`},
		{"plain", map[string]any{"message": "just text"}, `{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"text":"just text","data_objects":[]},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`},
		{"nothing", nil, `{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"text":null,"data_objects":[]},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`},
		{"boom", nil, ``},
	}
	for _, c := range cases[:3] {
		id := h.send(c.tool, map[string]any{"args": c.args})
		if got, want := shape(h.reply(id)), strings.Replace(c.want, "ID", id, 1); got != want {
			t.Errorf("%s:\n got %s\nwant %s", c.tool, got, want)
		}
	}
	id := h.send("echo", nil)
	h.reply(id)
	if got := h.status(id); len(got) != 1 || got[0] != "echoing" {
		t.Errorf("status lines %q", got)
	}
	// Work dirs are removed after the reply.
	waitFor(t, "work dirs removed", func() bool {
		e, _ := os.ReadDir(h.cfg.WorkDir)
		return len(e) == 0
	})
}

func TestErrorCodes(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	cases := []struct {
		tool   string
		params map[string]any
		code   string
		msg    string
	}{
		{"boom", nil, "EXECUTION_ERROR", "kaboom"},
		{"tool_error", nil, "TOOL_ERROR", "bad input, says the tool"},
		{"missing", nil, "IMPORT_ERROR", "does_not_exist"},
		{"files", map[string]any{"artifact_references": map[string]any{"input_file": map[string]any{"filename": "nope.txt"}}}, "ARTIFACT_ERROR", `artifact "nope.txt" (latest version) not found`},
		{"echo", map[string]any{"sandbox_profile": "no-such-profile"}, "INVALID_REQUEST", `sandbox profile "no-such-profile" (from the request)`},
		{"echo", map[string]any{"task_id": "../../etc"}, "INVALID_REQUEST", "params.task_id"},
		{"echo", map[string]any{"user_id": "../root"}, "INVALID_REQUEST", "params.user_id"},
		{"echo", map[string]any{"session_id": "a/b"}, "INVALID_REQUEST", "params.session_id"},
		{"echo", map[string]any{"app_name": nil}, "INVALID_REQUEST", "params.app_name is required"},
		{"echo", map[string]any{"tool_name": "plain"}, "INVALID_REQUEST", "does not match the topic"},
		{"echo", map[string]any{"preloaded_artifacts": map[string]any{"p": map[string]any{"filename": "../x", "content": ""}}}, "INVALID_REQUEST", "unsafe"},
	}
	for _, c := range cases {
		id := h.send(c.tool, c.params)
		code, msg := errorCode(t, h.reply(id))
		if code != c.code || !strings.Contains(msg, c.msg) {
			t.Errorf("%s %v: got %s %q, want %s containing %q", c.tool, c.params, code, msg, c.code, c.msg)
		}
	}
	// Unparseable and oversized payloads: id "unknown".
	h.sendRaw("echo", "raw1", []byte(`{not json`), nil)
	if got := string(h.reply("raw1")); !strings.HasPrefix(got, `{"jsonrpc":"2.0","id":"unknown","error":{"code":"INVALID_REQUEST"`) {
		t.Errorf("bad JSON: %s", got)
	}
	big := fmt.Sprintf(`{"jsonrpc":"2.0","id":"x","pad":"%s"}`, strings.Repeat("a", h.cfg.MaxPayloadBytes))
	h.sendRaw("echo", "raw2", []byte(big), nil)
	if code, msg := errorCode(t, h.reply("raw2")); code != "INVALID_REQUEST" || !strings.Contains(msg, "exceeds the limit") {
		t.Errorf("oversized: %s %s", code, msg)
	}
	// No replyTo: no reply at all; the worker keeps serving.
	h.sendRaw("echo", "noreply", []byte(`{"jsonrpc":"2.0","id":"noreply","method":"sam_remote_tool/invoke","params":{"task_id":"t","tool_name":"echo","app_name":"a","user_id":"u","session_id":"s"}}`),
		map[string]string{PropReplyTo: ""})
	id := h.send("echo", nil)
	h.reply(id)
	select {
	case r := <-h.replyChan("noreply"):
		t.Errorf("reply without replyTo: %s", r)
	default:
	}
}

func TestToolNotAvailableUnsubscribes(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	// A subscription the manifest does not back (as left by a removal the
	// broker had not applied yet).
	topic := h.cfg.Base() + "/sam_remote_tool/invoke/ghost"
	must(t, h.srv.tr.Subscribe(context.Background(), topic))
	id := h.send("ghost", nil)
	want := `{"jsonrpc":"2.0","id":"` + id + `","error":{"code":"TOOL_NOT_AVAILABLE","message":"Tool 'ghost' is not available on this worker"}}`
	if got := string(h.reply(id)); got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	// Unsubscribed: the next request for it gets nothing.
	id2 := h.send("ghost", nil)
	id3 := h.send("echo", nil)
	h.reply(id3)
	select {
	case r := <-h.replyChan(id2):
		t.Fatalf("still subscribed: %s", r)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestStatusLinesInOrderAndComplete(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	id := h.send("many_lines", map[string]any{"args": map[string]any{"n": 500}})
	h.reply(id)
	got := h.status(id)
	if len(got) != 500 {
		t.Fatalf("%d status lines, want 500", len(got))
	}
	for i, s := range got {
		if s != fmt.Sprintf("line %d", i) {
			t.Fatalf("line %d is %q", i, s)
		}
	}
}

func TestArtifactsInAndOut(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	ctx := context.Background()
	_, err := h.store.Save(ctx, "u1", "s1", "ref.txt", []byte("old"), "text/plain")
	must(t, err)
	_, err = h.store.Save(ctx, "u1", "s1", "ref.txt", []byte("referenced"), "text/plain")
	must(t, err)
	id := h.send("files", map[string]any{
		"preloaded_artifacts": map[string]any{"input_file": map[string]any{
			"filename": "in.txt", "content": base64.StdEncoding.EncodeToString([]byte("inline")), "mime_type": "text/plain"}},
		"artifact_references": map[string]any{"other": map[string]any{"filename": "ref.txt"}},
	})
	want := `{"jsonrpc":"2.0","id":"` + id + `","result":{"tool_result":{"a":"inline","b":"referenced"},"execution_time_ms":0,"timed_out":false,"created_artifacts":[` +
		`{"filename":"data.json","version":0,"mime_type":"application/json","size_bytes":8},` +
		`{"filename":"out.txt","version":0,"mime_type":"text/plain","size_bytes":17},` +
		`{"filename":"z.bin","version":0,"mime_type":"application/octet-stream","size_bytes":2}]}}`
	if got := shape(h.reply(id)); got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	a, err := h.store.Load(ctx, "u1", "s1", "out.txt", nil)
	must(t, err)
	if string(a.Data) != "inline|referenced" {
		t.Fatalf("stored %q", a.Data)
	}
	// A specific version by reference.
	id = h.send("files", map[string]any{
		"artifact_references": map[string]any{"input_file": map[string]any{"filename": "ref.txt", "version": 0},
			"other": map[string]any{"filename": "out.txt"}},
	})
	var r struct {
		Result struct {
			ToolResult       map[string]string `json:"tool_result"`
			CreatedArtifacts []CreatedArtifact `json:"created_artifacts"`
		}
	}
	must(t, json.Unmarshal(h.reply(id), &r))
	if r.Result.ToolResult["a"] != "old" || r.Result.ToolResult["b"] != "inline|referenced" || r.Result.CreatedArtifacts[1].Version != 1 {
		t.Fatalf("second run: %+v", r.Result)
	}
}

func TestOutputSizeCap(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxOutputBytes = 1000 })
	h.start()
	code, msg := errorCode(t, h.reply(h.send("big_output", nil)))
	if code != "ARTIFACT_ERROR" || !strings.Contains(msg, "exceed the limit of 1000 bytes") {
		t.Fatalf("%s %s", code, msg)
	}
}

func TestTimeoutReply(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	// The manifest bounds the request's 100 s to 1 s; + 5 s slack.
	id := h.send("short", map[string]any{"args": map[string]any{"seconds": 60}, "timeout_seconds": 100})
	reply := h.reply(id)
	want := `{"jsonrpc":"2.0","id":"` + id + `","result":{"tool_result":{},"execution_time_ms":0,"timed_out":true,"created_artifacts":[]}}`
	if got := shape(reply); got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
	var r struct {
		Result struct {
			Ms int64 `json:"execution_time_ms"`
		}
	}
	json.Unmarshal(reply, &r)
	if r.Result.Ms < 6000 {
		t.Fatalf("execution_time_ms %d < 6000 (timeout 1 s + 5 s)", r.Result.Ms)
	}
}

func TestCancel(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1 })
	h.start()
	running := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 60}})
	queued := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 60}})
	waitFor(t, "the tool running", func() bool { return len(h.status(running)) > 0 })
	base := h.cfg.Base()
	// The queued one by its task id in the payload, the running one by id.
	must(t, h.client.Publish(context.Background(), transport.Message{Topic: base + "/sam_remote_tool/cancel/whatever",
		Payload: []byte(`{"task_id":"task-` + queued + `"}`)}))
	must(t, h.client.Publish(context.Background(), transport.Message{Topic: base + "/sam_remote_tool/cancel/" + running}))
	for _, id := range []string{running, queued} {
		if code, _ := errorCode(t, h.reply(id)); code != "CANCELLED" {
			t.Errorf("%s: %s", id, code)
		}
	}
	h.reply(h.send("echo", nil))
}

func TestConcurrencyLimitAndQueue(t *testing.T) {
	// One requester may use both slots here (STR_USER_MAX_RUNNING): the
	// global cap is under test.
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 2; c.MaxQueued = 30; c.UserMaxRunning = 2; c.UserMaxQueued = 30 })
	h.start()
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 0.2}}))
	}
	for _, id := range ids {
		var r struct{ Result *json.RawMessage }
		if json.Unmarshal(h.reply(id), &r); r.Result == nil {
			t.Errorf("%s: not a result", id)
		}
	}
	h.srv.metrics.mu.Lock()
	m := h.srv.metrics.runningMax
	h.srv.metrics.mu.Unlock()
	if m != 2 {
		t.Fatalf("max running %d, want 2", m)
	}
}

func TestQueueFull(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1; c.MaxQueued = 1 })
	h.start()
	first := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 1}})
	waitFor(t, "running", func() bool { return len(h.status(first)) > 0 })
	second := h.send("echo", nil)
	third := h.send("echo", nil)
	if code, msg := errorCode(t, h.reply(third)); code != "RESOURCE_EXHAUSTED" || !strings.Contains(msg, "queue is full") {
		t.Fatalf("%s %s", code, msg)
	}
	h.reply(first)
	h.reply(second)
}

func TestHotReload(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	mpath := h.cfg.ManifestPath
	// Add a tool and drop "plain".
	updated := strings.Replace(testManifest, "  plain: {module: testtools, function: plain}\n", "  echo2: {module: testtools, function: echo}\n", 1)
	must(t, os.WriteFile(mpath+".tmp", []byte(updated), 0o644))
	must(t, os.Rename(mpath+".tmp", mpath))
	select {
	case d := <-h.other:
		if d.Topic != h.cfg.Base()+"/sam_remote_tool/removed/plain" {
			t.Fatalf("unexpected %s", d.Topic)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no removed/plain within 2 s")
	}
	if _, ok := shapeResult(h.reply(h.send("echo2", nil))); !ok {
		t.Fatal("added tool not served")
	}
	// "plain" is no longer subscribed: no reply at all.
	gone := h.send("plain", nil)
	h.reply(h.send("echo", nil))
	select {
	case r := <-h.replyChan(gone):
		t.Fatalf("removed tool answered: %s", r)
	case <-time.After(200 * time.Millisecond):
	}
}

func shapeResult(b []byte) (map[string]any, bool) {
	var r struct{ Result map[string]any }
	if json.Unmarshal(b, &r) != nil || r.Result == nil {
		return nil, false
	}
	return r.Result, true
}

func TestSigningAndRateLimit(t *testing.T) {
	// 0.001 a minute: a token back every 16 h, so no refill within the
	// test however loaded the machine is (60 a minute failed under load).
	h := newHarness(t, func(c *Config) { c.SigningSecret = "s3cret"; c.RatePerMinute = 0.001; c.RateBurst = 2 })
	h.start()
	payload := func(id string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":"` + id + `","method":"sam_remote_tool/invoke","params":{"task_id":"t-` + id + `","tool_name":"echo","app_name":"a","user_id":"u1","session_id":"s"}}`)
	}
	// Unsigned and forged: refused and counted, not answered (issue 16 §2).
	h.sendRaw("echo", "unsigned", payload("unsigned"), nil)
	h.sendSigned("echo", "forged", payload("forged"), "wrong", time.Now(), nil)
	waitFor(t, "both refusals counted", func() bool {
		return metricValue(t, h, `str_worker_errors_total{code="AUTHENTICATION_FAILED"}`) == 2
	})
	for i, want := range []bool{true, true, false} {
		id := fmt.Sprintf("signed%d", i)
		h.sendSigned("echo", id, payload(id), "s3cret", time.Now(), nil)
		reply := h.reply(id)
		if _, ok := shapeResult(reply); ok != want {
			t.Fatalf("%s: %s", id, reply)
		}
		if !want {
			if code, _ := errorCode(t, reply); code != "RESOURCE_EXHAUSTED" {
				t.Fatalf("rate limit: %s", code)
			}
		}
	}
}

func TestShutdownGraceAndHealth(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1; c.ShutdownGrace = 300 * time.Millisecond })
	// A stale work dir from a "previous crash" is removed at startup: a
	// generated name, its marker naming it.
	stale := filepath.Join(h.cfg.WorkDir, callDirPrefix+"0123456789abcdef")
	must(t, os.MkdirAll(filepath.Join(stale, "output"), 0o755))
	must(t, os.WriteFile(filepath.Join(stale, workdir.Marker), []byte(filepath.Base(stale)), 0o444))
	// Anything else under the base is the operator's and is kept: no
	// marker, a marker under a name the worker never generates (a task
	// id's), a generated name whose marker names another dir (a copy).
	var foreign []string
	for name, marker := range map[string]string{"operator-notes": "", "task-1": "task-1",
		callDirPrefix + "fedcba9876543210": callDirPrefix + "0123456789abcdef", warmDirPrefix + "00000000000000ff": ""} {
		p := filepath.Join(h.cfg.WorkDir, name)
		must(t, os.MkdirAll(p, 0o755))
		if marker != "" {
			must(t, os.WriteFile(filepath.Join(p, workdir.Marker), []byte(marker), 0o444))
		}
		foreign = append(foreign, p)
	}
	h.start()
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale work dir still there: %v", err)
	}
	for _, p := range foreign {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("a directory that is not a str work dir was removed: %v", err)
		}
	}
	hs := httptest.NewServer(h.srv.Handler())
	defer hs.Close()
	get := func(path string) (int, string) {
		resp, err := hs.Client().Get(hs.URL + path)
		must(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get("/readyz"); code != 200 || body != `{"ok":true,"broker":"connected"}` {
		t.Fatalf("readyz %d %s", code, body)
	}
	long := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 60}})
	queued := h.send("echo", nil)
	waitFor(t, "running", func() bool { return len(h.status(long)) > 0 })
	h.cancel()
	if code, _ := errorCode(t, h.reply(queued)); code != "RESOURCE_EXHAUSTED" {
		t.Errorf("queued at shutdown: %s", code)
	}
	if code, msg := errorCode(t, h.reply(long)); code != "CANCELLED" || !strings.Contains(msg, "shutting down") {
		t.Errorf("running after grace: %s %s", code, msg)
	}
	must(t, <-h.done)
	h.cancel = nil
	if code, _ := get("/readyz"); code != 503 {
		t.Fatalf("readyz after stop: %d", code)
	}
	if _, body := get("/metrics"); !strings.Contains(body, `str_worker_invocations_total{outcome="CANCELLED",tool="sleeper"} 1`) ||
		!strings.Contains(body, `str_worker_errors_total{code="RESOURCE_EXHAUSTED"} 1`) {
		t.Fatalf("metrics:\n%s", body)
	}
}

// stallingUnsubscribe blocks Unsubscribe until release is closed, as a
// broker that takes its time to answer.
type stallingUnsubscribe struct {
	transport.Transport
	entered chan struct{}
	release chan struct{}
}

func (s *stallingUnsubscribe) Unsubscribe(ctx context.Context, topic string) error {
	if strings.HasSuffix(topic, "/ghost") {
		close(s.entered) // once: the ghost's subscription is dropped once
		<-s.release
	}
	return s.Transport.Unsubscribe(ctx, topic)
}

// Issue 18 §4: the stale subscription of a tool that is not available is
// dropped off the receive loop. While the broker holds that Unsubscribe,
// a call to another tool is served; the stale tool's answer follows the
// Unsubscribe (a caller retrying on it cannot reach this worker again).
func TestStaleUnsubscribeDoesNotStallDispatch(t *testing.T) {
	st := &stallingUnsubscribe{entered: make(chan struct{}), release: make(chan struct{})}
	h := newExecHarness(t, nil, func(o *Options) {
		st.Transport = o.Transport
		o.Transport = st
	})
	h.start()
	topic := h.cfg.Base() + "/sam_remote_tool/invoke/ghost"
	must(t, h.srv.tr.Subscribe(context.Background(), topic))
	ghost := h.send("ghost", nil)
	<-st.entered
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Fatal("echo: no result while the stale unsubscribe was pending")
	}
	select {
	case r := <-h.replyChan(ghost):
		t.Fatalf("the ghost call was answered before its Unsubscribe returned: %s", r)
	default:
	}
	close(st.release)
	if got := string(h.reply(ghost)); !strings.Contains(got, `"code":"TOOL_NOT_AVAILABLE"`) {
		t.Fatalf("ghost: %s", got)
	}
}
