package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// generationsManifest serves a tool of each generation of the reference's
// tools from the example modules: class-based (DynamicTool subclasses,
// class_name and no function), portable (ToolContextFacade, Artifact
// parameters, a ToolResult return value) and a plain function taking ctx.
const generationsManifest = `version: 1
tools:
  greeter: {module: class_tools, class_name: GreeterTool}
  word_count: {module: class_tools, class_name: WordCountTool}
  portable_echo: {module: portable_tools, function: portable_echo}
  portable_process_file: {module: portable_tools, function: portable_process_file}
  portable_merge: {module: portable_tools, function: portable_merge}
  echo_tool: {module: example_tools, function: echo_tool}
  greeter_warm: {module: class_tools, class_name: GreeterTool, warm: 1}
  portable_echo_warm: {module: portable_tools, function: portable_echo, warm: 1}
`

// wantReply compares a reply byte for byte with want, where "ID" is the
// request id and execution_time_ms is 0.
func wantReply(t *testing.T, what, id string, got []byte, want string) {
	t.Helper()
	want = strings.ReplaceAll(want, `"id":"ID"`, `"id":"`+id+`"`)
	if norm := execTimeRE.ReplaceAllString(string(got), `"execution_time_ms":0`); norm != want {
		t.Errorf("%s:\n got %s\nwant %s", what, got, want)
	}
}

// storedArtifact returns version 0 of a saved artifact of user u-1,
// session s-1 and its .meta.
func storedArtifact(t *testing.T, e *env, name string) (string, string) {
	t.Helper()
	dir := filepath.Join(e.artifacts, "e2e", "u-1", "s-1", name)
	b, err := os.ReadFile(filepath.Join(dir, "0"))
	must(t, err)
	meta, err := os.ReadFile(filepath.Join(dir, "0.meta"))
	must(t, err)
	return string(b), string(meta)
}

