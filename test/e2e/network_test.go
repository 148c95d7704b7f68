package e2e

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// netTools probe the worker's own ports from inside a tool: the way the
// attacks of issue 9 started (a standard tool connected to the embedded
// broker on the host's 127.0.0.1 with the worker's client id and answered
// other users' calls; it also read /metrics on the health port).
const netTools = `
import socket

def connect_out(ctx, targets):
    out = {}
    for t in targets:
        host, port = t.rsplit(":", 1)
        try:
            s = socket.create_connection((host, int(port)), timeout=3)
            s.close()
            out[t] = "connected"
        except Exception as e:
            out[t] = "refused: %s" % e
    return out

def connect_proxy(ctx, targets):
    out = {}
    for t in targets:
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=3)
            s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
            out[t] = s.recv(200).decode(errors="replace").split("\r\n")[0]
        except Exception as e:
            out[t] = "refused: %s" % e
    return out
`

const netManifest = `  connect_out: {module: net_tools, function: connect_out}
  connect_proxy: {module: net_tools, function: connect_proxy}
`

// hostAddress is one of the host's non-loopback IPv4 addresses, if any.
func hostAddress() string {
	ifas, _ := net.InterfaceAddrs()
	for _, a := range ifas {
		if pn, ok := a.(*net.IPNet); ok && pn.IP.To4() != nil && !pn.IP.IsLoopback() {
			return pn.IP.String()
		}
	}
	return ""
}

// TestStandardToolCannotReachTheWorker: from a standard tool (the default
// profile), the dev broker, the health and metrics port and the host's
// other addresses are unreachable, directly and through the proxy, so none
// of the broker attacks can start.
func TestStandardToolCannotReachTheWorker(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "net_tools.py"), []byte(netTools), 0o644))
	writeManifest(t, e.manifest, e2eManifest+netManifest)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	targets := []string{"127.0.0.1:" + strconv.Itoa(w.port), "127.0.0.1:" + strconv.Itoa(w.health)}
	if h := hostAddress(); h != "" {
		targets = append(targets, h+":"+strconv.Itoa(w.port), h+":"+strconv.Itoa(w.health))
	}
	for _, tool := range []string{"connect_out", "connect_proxy"} {
		r := a.reply(a.invoke(tool, map[string]any{"args": map[string]any{"targets": targets}}), replyWait)
		var rep struct {
			Result struct {
				ToolResult map[string]string `json:"tool_result"`
			} `json:"result"`
		}
		if err := json.Unmarshal(r, &rep); err != nil || len(rep.Result.ToolResult) != len(targets) {
			t.Fatalf("%s: %v\n%s", tool, err, r)
		}
		for target, got := range rep.Result.ToolResult {
			if got == "connected" || strings.Contains(got, " 200 ") {
				t.Errorf("%s: a standard tool reached the worker's %s: %s", tool, target, got)
			}
		}
	}
}

// TestViolationsInTheReply: a tool whose manifest entry narrows the
// network to restricted (api.example.com only) tries another host; the
// reply's result carries the denial (host, port, reason) and the summary
// an agent can show its model.
func TestViolationsInTheReply(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "net_tools.py"), []byte(netTools), 0o644))
	writeManifest(t, e.manifest, e2eManifest+netManifest+
		"  narrowed: {module: net_tools, function: connect_proxy, network: {policy: restricted, allowed_hosts: [api.example.com]}}\n")
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	r := a.reply(a.invoke("narrowed", map[string]any{"args": map[string]any{"targets": []string{"evil.example.net:443", "api.example.com:8443"}}}), replyWait)
	var rep struct {
		Result struct {
			ToolResult map[string]string `json:"tool_result"`
			Violations []struct {
				Kind, Reason, Host string
				Port               int
			} `json:"violations"`
			Summary string `json:"violation_summary"`
		} `json:"result"`
	}
	if err := json.Unmarshal(r, &rep); err != nil {
		t.Fatalf("%v\n%s", err, r)
	}
	want := map[string]string{"evil.example.net:443": "not_allowlisted", "api.example.com:8443": "port_not_allowed"}
	for dst, reason := range want {
		found := false
		for _, v := range rep.Result.Violations {
			found = found || (v.Host+":"+strconv.Itoa(v.Port) == dst && v.Reason == reason && v.Kind == "net")
		}
		if !found {
			t.Errorf("no violation %s %s in the reply: %s", dst, reason, r)
		}
		if !strings.Contains(rep.Result.ToolResult[dst], "403") {
			t.Errorf("%s: the tool saw %q, want a 403", dst, rep.Result.ToolResult[dst])
		}
	}
	if !strings.Contains(rep.Result.Summary, "<sandbox_violations>") || !strings.Contains(rep.Result.Summary, "evil.example.net:443") {
		t.Errorf("summary: %q", rep.Result.Summary)
	}
}
