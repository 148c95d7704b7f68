package worker

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/workdir"
	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// Tools of the execution tests (beside the harness's testtools).
const execTools = `
import os, sys

def stderr_crash(ctx):
    sys.stderr.write("FIRST-LINE-OF-STDERR\n")
    sys.stderr.write("x" * 20000 + "\n")
    sys.stderr.write("Traceback: the very last words\n")
    sys.stderr.flush()
    os._exit(3)

def raw_result(ctx, hexdata="", size=0, depth=0):
    # Writes result.json itself (as a hostile tool can) and exits at once.
    if size:
        head = '{"result": {"x": "'
        data = (head + "a" * (int(size) - len(head) - 3) + '"}}').encode()
    elif depth:
        data = ('{"result": ' + '{"a":' * int(depth) + '1' + '}' * int(depth) + '}').encode()
    else:
        data = bytes.fromhex(hexdata)
    with open(".str/result.json", "wb") as f:
        f.write(data)
    os._exit(0)

def odd_names(ctx):
    out = os.path.dirname(ctx.save_artifact("good.txt", b"ok"))
    for name in [b"tab\there.txt", b"new\nline.txt", b"bad\xffutf8.txt", b"del\x7f.txt"]:
        with open(os.path.join(out.encode(), name), "wb") as f:
            f.write(b"data")
    os.mkdir(os.path.join(out, "dir\twith tab"))
    return {"ok": True}

def echo_input(ctx, f):
    return {"f": ctx.load_artifact_text("f")}

def same_file(ctx, files, primary):
    params = ["files[%d]" % i for i in range(len(files))] + ["primary"]
    return {"text": {p: ctx.load_artifact_text(p) for p in params},
            "meta": {p: ctx.get_artifact_metadata(p) for p in params},
            "input": sorted(os.listdir("input"))}
`

const execManifest = `  stderr_crash: {module: exectools, function: stderr_crash}
  raw_result: {module: exectools, function: raw_result}
  odd_names: {module: exectools, function: odd_names}
  echo_input: {module: exectools, function: echo_input}
  same_file: {module: exectools, function: same_file}
`

// newExecHarness is the package's harness with the execution tests' tools,
// its server rebuilt with what opts sets (transport, sandboxes, logger).
func newExecHarness(t *testing.T, mod func(*Config), opts func(*Options)) *harness {
	t.Helper()
	h := newHarness(t, mod)
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "exectools.py"), []byte(execTools), 0o644))
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, execManifest...), 0o644))
	o := Options{Config: h.cfg, Transport: h.bus.Client("worker-exec", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))}
	if opts != nil {
		opts(&o)
	}
	h.srv, err = New(o)
	must(t, err)
	return h
}

// logBuffer is a concurrency-safe log sink.
type logBuffer struct{ syncbuf.Buffer }

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// metricsText is the server's /metrics.
func metricsText(t *testing.T, h *harness) string {
	t.Helper()
	hs := httptest.NewServer(h.srv.Handler())
	defer hs.Close()
	resp, err := hs.Client().Get(hs.URL + "/metrics")
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// ---- item 1: the sandbox's own owner; a created sandbox is always released

// trackingSandboxes wraps launchertest.Sandboxes: it counts what happens
// to every created sandbox. (Who owns the work dir is the launcher's:
// launcher's TestWorkDirLayout.)
type trackingSandboxes struct {
	launchertest.Sandboxes
	startErr error

	mu                       sync.Mutex
	created, started, killed int
}

func (ts *trackingSandboxes) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	c, err := ts.Sandboxes.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	ts.mu.Lock()
	ts.created++
	ts.mu.Unlock()
	return &trackingCreated{Box: c, ts: ts}, nil
}

type trackingCreated struct {
	provider.Box
	ts   *trackingSandboxes
	done bool
}

func (c *trackingCreated) Kill() error {
	c.ts.mu.Lock()
	if !c.done {
		c.done = true
		c.ts.killed++
	}
	c.ts.mu.Unlock()
	return c.Box.Kill()
}

