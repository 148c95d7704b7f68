package runner

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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

// inputArtifact writes content as the input file name and returns its
// artifact_metadata entry (spec §7.3) and its local path.
func (h *harness) inputArtifact(name, mime string, version int, content string) ArtifactMeta {
	h.t.Helper()
	p := filepath.Join(h.input, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		h.t.Fatal(err)
	}
	return ArtifactMeta{Filename: name, MimeType: mime, Version: version, LocalPath: p}
}

// outputs returns the files the run left in the output directory.
func (h *harness) outputs() map[string]string {
	h.t.Helper()
	entries, err := os.ReadDir(h.output)
	if err != nil {
		h.t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(h.output, e.Name()))
		if err != nil {
			h.t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	return files
}

// generationTools are tools of every generation the reference runs, each
// sync and async: plain functions, functions taking the legacy ctx,
// class-based tools (DynamicTool and str's older class convention) and
// portable tools.
const generationTools = `
from typing import Any

def plain(name: str):
    return {"hello": name}

async def plain_async(name: str):
    return {"hello": name}

def with_ctx(ctx, name):
    ctx.send_status("with ctx")
    return {"hello": name, "app": ctx.app_name}

async def with_ctx_async(ctx: Any, name: str):
    ctx.send_status("with ctx")
    return {"hello": name, "app": ctx.app_name}

class OlderClass:
    def __init__(self, tool_config=None):
        self.prefix = (tool_config or {}).get("greeting_prefix", "Hi")
    def run(self, ctx, name):
        return {"hello": "%s %s" % (self.prefix, name)}

class OlderClassAsync(OlderClass):
    async def run(self, ctx, name):
        return {"hello": "%s %s" % (self.prefix, name)}
`

func TestGenerationsRun(t *testing.T) {
	cases := []struct {
		name, module, function, class, args, want string
		status                                    []string
	}{
		{"function", "gen", "plain", "", `{"name":"Ann"}`, `{"hello":"Ann"}`, nil},
		{"function/async", "gen", "plain_async", "", `{"name":"Ann"}`, `{"hello":"Ann"}`, nil},
		{"function with ctx", "gen", "with_ctx", "", `{"name":"Ann"}`, `{"hello":"Ann","app":"MyAgent"}`, []string{"with ctx"}},
		{"function with ctx/async", "gen", "with_ctx_async", "", `{"name":"Ann"}`, `{"hello":"Ann","app":"MyAgent"}`, []string{"with ctx"}},
		{"class-based DynamicTool/async", "class_tools", "", "GreeterTool", `{"name":"Ann","shout":true}`, `{"greeting":"HEY, ANN!","tool_context_is_none":true}`, nil},
		// a function named with class_name is ignored for a DynamicTool, as by the reference
		{"class-based DynamicTool, function ignored", "class_tools", "tool_name", "GreeterTool", `{"name":"Ann"}`, `{"greeting":"Hey, Ann!","tool_context_is_none":true}`, nil},
		{"class-based, older convention", "gen", "run", "OlderClass", `{"name":"Ann"}`, `{"hello":"Hey Ann"}`, nil},
		{"class-based, older convention/async", "gen", "run", "OlderClassAsync", `{"name":"Ann"}`, `{"hello":"Hey Ann"}`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, map[string]string{"gen.py": generationTools, "class_tools.py": exampleTool(t, "class_tools.py")})
			a := h.args(c.module, c.function, c.args)
			a.ClassName = c.class
			a.ToolConfig = json.RawMessage(`{"greeting_prefix":"Hey"}`)
			out, lines := h.run(a)
			wantResult(t, out, c.want)
			if !reflect.DeepEqual(lines, c.status) {
				t.Errorf("status lines = %q, want %q", lines, c.status)
			}
		})
	}
}

