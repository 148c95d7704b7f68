package worker

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/transport"
)

// Tools of the hardening tests (issue 11's defects).
const hardeningTools = `
import os

def status_flood(ctx, n=2000, size=16384, pidfile=""):
    # Straight into the FIFO, as a hostile tool can, as fast as it can;
    # each line of size bytes (newline excluded) starts with its number.
    # With pidfile: the pid goes there, and pidfile.count holds the
    # number of lines written in full so far.
    cfd = None
    if pidfile:
        cfd = os.open(pidfile + ".count", os.O_WRONLY | os.O_CREAT, 0o644)
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(pidfile + ".tmp", pidfile)
    pad = "s" * (int(size) - 21)
    fd = os.open(".str/status.pipe", os.O_WRONLY)
    for i in range(int(n)):
        line = ('{"status": "%06d ' % i + pad + '"}\n').encode()
        while line:
            line = line[os.write(fd, line):]
        if cfd is not None:
            os.pwrite(cfd, b"%010d" % (i + 1), 0)
    os.close(fd)
    return {"sent": int(n)}

def outputs(ctx, names=(), big="", mime=""):
    for name in names:
        ctx.save_artifact(name, b"data of " + name.encode(), mime or None)
    if big:
        ctx.save_artifact(big, b"x" * 4096)
    return {"ok": True}

def read_ref(ctx, f):
    return {"f": ctx.load_artifact_text("f")}
`

const hardeningManifest = `  status_flood: {module: hardtools, function: status_flood}
  status_flood_short: {module: hardtools, function: status_flood, timeout_seconds: 1}
  outputs: {module: hardtools, function: outputs}
  outputs_write: {module: hardtools, function: outputs, artifacts: {user_scope: write}}
  outputs_none: {module: hardtools, function: outputs, artifacts: {user_scope: none}}
  read_ref: {module: hardtools, function: read_ref}
  read_ref_none: {module: hardtools, function: read_ref, artifacts: {user_scope: none}}
`

func newHardeningHarness(t *testing.T, mod func(*Config), opts func(*Options)) *harness {
	t.Helper()
	h := newExecHarness(t, mod, nil)
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "hardtools.py"), []byte(hardeningTools), 0o644))
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, hardeningManifest...), 0o644))
	if opts != nil {
		o := Options{Config: h.cfg, Transport: h.bus.Client("worker-hard", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
			Store: h.store, Logger: h.srv.log}
		opts(&o)
		h.srv, err = New(o)
		must(t, err)
	}
	return h
}

// ---- status lines cannot pin the worker's memory

// blockingStatus holds every status publish until release is closed.
type blockingStatus struct {
	transport.Transport
	release chan struct{}
}

func (b *blockingStatus) Publish(ctx context.Context, m transport.Message) error {
	if strings.Contains(m.Topic, "/status/") {
		<-b.release
	}
	return b.Transport.Publish(ctx, m)
}

// statusNumbers checks that status lines are the flood's lines 0, 1, 2, ...
// in order, each of size bytes of JSON, and returns how many there are.
func statusNumbers(t *testing.T, st []string, size int) int {
	t.Helper()
	for i, s := range st {
		if want := fmt.Sprintf("%06d ", i); !strings.HasPrefix(s, want) || len(s) != size-14 {
			t.Fatalf("status line %d: %.20q... (%d bytes), want %q... (%d bytes)", i, s, len(s), want, size-14)
		}
	}
	return len(st)
}

// startBlockedStatus starts a hardening harness whose status publishes are
// stuck in bs until the test releases them, its log in logs.
func startBlockedStatus(t *testing.T) (*harness, *blockingStatus, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	bs := &blockingStatus{release: make(chan struct{})}
	h := newHardeningHarness(t, nil, func(o *Options) {
		bs.Transport = o.Transport
		o.Transport = bs
		o.Logger = logs.logger()
	})
	h.start()
	return h, bs, logs
}