func (c *trackingCreated) Start() error {
	c.ts.mu.Lock()
	c.done = true
	c.ts.started++
	startErr := c.ts.startErr
	c.ts.mu.Unlock()
	if startErr != nil {
		return startErr
	}
	return c.Box.Start()
}

func (ts *trackingSandboxes) counts() (created, started, killed int) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.created, ts.started, ts.killed
}

// TestCreatedSandboxAlwaysReleased: every error between Create and Start
// (an input that cannot be loaded, a failing Start) leaves no sandbox
// behind: each one created is started or killed.
func TestCreatedSandboxAlwaysReleased(t *testing.T) {
	ts := &trackingSandboxes{}
	h := newExecHarness(t, nil, func(o *Options) { o.Sandboxes = ts })
	h.start()
	base, _, _ := ts.counts() // the start-up probe's sandbox
	// 1. an input artifact that does not exist: ARTIFACT_ERROR after Create.
	code, _ := errorCode(t, h.reply(h.send("echo_input", map[string]any{
		"artifact_references": map[string]any{"f": map[string]any{"filename": "nope.txt"}}})))
	if code != "ARTIFACT_ERROR" {
		t.Fatalf("missing input: %s", code)
	}
	created, started, killed := ts.counts()
	created, started = created-base, started-base
	if created != 1 || started != 0 || killed != 1 {
		t.Fatalf("after a failed input: created %d, started %d, killed %d; want 1, 0, 1", created, started, killed)
	}
	// 2. Start fails: SANDBOX_FAILED naming the step, nothing left.
	ts.mu.Lock()
	ts.startErr = errors.New("clone failed")
	ts.mu.Unlock()
	code, msg := errorCode(t, h.reply(h.send("echo", nil)))
	if code != "SANDBOX_FAILED" || !strings.Contains(msg, `step "start"`) || !strings.Contains(msg, "clone failed") {
		t.Fatalf("failed start: %s %s", code, msg)
	}
	// 3. a normal run.
	ts.mu.Lock()
	ts.startErr = nil
	ts.mu.Unlock()
	h.reply(h.send("echo", nil))
	created, started, killed = ts.counts()
	created, started = created-base, started-base
	if created != 3 || started+killed != created {
		t.Fatalf("created %d, started %d, killed before start %d: a sandbox was neither started nor released", created, started, killed)
	}
}

// ---- item 2: modes set explicitly, never through the umask

// TestWorkUnderUmask0027 runs the worker in a child process whose umask
// is 0027 (the systemd unit's UMask=) with the tool as another uid than
// the worker's, as the launcher does: the runner dir, the work dir,
// input files and runner_args.json must still be readable by the tool.
// The umask is changed in the child only.
func TestWorkUnderUmask0027(t *testing.T) {
	if os.Getenv("STR_TEST_UMASK_CHILD") == "1" {
		umaskChild(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("running the tool as another uid needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkUnderUmask0027$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "STR_TEST_UMASK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestWorkUnderUmask0027") {
		t.Fatalf("child under umask 0027: %v\n%s", err, out)
	}
}

func umaskChild(t *testing.T) {
	const nobody = 65534
	h := newExecHarness(t, nil, func(o *Options) { o.Sandboxes = launchertest.Sandboxes{UID: nobody, GID: nobody} })
	// The test's own temp dirs are 0700: open them (and the tools) for the
	// tool's uid, as an operator's tools dir is.
	for p := h.dir; p != filepath.Dir(p) && strings.HasPrefix(p, os.TempDir()) && p != os.TempDir(); p = filepath.Dir(p) {
		must(t, os.Chmod(p, 0o755))
	}
	syscall.Umask(0o027) // this child process only
	h.start()
	reply := h.reply(h.send("echo_input", map[string]any{"preloaded_artifacts": map[string]any{"f": map[string]any{
		"filename": "in.txt", "content": base64.StdEncoding.EncodeToString([]byte("readable"))}}}))
	if r, ok := shapeResult(reply); !ok || fmt.Sprint(r["tool_result"]) != "map[f:readable]" {
		t.Fatalf("under umask 0027: %s", reply)
	}
	for path, want := range map[string]os.FileMode{h.cfg.RunnerDir: 0o755, h.cfg.SiteDir: 0o755, h.cfg.WorkDir: 0o711} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm()&want != want {
			t.Errorf("%s: mode %v, want at least %v", path, fi.Mode().Perm(), want)
		}
	}
	// The pieces, one by one: the launcher's work dir, the worker's files.
	sb, err := launchertest.Sandboxes{}.Create(context.Background(), SandboxSpec{Profile: "standard", Argv: []string{"/bin/true"},
		WorkDir: workdir.Spec{Base: h.dir, Prefix: "pieces-"}})
	must(t, err)
	defer sb.Release()
	wd := sb.WorkDir()
	must(t, writeNewFileAt(unix.AT_FDCWD, filepath.Join(wd.Input, "f"), filepath.Join(wd.Input, "f"), nil, modeInputFile))
	must(t, runner.WriteArgs(wd.Args, &runner.Args{Module: "m", Function: "f", ResultFile: "r"}))
	for p, want := range map[string]os.FileMode{wd.Path: 0o700, wd.Input: 0o755, wd.Output: 0o700, wd.Runner: 0o700,
		wd.StatusPipe: 0o600, filepath.Join(wd.Input, "f"): modeInputFile, wd.Args: runner.ArgsMode,
		filepath.Join(wd.Path, workdir.Marker): 0o444} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v %v, want %v", p, fi.Mode().Perm(), err, want)
		}
	}
}