func TestClassBasedDynamicToolArtifactsAndFacade(t *testing.T) {
	// WordCountTool names its artifact parameter in artifact_args and its
	// facade in ctx_facade_param_name; its _run_async_impl is synchronous.
	h := newHarness(t, map[string]string{"class_tools.py": exampleTool(t, "class_tools.py")})
	a := h.args("", "", `{"document":"notes.txt"}`)
	a.Module, a.ClassName = "class_tools", "WordCountTool"
	meta := h.inputArtifact("notes.txt", "text/plain", 4, "one two three\nfour\n")
	a.ArtifactMetadata = map[string]ArtifactMeta{"document": meta}
	a.ArtifactPaths = map[string]string{"document": meta.LocalPath}
	out, lines := h.run(a)
	wantResult(t, out, `{"filename":"notes.txt","version":4,"words":4,"user_id":"user-42"}`)
	if !reflect.DeepEqual(lines, []string{"counting words of notes.txt"}) {
		t.Errorf("status lines = %q", lines)
	}
}

func TestClassBasedConfigModel(t *testing.T) {
	// A DynamicTool with a config_model gets the validated model, as the
	// reference builds it; a validation failure is an import error (the
	// tool cannot be instantiated).
	src := `
from solace_agent_mesh.agent.tools.dynamic_tool import DynamicTool

class Config:
    def __init__(self, limit):
        self.limit = limit
    @classmethod
    def model_validate(cls, data):
        if not isinstance(data.get("limit"), int):
            raise ValueError("limit must be an integer")
        return cls(data["limit"])

class Limited(DynamicTool):
    config_model = Config
    tool_name = "limited"
    tool_description = "d"
    parameters_schema = None
    async def _run_async_impl(self, args, tool_context=None, credential=None):
        return {"limit": self.tool_config.limit, "config_type": type(self.tool_config).__name__}
`
	h := newHarness(t, map[string]string{"lim.py": src})
	a := h.args("lim", "", `{}`)
	a.ClassName = "Limited"
	a.ToolConfig = json.RawMessage(`{"limit": 3}`)
	out, _ := h.run(a)
	wantResult(t, out, `{"limit":3,"config_type":"Config"}`)

	h2 := newHarness(t, map[string]string{"lim.py": src})
	a2 := h2.args("lim", "", `{}`)
	a2.ClassName = "Limited"
	a2.ToolConfig = json.RawMessage(`{"limit": "many"}`)
	out2, _ := h2.run(a2)
	wantError(t, out2, KindImport, "cannot instantiate lim.Limited", "limit must be an integer")
}

func TestPortableToolResult(t *testing.T) {
	// The result is the reference's json.dumps(ToolResult.model_dump(),
	// default=str), byte for byte; data objects to become artifacts are
	// files in the output directory and leave data_objects, inline ones
	// stay.
	cases := []struct {
		function, want string
		files          map[string]string
	}{
		{
			"portable_echo",
			`{"status": "success", "message": "Echoed: hey", "data": null, "data_objects": [], "error_code": null}`,
			map[string]string{"echo_output.txt": "Echoed: hey\nUser: user-42\nSession: web-session-abc"},
		},
		{
			"portable_echo_sync",
			`{"status": "success", "message": "Echoed: hey", "data": {"length": 3}, "data_objects": [{"name": "note", "content": "inline, not saved", "mime_type": "text/plain", "disposition": "inline", "description": null, "preview": null, "metadata": null, "tags": null}], "error_code": null}`,
			map[string]string{"echo_output.txt": "Echoed: hey"},
		},
	}
	for _, c := range cases {
		t.Run(c.function, func(t *testing.T) {
			h := newHarness(t, map[string]string{"portable_tools.py": exampleTool(t, "portable_tools.py")})
			out, lines := h.run(h.args("portable_tools", c.function, `{"message":"hey"}`))
			if out.Error != "" {
				t.Fatalf("%s: %s", out.ErrorKind, out.Error)
			}
			if string(out.Result) != c.want {
				t.Errorf("result\n got %s\nwant %s", out.Result, c.want)
			}
			if got := h.outputs(); !reflect.DeepEqual(got, c.files) {
				t.Errorf("output files = %q, want %q", got, c.files)
			}
			if len(out.OutputMimeTypes) != 0 {
				t.Errorf("data objects must take their mime type from the extension, as the reference's: %v", out.OutputMimeTypes)
			}
			if !reflect.DeepEqual(lines, []string{"Processing message..."}) {
				t.Errorf("status lines = %q", lines)
			}
		})
	}
}