// The broker is slower than the tool: the status publishes are stuck
// until the test releases them. The relay stops reading the FIFO once its
// queue is full, so the tool's writes block (it cannot have finished),
// and after the release every line arrives, in order, none dropped.
func TestStatusBackPressureKeepsEveryLine(t *testing.T) {
	h, bs, logs := startBlockedStatus(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", logs.String())
		}
	})
	// 3.2 MB of status: more than the queue, the FIFO's buffer and the
	// reader's buffer together, less than the task's cap.
	const n, size = 200, 16384
	id := h.send("status_flood", map[string]any{"args": map[string]any{"n": n, "size": size}})
	waitFor(t, "the relay to wait for the broker", func() bool {
		return strings.Contains(logs.String(), "status queue full: the status pipe is read at the broker's pace")
	})
	// The tool is blocked in a write: it has no result, so no reply.
	select {
	case r := <-h.replyChan(id):
		t.Fatalf("reply while the tool's status writes should be blocked: %.200s", r)
	default:
	}
	close(bs.release)
	reply := h.reply(id)
	if _, ok := shapeResult(reply); !ok {
		t.Fatalf("reply %s", reply)
	}
	if got := statusNumbers(t, h.status(id), size); got != n {
		t.Fatalf("%d status lines relayed, want all %d", got, n)
	}
	pm := regexp.MustCompile(`"status lines relayed at the broker's pace".*"status_lines_relayed":(\d+),"status_queue_peak_bytes":(\d+)`).FindStringSubmatch(logs.String())
	if pm == nil {
		t.Fatalf("no relay summary in the log:\n%s", grepLines(logs.String(), "status"))
	}
	if peak, _ := strconv.Atoi(pm[2]); peak > statusQueueBytes {
		t.Errorf("queue peak %d bytes > %d", peak, statusQueueBytes)
	}
	if strings.Contains(logs.String(), "status lines dropped") {
		t.Errorf("lines were dropped:\n%s", grepLines(logs.String(), "dropped"))
	}
}

// A tool blocked writing status (the publishes are stuck) is still ended
// by its timeout: once its process is gone the test releases the broker,
// and the reply is TIMEOUT; every line the tool wrote in full before it
// was killed is relayed, in order.
func TestStatusBackPressureTimeoutEndsTheCall(t *testing.T) {
	h, bs, logs := startBlockedStatus(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	id := h.send("status_flood_short", map[string]any{"args": map[string]any{"n": 100000, "size": 16384, "pidfile": pidfile}})
	waitFor(t, "the relay to wait for the broker", func() bool {
		return strings.Contains(logs.String(), "status queue full: the status pipe is read at the broker's pace")
	})
	var pid int
	waitFor(t, "the tool's pid", func() bool {
		b, err := os.ReadFile(pidfile)
		pid, _ = strconv.Atoi(string(b))
		return err == nil && pid > 0
	})
	// The publishes are still stuck, so only the timeout can end the tool.
	waitFor(t, "the tool to be killed by its timeout", func() bool {
		return unix.Kill(pid, 0) == unix.ESRCH
	})
	close(bs.release)
	reply := h.reply(id)
	var r struct {
		Result *struct {
			TimedOut bool `json:"timed_out"`
		} `json:"result"`
		Error *struct{ Code string } `json:"error"`
	}
	must(t, json.Unmarshal(reply, &r))
	if !(r.Result != nil && r.Result.TimedOut) && !(r.Error != nil && r.Error.Code == "TIMEOUT") {
		t.Fatalf("reply %.300s: want a timeout", reply)
	}
	b, err := os.ReadFile(pidfile + ".count")
	must(t, err)
	written, err := strconv.Atoi(strings.TrimSpace(string(b)))
	must(t, err)
	st := h.status(id)
	if written == 0 || len(st) < written {
		t.Fatalf("%d status lines relayed, the tool wrote %d in full", len(st), written)
	}
	statusNumbers(t, st[:written], 16384) // a last one may be cut by the kill
}

// A tool writes more status text than a task may publish (statusTaskBytes)
// while the publishes are stuck: it is slowed down, not dropped, up to the
// cap; the lines beyond the cap are dropped at once (the tool finishes),
// counted, and announced by one last status line after the kept ones.
func TestStatusFloodBoundedWithBlockedPublish(t *testing.T) {
	h, bs, logs := startBlockedStatus(t)
	const n, size = 2000, 16384
	id := h.send("status_flood", map[string]any{"args": map[string]any{"n": n, "size": size}})
	waitFor(t, "the relay to wait for the broker", func() bool {
		return strings.Contains(logs.String(), "status queue full: the status pipe is read at the broker's pace")
	})
	close(bs.release)
	reply := h.reply(id)
	if _, ok := shapeResult(reply); !ok {
		t.Fatalf("reply %s", reply)
	}
	st := h.status(id)
	if len(st) == 0 {
		t.Fatal("no status lines")
	}
	last := st[len(st)-1]
	m := regexp.MustCompile(`^\[str\] (\d+) status lines \((\d+) bytes\) were dropped: more than 16777216 bytes of status text`).FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("last status line %.200q does not report the drops", last)
	}
	// Every line that fits the cap is kept, in order: the first
	// statusTaskBytes/size of them.
	kept := statusNumbers(t, st[:len(st)-1], size)
	dropped, _ := strconv.Atoi(m[1])
	if want := statusTaskBytes / size; kept != want || kept+dropped != n {
		t.Errorf("%d lines relayed, %d dropped: want %d relayed and %d in all", kept, dropped, want, n)
	}
	// The final log line carries the count and the queue's peak.
	pm := regexp.MustCompile(`"status_lines_dropped":(\d+).*"status_queue_peak_bytes":(\d+)`).FindStringSubmatch(logs.String())
	if pm == nil {
		t.Fatalf("no count in the log:\n%s", grepLines(logs.String(), "status"))
	}
	if n, _ := strconv.Atoi(pm[1]); n != dropped {
		t.Errorf("log counts %d drops, the status line %d", n, dropped)
	}
	if peak, _ := strconv.Atoi(pm[2]); peak > statusQueueBytes {
		t.Errorf("queue peak %d bytes > %d", peak, statusQueueBytes)
	}
}