// ---- item 3: the sandbox's stderr

// TestStderrTailInErrorAndLog: a crash before result.json reports the end
// of stderr in the reply and in the log, not just the exit code. The
// reply carries at most stderrAgentBytes of it (the tool controls that
// text), after a marker saying it is the tool's; the log keeps 8 KiB.
func TestStderrTailInErrorAndLog(t *testing.T) {
	var logs logBuffer
	h := newExecHarness(t, nil, func(o *Options) { o.Logger = logs.logger() })
	h.start()
	code, msg := errorCode(t, h.reply(h.send("stderr_crash", nil)))
	if code != "SANDBOX_FAILED" || !strings.Contains(msg, "exit code 3") {
		t.Fatalf("%s %.200s", code, msg)
	}
	marker := fmt.Sprintf("\n--- tool stderr (last %d bytes) ---\n", stderrAgentBytes)
	before, tail, ok := strings.Cut(msg, marker)
	if !ok || !strings.HasSuffix(tail, "Traceback: the very last words") || strings.Contains(msg, "FIRST-LINE-OF-STDERR") {
		t.Fatalf("the message does not end with the marked stderr tail: …%q", msg[max(0, len(msg)-400):])
	}
	if len(tail) > stderrAgentBytes+len("…") || strings.Contains(before, "xxxx") {
		t.Fatalf("stderr in the reply: %d bytes after the marker, %d before it; want at most %d", len(tail), len(before), stderrAgentBytes)
	}
	if l := logs.String(); !strings.Contains(l, "Traceback: the very last words") || !strings.Contains(l, strings.Repeat("x", 4000)) {
		t.Fatal("the log does not keep the longer stderr tail")
	}
}

func TestTailBuffer(t *testing.T) {
	b := newTailBuffer(8)
	if b.String() != "" {
		t.Fatal("empty buffer")
	}
	b.Write([]byte("abc"))
	if b.String() != "abc" {
		t.Fatalf("%q", b.String())
	}
	b.Write([]byte("defghij"))
	if got := b.String(); got != "…cdefghij" {
		t.Fatalf("%q", got)
	}
	b.Write([]byte(strings.Repeat("z", 100) + "é12345"))
	if got := b.String(); got != "…zé12345" {
		t.Fatalf("%q", got)
	}
	b.Write([]byte("abé1234567")) // the kept 8 bytes start inside "é"
	if got := b.String(); got != "…1234567" {
		t.Fatalf("%q", got)
	}
	b.Write([]byte("\xff\xfe12345"))
	if got := b.String(); !utf8.ValidString(got) {
		t.Fatalf("invalid UTF-8: %q", got)
	}
}

