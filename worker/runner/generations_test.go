package runner

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// exampleTool returns the source of one of the example tool modules under
// examples/tools/python (the tests run them as users will).
func exampleTool(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "examples", "tools", "python", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// initArgs returns the arguments of an init-mode run: what the worker's
// init sub-protocol sends (no args, no status pipe, no output dir).
func (h *harness) initArgs(module, function, class string, toolConfig string) *Args {
	return &Args{
		Module:     module,
		Function:   function,
		ClassName:  class,
		ToolConfig: json.RawMessage(toolConfig),
		ResultFile: h.result,
		Mode:       ModeInit,
	}
}

// wantInit checks an init-mode outcome against want, an InitInfo in JSON,
// field by field (the result must decode into InitInfo with nothing left
// over).
func wantInit(t *testing.T, out *Outcome, want string) {
	t.Helper()
	if out.Error != "" {
		t.Fatalf("init failed (%s): %s", out.ErrorKind, out.Error)
	}
	dec := json.NewDecoder(strings.NewReader(string(out.Result)))
	dec.DisallowUnknownFields()
	var info InitInfo
	if err := dec.Decode(&info); err != nil {
		t.Fatalf("result %s is not an InitInfo: %v", out.Result, err)
	}
	wantResult(t, out, want)
}

func TestInitModeClassBased(t *testing.T) {
	h := newHarness(t, map[string]string{"class_tools.py": exampleTool(t, "class_tools.py")})
	out, _ := h.run(h.initArgs("class_tools", "", "GreeterTool", `{"greeting_prefix":"Hi"}`))
	// init() ran before the description was read: it names the prefix
	// from the tool config and the Python version.
	wantInit(t, out, `{
		"tool_name": "greeter",
		"description": "Greets a name with the prefix 'Hi' (Python `+pythonVersion(t, h)+`).",
		"parameters_schema": {"type": "OBJECT", "properties": {
			"name": {"type": "STRING", "description": "Who to greet"},
			"shout": {"type": "BOOLEAN", "description": "Upper-case the greeting", "nullable": true}},
			"required": ["name"]}}`)

	h2 := newHarness(t, map[string]string{"class_tools.py": exampleTool(t, "class_tools.py")})
	out2, _ := h2.run(h2.initArgs("class_tools", "", "WordCountTool", ``))
	wantInit(t, out2, `{
		"tool_name": "word_count",
		"description": "Counts the words of a text artifact.",
		"parameters_schema": {"type": "OBJECT", "properties": {"document": {"type": "STRING", "description": "Artifact filename"}}, "required": ["document"]},
		"ctx_facade_param_name": "ctx",
		"artifact_params": {"document": {"is_list": false, "is_optional": false}}}`)
}

func pythonVersion(t *testing.T, h *harness) string {
	t.Helper()
	b, err := exec.Command(h.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").Output()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestInitModeSchemaObjects(t *testing.T) {
	// parameters_schema as the agent's Schema type is a pydantic model:
	// model_dump(exclude_none=True) is what the reference reports; an
	// object with to_dict() is asked for that. init() and cleanup() are
	// awaited in that order; a cleanup failure does not fail the init.
	src := `
import enum
from solace_agent_mesh.agent.tools.dynamic_tool import DynamicTool

class Type(str, enum.Enum):
    OBJECT = "OBJECT"
    STRING = "STRING"

class Schema:
    def __init__(self, **kw):
        self.kw = kw
    def model_dump(self, exclude_none=False):
        out = {}
        for k, v in self.kw.items():
            if v is None and exclude_none:
                continue
            if isinstance(v, Schema):
                v = v.model_dump(exclude_none=exclude_none)
            elif isinstance(v, dict):
                v = {a: b.model_dump(exclude_none=exclude_none) for a, b in v.items()}
            out[k] = v
        return out

events = []

class Modelled(DynamicTool):
    tool_name = "modelled"
    @property
    def tool_description(self):
        return "events: " + ",".join(events)
    @property
    def parameters_schema(self):
        return Schema(type=Type.OBJECT, properties={"q": Schema(type=Type.STRING, description=None)}, required=["q"])
    async def init(self, component, tool_config):
        events.append("init(%s,%s)" % (component, sorted(tool_config)))
    async def cleanup(self, component, tool_config):
        raise RuntimeError("cleanup fails")
    async def _run_async_impl(self, args, tool_context=None, credential=None):
        return {}

class ToDict(Modelled):
    tool_name = "to_dict"
    @property
    def parameters_schema(self):
        class S:
            def to_dict(self):
                return {"type": "OBJECT", "properties": {}}
        return S()

class BrokenSchema(Modelled):
    tool_name = "broken"
    @property
    def parameters_schema(self):
        raise ValueError("no schema today")
`
	cases := []struct{ class, want string }{
		{"Modelled", `{"tool_name":"modelled","description":"events: init(None,['k'])","parameters_schema":{"type":"OBJECT","properties":{"q":{"type":"STRING"}},"required":["q"]}}`},
		{"ToDict", `{"tool_name":"to_dict","description":"events: init(None,['k'])","parameters_schema":{"type":"OBJECT","properties":{}}}`},
		{"BrokenSchema", `{"tool_name":"broken","description":"events: init(None,['k'])"}`},
	}
	for _, c := range cases {
		t.Run(c.class, func(t *testing.T) {
			h := newHarness(t, map[string]string{"modelled.py": src})
			out, _ := h.run(h.initArgs("modelled", "", c.class, `{"k":1}`))
			wantInit(t, out, c.want)
		})
	}
}

func TestInitModeFunction(t *testing.T) {
	// A function tool is described as the reference's agent describes a
	// function it wraps: name, docstring, schema from the signature; the
	// facade, tool_config and the legacy ctx are not parameters the agent
	// sends.
	h := newHarness(t, map[string]string{"portable_tools.py": exampleTool(t, "portable_tools.py")})
	out, _ := h.run(h.initArgs("portable_tools", "portable_merge", "", ``))
	wantInit(t, out, `{
		"tool_name": "portable_merge",
		"description": "Joins several artifacts (and an optional header) into merged.bin.",
		"parameters_schema": {"type": "OBJECT", "properties": {
			"parts": {"type": "ARRAY", "items": {"type": "STRING"}, "nullable": false},
			"header": {"type": "STRING", "nullable": true},
			"separator": {"type": "STRING", "nullable": false}},
			"required": ["parts"]},
		"artifact_params": {"parts": {"is_list": true, "is_optional": false}, "header": {"is_list": false, "is_optional": true}}}`)

	src := `
from __future__ import annotations
from typing import Any, Dict, List, Optional

def legacy(ctx: Any, count: int, ratio: float = 1.0, flags: Optional[List[str]] = None,
           opts: Dict[str, Any] = None, on: bool = False, tool_config: dict = None, **kwargs):
    """Counts.

    More text."""
    return {}
`
	h2 := newHarness(t, map[string]string{"legacy.py": src})
	out2, _ := h2.run(h2.initArgs("legacy", "legacy", "", ``))
	wantInit(t, out2, `{
		"tool_name": "legacy",
		"description": "Counts.\n\nMore text.",
		"parameters_schema": {"type": "OBJECT", "properties": {
			"count": {"type": "INTEGER", "nullable": false},
			"ratio": {"type": "NUMBER", "nullable": false},
			"flags": {"type": "ARRAY", "nullable": true},
			"opts": {"type": "OBJECT", "nullable": false},
			"on": {"type": "BOOLEAN", "nullable": false}},
			"required": ["count"]}}`)
}

func TestInitModeErrors(t *testing.T) {
	src := `
from solace_agent_mesh.agent.tools.dynamic_tool import DynamicTool
from str_tool import ToolError

class FailsInit(DynamicTool):
    tool_name = "f"
    tool_description = "d"
    parameters_schema = None
    async def init(self, component, tool_config):
        raise ConnectionError("database unreachable")
    async def _run_async_impl(self, args, tool_context=None, credential=None):
        return {}

class RefusesInit(FailsInit):
    async def init(self, component, tool_config):
        raise ToolError("not configured")

class Abstract(DynamicTool):
    pass
`
	cases := []struct {
		name, module, function, class, kind string
		contains                            []string
	}{
		{"missing module", "nope", "", "Tool", KindImport, []string{"cannot import module 'nope'"}},
		{"missing class", "dyn", "", "Nope", KindImport, []string{"has no attribute 'Nope'"}},
		{"missing function", "dyn", "nope", "", KindImport, []string{"no callable attribute 'nope'"}},
		{"abstract class", "dyn", "", "Abstract", KindImport, []string{"cannot instantiate dyn.Abstract", "abstract"}},
		{"init raises", "dyn", "", "FailsInit", KindExecution, []string{"ConnectionError: database unreachable", "in init"}},
		{"init raises ToolError", "dyn", "", "RefusesInit", KindTool, []string{"not configured"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, map[string]string{"dyn.py": src})
			out, _ := h.run(h.initArgs(c.module, c.function, c.class, ``))
			wantError(t, out, c.kind, c.contains...)
		})
	}
}

func TestEncodeArgsModes(t *testing.T) {
	base := Args{Module: "m", ClassName: "C", ResultFile: "/r"}
	for _, mode := range []string{"", ModeInvoke, ModeInit} {
		a := base
		a.Mode = mode
		data, err := EncodeArgs(&a)
		if err != nil {
			t.Fatalf("mode %q: %v", mode, err)
		}
		var doc map[string]any
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		if got, ok := doc["mode"]; (mode == "") == ok || (ok && got != mode) {
			t.Errorf("mode %q encoded as %v (present %t)", mode, got, ok)
		}
	}
	a := base
	a.Mode = "describe"
	if _, err := EncodeArgs(&a); err == nil || !strings.Contains(err.Error(), `mode "describe" is neither "invoke" nor "init"`) {
		t.Errorf("bad mode: err = %v", err)
	}
	a = base
	a.ClassName = ""
	a.Mode = ModeInit
	if _, err := EncodeArgs(&a); err == nil || !strings.Contains(err.Error(), "function and class_name are both empty") {
		t.Errorf("init without class or function: err = %v", err)
	}
}
