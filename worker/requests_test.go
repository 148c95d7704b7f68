package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/launchertest"

	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/transport"
)

// Tests of the request and serving side: the tighten-only profile rule,
// the start-up checks of the tools, queued calls, reserved and oversized
// names, stopping before the first connection, and fail-closed start-up.

// rebuild replaces the harness's server (before start) with one using sb
// (nil = launchertest.Sandboxes) and logging to the returned buffer.
func (h *harness) rebuild(sb Sandboxes, tr transport.Transport) *logBuffer {
	h.t.Helper()
	if sb == nil {
		sb = launchertest.Sandboxes{}
	}
	if tr == nil {
		tr = h.bus.Client("worker", h.cfg.QueueName())
	}
	logs := &logBuffer{}
	var err error
	h.srv, err = New(Options{Config: h.cfg, Transport: tr, Sandboxes: sb, Store: h.store,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	must(h.t, err)
	return logs
}

// allProfiles accepts every embedded profile name and alias.
type allProfiles struct{ launchertest.Sandboxes }

func (allProfiles) CheckProfile(name string) error {
	set, err := profiles.Embedded()
	if err != nil {
		return err
	}
	if _, err := set.Lookup(name); err != nil {
		return fmt.Errorf("%w: %w", ErrUnknownProfile, err)
	}
	return nil
}

// TestProfileCeilingEveryPair: issue 7 item 3, issue 15 §1. For every
// (ceiling, asked) pair, with the ceiling from the manifest and from the
// worker default, a call runs with the asked profile when it is the
// ceiling or stricter, and with the ceiling otherwise (clamped, never
// refused, never looser than the ceiling).
func TestProfileCeilingEveryPair(t *testing.T) {
	h := newHarness(t, nil)
	h.rebuild(allProfiles{}, nil)
	rank := map[string]int{"permissive": 0, "trusted": 0, "standard": 1, "restrictive": 2, "untrusted": 2, "confidential": 3}
	names := []string{"permissive", "trusted", "standard", "restrictive", "untrusted", "confidential"}
	for _, from := range []string{"manifest", "default"} {
		for _, ceiling := range names {
			for _, asked := range append([]string{""}, names...) {
				t.Run(from+"/"+ceiling+"/"+asked, func(t *testing.T) {
					tool := &manifest.Tool{Name: "t", TimeoutSeconds: 300}
					h.srv.cfg.DefaultProfile = "standard"
					if from == "manifest" {
						tool.SandboxProfile = ceiling
					} else {
						h.srv.cfg.DefaultProfile = ceiling
					}
					got, e := h.srv.choose(tool, &Request{SandboxProfile: asked})
					if e != nil {
						t.Fatalf("asked %q under the ceiling %q: refused %s %q", asked, ceiling, e.Code, e.Message)
					}
					if rank[got.profile] < rank[ceiling] {
						t.Fatalf("asked %q under the ceiling %q: got %q, looser than the ceiling", asked, ceiling, got.profile)
					}
					switch {
					case asked == "":
						if got.profile != ceiling || got.clamped != "" {
							t.Fatalf("no profile asked: got %+v, want the ceiling %q", got, ceiling)
						}
					case rank[asked] == rank[ceiling]:
						if got.profile != ceiling || got.clamped != "" {
							t.Fatalf("got %+v, want the ceiling's spelling %q unclamped", got, ceiling)
						}
					case rank[asked] > rank[ceiling]:
						if got.profile != asked || got.clamped != "" {
							t.Fatalf("got %+v, want %q unclamped", got, asked)
						}
					default:
						if got.profile != ceiling || got.clamped != asked+"->"+ceiling ||
							!strings.Contains(got.reason, fmt.Sprintf("%q", asked)) || !strings.Contains(got.reason, fmt.Sprintf("%q", ceiling)) {
							t.Fatalf("looser %q under the ceiling %q: got %+v, want the ceiling, clamped, a reason naming both", asked, ceiling, got)
						}
					}
				})
			}
		}
	}
}

// TestProfileCeilingThroughServer: the rule on the wire, as a reference
// agent meets it (issue 15 §1: "standard" on every call used to be
// INVALID_REQUEST for a restrictive tool). A looser request runs clamped,
// its reply carries strProfileClamped; an unknown name is still
// INVALID_REQUEST; the worker logs the clamp at debug.
func TestProfileCeilingThroughServer(t *testing.T) {
	h := newHarness(t, nil)
	logs := &logBuffer{}
	var err error
	h.srv, err = New(Options{Config: h.cfg, Transport: h.bus.Client("worker", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	must(t, err)
	h.start()
	// A second agent-side client sees the replies' user properties.
	props := h.bus.Client("props", "")
	must(t, props.Connect(context.Background(), []string{h.cfg.Base() + "/sam_remote_tool/response/>"}))
	defer props.Close()
	replyProps := func(id string) map[string]string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for {
			d, err := props.Receive(ctx)
			if err != nil {
				t.Fatalf("no reply to %s on the second client: %v", id, err)
			}
			if strings.HasSuffix(d.Topic, "/"+id) {
				return d.UserProperties
			}
		}
	}
	cases := []struct {
		tool, asked string
		clamped     string // "" = not clamped
	}{
		{"echo", "permissive", "permissive->standard"},
		{"echo", "standard", ""},
		{"echo", "restrictive", ""},
		{"restricted", "standard", "standard->restrictive"},
		{"restricted", "permissive", "permissive->restrictive"},
		{"restricted", "restrictive", ""},
		{"restricted", "", ""},
	}
	for _, c := range cases {
		params := map[string]any{"sandbox_profile": c.asked}
		if c.asked == "" {
			params = map[string]any{"sandbox_profile": nil}
		}
		id := h.send(c.tool, params)
		reply := h.reply(id)
		if _, ok := shapeResult(reply); !ok {
			t.Errorf("%s asking %q: %s", c.tool, c.asked, reply)
			continue
		}
		if got := replyProps(id)[PropProfileClamped]; got != c.clamped {
			t.Errorf("%s asking %q: %s = %q, want %q", c.tool, c.asked, PropProfileClamped, got, c.clamped)
		}
		logged := strings.Contains(logs.String(), `"msg":"the request's sandbox profile was clamped to the tool's ceiling"`) &&
			strings.Contains(logs.String(), `"clamped":"`+c.clamped+`"`)
		if c.clamped != "" && !logged {
			t.Errorf("%s asking %q: no debug line for the clamp:\n%s", c.tool, c.asked, logs)
		}
	}
	id := h.send("restricted", map[string]any{"sandbox_profile": "nosuch"})
	if code, msg := errorCode(t, h.reply(id)); code != "INVALID_REQUEST" || !strings.Contains(msg, `sandbox profile "nosuch" (from the request)`) {
		t.Errorf("unknown profile: %s %q", code, msg)
	}
	if got, ok := replyProps(id)[PropProfileClamped]; ok {
		t.Errorf("unknown profile: %s = %q on the error reply", PropProfileClamped, got)
	}
}

// TestClampedCallsAreServedWarm: a reference agent's "standard" on a
// restrictive tool with a warm pool runs at the ceiling, so a pooled
// sandbox (made at the ceiling) serves it; so does a call naming the
// ceiling itself. A stricter profile than the ceiling is served cold.
func TestClampedCallsAreServedWarm(t *testing.T) {
	h := newWarmHarness(t, nil)
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(`version: 1
tools:
  strict: {module: warmtools, function: remember, warm: 1, timeout_seconds: 10, sandbox_profile: restrictive}
  loose: {module: warmtools, function: remember, warm: 1, timeout_seconds: 10, sandbox_profile: permissive}
`), 0o644))
	h.start()
	for i, c := range []struct {
		tool, asked string
		hits        float64
	}{
		{"strict", "standard", 1},
		{"strict", "restrictive", 2},
		{"strict", "permissive", 3},
		{"loose", "standard", 0},
	} {
		waitPoolReady(t, h, c.tool, 1)
		id := h.send(c.tool, map[string]any{"sandbox_profile": c.asked, "args": map[string]any{"mark": strconv.Itoa(i)}})
		resultOf(t, h.reply(id))
		sample := `str_worker_warm_hits_total{tool="` + c.tool + `"}`
		if got := metricValue(t, h, sample); got != c.hits {
			t.Errorf("%s asking %s: %s = %v, want %v", c.tool, c.asked, sample, got, c.hits)
		}
	}
}

const extraTools = `  secret: {module: secrettools, function: f}
  ghostmod: {module: nosuchmodule, function: f}
  badprofile: {module: testtools, function: echo, sandbox_profile: nosuch}
`

// TestStartupToolChecks: issue 7 item 4. Tools that cannot work are
// logged at start-up, listed on /readyz and answered TOOL_NOT_AVAILABLE;
// the others serve.
func TestStartupToolChecks(t *testing.T) {
	h := newHarness(t, nil)
	must(t, os.WriteFile(filepath.Join(h.cfg.ToolsDir, "secrettools.py"), []byte("def f(ctx): return {}\n"), 0o600))
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(testManifest+extraTools), 0o644))
	logs := h.rebuild(nil, nil)
	h.start()
	for _, tool := range []string{"secret", "ghostmod", "badprofile"} {
		if !strings.Contains(logs.String(), `"msg":"tool cannot work on this worker: its calls will be answered TOOL_NOT_AVAILABLE","tool":"`+tool+`"`) {
			t.Errorf("no start-up error logged for %s:\n%s", tool, logs)
		}
		code, msg := errorCode(t, h.reply(h.send(tool, nil)))
		if code != "TOOL_NOT_AVAILABLE" || !strings.Contains(msg, "Tool '"+tool+"' is not available on this worker") {
			t.Errorf("%s: %s %q", tool, code, msg)
		}
	}
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Error("a good tool stopped serving")
	}
	hs := httptest.NewServer(h.srv.Handler())
	defer hs.Close()
	resp, err := hs.Client().Get(hs.URL + "/readyz")
	must(t, err)
	defer resp.Body.Close()
	var body struct {
		OK               bool              `json:"ok"`
		UnavailableTools map[string]string `json:"unavailable_tools"`
	}
	must(t, json.NewDecoder(resp.Body).Decode(&body))
	if resp.StatusCode != 200 || !body.OK || len(body.UnavailableTools) != 3 ||
		!strings.Contains(body.UnavailableTools["secret"], "cannot read "+filepath.Join(h.cfg.ToolsDir, "secrettools.py")) ||
		!strings.Contains(body.UnavailableTools["ghostmod"], "nosuchmodule") ||
		!strings.Contains(body.UnavailableTools["badprofile"], `sandbox_profile "nosuch"`) {
		t.Fatalf("readyz %d %+v", resp.StatusCode, body)
	}

	// A reload is checked the same way: the three leave the list with
	// the manifest, a new tool that cannot work joins it and is logged.
	mpath := h.cfg.ManifestPath
	must(t, os.WriteFile(mpath+".tmp", []byte(testManifest+"  ghost2: {module: nosuchmodule2, function: f}\n"), 0o644))
	must(t, os.Rename(mpath+".tmp", mpath))
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := hs.Client().Get(hs.URL + "/readyz")
		must(t, err)
		body.UnavailableTools = nil
		must(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		if len(body.UnavailableTools) == 1 && strings.Contains(body.UnavailableTools["ghost2"], "nosuchmodule2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readyz 10 s after the reload: %+v, want only ghost2", body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), `"msg":"tool cannot work on this worker: its calls will be answered TOOL_NOT_AVAILABLE","tool":"ghost2"`) {
		t.Errorf("no error logged for ghost2 at the reload:\n%s", logs)
	}
	if code, msg := errorCode(t, h.reply(h.send("ghost2", nil))); code != "TOOL_NOT_AVAILABLE" {
		t.Errorf("ghost2 after the reload: %s %q", code, msg)
	}
}

