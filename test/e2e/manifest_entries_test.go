package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// resultJSON is the tool_result of a success reply, as JSON text.
func resultJSON(t *testing.T, reply []byte) string {
	t.Helper()
	b, err := json.Marshal(toolResult(t, reply))
	must(t, err)
	return string(b)
}

// The reference's own example manifest, plus an entry str cannot serve
// (runtime: node) and a class that fails its init: the worker starts,
// serves the good entries (function, portable and class-based tools),
// answers the bad one TOOL_NOT_AVAILABLE with the manifest's reason and
// lists it on /readyz, which stays 200.
func TestReferenceManifestServesGoodEntries(t *testing.T) {
	requireRoot(t)
	e := newReferenceEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)

	if got := resultJSON(t, a.reply(a.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "hi"}}), 60*time.Second)); !strings.Contains(got, `"echo":"hi"`) {
		t.Errorf("echo_tool: %s", got)
	}
	if got := resultJSON(t, a.reply(a.invoke("execute_python", map[string]any{"args": map[string]any{"code": "print(6 * 7)"}}), 60*time.Second)); !strings.Contains(got, `42\n`) {
		t.Errorf("execute_python: %s", got)
	}
	if got := resultJSON(t, a.reply(a.invoke("portable_echo", map[string]any{"args": map[string]any{"message": "hi"}}), 60*time.Second)); !strings.Contains(got, "Echoed: hi") {
		t.Errorf("portable_echo: %s", got)
	}
	if got := resultJSON(t, a.reply(a.invoke("dynamic_test", map[string]any{"args": map[string]any{"name": "Ada"}}), 60*time.Second)); !strings.Contains(got, "Hello from sandbox, Ada!") {
		t.Errorf("dynamic_test: %s", got)
	}

	code, msg := errorCode(t, a.reply(a.invoke("node_tool", nil), 60*time.Second))
	if code != "TOOL_NOT_AVAILABLE" || !strings.Contains(msg, `tools.node_tool.runtime: "node" is not supported`) {
		t.Errorf("node_tool: %s %q, want TOOL_NOT_AVAILABLE with the manifest's reason", code, msg)
	}
	status, body := w.get("/readyz")
	var rz struct {
		OK          bool              `json:"ok"`
		Unavailable map[string]string `json:"unavailable_tools"`
	}
	must(t, json.Unmarshal([]byte(body), &rz))
	if status != 200 || !rz.OK || !strings.Contains(rz.Unavailable["node_tool"], "runtime") {
		t.Errorf("/readyz %d %s, want 200 listing node_tool", status, body)
	}
	if _, listed := rz.Unavailable["echo_tool"]; listed {
		t.Errorf("/readyz lists a good tool: %s", body)
	}
	if !strings.Contains(w.log.String(), "node_tool") {
		t.Error("the worker's log does not name the unavailable entry")
	}
}
