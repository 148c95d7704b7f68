package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
)

// The worker's side of the init sub-protocol (init.go), against a stub
// runner that implements the runner's init-mode contract (runner.Args.Mode,
// {"result": runner.InitInfo}) and records every run it gets: the worker
// is tested here, the real runner in its own package and end to end.

const initManifest = `version: 1
tools:
  dyn: {module: inittools, class_name: Dyn, function: run, description: "static dyn"}
  fn: {module: inittools, function: plain_fn, description: "a function tool"}
  broken_class: {module: inittools, class_name: Broken, function: run}
  quiet: {module: inittools, function: plain_fn}
  bad_entry: {module: inittools, function: plain_fn, timeout_seconds: -5}
  schema_only: {module: inittools, function: plain_fn, parameters: {type: object, properties: {x: {type: integer}}}, instructions: "x > 0", artifact_params: {doc: {is_list: true, is_optional: false}}, config_schema: [{name: k}]}
`

const initTools = `
class Dyn:
    pass

def plain_fn(x=1):
    return x
`

// initStub is the stub runner; %q is the file each run appends its
// arguments to.
const initStub = `import json, sys
args = json.load(open(sys.argv[-1]))
with open(%q, "a") as f:
    f.write(json.dumps({"mode": args.get("mode"), "module": args.get("module"), "class_name": args.get("class_name"),
                        "tool_config": args.get("tool_config")}, sort_keys=True) + "\n")
if args.get("mode") != "init":
    res = {"error": "the stub runs init only", "error_kind": "execution"}
elif args["class_name"] == "Broken":
    res = {"error": "AttributeError: module 'inittools' has no attribute 'Broken'", "error_kind": "import"}
else:
    res = {"result": {"tool_name": "not the worker's name", "description": "described %%s with %%s" %% (args["class_name"], json.dumps(args["tool_config"], sort_keys=True)),
        "parameters_schema": {"type": "OBJECT", "properties": {"q": {"type": "STRING"}}, "required": ["q"]},
        "ctx_facade_param_name": "ctx", "artifact_params": {"doc": {"is_list": False, "is_optional": True}},
        "instructions": "use it well", "config_schema": [{"name": "api_key"}]}}
json.dump(res, open(args["result_file"], "w"))
`

// stubRunnerSandboxes runs the stub instead of the runner.
type stubRunnerSandboxes struct {
	launchertest.Sandboxes
	stub string
}

func (s stubRunnerSandboxes) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	// PYTHON -S RUNNER ... -> PYTHON STUB LAST_ARG
	if slices.ContainsFunc(spec.Argv, func(a string) bool { return filepath.Base(a) == runner.FileName }) {
		spec.Argv = []string{spec.Argv[0], s.stub, spec.Argv[len(spec.Argv)-1]}
	}
	return s.Sandboxes.Create(ctx, spec)
}

// newInitHarness is a harness on initManifest with the stub runner; it
// returns the file of the runs.
func newInitHarness(t *testing.T) (*harness, string) {
	t.Helper()
	h := newHarness(t, nil)
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "inittools.py"), []byte(initTools), 0o644))
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(initManifest), 0o644))
	runs := filepath.Join(h.dir, "runs.jsonl")
	stub := filepath.Join(h.dir, "stub_runner.py")
	must(t, os.WriteFile(stub, []byte(fmt.Sprintf(initStub, runs)), 0o644))
	h.rebuild(stubRunnerSandboxes{stub: stub}, nil)
	return h, runs
}

// sendInit publishes an init request of either generation ("init" or
// "init_request" topic) with the method given; it returns the id.
func (h *harness) sendInit(topicKind, method, tool string, params map[string]any) string {
	id := nextID()
	env := map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params}
	if params == nil {
		env["params"] = map[string]any{"tool_name": tool, "tool_config": map[string]any{}}
	}
	payload, _ := json.Marshal(env)
	h.publishInit(topicKind, tool, id, payload)
	return id
}

func (h *harness) publishInit(topicKind, tool, replyID string, payload []byte) {
	base := h.cfg.Base()
	must(h.t, h.client.Publish(context.Background(), transport.Message{
		Topic: base + "/sam_remote_tool/" + topicKind + "/" + tool, Payload: payload,
		UserProperties: map[string]string{PropReplyTo: base + "/sam_remote_tool/response/app/" + replyID, "clientId": "agent"}}))
}

func decodeObject(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("reply %s: %v", b, err)
	}
	return m
}

func runLines(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(bytes.TrimSpace(data)), " ", ""))
}

