package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

// initResult is the result of a successful init reply.
func initResult(t *testing.T, reply []byte) map[string]any {
	t.Helper()
	var r struct {
		ID     string         `json:"id"`
		Result map[string]any `json:"result"`
	}
	must(t, json.Unmarshal(reply, &r))
	if r.Result == nil {
		t.Fatalf("not a success: %s", reply)
	}
	return r.Result
}

// The init sub-protocol through the dev broker, as a reference agent
// uses it, with the reference's own manifest: the init broadcasts a
// subscriber sees at start-up; both generations of init request for the
// class-based tool, answered from its init() run inside a sandbox; a
// class whose init() raises; a function tool and an unavailable entry
// asked for init; and the notices of a reload that adds and removes.
func TestInitProtocolEndToEnd(t *testing.T) {
	requireRoot(t)
	e := newReferenceEnv(t)
	port := freePort(t)
	broker := startDevBroker(t, port)
	t.Cleanup(func() { broker.Process.Kill(); broker.Wait() })
	// The agent is there before the worker: it sees the start-up notices.
	a := newAgent(t, port)
	w := startWorker(t, e, port, nil)

	// 1. start-up: an init broadcast for each served tool with a
	// description (seven of the reference's entries); none for node_tool
	// (unavailable) or broken_dynamic (no description).
	seen := map[string]map[string]any{}
	for len(seen) < 7 {
		n := a.nextNotice("the start-up init broadcasts", 60*time.Second)
		seen[strings.TrimPrefix(n.topic, a.base+"/sam_remote_tool/init/")] = n.payload
	}
	for _, tool := range []string{"echo_tool", "execute_python", "process_file", "portable_echo", "portable_process_file", "render_ascii_art", "dynamic_test"} {
		if seen[tool] == nil {
			t.Errorf("no start-up broadcast for %s (seen %v)", tool, keys(seen))
		}
	}
	if b, _ := json.Marshal(seen["dynamic_test"]); string(b) != `{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"description":"Dynamic test tool (class-based, enriches description via init)","tool_name":"dynamic_test"}}` {
		t.Errorf("dynamic_test broadcast %s", b)
	}

	// 2. the older generation: description computed by init() in the
	// sandbox, with the request's tool_config.
	res := initResult(t, a.reply(a.initRequest("init", "dynamic_test", map[string]any{"greeting_prefix": "Hi"}), 90*time.Second))
	desc, _ := res["tool_description"].(string)
	t.Logf("dynamic_test's description from init(): %s", desc)
	if res["tool_name"] != "dynamic_test" || !strings.HasPrefix(desc, "Greets with 'Hi' on Python 3.") {
		t.Errorf("older init result %v", res)
	}
	// init() ran in a sandbox as its unprivileged uid, not on the host as
	// the worker (root).
	if strings.HasSuffix(desc, " as uid 0.") {
		t.Errorf("init() ran as root: %s", desc)
	}
	if schema, _ := res["parameters_schema"].(map[string]any); schema == nil || schema["type"] != "OBJECT" {
		t.Errorf("older parameters_schema %v", res["parameters_schema"])
	}
	if _, ok := res["description"]; ok {
		t.Errorf("older result carries the newer field description: %v", res)
	}
	// 3. the newer generation.
	res = initResult(t, a.reply(a.initRequest("init_request", "dynamic_test", map[string]any{"greeting_prefix": "Hey"}), 90*time.Second))
	desc, _ = res["description"].(string)
	if res["tool_name"] != "dynamic_test" || !strings.HasPrefix(desc, "Greets with 'Hey' on Python 3.") {
		t.Errorf("newer init result %v", res)
	}
	if params, _ := res["parameters"].(map[string]any); params == nil || params["type"] != "OBJECT" {
		t.Errorf("newer parameters %v", res["parameters"])
	}
	if _, ok := res["tool_description"]; ok {
		t.Errorf("newer result carries the older field tool_description: %v", res)
	}

	// 4. errors.
	for _, c := range []struct{ kind, tool, code, msg string }{
		{"init", "broken_dynamic", "INIT_ERROR", "cannot reach the inventory database"},
		{"init_request", "broken_dynamic", "INIT_ERROR", "Init failed: "},
		{"init", "echo_tool", "TOOL_NOT_AVAILABLE", "not class-based"},
		{"init_request", "echo_tool", "TOOL_NOT_AVAILABLE", "not available for init"},
		{"init_request", "node_tool", "TOOL_NOT_AVAILABLE", `runtime: "node" is not supported`},
	} {
		code, msg := errorCode(t, a.reply(a.initRequest(c.kind, c.tool, nil), 90*time.Second))
		if code != c.code || !strings.Contains(msg, c.msg) {
			t.Errorf("%s %s: %s %q, want %s containing %q", c.kind, c.tool, code, msg, c.code, c.msg)
		}
	}

	// 5. a reload adding a described tool and removing execute_python.
	b, err := os.ReadFile(e.manifest)
	must(t, err)
	updated := strings.Replace(string(b), "  execute_python:\n", "  added_later:\n    module: example_sandbox_tools\n    function: echo_tool\n    description: \"added by a reload\"\n\n  old_execute_python:\n", 1)
	// old_execute_python is execute_python renamed: execute_python leaves.
	writeManifest(t, e.manifest, updated)
	select {
	case tool := <-a.removed:
		if tool != "execute_python" {
			t.Errorf("removed %s, want execute_python", tool)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("no removed/execute_python within 60 s")
	}
	added := map[string]map[string]any{}
	for len(added) < 2 {
		n := a.nextNotice("the reload's init broadcasts", 60*time.Second)
		added[strings.TrimPrefix(n.topic, a.base+"/sam_remote_tool/init/")] = n.payload
	}
	if b, _ := json.Marshal(added["added_later"]); string(b) != `{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"description":"added by a reload","tool_name":"added_later"}}` {
		t.Errorf("added_later broadcast %s (seen %v)", b, keys(added))
	}
	if added["old_execute_python"] == nil {
		t.Errorf("no broadcast for old_execute_python (seen %v)", keys(added))
	}
	if !strings.Contains(w.log.String(), "init answered") {
		t.Error("the worker's log has no init answered line")
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