// The queue's bounds, without a tool: a full queue makes push wait for a
// pop (nothing dropped); the line and total caps drop at once.
func TestStatusQueueBounds(t *testing.T) {
	q := newStatusQueue(100, 250, 5)
	line := make([]byte, 40)
	for i := 0; i < 2; i++ {
		if r, _, waited := q.push(line); r != "" || waited {
			t.Fatalf("push %d: dropped %q, waited %v", i, r, waited)
		}
	}
	// A third line does not fit in 100 queued bytes: push waits until a
	// pop makes room, and queues it.
	pushed := make(chan bool)
	go func() {
		r, _, waited := q.push(line)
		pushed <- r == "" && waited
	}()
	q.mu.Lock()
	for q.waits == 0 {
		q.mu.Unlock()
		runtime.Gosched()
		q.mu.Lock()
	}
	q.mu.Unlock()
	if _, ok := q.pop(); !ok {
		t.Fatal("pop")
	}
	if ok := <-pushed; !ok {
		t.Fatal("the waiting push did not queue its line after the pop")
	}
	if q.accepted != 3 || q.dropped != 0 || q.peak != 80 {
		t.Fatalf("accepted %d dropped %d peak %d", q.accepted, q.dropped, q.peak)
	}
	for i := 0; i < 2; i++ {
		q.pop()
	}
	for i := 0; i < 4; i++ {
		if r, _, _ := q.push(line); r == "" {
			q.pop()
		}
	}
	// 250 total bytes: 6 lines of 40 would be 240, but the line cap is 5.
	if q.accepted != 5 || q.total != 200 || q.dropped != 2 || !strings.Contains(q.firstDropReason, "more than 5 status lines") {
		t.Fatalf("accepted %d total %d dropped %d (%q)", q.accepted, q.total, q.dropped, q.firstDropReason)
	}
	q2 := newStatusQueue(1000, 100, 100)
	q2.push(line)
	q2.pop()
	q2.push(line)
	q2.pop()
	if r, _, _ := q2.push(line); !strings.Contains(r, "more than 100 bytes of status text") {
		t.Fatalf("total cap: %q", r)
	}
	// An empty queue takes a line larger than its bound (no deadlock).
	q3 := newStatusQueue(10, 1000, 10)
	if r, _, waited := q3.push(line); r != "" || waited {
		t.Fatalf("oversized line into an empty queue: dropped %q, waited %v", r, waited)
	}
	q2.close()
	if _, ok := q2.pop(); ok {
		t.Fatal("pop after close and empty")
	}
}

