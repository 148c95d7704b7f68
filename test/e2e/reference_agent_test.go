package e2e

import (
	"path/filepath"
	"testing"
)

// TestReferenceAgentServedByEveryKindOfTool is issue 15's "done when": one
// worker, started on a manifest with a class-based entry (class_name, no
// function), a portable tool (ToolResult with a data object), a package:
// tool whose module is not its package's, and a restrictive tool, serves
// all four to a client that sends what a reference agent sends on every
// call (sandbox_profile "standard", timeout_seconds 300). Before issue 15
// the class-based entry kept the worker from starting, the portable
// tool's result came back stringified, the package was never installed
// and the restrictive tool answered INVALID_REQUEST.
func TestReferenceAgentServedByEveryKindOfTool(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	for _, m := range []string{"class_tools.py", "portable_tools.py"} {
		copyFile(t, filepath.Join("../../examples/tools/python", m), filepath.Join(e.tools, m))
	}
	figletWheel(t, e)
	writeManifest(t, e.manifest, `version: 1
tools:
  greeter: {module: class_tools, class_name: GreeterTool}
  portable_echo: {module: portable_tools, function: portable_echo}
  render_ascii_art: {module: package_test_tool, function: render_ascii_art, package: str-figlet}
  echo_restrictive: {module: example_tools, function: echo_tool, sandbox_profile: restrictive}
`)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)

	calls := []struct {
		tool string
		args map[string]any
		want string // the whole reply, with "ID" for the request id
	}{
		{"greeter", map[string]any{"name": "Ann"},
			`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"greeting":"Hello, Ann!","tool_context_is_none":true},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`},
		{"portable_echo", map[string]any{"message": "hey"},
			`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"status":"success","message":"Echoed: hey","data":null,"data_objects":[],"error_code":null},"execution_time_ms":0,"timed_out":false,"created_artifacts":[{"filename":"echo_output.txt","version":0,"mime_type":"text/plain","size_bytes":34}]}}`},
		{"render_ascii_art", map[string]any{"text": "str"}, ""},
		{"echo_restrictive", map[string]any{"message": "clamped"}, ""},
	}
	ids := make([]string, len(calls))
	for i, c := range calls {
		ids[i] = a.referenceCall(c.tool, map[string]any{"args": c.args})
	}
	for i, c := range calls {
		r := a.reply(ids[i], replyWait)
		if c.want != "" {
			wantReply(t, c.tool, ids[i], r, c.want)
		} else if !isSuccess(r) {
			t.Errorf("%s with the reference agent's defaults: %s", c.tool, r)
		}
	}
}