// Both generations are answered with their own field names, from one run
// of the runner in init mode with the request's tool_config and the
// tool's class; a second identical request is answered from the cache.
func TestInitBothGenerations(t *testing.T) {
	h, runs := newInitHarness(t)
	h.start()
	cfg := map[string]any{"api_key": "k", "n": 2}

	older := decodeObject(t, h.reply(h.sendInit("init", MethodInit, "dyn", map[string]any{"tool_name": "dyn", "tool_config": cfg})))
	res, _ := older["result"].(map[string]any)
	if older["id"] == nil || res == nil {
		t.Fatalf("older reply %v", older)
	}
	wantDesc := `described Dyn with {"api_key": "k", "n": 2}`
	if res["tool_name"] != "dyn" || res["tool_description"] != wantDesc || res["ctx_facade_param_name"] != "ctx" {
		t.Errorf("older result %v", res)
	}
	if schema, _ := res["parameters_schema"].(map[string]any); schema == nil || schema["type"] != "OBJECT" {
		t.Errorf("older parameters_schema %v", res["parameters_schema"])
	}
	for _, newer := range []string{"description", "parameters", "instructions", "artifact_params", "config_schema"} {
		if _, ok := res[newer]; ok {
			t.Errorf("older result has the newer field %q: %v", newer, res)
		}
	}
	if got := runLines(t, runs); len(got) != 1 || !strings.Contains(got[0], `"mode":"init"`) || !strings.Contains(got[0], `"class_name":"Dyn"`) ||
		!strings.Contains(got[0], `"tool_config":{"api_key":"k","n":2}`) || !strings.Contains(got[0], `"module":"inittools"`) {
		t.Fatalf("runs %v, want one init run of Dyn with the request's tool_config", got)
	}

	// The newer generation, same tool and config: from the cache.
	newer := decodeObject(t, h.reply(h.sendInit("init_request", MethodInitRequest, "dyn", map[string]any{"tool_name": "dyn", "tool_config": cfg})))
	res, _ = newer["result"].(map[string]any)
	if res == nil || res["tool_name"] != "dyn" || res["description"] != wantDesc || res["instructions"] != "use it well" || res["ctx_facade_param_name"] != "ctx" {
		t.Fatalf("newer reply %v", newer)
	}
	if p, _ := res["parameters"].(map[string]any); p == nil || p["type"] != "OBJECT" {
		t.Errorf("newer parameters %v", res["parameters"])
	}
	if ap, _ := res["artifact_params"].(map[string]any); ap == nil || ap["doc"] == nil {
		t.Errorf("newer artifact_params %v", res["artifact_params"])
	}
	if cs, _ := res["config_schema"].([]any); len(cs) != 1 {
		t.Errorf("newer config_schema %v", res["config_schema"])
	}
	for _, older := range []string{"tool_description", "parameters_schema"} {
		if _, ok := res[older]; ok {
			t.Errorf("newer result has the older field %q: %v", older, res)
		}
	}
	if got := runLines(t, runs); len(got) != 1 {
		t.Errorf("the same tool and config ran again: %v", got)
	}

	// Another tool_config, and then a changed module source: new runs.
	h.reply(h.sendInit("init_request", MethodInitRequest, "dyn", map[string]any{"tool_name": "dyn", "tool_config": map[string]any{"api_key": "other"}}))
	if got := runLines(t, runs); len(got) != 2 {
		t.Errorf("another tool_config did not run again: %v", got)
	}
	must(t, os.WriteFile(filepath.Join(h.dir, "tools", "inittools.py"), []byte(initTools+"\n# edited\n"), 0o644))
	h.reply(h.sendInit("init", MethodInit, "dyn", map[string]any{"tool_name": "dyn", "tool_config": cfg}))
	if got := runLines(t, runs); len(got) != 3 {
		t.Errorf("a changed source did not run again: %v", got)
	}
}

// The errors: a class that fails (INIT_ERROR "Init failed: ..."), a
// function tool and an unknown-to-init tool (TOOL_NOT_AVAILABLE), a bad
// manifest entry (TOOL_NOT_AVAILABLE with its reason), a request of the
// wrong generation or for another tool (INVALID_REQUEST); a notification
// (no id) on the init topic is not answered at all.
func TestInitErrors(t *testing.T) {
	h, runs := newInitHarness(t)
	h.start()
	cases := []struct {
		kind, method, tool string
		params             map[string]any
		code, msg          string
	}{
		{"init", MethodInit, "broken_class", nil, "INIT_ERROR", "Init failed: IMPORT_ERROR: AttributeError: module 'inittools' has no attribute 'Broken'"},
		{"init_request", MethodInitRequest, "broken_class", nil, "INIT_ERROR", "Init failed: "},
		{"init", MethodInit, "fn", nil, "TOOL_NOT_AVAILABLE", "Tool 'fn' is not available for init on this worker: it is not class-based"},
		{"init_request", MethodInitRequest, "fn", nil, "TOOL_NOT_AVAILABLE", "not class-based"},
		{"init_request", MethodInitRequest, "bad_entry", nil, "TOOL_NOT_AVAILABLE", "tools.bad_entry.timeout_seconds: -5 is negative"},
		{"init", MethodInit, "bad_entry", nil, "TOOL_NOT_AVAILABLE", "its manifest entry is invalid"},
		{"init_request", MethodInit, "dyn", nil, "INVALID_REQUEST", `"method" must be "sam_remote_tool/init_request"`},
		{"init", MethodInitRequest, "dyn", nil, "INVALID_REQUEST", `"method" must be "sam_remote_tool/init"`},
		{"init_request", MethodInitRequest, "dyn", map[string]any{"tool_name": "fn"}, "INVALID_REQUEST", `does not match the topic's tool "dyn"`},
		{"init_request", MethodInitRequest, "dyn", map[string]any{"tool_name": "dyn", "tool_config": "x"}, "INVALID_REQUEST", "params.tool_config must be an object"},
	}
	for _, c := range cases {
		id := h.sendInit(c.kind, c.method, c.tool, c.params)
		code, msg := errorCode(t, h.reply(id))
		if code != c.code || !strings.Contains(msg, c.msg) {
			t.Errorf("%s %s %s: %s %q, want %s containing %q", c.kind, c.method, c.tool, code, msg, c.code, c.msg)
		}
	}
	// A notification on the init topic (a broadcast: no id), then a
	// request: only the request is answered (answers leave in order).
	notice := []byte(`{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"tool_name":"dyn","description":"x"}}`)
	h.publishInit("init", "dyn", "notice", notice)
	h.reply(h.sendInit("init", MethodInit, "dyn", nil))
	select {
	case r := <-h.replyChan("notice"):
		t.Errorf("a notification was answered: %s", r)
	default:
	}
	// Only broken_class and dyn ran.
	for _, line := range runLines(t, runs) {
		if !strings.Contains(line, `"class_name":"Broken"`) && !strings.Contains(line, `"class_name":"Dyn"`) {
			t.Errorf("unexpected run %s", line)
		}
	}
}