// ---- item 4: replies that cannot be published

// flakyTransport fails reply publishes (topics containing /response/):
// failFirst of them with a transport error, or every one with refuse.
type flakyTransport struct {
	transport.Transport
	mu        sync.Mutex
	failFirst int
	always    bool
	refuse    bool
	hang      bool // wait for ctx like a client waiting for its broker
	attempts  int
}

func (f *flakyTransport) Publish(ctx context.Context, m transport.Message) error {
	if strings.Contains(m.Topic, "/response/") {
		f.mu.Lock()
		f.attempts++
		n, always, refuse := f.attempts, f.always, f.refuse
		f.mu.Unlock()
		if refuse && n == 1 {
			// As the dev broker's transport classifies its broker's
			// ERROR to an over-long PUBLISH line.
			return transport.Refused("devbroker: publish", m.Topic, errors.New("broker refused PUBLISH: status ERROR, INVALID_COMMAND: request line longer than 16777216 bytes"))
		}
		if f.hang {
			<-ctx.Done()
			return fmt.Errorf("waiting for the broker connection: %w", ctx.Err())
		}
		if always || n <= f.failFirst {
			return errors.New("broker unreachable")
		}
	}
	return f.Transport.Publish(ctx, m)
}

func TestReplyRetriedUntilPublished(t *testing.T) {
	var ft *flakyTransport
	h := newExecHarness(t, nil, func(o *Options) {
		ft = &flakyTransport{Transport: o.Transport, failFirst: 3}
		o.Transport = ft
	})
	h.start()
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Fatal("no result")
	}
	waitMetric(t, h, `str_worker_invocations_total{outcome="success",tool="echo"} 1`)
}

func TestReplyRefusedIsAFailure(t *testing.T) {
	var logs logBuffer
	h := newExecHarness(t, nil, func(o *Options) {
		o.Transport = &flakyTransport{Transport: o.Transport, refuse: true}
		o.Logger = logs.logger()
	})
	h.start()
	// The refused success reply is replaced by an error reply.
	code, msg := errorCode(t, h.reply(h.send("echo", nil)))
	if code != "INTERNAL_ERROR" || !strings.Contains(msg, "could not deliver the reply") {
		t.Fatalf("%s %s", code, msg)
	}
	if m := waitMetric(t, h, `str_worker_invocations_total{outcome="reply_failed",tool="echo"} 1`); strings.Contains(m, `outcome="success"`) {
		t.Fatalf("metrics:\n%s", grepLines(m, "invocations"))
	}
	if !strings.Contains(logs.String(), "publishing the reply failed") {
		t.Fatal("not logged")
	}
}

func TestReplyNeverPublishedIsAFailure(t *testing.T) {
	var logs logBuffer
	var ft *flakyTransport
	h := newExecHarness(t, nil, func(o *Options) {
		ft = &flakyTransport{Transport: o.Transport, always: true}
		o.Transport = ft
		o.Logger = logs.logger()
	})
	saved := replyRetryWindow
	replyRetryWindow = 0 // the task's own deadline only
	t.Cleanup(func() { replyRetryWindow = saved })
	h.start()
	// Retried until the task's deadline (0.1 s + 5 s of slack).
	h.send("echo", map[string]any{"timeout_seconds": 0.1})
	waitFor(t, "the reply given up", func() bool { return strings.Contains(logs.String(), "publishing the reply failed\"") })
	ft.mu.Lock()
	attempts := ft.attempts
	ft.mu.Unlock()
	if attempts < 3 {
		t.Fatalf("%d attempts: the reply was not retried", attempts)
	}
	if m := waitMetric(t, h, `str_worker_invocations_total{outcome="reply_failed",tool="echo"} 1`); strings.Contains(m, `outcome="success"`) {
		t.Fatalf("metrics:\n%s", grepLines(m, "invocations"))
	}
}