// ---- outputs: all or nothing, mime types capped

// Outputs over the limit after an earlier one fit: nothing is stored.
func TestOutputsAllOrNothingOnLimit(t *testing.T) {
	h := newHardeningHarness(t, func(c *Config) { c.MaxOutputBytes = 1000 }, nil)
	h.start()
	reply := h.reply(h.send("outputs", map[string]any{"args": map[string]any{"names": []string{"a.txt"}, "big": "z.txt"}}))
	if code, msg := errorCode(t, reply); code != "ARTIFACT_ERROR" || !strings.Contains(msg, "nothing was saved") {
		t.Fatalf("reply %s", reply)
	}
	if vs, _ := h.store.ListVersions(context.Background(), "u1", "s1", "a.txt"); len(vs) != 0 {
		t.Fatalf("a.txt stored (versions %v) although the call failed", vs)
	}
}

// failingStore fails the save of one name.
type failingStore struct {
	artifacts.Store
	fail string
}

func (f failingStore) Save(ctx context.Context, u, s, name string, data []byte, mime string) (int, error) {
	if name == f.fail {
		return 0, errors.New("disk on fire")
	}
	return f.Store.Save(ctx, u, s, name, data, mime)
}

func (f failingStore) SaveReader(ctx context.Context, u, s, name string, r io.Reader, size int64, mime string) (int, error) {
	if name == f.fail {
		return 0, errors.New("disk on fire")
	}
	return f.Store.SaveReader(ctx, u, s, name, r, size, mime)
}

// A save that fails after others succeeded says exactly what was saved.
func TestOutputSaveFailureSaysWhatWasSaved(t *testing.T) {
	h := newHardeningHarness(t, nil, func(o *Options) { o.Store = failingStore{Store: o.Store, fail: "c.txt"} })
	h.start()
	reply := h.reply(h.send("outputs", map[string]any{"args": map[string]any{"names": []string{"a.txt", "b.txt", "c.txt", "d.txt"}}}))
	code, msg := errorCode(t, reply)
	if code != "ARTIFACT_ERROR" || !strings.Contains(msg, "save output c.txt: disk on fire; 2 of 4 outputs were saved before") ||
		!strings.Contains(msg, `"a.txt" version 0, "b.txt" version 0`) {
		t.Fatalf("reply %s", reply)
	}
}