// TestDeletedToolsDir: a tools dir removed while serving is the worker's
// problem (TOOL_NOT_AVAILABLE), never the caller's (INVALID_REQUEST).
func TestDeletedToolsDir(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	h.reply(h.send("echo", nil))
	must(t, os.RemoveAll(h.cfg.ToolsDir))
	code, msg := errorCode(t, h.reply(h.send("echo", nil)))
	if code != "TOOL_NOT_AVAILABLE" {
		t.Fatalf("%s %q, want TOOL_NOT_AVAILABLE", code, msg)
	}
}

// TestQueuedCallOfRemovedTool: issue 7 item 5. A call queued when its tool
// is removed from the manifest is answered TOOL_NOT_AVAILABLE when it is
// dequeued; before the fix it ran the removed tool.
func TestQueuedCallOfRemovedTool(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1 })
	h.start()
	running := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 600}})
	waitFor(t, "the tool running", func() bool { return len(h.status(running)) > 0 })
	queued := h.send("plain", map[string]any{"args": map[string]any{"message": "x"}})
	waitFor(t, "the call queued", func() bool { _, ok := h.srv.inflight.Load("id:" + queued); return ok })
	updated := strings.Replace(testManifest, "  plain: {module: testtools, function: plain}\n", "", 1)
	must(t, os.WriteFile(h.cfg.ManifestPath+".tmp", []byte(updated), 0o644))
	must(t, os.Rename(h.cfg.ManifestPath+".tmp", h.cfg.ManifestPath))
	if d := <-h.other; d.Topic != h.cfg.Base()+"/sam_remote_tool/removed/plain" {
		t.Fatalf("unexpected %s", d.Topic)
	}
	must(t, h.client.Publish(context.Background(), transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/cancel/" + running}))
	if code, _ := errorCode(t, h.reply(running)); code != "CANCELLED" {
		t.Fatalf("running: %s", code)
	}
	code, msg := errorCode(t, h.reply(queued))
	if code != "TOOL_NOT_AVAILABLE" || !strings.Contains(msg, "removed from the manifest while the request was queued") {
		t.Fatalf("queued call of a removed tool: %s %q", code, msg)
	}
}

// TestCancelQueuedAnswersAtOnce: a queued call is answered CANCELLED while
// the only executor is still busy (before the fix, only when a slot freed).
func TestCancelQueuedAnswersAtOnce(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1 })
	h.start()
	running := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 600}})
	waitFor(t, "the tool running", func() bool { return len(h.status(running)) > 0 })
	queued := h.send("echo", nil)
	waitFor(t, "the call queued", func() bool { _, ok := h.srv.inflight.Load("id:" + queued); return ok })
	must(t, h.client.Publish(context.Background(), transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/cancel/" + queued}))
	if code, msg := errorCode(t, h.reply(queued)); code != "CANCELLED" {
		t.Fatalf("queued: %s %q", code, msg)
	}
	select {
	case r := <-h.replyChan(running):
		t.Fatalf("the running call ended first: %s", r)
	default:
	}
	must(t, h.client.Publish(context.Background(), transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/cancel/" + running}))
	if code, _ := errorCode(t, h.reply(running)); code != "CANCELLED" {
		t.Fatalf("running: %s", code)
	}
	// The executor skipped the answered call: exactly one reply each, and
	// the worker still serves.
	h.reply(h.send("echo", nil))
	select {
	case r := <-h.replyChan(queued):
		t.Fatalf("second reply to the cancelled call: %s", r)
	default:
	}
}

// TestReservedSessionID: "user" names the store's user-scope directory;
// it is refused up front instead of failing at save time.
func TestReservedSessionID(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	code, msg := errorCode(t, h.reply(h.send("echo", map[string]any{"session_id": "user"})))
	if code != "INVALID_REQUEST" || !strings.Contains(msg, `params.session_id "user" is reserved`) {
		t.Fatalf("%s %q", code, msg)
	}
}

// TestLongNamesTruncated: a 10,000-byte tool name is not copied whole into
// the reply or the log, and the cut keeps the reply valid UTF-8.
func TestLongNamesTruncated(t *testing.T) {
	h := newHarness(t, nil)
	logs := h.rebuild(nil, nil)
	h.start()
	long := strings.Repeat("é", 5000) // 10,000 bytes
	topic := h.cfg.Base() + "/sam_remote_tool/invoke/" + long
	must(t, h.srv.tr.Subscribe(context.Background(), topic))
	replies := [][]byte{h.reply(h.send(long, nil)), h.reply(h.send("echo", map[string]any{"tool_name": long}))}
	for i, r := range replies {
		code, msg := errorCode(t, r)
		if len(r) > 1000 || !utf8.Valid(r) || !strings.Contains(msg, "é…") {
			t.Errorf("reply %d (%s, %d bytes, valid UTF-8 %v): %.300s", i, code, len(r), utf8.Valid(r), r)
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if len(line) > 2000 {
			t.Errorf("log line of %d bytes: %.300s", len(line), line)
		}
	}
}

// blockingConnect is a transport whose broker never answers.
type blockingConnect struct{ transport.Transport }

func (blockingConnect) Connect(ctx context.Context, _ []string) error {
	<-ctx.Done()
	return fmt.Errorf("connect to 127.0.0.1:1 failed after 3 attempt(s): %w", ctx.Err())
}

// TestStopBeforeFirstConnection: SIGTERM before the broker ever answered
// is a clean stop (Run returns nil, `str worker` exits 0), not a failure.
func TestStopBeforeFirstConnection(t *testing.T) {
	h := newHarness(t, nil)
	h.rebuild(nil, blockingConnect{h.bus.Client("worker", h.cfg.QueueName())})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.srv.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after a stop before connecting: %v", err)
	}
}

// connectSpy records whether Connect was called.
type connectSpy struct {
	transport.Transport
	called atomic.Bool
}

func (c *connectSpy) Connect(ctx context.Context, subs []string) error {
	c.called.Store(true)
	return c.Transport.Connect(ctx, subs)
}

// noUserNS fails like a host without user namespaces.
type noUserNS struct{ launchertest.Sandboxes }

func (noUserNS) Create(context.Context, SandboxSpec) (Sandbox, error) {
	return nil, errors.New("nsinit: clone (step 0, CLONE_NEWUSER): operation not permitted (hint: user namespaces disabled? see str doctor)")
}

// setupFails creates sandboxes whose setup fails (a profile that cannot
// work here).
type setupFails struct{ launchertest.Sandboxes }

func (s setupFails) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	c, err := s.Sandboxes.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return setupFailsCreated{c}, nil
}

// setupFailsCreated never starts its process: it has ended at once,
// with a setup error.
type setupFailsCreated struct{ Sandbox }

func (c setupFailsCreated) Start() error                { return nil }
func (c setupFailsCreated) Wait() (*SandboxExit, error) { return setupFailsExit, nil }
func (c setupFailsCreated) Kill() error                 { return nil }
func (c setupFailsCreated) Arm(time.Duration) error     { return launcher.ErrEnded }

var setupFailsExit = &SandboxExit{ExitCode: 1, SetupError: errors.New("nsinit: mount proc /proc (step 8): operation not permitted")}

// TestProbeFailureRefusesStart: issue 7 item 6. A host that cannot create
// sandboxes makes Run fail before it connects, saying why and pointing at
// str doctor.
func TestProbeFailureRefusesStart(t *testing.T) {
	for _, c := range []struct {
		name string
		sb   Sandboxes
		want string
	}{
		{"create fails", noUserNS{}, "CLONE_NEWUSER): operation not permitted"},
		{"setup fails", setupFails{}, "mount proc /proc (step 8)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, nil)
			spy := &connectSpy{Transport: h.bus.Client("worker", h.cfg.QueueName())}
			h.rebuild(c.sb, spy)
			err := h.srv.Run(context.Background())
			if err == nil {
				t.Fatal("started without sandboxes")
			}
			for _, w := range []string{"refusing to start: this host cannot create sandboxes", `"standard" sandbox`, c.want, "run `str doctor`"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q: %v", w, err)
				}
			}
			if spy.called.Load() {
				t.Error("connected to the broker")
			}
			if e, _ := os.ReadDir(h.cfg.WorkDir); len(e) != 0 {
				t.Errorf("probe left %v in the work dir", e)
			}
		})
	}
}