// nextNotice returns the next worker notice (no id) seen by the agent,
// skipping the agent's own requests on the init topics.
func (h *harness) nextNotice(what string) (string, map[string]any) {
	h.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case d := <-h.other:
			m := decodeObject(h.t, d.Payload)
			if _, isRequest := m["id"]; isRequest {
				continue
			}
			return d.Topic, m
		case <-deadline:
			h.t.Fatalf("no notice: %s", what)
			return "", nil
		}
	}
}

// The newer generation's notices: init broadcasts at start-up for the
// tools with a description, for a tool a reload adds, and removed for a
// tool a reload drops, each seen by a subscriber, in the reference's shape.
func TestInitBroadcasts(t *testing.T) {
	h, _ := newInitHarness(t)
	h.start()
	base := h.cfg.Base()
	seen := map[string]map[string]any{}
	for len(seen) < 3 {
		topic, m := h.nextNotice("start-up broadcasts of dyn, fn and schema_only")
		seen[topic] = m
	}
	want := map[string]string{
		base + "/sam_remote_tool/init/dyn": `{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"description":"static dyn","tool_name":"dyn"}}`,
		base + "/sam_remote_tool/init/fn":  `{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"description":"a function tool","tool_name":"fn"}}`,
		// parameters without a description: announced, with the other
		// description fields.
		base + "/sam_remote_tool/init/schema_only": `{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"artifact_params":{"doc":{"is_list":true,"is_optional":false}},` +
			`"config_schema":[{"name":"k"}],"instructions":"x \u003e 0","parameters":{"properties":{"x":{"type":"integer"}},"type":"object"},"tool_name":"schema_only"}}`,
	}
	for topic, w := range want {
		got, _ := json.Marshal(seen[topic])
		if string(got) != w {
			t.Errorf("%s: %s, want %s", topic, got, w)
		}
	}
	// Reload: fn removed, added (with a description) and plain2 (without) added.
	updated := strings.Replace(initManifest, `  fn: {module: inittools, function: plain_fn, description: "a function tool"}`,
		`  added: {module: inittools, function: plain_fn, description: "added later"}
  plain2: {module: inittools, function: plain_fn}`, 1)
	must(t, os.WriteFile(h.cfg.ManifestPath+".tmp", []byte(updated), 0o644))
	must(t, os.Rename(h.cfg.ManifestPath+".tmp", h.cfg.ManifestPath))
	seen = map[string]map[string]any{}
	for len(seen) < 2 {
		topic, m := h.nextNotice("the reload's removed and init notices")
		seen[topic] = m
	}
	want = map[string]string{
		base + "/sam_remote_tool/removed/fn": `{"jsonrpc":"2.0","method":"sam_remote_tool/removed","params":{"tool_name":"fn"}}`,
		base + "/sam_remote_tool/init/added": `{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"description":"added later","tool_name":"added"}}`,
	}
	for topic, w := range want {
		got, _ := json.Marshal(seen[topic])
		if string(got) != w {
			t.Errorf("%s: %s, want %s", topic, got, w)
		}
	}
	// plain2 (no description) was not broadcast: the next notice is the
	// removal of "added" by one more reload.
	final := strings.Replace(updated, `  added: {module: inittools, function: plain_fn, description: "added later"}`+"\n", "", 1)
	must(t, os.WriteFile(h.cfg.ManifestPath+".tmp", []byte(final), 0o644))
	must(t, os.Rename(h.cfg.ManifestPath+".tmp", h.cfg.ManifestPath))
	if topic, m := h.nextNotice("removed/added"); topic != base+"/sam_remote_tool/removed/added" {
		t.Errorf("next notice %s %v, want removed/added (plain2 has no description: no broadcast)", topic, m)
	}
}