// A megabyte mime type is not stored: the extension's is; a valid one
// with parameters is kept.
func TestOutputMimeTypeCapped(t *testing.T) {
	logs := &logBuffer{}
	h := newHardeningHarness(t, nil, func(o *Options) { o.Logger = logs.logger() })
	h.start()
	huge := "text/" + strings.Repeat("x", 1<<20)
	reply := h.reply(h.send("outputs", map[string]any{"args": map[string]any{"names": []string{"a.csv"}, "mime": huge}}))
	if len(reply) > 64<<10 {
		t.Fatalf("reply of %d bytes repeats the mime type", len(reply))
	}
	r, ok := shapeResult(reply)
	if !ok {
		t.Fatalf("reply %.300s", reply)
	}
	if !strings.Contains(string(mustJSON(t, r["created_artifacts"])), `"mime_type":"text/csv"`) {
		t.Fatalf("created %v", r["created_artifacts"])
	}
	if a, err := h.store.Load(context.Background(), "u1", "s1", "a.csv", nil); err != nil || a.MimeType != "text/csv" {
		t.Fatalf("stored %v %v", a, err)
	}
	if !strings.Contains(logs.String(), "mime type for this output is refused") {
		t.Error("the refusal is not logged")
	}
	reply = h.reply(h.send("outputs", map[string]any{"args": map[string]any{"names": []string{"b.txt"}, "mime": "text/plain; charset=utf-8"}}))
	if a, err := h.store.Load(context.Background(), "u1", "s1", "b.txt", nil); err != nil || a.MimeType != "text/plain; charset=utf-8" {
		t.Fatalf("stored %v %v (reply %s)", a, err, reply)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	must(t, err)
	return b
}

// ---- user-scoped artifacts are a manifest permission

func TestUserScopeOutputs(t *testing.T) {
	h := newHardeningHarness(t, nil, nil)
	h.start()
	ctx := context.Background()
	args := map[string]any{"args": map[string]any{"names": []string{"user:shared.txt", "mine.txt"}}}
	// read (the default) and none: the user: output is skipped with the
	// reason, the session's output is stored.
	for _, tool := range []string{"outputs", "outputs_none"} {
		var r struct {
			Result struct {
				Created []CreatedArtifact `json:"created_artifacts"`
				Skipped []SkippedOutput   `json:"skipped_outputs"`
			}
		}
		reply := h.reply(h.send(tool, args))
		must(t, json.Unmarshal(reply, &r))
		if len(r.Result.Created) != 1 || r.Result.Created[0].Filename != "mine.txt" ||
			len(r.Result.Skipped) != 1 || r.Result.Skipped[0].Filename != "user:shared.txt" ||
			!strings.Contains(r.Result.Skipped[0].Reason, "may not write them (manifest artifacts.user_scope: ") {
			t.Fatalf("%s: %s", tool, reply)
		}
		if vs, _ := h.store.ListVersions(ctx, "u1", "other-session", "user:shared.txt"); len(vs) != 0 {
			t.Fatalf("%s: a user-scoped artifact was written", tool)
		}
	}
	// write: stored, visible from another session of the user.
	reply := h.reply(h.send("outputs_write", args))
	if _, ok := shapeResult(reply); !ok || strings.Contains(string(reply), "skipped_outputs") {
		t.Fatalf("write: %s", reply)
	}
	if vs, _ := h.store.ListVersions(ctx, "u1", "other-session", "user:shared.txt"); len(vs) != 1 {
		t.Fatalf("write: versions %v", vs)
	}
}

func TestUserScopeInputs(t *testing.T) {
	h := newHardeningHarness(t, nil, nil)
	h.start()
	_, err := h.store.Save(context.Background(), "u1", "elsewhere", "user:notes.txt", []byte("shared notes"), "")
	must(t, err)
	ref := map[string]any{"artifact_references": map[string]any{"f": map[string]any{"filename": "user:notes.txt"}}}
	if r, ok := shapeResult(h.reply(h.send("read_ref", ref))); !ok || !strings.Contains(string(mustJSON(t, r["tool_result"])), "shared notes") {
		t.Fatalf("read (default): %v", r)
	}
	for _, name := range []string{"user:notes.txt", "ｕｓｅｒ:notes.txt"} { // NFKC: the fullwidth prefix is the same scope
		reply := h.reply(h.send("read_ref_none", map[string]any{"artifact_references": map[string]any{"f": map[string]any{"filename": name}}}))
		if code, msg := errorCode(t, reply); code != "ARTIFACT_ERROR" || !strings.Contains(msg, "may not read user-scoped artifacts (manifest artifacts.user_scope: none)") {
			t.Fatalf("none, %q: %s", name, reply)
		}
	}
	// A preloaded input named user:… is the request's bytes, not the store's.
	reply := h.reply(h.send("read_ref_none", map[string]any{"preloaded_artifacts": map[string]any{"f": map[string]any{
		"filename": "local.txt", "content": base64.StdEncoding.EncodeToString([]byte("inline"))}}}))
	if _, ok := shapeResult(reply); !ok {
		t.Fatalf("preloaded: %s", reply)
	}
}
