package worker

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/worker/transport"
)

// toolsClient is a `str tools` client on the harness's bus: it publishes
// tools requests and reads the replies on the reply prefix.
type toolsClient struct {
	t *testing.T
	c transport.Transport
	h *harness
}

func newToolsClient(h *harness) *toolsClient {
	c := h.bus.Client("str-tools", "")
	must(h.t, c.Connect(context.Background(), []string{ToolsReplyPrefix(h.cfg.Namespace) + ">"}))
	h.t.Cleanup(func() { c.Close() })
	return &toolsClient{t: h.t, c: c, h: h}
}

// ask publishes one request with replyTo and returns the next reply
// (nil when none comes within wait).
func (tc *toolsClient) ask(replyTo string, props map[string]string, wait time.Duration) *ToolsReply {
	tc.t.Helper()
	up := map[string]string{PropReplyTo: replyTo}
	for k, v := range props {
		up[k] = v
	}
	must(tc.t, tc.c.Publish(context.Background(), transport.Message{Topic: ToolsRequestTopic(tc.h.cfg.Namespace), Payload: []byte(`{}`), UserProperties: up}))
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	d, err := tc.c.Receive(ctx)
	if err != nil {
		return nil
	}
	if d.Topic != replyTo {
		tc.t.Fatalf("reply on %s, want %s", d.Topic, replyTo)
	}
	var r ToolsReply
	must(tc.t, json.Unmarshal(d.Payload, &r))
	return &r
}

// TestToolsRequest: issue 15 §6. The worker answers a tools request with
// each manifest tool's ceiling, network policy, warm size and timeout,
// and whether it can work; a replyTo outside the reply prefix gets
// nothing (it could be an agent's reply topic).
func TestToolsRequest(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.WarmDefault = 0 })
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(testManifest+`  narrowed: {module: testtools, function: echo, warm: 2, timeout_seconds: 30, network: {policy: restricted, allowed_hosts: [pypi.org]}}
  ghost: {module: nosuchmodule, function: f}
`), 0o644))
	logs := h.rebuild(nil, nil)
	h.start()
	tc := newToolsClient(h)
	r := tc.ask(ToolsReplyPrefix(h.cfg.Namespace)+"cli-1", nil, 60*time.Second)
	if r == nil {
		t.Fatal("no tools reply")
	}
	if r.Version != ToolsReplyVersion || r.WorkerID != h.cfg.WorkerID || r.Error != nil {
		t.Fatalf("reply %+v", r)
	}
	byName := map[string]ToolInfo{}
	for _, ti := range r.Tools {
		byName[ti.Name] = ti
	}
	h.srv.mu.RLock() // the manifest watcher may be applying a reload
	inManifest := len(h.srv.manifest.Tools)
	h.srv.mu.RUnlock()
	if len(byName) != inManifest {
		t.Errorf("%d tools listed, the manifest has %d", len(byName), inManifest)
	}
	want := map[string]ToolInfo{
		"echo":       {Name: "echo", Profile: "standard", Network: egress.AllowEgress, TimeoutSeconds: 300},
		"restricted": {Name: "restricted", Profile: "restrictive", Network: egress.Isolated, TimeoutSeconds: 300},
		"narrowed":   {Name: "narrowed", Profile: "standard", Network: egress.Restricted, AllowedHosts: []string{"pypi.org"}, Warm: 2, TimeoutSeconds: 30},
	}
	for name, w := range want {
		got := byName[name]
		if got.Name != w.Name || got.Profile != w.Profile || got.Network != w.Network || got.Warm != w.Warm ||
			got.TimeoutSeconds != w.TimeoutSeconds || strings.Join(got.AllowedHosts, ",") != strings.Join(w.AllowedHosts, ",") || got.Unavailable != "" {
			t.Errorf("%s: %+v, want %+v", name, got, w)
		}
	}
	if g := byName["ghost"]; !strings.Contains(g.Unavailable, "nosuchmodule") {
		t.Errorf("ghost: %+v, want unavailable naming its module", g)
	}
	// A replyTo outside the prefix: no answer there, and the worker goes
	// on answering.
	other := h.bus.Client("agent-2", "")
	must(t, other.Connect(context.Background(), []string{h.cfg.Base() + "/sam_remote_tool/response/>"}))
	defer other.Close()
	must(t, tc.c.Publish(context.Background(), transport.Message{Topic: ToolsRequestTopic(h.cfg.Namespace), Payload: []byte(`{}`),
		UserProperties: map[string]string{PropReplyTo: h.cfg.Base() + "/sam_remote_tool/response/app/victim"}}))
	// The worker handles deliveries in order: once the next request is
	// answered, the one before it was handled.
	if tc.ask(ToolsReplyPrefix(h.cfg.Namespace)+"cli-2", nil, 60*time.Second) == nil {
		t.Fatal("no reply after a request with a foreign replyTo")
	}
	if !strings.Contains(logs.String(), `"msg":"tools request ignored: replyTo is not under `+ToolsReplyPrefix(h.cfg.Namespace)) {
		t.Errorf("the foreign replyTo was not logged:\n%s", logs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if d, err := other.Receive(ctx); err == nil {
		t.Fatalf("the listing was published to a foreign replyTo: %s %s", d.Topic, d.Payload)
	}
}

// TestToolsRequestSigned: with signing required, an unsigned tools
// request is answered AUTHENTICATION_FAILED (no listing), a signed one
// with the listing.
func TestToolsRequestSigned(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SigningSecret = "s3cret" })
	h.start()
	tc := newToolsClient(h)
	r := tc.ask(ToolsReplyPrefix(h.cfg.Namespace)+"u", nil, 60*time.Second)
	if r == nil || r.Error == nil || r.Error.Code != string(CodeAuthenticationFailed) || len(r.Tools) != 0 {
		t.Fatalf("unsigned: %+v", r)
	}
	m := transport.Message{Topic: ToolsRequestTopic(h.cfg.Namespace), Payload: []byte(`{}`),
		UserProperties: map[string]string{PropReplyTo: ToolsReplyPrefix(h.cfg.Namespace) + "s"}}
	SignMessage("s3cret", &m, time.Now())
	must(t, tc.c.Publish(context.Background(), m))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	d, err := tc.c.Receive(ctx)
	must(t, err)
	var signed ToolsReply
	must(t, json.Unmarshal(d.Payload, &signed))
	if signed.Error != nil || len(signed.Tools) == 0 {
		t.Fatalf("signed: %s", d.Payload)
	}
}