// TestShutdownReplyWaitIsBounded: a reply waiting for a broker that is
// gone holds the shutdown for the grace period and replyShutdownWindow,
// not for the task's deadline; it is then reported lost, never a success.
// (CI saw a worker hang at SIGTERM with the dev broker stopped between its
// forwarding of a reply and its acknowledgement.)
func TestShutdownReplyWaitIsBounded(t *testing.T) {
	var logs logBuffer
	var ft *flakyTransport
	h := newExecHarness(t, func(c *Config) { c.ShutdownGrace = 100 * time.Millisecond }, func(o *Options) {
		ft = &flakyTransport{Transport: o.Transport, hang: true}
		o.Transport = ft
		o.Logger = logs.logger()
	})
	saved := replyShutdownWindow
	replyShutdownWindow = 100 * time.Millisecond
	t.Cleanup(func() { replyShutdownWindow = saved })
	h.start()
	// A task deadline of an hour: only the shutdown can end the wait.
	h.send("echo", map[string]any{"timeout_seconds": 3600})
	waitFor(t, "the reply waiting for the broker", func() bool {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		return ft.attempts > 0
	})
	h.stop() // fails the test when Run does not return
	if !strings.Contains(logs.String(), "worker stopped: reply not published") {
		t.Fatalf("the lost reply is not reported:\n%s", logs.String())
	}
	if m := metricsText(t, h); !strings.Contains(m, `str_worker_invocations_total{outcome="reply_failed",tool="echo"} 1`) ||
		strings.Contains(m, `outcome="success"`) {
		t.Fatalf("metrics:\n%s", grepLines(m, "invocations"))
	}
}