func TestPortableDataObjectShapes(t *testing.T) {
	src := `
from solace_agent_mesh.agent.tools.tool_result import ToolResult, DataObject, DataDisposition

def shapes(ctx):
    return ToolResult.partial(
        "some failed",
        data_objects=[
            DataObject(name="raw", content=b"\x00\xff", disposition=DataDisposition.INLINE, tags=["__working"]),
            {"name": "preview.csv", "content": "a,b\n1,2\n", "mime_type": "text/csv",
             "disposition": "artifact_with_preview", "preview": "a,b"},
            DataObject(name="chart.png", content=b"\x89PNG", mime_type="image/png", disposition="artifact"),
        ],
        error_code="PARTIAL",
    )

async def unsafe(ctx):
    return ToolResult.ok("x", data_objects=[DataObject(name="../escape.txt", content="no")])

class NotAResult:
    def __init__(self):
        self.data_objects = [DataObject(name="from_any_object.txt", content="saved")]
    def __str__(self):
        return "NotAResult with %d data objects" % len(self.data_objects)

def duck(ctx):
    return NotAResult()
`
	h := newHarness(t, map[string]string{"shapes.py": src})
	out, _ := h.run(h.args("shapes", "shapes", `{}`))
	want := `{"status": "partial", "message": "some failed", "data": null, "data_objects": [{"name": "raw", "content": "b'\\x00\\xff'", "mime_type": "text/plain", "disposition": "inline", "description": null, "preview": null, "metadata": null, "tags": ["__working"]}], "error_code": "PARTIAL"}`
	if out.Error != "" || string(out.Result) != want {
		t.Errorf("result\n got %s (%s)\nwant %s", out.Result, out.Error, want)
	}
	if got, wantFiles := h.outputs(), map[string]string{"preview.csv": "a,b\n1,2\n", "chart.png": "\x89PNG"}; !reflect.DeepEqual(got, wantFiles) {
		t.Errorf("output files = %q, want %q", got, wantFiles)
	}

	h2 := newHarness(t, map[string]string{"shapes.py": src})
	out2, _ := h2.run(h2.args("shapes", "unsafe", `{}`))
	wantError(t, out2, KindExecution, "unsafe artifact filename", "../escape.txt")
	if got := h2.outputs(); len(got) != 0 {
		t.Errorf("output files = %q", got)
	}

	// Any return value with data_objects has them extracted (the
	// reference's test), then becomes its str().
	h3 := newHarness(t, map[string]string{"shapes.py": src})
	out3, _ := h3.run(h3.args("shapes", "duck", `{}`))
	wantResult(t, out3, `{"text":"NotAResult with 0 data objects","data_objects":[]}`)
	if got := h3.outputs(); !reflect.DeepEqual(got, map[string]string{"from_any_object.txt": "saved"}) {
		t.Errorf("output files = %q", got)
	}
}