// TestSandboxModeNone: only an explicit SANDBOX_MODE=none runs tools
// without a sandbox; it warns at start-up and on each call's log lines.
func TestSandboxModeNone(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SandboxMode = ModeNone })
	set, err := profiles.Embedded()
	must(t, err)
	// A host that cannot create sandboxes: the probe is skipped in this mode.
	logs := h.rebuild(Unsandboxed{Profiles: set}, nil)
	h.start()
	id := h.send("echo", map[string]any{"args": map[string]any{"message": "direct"}})
	if r, ok := shapeResult(h.reply(id)); !ok || !strings.Contains(fmt.Sprint(r), "direct") {
		t.Fatalf("not served: %v", r)
	}
	// "invocation answered" is logged just after the reply is published.
	waitFor(t, "the call's answered log line", func() bool { return strings.Contains(logs.String(), "invocation answered") })
	out := logs.String()
	if !strings.Contains(out, `"level":"WARN","msg":"SANDBOX_MODE=none: TOOLS RUN WITHOUT ANY ISOLATION`) {
		t.Errorf("no start-up warning:\n%s", out)
	}
	var answered int
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `"id":"`+id+`"`) {
			if !strings.Contains(line, `"sandbox_mode":"NONE: this tool runs WITHOUT ISOLATION"`) {
				t.Errorf("call log line without the warning: %s", line)
			}
			if strings.Contains(line, "invocation answered") {
				answered++
			}
		}
	}
	if answered != 1 {
		t.Errorf("%d 'invocation answered' lines for %s:\n%s", answered, id, out)
	}
}