func TestToolGenerations(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	for _, m := range []string{"class_tools.py", "portable_tools.py"} {
		copyFile(t, filepath.Join("../../examples/tools/python", m), filepath.Join(e.tools, m))
	}
	writeManifest(t, e.manifest, generationsManifest)
	// The agent's artifacts, in the shared store (reference layout): a
	// reference agent loads an Artifact parameter's artifact itself and
	// sends an artifact_reference (filename and version) for it, keyed by
	// the parameter (a list's items by "param[i]"), with the filename in
	// the args.
	stored := func(name, mime string, versions ...string) {
		dir := filepath.Join(e.artifacts, "e2e", "u-1", "s-1", name)
		must(t, os.MkdirAll(dir, 0o755))
		for v, content := range versions {
			must(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(v)), []byte(content), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, strconv.Itoa(v)+".meta"), []byte(`{"mime_type": "`+mime+`"}`), 0o644))
		}
	}
	notes := "one two three\nfour\n"
	report := "# Title\nbody text here\n"
	stored("notes.txt", "text/plain", "old", "older", notes)
	stored("report.md", "text/markdown", "draft", report)
	stored("header.txt", "text/plain", "HEADER")
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)

	// A class-based tool: instantiated with the request's tool_config,
	// called through _run_async_impl.
	id := a.referenceCall("greeter", map[string]any{"args": map[string]any{"name": "Ann"}, "tool_config": map[string]any{"greeting_prefix": "Hey"}})
	wantReply(t, "greeter", id, a.reply(id, replyWait),
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"greeting":"Hey, Ann!","tool_context_is_none":true},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`)

	// A class-based tool with an input artifact and the facade.
	id = a.referenceCall("word_count", map[string]any{"args": map[string]any{"document": "notes.txt"},
		"artifact_references": map[string]any{"document": map[string]any{"filename": "notes.txt", "version": 2}}})
	wantReply(t, "word_count", id, a.reply(id, replyWait),
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"filename":"notes.txt","version":2,"words":4,"user_id":"u-1"},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`)
	if got := a.status(id); len(got) != 1 || got[0] != "counting words of notes.txt" {
		t.Errorf("word_count status = %q", got)
	}

	// A portable tool: the ToolResult as the reference serialises it, its
	// data object saved as an artifact and listed in created_artifacts.
	id = a.referenceCall("portable_echo", map[string]any{"args": map[string]any{"message": "hey"}})
	echoed := "Echoed: hey\nUser: u-1\nSession: s-1"
	wantReply(t, "portable_echo", id, a.reply(id, replyWait), fmt.Sprintf(
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"status":"success","message":"Echoed: hey","data":null,"data_objects":[],"error_code":null},"execution_time_ms":0,"timed_out":false,"created_artifacts":[{"filename":"echo_output.txt","version":0,"mime_type":"text/plain","size_bytes":%d}]}}`,
		len(echoed)))
	if b, meta := storedArtifact(t, e, "echo_output.txt"); b != echoed || meta != `{"mime_type": "text/plain"}` {
		t.Errorf("echo_output.txt = %q, meta %q", b, meta)
	}

	// A portable tool with an Artifact parameter (the agent sends the
	// filename; the tool gets the artifact).
	id = a.referenceCall("portable_process_file", map[string]any{"args": map[string]any{"input_file": "report.md"},
		"artifact_references": map[string]any{"input_file": map[string]any{"filename": "report.md", "version": 1}}})
	summary := "Filename: report.md\nMIME type: text/markdown\nVersion: 1\nLines: 3\nWords: 5"
	wantReply(t, "portable_process_file", id, a.reply(id, replyWait), fmt.Sprintf(
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"status":"success","message":"Processed report.md: 3 lines","data":{"line_count":3,"facade_sees_same_bytes":true},"data_objects":[],"error_code":null},"execution_time_ms":0,"timed_out":false,"created_artifacts":[{"filename":"processing_summary.txt","version":0,"mime_type":"text/plain","size_bytes":%d}]}}`,
		len(summary)))
	if b, _ := storedArtifact(t, e, "processing_summary.txt"); b != summary {
		t.Errorf("processing_summary.txt = %q", b)
	}

	// A list of Artifacts and an Optional one.
	id = a.referenceCall("portable_merge", map[string]any{"args": map[string]any{"parts": []string{"notes.txt", "report.md"}, "header": "header.txt", "separator": "--"},
		"artifact_references": map[string]any{
			"parts[0]": map[string]any{"filename": "notes.txt", "version": 2},
			"parts[1]": map[string]any{"filename": "report.md", "version": 1},
			"header":   map[string]any{"filename": "header.txt", "version": 0}}})
	merged := "HEADER--" + notes + "--" + report
	wantReply(t, "portable_merge", id, a.reply(id, replyWait), fmt.Sprintf(
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"status":"success","message":"Merged 3 artifacts","data":{"names":["notes.txt","report.md"],"header":"header.txt"},"data_objects":[],"error_code":null},"execution_time_ms":0,"timed_out":false,"created_artifacts":[{"filename":"merged.bin","version":0,"mime_type":"application/octet-stream","size_bytes":%d}]}}`,
		len(merged)))
	if b, _ := storedArtifact(t, e, "merged.bin"); b != merged {
		t.Errorf("merged.bin = %q, want %q", b, merged)
	}

	// The same tools from the warm pool (imported ahead of the call, the
	// class instantiated with the call's tool_config). timeout_seconds 60:
	// a pooled sandbox's wall clock (the standard profile's timeout) runs
	// from its start, so a call that may take the whole 300 s is served
	// cold (worker/pool.go claim).
	for _, tool := range []string{"greeter_warm", "portable_echo_warm"} {
		waitFor(t, tool+"'s pool ready", 60*time.Second, func() bool {
			return w.labelledMetric(`str_worker_warm_pool_size{tool="`+tool+`"}`) == 1
		})
	}
	id = a.referenceCall("greeter_warm", map[string]any{"args": map[string]any{"name": "Bo"}, "tool_config": map[string]any{"greeting_prefix": "Yo"}, "timeout_seconds": 60})
	wantReply(t, "greeter_warm", id, a.reply(id, replyWait),
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"greeting":"Yo, Bo!","tool_context_is_none":true},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`)
	id = a.referenceCall("portable_echo_warm", map[string]any{"args": map[string]any{"message": "hey"}, "timeout_seconds": 60})
	wantReply(t, "portable_echo_warm", id, a.reply(id, replyWait), fmt.Sprintf(
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"status":"success","message":"Echoed: hey","data":null,"data_objects":[],"error_code":null},"execution_time_ms":0,"timed_out":false,"created_artifacts":[{"filename":"echo_output.txt","version":1,"mime_type":"text/plain","size_bytes":%d}]}}`,
		len(echoed)))
	for _, tool := range []string{"greeter_warm", "portable_echo_warm"} {
		if hits := w.labelledMetric(`str_worker_warm_hits_total{tool="` + tool + `"}`); hits != 1 {
			t.Errorf("%s: warm hits = %v, want 1 (not served by its pooled sandbox)", tool, hits)
		}
	}

	// A function tool taking ctx, beside them.
	id = a.referenceCall("echo_tool", map[string]any{"args": map[string]any{"message": "hi"}})
	wantReply(t, "echo_tool", id, a.reply(id, replyWait),
		`{"jsonrpc":"2.0","id":"ID","result":{"tool_result":{"echo":"hi","user_id":"u-1","session_id":"s-1"},"execution_time_ms":0,"timed_out":false,"created_artifacts":[]}}`)
}