func TestPortableArtifactParameters(t *testing.T) {
	t.Run("Artifact and facade/async", func(t *testing.T) {
		h := newHarness(t, map[string]string{"portable_tools.py": exampleTool(t, "portable_tools.py")})
		a := h.args("portable_tools", "portable_process_file", `{"input_file":"report.md"}`)
		meta := h.inputArtifact("report.md", "text/markdown", 2, "# Title\nbody text here\n")
		a.ArtifactMetadata = map[string]ArtifactMeta{"input_file": meta}
		a.ArtifactPaths = map[string]string{"input_file": meta.LocalPath}
		out, _ := h.run(a)
		want := `{"status": "success", "message": "Processed report.md: 3 lines", "data": {"line_count": 3, "facade_sees_same_bytes": true}, "data_objects": [], "error_code": null}`
		if out.Error != "" || string(out.Result) != want {
			t.Errorf("result\n got %s (%s)\nwant %s", out.Result, out.Error, want)
		}
		wantFiles := map[string]string{"processing_summary.txt": "Filename: report.md\nMIME type: text/markdown\nVersion: 2\nLines: 3\nWords: 5"}
		if got := h.outputs(); !reflect.DeepEqual(got, wantFiles) {
			t.Errorf("output files = %q, want %q", got, wantFiles)
		}
	})
	t.Run("List and Optional/sync", func(t *testing.T) {
		h := newHarness(t, map[string]string{"portable_tools.py": exampleTool(t, "portable_tools.py")})
		a := h.args("portable_tools", "portable_merge", `{"parts":["a.txt","b.txt"],"header":"h.txt","separator":"|"}`)
		ma := h.inputArtifact("a.txt", "text/plain", 1, "A")
		mb := h.inputArtifact("b.txt", "text/plain", 1, "B")
		mh := h.inputArtifact("h.txt", "text/plain", 1, "H")
		a.ArtifactMetadata = map[string]ArtifactMeta{"parts[0]": ma, "parts[1]": mb, "header": mh}
		out, _ := h.run(a)
		wantResult(t, out, `{"status":"success","message":"Merged 3 artifacts","data":{"names":["a.txt","b.txt"],"header":"h.txt"},"data_objects":[],"error_code":null}`)
		if got := h.outputs(); got["merged.bin"] != "H|A|B" {
			t.Errorf("merged.bin = %q", got["merged.bin"])
		}
	})
	t.Run("Optional left out", func(t *testing.T) {
		h := newHarness(t, map[string]string{"portable_tools.py": exampleTool(t, "portable_tools.py")})
		a := h.args("portable_tools", "portable_merge", `{"parts":["a.txt"]}`)
		a.ArtifactMetadata = map[string]ArtifactMeta{"parts[0]": h.inputArtifact("a.txt", "text/plain", 1, "A")}
		out, _ := h.run(a)
		wantResult(t, out, `{"status":"success","message":"Merged 1 artifacts","data":{"names":["a.txt"],"header":null},"data_objects":[],"error_code":null}`)
	})
	t.Run("annotation spellings", func(t *testing.T) {
		src := `
from __future__ import annotations
import typing
from typing import List, Optional, Union
from solace_agent_mesh.agent.tools import Artifact

def spelled(one: Artifact, many: list[Artifact], maybe: Optional[Artifact], union: Union[Artifact, None],
            dotted: "artifact_types.Artifact", pep604: Artifact | None = None, absent: Optional[List[Artifact]] = None):
    got = {}
    for name, value in (("one", one), ("maybe", maybe), ("union", union), ("dotted", dotted), ("pep604", pep604)):
        got[name] = [type(value).__name__, value.as_text() if value is not None else None]
    got["many"] = [a.as_bytes().decode() for a in many]
    got["absent"] = absent
    got["one_meta"] = [one.filename, one.version, one.mime_type, one.metadata]
    return got
`
		h := newHarness(t, map[string]string{"spell.py": src})
		a := h.args("spell", "spelled", `{"one":"x","many":["x","y"],"maybe":"x","union":"y","dotted":"x","pep604":"y"}`)
		mx := h.inputArtifact("x", "text/plain", 7, "X")
		my := h.inputArtifact("y", "", 0, "Y")
		a.ArtifactMetadata = map[string]ArtifactMeta{"one": mx, "many[0]": mx, "many[1]": my, "maybe": mx, "union": my, "dotted": mx, "pep604": my}
		out, _ := h.run(a)
		wantResult(t, out, `{"one":["Artifact","X"],"maybe":["Artifact","X"],"union":["Artifact","Y"],"dotted":["Artifact","X"],"pep604":["Artifact","Y"],"many":["X","Y"],"absent":[],"one_meta":["x",7,"text/plain",{}]}`)
	})
	t.Run("missing metadata keeps the filename", func(t *testing.T) {
		// as the reference: no metadata (or no file) for a parameter leaves
		// what the agent sent
		src := "from solace_agent_mesh.agent.tools import Artifact\n\ndef f(doc: Artifact):\n    return {'doc': doc}\n"
		h := newHarness(t, map[string]string{"miss.py": src})
		out, _ := h.run(h.args("miss", "f", `{"doc":"gone.txt"}`))
		wantResult(t, out, `{"doc":"gone.txt"}`)
	})
}