// waitMetric waits until /metrics has the line (the reply is published
// before the invocation is counted) and returns the metrics.
func waitMetric(t *testing.T, h *harness, line string) string {
	t.Helper()
	var m string
	waitFor(t, line, func() bool { m = metricsText(t, h); return strings.Contains(m, line) })
	return m
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestReplyCapLeavesRoomForTheEnvelope: a result that fits the old cap
// (16 MiB of result.json) but not a broker message once wrapped is a
// TOOL_ERROR, and the largest reply the worker sends fits the dev
// broker's line together with its PUBLISH envelope; a larger one the
// dev broker's transport reports as a refusal (not retried).
func TestReplyCapLeavesRoomForTheEnvelope(t *testing.T) {
	h := newExecHarness(t, nil, nil)
	h.start()
	for _, size := range []int{16_777_100, h.srv.maxReplyBytes()} {
		code, msg := errorCode(t, h.reply(h.send("raw_result", map[string]any{"args": map[string]any{"size": size}})))
		if code != "TOOL_ERROR" || !strings.Contains(msg, "too large") {
			t.Fatalf("result.json of %d bytes: %s %.300s", size, code, msg)
		}
	}
	// A maximal reply through a real dev broker, with a long topic.
	srv := broker.NewServer(broker.Options{Anonymous: true, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	must(t, srv.Listen("127.0.0.1:0"))
	defer srv.Close()
	c, err := devbroker.NewClient(devbroker.ClientOptions{Host: "127.0.0.1", Port: srv.Addr().(*net.TCPAddr).Port, ClientID: "cap",
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	must(t, err)
	defer c.Close()
	must(t, c.Connect(context.Background(), nil))
	maxReply := c.MaxMessageBytes() - publishEnvelopeRoom
	payload := []byte(`{"x":"` + strings.Repeat("a", maxReply-8) + `"}`)
	topic := "ns/a2a/v1/sam_remote_tool/response/" + strings.Repeat("agent", 50) + "/" + strings.Repeat("c", 36)
	props := map[string]string{PropTimestamp: "1760000000000"}
	if err := c.Publish(context.Background(), transport.Message{Topic: topic, Payload: payload, UserProperties: props}); err != nil {
		t.Fatalf("a reply of maxReplyBytes (%d) refused: %v", maxReply, err)
	}
	// And the broker's refusal is classified as one by the transport.
	payload = []byte(`{"x":"` + strings.Repeat("a", c.MaxMessageBytes()) + `"}`)
	err = c.Publish(context.Background(), transport.Message{Topic: topic, Payload: payload, UserProperties: props})
	if !errors.Is(err, transport.ErrRefused) {
		t.Fatalf("oversized publish: %v, want a refusal (transport.ErrRefused)", err)
	}
}

// ---- item 5: result content

func TestResultInvalidUTF8Replaced(t *testing.T) {
	var logs logBuffer
	h := newExecHarness(t, nil, func(o *Options) { o.Logger = logs.logger() })
	h.start()
	// Raw invalid bytes (written with surrogateescape) and an escaped
	// unpaired surrogate.
	text := "{\"result\": {\"s\": \"a\xffb\", \"e\": \"x\\ud800y\", \"ok\": \"\\ud83d\\ude00\"}}"
	reply := h.reply(h.send("raw_result", map[string]any{"args": map[string]any{"hexdata": hex.EncodeToString([]byte(text))}}))
	if !utf8.Valid(reply) {
		t.Fatalf("reply is not valid UTF-8: %q", reply)
	}
	if !strings.Contains(string(reply), `"tool_result":{"s":"a`+"\uFFFD"+`b","e":"x\ufffdy","ok":"\ud83d\ude00"}`) {
		t.Fatalf("reply %s", reply)
	}
	if !strings.Contains(logs.String(), "invalid UTF-8") {
		t.Fatal("the replacement is not logged")
	}
}

func TestResultNestingCapped(t *testing.T) {
	h := newExecHarness(t, nil, nil)
	h.start()
	for _, depth := range []int{MaxResultDepth, 9000, 20000} {
		reply := h.reply(h.send("raw_result", map[string]any{"args": map[string]any{"depth": depth}}))
		if depth == MaxResultDepth {
			if _, ok := shapeResult(reply); !ok {
				t.Fatalf("depth %d refused: %.300s", depth, reply)
			}
			continue
		}
		code, msg := errorCode(t, reply)
		if code != "TOOL_ERROR" || !strings.Contains(msg, "512") {
			t.Fatalf("depth %d: %s %.300s", depth, code, msg)
		}
	}
}

func TestCleanToolResult(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	cases := []struct {
		in, out string
		fixes   int
		err     bool
	}{
		{`{"a":"plain"}`, `{"a":"plain"}`, 0, false},
		{"{\"a\":\"\xff\"}", "{\"a\":\"\uFFFD\"}", 1, false},
		{"{\"a\":\"\xed\xa0\x80\"}", "{\"a\":\"\uFFFD\uFFFD\uFFFD\"}", 3, false}, // a surrogate encoded in UTF-8
		{`{"a":"\udc00"}`, `{"a":"\ufffd"}`, 1, false},
		{`{"a":"\ud800\u0041"}`, `{"a":"\ufffd\u0041"}`, 1, false},
		{`{"a":"\ud800"}`, `{"a":"\ufffd"}`, 1, false},
		{`{"a":"\\ud800"}`, `{"a":"\\ud800"}`, 0, false}, // an escaped backslash, not an escape
		{`{"a":"\ud83d\ude00"}`, `{"a":"\ud83d\ude00"}`, 0, false},
		{`{"[":"{{{{"}`, `{"[":"{{{{"}`, 0, false}, // brackets in strings do not nest
		{deep(MaxResultDepth), deep(MaxResultDepth), 0, false},
		{deep(MaxResultDepth + 1), "", 0, true},
	}
	for _, c := range cases {
		out, fixes, err := CleanToolResult([]byte(c.in))
		if c.err {
			if !errors.Is(err, ErrResultTooDeep) {
				t.Errorf("%.40q: err %v, want ErrResultTooDeep", c.in, err)
			}
			continue
		}
		if err != nil || string(out) != c.out || fixes != c.fixes {
			t.Errorf("%q: %q %d %v, want %q %d", c.in, out, fixes, err, c.out, c.fixes)
		}
		if !json.Valid(out) {
			t.Errorf("%q: output not valid JSON", c.in)
		}
	}
}

// ---- item 6c: one filename rule; skipped outputs reported

func TestSkippedOutputsReported(t *testing.T) {
	h := newExecHarness(t, nil, nil)
	h.start()
	reply := h.reply(h.send("odd_names", nil))
	var r struct {
		Result struct {
			Created []CreatedArtifact `json:"created_artifacts"`
			Skipped []SkippedOutput   `json:"skipped_outputs"`
		}
	}
	must(t, json.Unmarshal(reply, &r))
	if len(r.Result.Created) != 1 || r.Result.Created[0].Filename != "good.txt" {
		t.Fatalf("created %+v", r.Result.Created)
	}
	got := map[string]string{}
	for _, s := range r.Result.Skipped {
		got[s.Filename] = s.Reason
	}
	want := map[string]string{"tab\there.txt": "control character", "new\nline.txt": "control character",
		"bad\uFFFDutf8.txt": "not valid UTF-8", "del\x7f.txt": "control character"}
	for name, reason := range want {
		if !strings.Contains(got[name], reason) {
			t.Errorf("skipped %q: reason %q, want %q (all: %q)", name, got[name], reason, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("skipped %q: the directory is not an output and must not be listed", got)
	}
	if vs, _ := h.store.ListVersions(context.Background(), "u1", "s1", "tab\there.txt"); len(vs) != 0 {
		t.Fatal("a name with a tab was stored")
	}
	// An ordinary reply carries no skipped_outputs member (byte-compatible).
	if reply := h.reply(h.send("echo", nil)); strings.Contains(string(reply), "skipped_outputs") {
		t.Fatalf("reply %s", reply)
	}
}

// TestOneFilenameRule: the request parser, the worker's output check and
// the store agree on every name.
func TestOneFilenameRule(t *testing.T) {
	store := artifacts.NewMemory("ns")
	for _, name := range []string{"ok.txt", "a..b", "user:x.txt", "tab\t.txt", "nl\n.txt", "bad\xff", "../x", "/abs",
		"a/b", `a\b`, "", ".", "..", "user:", "del\x7f", "c1\u0085", "full\uff0fwidth", strings.Repeat("n", 256), "ﬁle"} {
		ruleErr := artifacts.CheckFilename(name)
		parserOK := UnsafeFilename(name) == ""
		_, saveErr := store.Save(context.Background(), "u", "s", name, []byte("x"), "")
		if parserOK != (ruleErr == nil) || (saveErr == nil) != (ruleErr == nil) {
			t.Errorf("%q: rule %v, request parser ok %v, store %v", name, ruleErr, parserOK, saveErr)
		}
	}
}

// referenceArtifactCall is an invoke shaped as the reference agent's
// sandboxed executor builds it: each artifact argument becomes its
// filename in args and an artifact_references entry, a list one entry
// per element ("files[0]", "files[1]", ...), version as the agent holds
// it (null: the latest).
func referenceArtifactCall(files []map[string]any, primary map[string]any) map[string]any {
	refs := map[string]any{"primary": primary}
	var names []any
	for i, f := range files {
		refs[fmt.Sprintf("files[%d]", i)] = f
		names = append(names, f["filename"])
	}
	return map[string]any{
		"args":                map[string]any{"files": names, "primary": primary["filename"]},
		"artifact_references": refs,
		"sandbox_profile":     "standard", "timeout_seconds": 300,
	}
}

// TestSameArtifactTwice: the reference agent passes one artifact in a
// list and alone (two parameters naming one file). The same bytes are
// written once, both parameters point at them and each keeps its own
// metadata (as the reference does). Different bytes under one name (two
// versions) are INVALID_REQUEST naming both parameters: the reference
// would write both to input/<filename> and hand one parameter the other's
// bytes. The worker keeps serving.
func TestSameArtifactTwice(t *testing.T) {
	h := newExecHarness(t, nil, nil)
	h.start()
	ctx := context.Background()
	_, err := h.store.Save(ctx, "u1", "s1", "data.csv", []byte("a,b\n1,2\n"), "text/csv")
	must(t, err)
	_, err = h.store.Save(ctx, "u1", "s1", "other.csv", []byte("x\n"), "text/csv")
	must(t, err)
	var out struct {
		Result struct {
			ToolResult struct {
				Text  map[string]string              `json:"text"`
				Meta  map[string]runner.ArtifactMeta `json:"meta"`
				Input []string                       `json:"input"`
			} `json:"tool_result"`
		} `json:"result"`
	}

	// 1. the same artifact in the list (version 0) and alone (latest: 0).
	call := referenceArtifactCall([]map[string]any{{"filename": "data.csv", "version": 0}, {"filename": "other.csv", "version": nil}},
		map[string]any{"filename": "data.csv", "version": nil})
	reply := h.reply(h.send("same_file", call))
	must(t, json.Unmarshal(reply, &out))
	r := out.Result.ToolResult
	if r.Text["files[0]"] != "a,b\n1,2\n" || r.Text["primary"] != "a,b\n1,2\n" || r.Text["files[1]"] != "x\n" {
		t.Fatalf("contents %q: %s", r.Text, reply)
	}
	if !slices.Equal(r.Input, []string{"data.csv", "other.csv"}) {
		t.Errorf("input/ holds %v, want data.csv written once and other.csv", r.Input)
	}
	if a, b := r.Meta["files[0]"], r.Meta["primary"]; a.LocalPath == "" || a.LocalPath != b.LocalPath || a.Filename != "data.csv" || b.Filename != "data.csv" || a.MimeType != "text/csv" {
		t.Errorf("metadata %+v and %+v: want one local path, each its own filename and mime type", a, b)
	}

	// 2. preloaded twice with the same bytes: accepted too.
	content := base64.StdEncoding.EncodeToString([]byte("inline"))
	pre := map[string]any{"filename": "in.txt", "content": content, "mime_type": "text/plain"}
	reply = h.reply(h.send("same_file", map[string]any{
		"args":                map[string]any{"files": []any{"in.txt"}, "primary": "in.txt"},
		"preloaded_artifacts": map[string]any{"files[0]": pre, "primary": pre},
	}))
	must(t, json.Unmarshal(reply, &out))
	if r := out.Result.ToolResult; r.Text["files[0]"] != "inline" || r.Text["primary"] != "inline" || !slices.Equal(r.Input, []string{"in.txt"}) {
		t.Errorf("preloaded twice: %s", reply)
	}

	// 3. two versions of one file with different bytes: refused, by name.
	_, err = h.store.Save(ctx, "u1", "s1", "data.csv", []byte("a,b\n3,4\n5,6\n"), "text/csv")
	must(t, err)
	call = referenceArtifactCall([]map[string]any{{"filename": "data.csv", "version": 0}},
		map[string]any{"filename": "data.csv", "version": nil})
	code, msg := errorCode(t, h.reply(h.send("same_file", call)))
	for _, want := range []string{`"files[0]" (artifact "data.csv" version 0)`, `"primary" (artifact "data.csv" version 1)`, "input/data.csv", "contents differ (8 and 12 bytes)"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q: %s", want, msg)
		}
	}
	if code != string(CodeInvalidRequest) {
		t.Errorf("code %s, want INVALID_REQUEST: %s", code, msg)
	}
	// 4. still serving: the same version twice again.
	call = referenceArtifactCall([]map[string]any{{"filename": "data.csv", "version": 1}},
		map[string]any{"filename": "data.csv", "version": nil})
	reply = h.reply(h.send("same_file", call))
	must(t, json.Unmarshal(reply, &out))
	if r := out.Result.ToolResult; r.Text["files[0]"] != "a,b\n3,4\n5,6\n" || r.Text["primary"] != "a,b\n3,4\n5,6\n" {
		t.Errorf("after the refusal: %s", reply)
	}
}