func TestPortableFacade(t *testing.T) {
	src := `
from solace_agent_mesh.agent.utils.tool_context_facade import ToolContextFacade

async def use_facade(question: str, ctx: ToolContextFacade, tool_config: dict = None):
    ctx.state["k"] = 1
    names = await ctx.list_artifacts()
    meta = await ctx.load_artifact_metadata("data.csv")
    text = await ctx.load_artifact("data.csv", as_text=True)
    raw = await ctx.load_artifact("data.csv")
    try:
        await ctx.load_artifact("absent.txt")
        missing = "found?"
    except FileNotFoundError as e:
        missing = type(e).__name__
    ctx.save_artifact("legacy_out.txt", b"saved the old way")
    return {
        "question": question, "names": names, "meta": meta, "text": text, "raw_is_bytes": isinstance(raw, bytes),
        "exists": [await ctx.artifact_exists("data.csv"), await ctx.artifact_exists("nope")],
        "missing": missing, "signal": ctx.send_signal({"x": 1}), "raw_tool_context": ctx.raw_tool_context,
        "state": ctx.state, "config": ctx.get_config("mode"), "tool_config": tool_config,
        "ids": [ctx.user_id, ctx.session_id, ctx.app_name], "status": ctx.send_status("hi"),
        "by_param": ctx.load_artifact_by_param("table").decode(), "outputs": ctx.list_output_artifacts(),
    }
`
	h := newHarness(t, map[string]string{"fac2.py": src})
	a := h.args("fac2", "use_facade", `{"question":"q"}`)
	meta := h.inputArtifact("data.csv", "text/csv", 5, "a,b\n")
	a.ArtifactMetadata = map[string]ArtifactMeta{"table": meta}
	a.ArtifactPaths = map[string]string{"table": meta.LocalPath}
	a.ToolConfig = json.RawMessage(`{"mode":"fast"}`)
	out, lines := h.run(a)
	wantResult(t, out, `{"question":"q","names":["data.csv"],"meta":{"mime_type":"text/csv","size_bytes":4,"version":5},
		"text":"a,b\n","raw_is_bytes":true,"exists":[true,false],"missing":"FileNotFoundError","signal":false,
		"raw_tool_context":null,"state":{"k":1},"config":"fast","tool_config":{"mode":"fast"},
		"ids":["user-42","web-session-abc","MyAgent"],"status":true,"by_param":"a,b\n","outputs":["legacy_out.txt"]}`)
	if !reflect.DeepEqual(lines, []string{"hi"}) {
		t.Errorf("status lines = %q", lines)
	}
}

func TestReferencePackagePreferred(t *testing.T) {
	// An importable solace_agent_mesh is used, not the runner's stand-in,
	// and the stand-in never fills a submodule the real package lacks.
	tools := map[string]string{
		"solace_agent_mesh/__init__.py":                "",
		"solace_agent_mesh/agent/__init__.py":          "",
		"solace_agent_mesh/agent/tools/__init__.py":    "",
		"solace_agent_mesh/agent/tools/tool_result.py": "ORIGIN = 'installed'\nclass ToolResult:\n    def __init__(self, **kw):\n        self.data_objects = []\n    def model_dump(self):\n        return {'from': ORIGIN}\n",
		"real.py":    "from solace_agent_mesh.agent.tools.tool_result import ToolResult\n\ndef f():\n    return ToolResult()\n",
		"partial.py": "from solace_agent_mesh.agent.tools.artifact_types import Artifact\n\ndef f():\n    return {}\n",
		"standin.py": "import solace_agent_mesh.agent.tools.tool_result as tr\n\ndef f():\n    return {'doc': tr.__doc__}\n",
	}
	h := newHarness(t, tools)
	out, _ := h.run(h.args("real", "f", `{}`))
	wantResult(t, out, `{"from":"installed"}`)

	h2 := newHarness(t, tools)
	out2, _ := h2.run(h2.args("partial", "f", `{}`))
	wantError(t, out2, KindImport, "No module named 'solace_agent_mesh.agent.tools.artifact_types'")

	h3 := newHarness(t, map[string]string{"standin.py": tools["standin.py"]})
	out3, _ := h3.run(h3.args("standin", "f", `{}`))
	wantResult(t, out3, `{"doc":"str runner stand-in for the reference's solace_agent_mesh.agent.tools.tool_result (not installed here)."}`)
}
