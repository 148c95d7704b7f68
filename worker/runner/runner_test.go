package runner

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// pythonBin returns the interpreter the tests run runner.py with.
func pythonBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("STR_TEST_PYTHON")
	if bin == "" {
		bin = "/usr/bin/python3"
	}
	if _, err := os.Stat(bin); err != nil {
		msg := fmt.Sprintf("python interpreter %s not available (%v); set STR_TEST_PYTHON", bin, err)
		mustwork.Skip(t, msg)
	}
	return bin
}

// harness is one tool run: a tools dir, a work dir laid out as spec §7.1
// and the installed runner.
type harness struct {
	t       *testing.T
	python  string
	env     []string // more of the runner's environment
	runner  string
	tools   string
	work    string
	output  string
	input   string
	fifo    string
	result  string
	argPath string
}

func newHarness(t *testing.T, modules map[string]string) *harness {
	t.Helper()
	h := &harness{t: t, python: pythonBin(t)}
	root := t.TempDir()
	h.tools = filepath.Join(root, "tools")
	h.work = filepath.Join(root, "work")
	h.output = filepath.Join(h.work, "output")
	h.input = filepath.Join(h.work, "input")
	h.fifo = filepath.Join(h.work, "status.pipe")
	h.result = filepath.Join(h.work, "result.json")
	h.argPath = filepath.Join(h.work, "runner_args.json")
	for _, d := range []string{h.tools, h.output, h.input, filepath.Join(root, "bin")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, src := range modules {
		p := filepath.Join(h.tools, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Mkfifo(h.fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var err error
	if h.runner, err = Install(filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	return h
}

// args returns runner arguments for module.function with the harness paths.
func (h *harness) args(module, function, argsJSON string) *Args {
	return &Args{
		Module:     module,
		Function:   function,
		Args:       json.RawMessage(argsJSON),
		StatusPipe: h.fifo,
		ResultFile: h.result,
		OutputDir:  h.output,
		UserID:     "user-42",
		SessionID:  "web-session-abc",
		AppName:    "MyAgent",
	}
}

// run writes the arguments, opens the FIFO's read end first (as the worker
// does), runs the runner and returns its outcome and the status lines.
func (h *harness) run(a *Args) (*Outcome, []string) {
	h.t.Helper()
	return h.runMode(a, false)
}

// runMode is run, in warm mode when warm is set: the runner started with
// --warm 3 MODULE FUNCTION reads the arguments file's bytes on descriptor 3.
func (h *harness) runMode(a *Args, warm bool) (*Outcome, []string) {
	h.t.Helper()
	if err := WriteArgs(h.argPath, a); err != nil {
		h.t.Fatal(err)
	}
	// Read end first (non-blocking open), then a write end held by the
	// test so the reader sees EOF only after the tool exited and we close it.
	rd, err := os.OpenFile(h.fifo, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	defer rd.Close()
	hold, err := os.OpenFile(h.fifo, os.O_WRONLY, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	linesCh := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(rd)
		sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
		for sc.Scan() {
			var msg struct {
				Status *string `json:"status"`
			}
			if err := json.Unmarshal(sc.Bytes(), &msg); err != nil || msg.Status == nil {
				lines = append(lines, "MALFORMED:"+sc.Text())
				continue
			}
			lines = append(lines, *msg.Status)
		}
		linesCh <- lines
	}()

	argv := Command(h.python, h.runner, h.argPath)
	var argsR *os.File
	if warm {
		data, err := os.ReadFile(h.argPath)
		if err != nil {
			h.t.Fatal(err)
		}
		var argsW *os.File
		argsR, argsW, err = os.Pipe()
		if err != nil {
			h.t.Fatal(err)
		}
		defer argsR.Close()
		go func() {
			argsW.Write(data)
			argsW.Close()
		}()
		argv = Command(h.python, h.runner, "--warm", "3", a.Module, a.Function)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	if warm {
		cmd.ExtraFiles = []*os.File{argsR}
	}
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "PYTHONPATH=" + h.tools, "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"}, h.env...)
	cmd.Dir = h.work
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	runErr := cmd.Run()
	hold.Close()
	lines := <-linesCh
	if runErr != nil {
		h.t.Fatalf("runner exited with %v; output:\n%s", runErr, stderr.String())
	}
	out, err := ReadResult(h.result, 1<<20)
	if err != nil {
		h.t.Fatalf("ReadResult: %v; runner output:\n%s", err, stderr.String())
	}
	return out, lines
}

func resultMap(t *testing.T, out *Outcome) map[string]any {
	t.Helper()
	if out.Error != "" {
		t.Fatalf("tool failed (%s): %s", out.ErrorKind, out.Error)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Result, &m); err != nil {
		t.Fatalf("result %s: %v", out.Result, err)
	}
	return m
}

func wantResult(t *testing.T, out *Outcome, want string) {
	t.Helper()
	got := resultMap(t, out)
	var w map[string]any
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, w) {
		t.Fatalf("result = %s, want %s", out.Result, want)
	}
}

func wantError(t *testing.T, out *Outcome, kind string, contains ...string) {
	t.Helper()
	if out.Error == "" {
		t.Fatalf("want a %s error, got result %s", kind, out.Result)
	}
	if out.ErrorKind != kind {
		t.Fatalf("error kind = %q, want %q; error: %s", out.ErrorKind, kind, out.Error)
	}
	for _, c := range contains {
		if !strings.Contains(out.Error, c) {
			t.Errorf("error does not contain %q:\n%s", c, out.Error)
		}
	}
}

const specExampleTools = `
def echo_tool(ctx, message="Hello"):
    ctx.send_status("echoing")
    return f"Echo: {message}"


def process_file(ctx, input_file):
    ctx.send_status("Loading input file...")
    text = ctx.load_artifact_text("input_file")
    ctx.save_artifact("summary.txt", f"Lines: {len(text.splitlines())}".encode())
    return {"status": "success"}
`

func TestEchoToolSpecExample(t *testing.T) {
	h := newHarness(t, map[string]string{"example_tools.py": specExampleTools})
	out, lines := h.run(h.args("example_tools", "echo_tool", `{"message":"hi"}`))
	wantResult(t, out, `{"text":"Echo: hi","data_objects":[]}`)
	if !reflect.DeepEqual(lines, []string{"echoing"}) {
		t.Errorf("status lines = %q", lines)
	}
}

func TestEchoToolDefaultArgument(t *testing.T) {
	h := newHarness(t, map[string]string{"example_tools.py": specExampleTools})
	out, _ := h.run(h.args("example_tools", "echo_tool", `{}`))
	wantResult(t, out, `{"text":"Echo: Hello","data_objects":[]}`)
}

func TestProcessFileSpecExample(t *testing.T) {
	h := newHarness(t, map[string]string{"example_tools.py": specExampleTools})
	in := filepath.Join(h.input, "data.csv")
	if err := os.WriteFile(in, []byte("a,b\n1,2\n3,4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := h.args("example_tools", "process_file", `{}`)
	a.ArtifactPaths = map[string]string{"input_file": in}
	a.ArtifactMetadata = map[string]ArtifactMeta{"input_file": {Filename: "data.csv", MimeType: "text/csv", Version: 0, LocalPath: in}}
	out, lines := h.run(a)
	wantResult(t, out, `{"status":"success"}`)
	if !reflect.DeepEqual(lines, []string{"Loading input file..."}) {
		t.Errorf("status lines = %q", lines)
	}
	got, err := os.ReadFile(filepath.Join(h.output, "summary.txt"))
	if err != nil || string(got) != "Lines: 3" {
		t.Fatalf("summary.txt = %q, %v", got, err)
	}
}

func TestAsyncTool(t *testing.T) {
	h := newHarness(t, map[string]string{"atool.py": `
import asyncio

async def slow_double(ctx, n):
    await asyncio.sleep(0.01)
    ctx.send_status("half way")
    return {"value": n * 2}
`})
	out, lines := h.run(h.args("atool", "slow_double", `{"n": 21}`))
	wantResult(t, out, `{"value":42}`)
	if !reflect.DeepEqual(lines, []string{"half way"}) {
		t.Errorf("status lines = %q", lines)
	}
}

func TestToolConfigParameter(t *testing.T) {
	h := newHarness(t, map[string]string{"cfg.py": `
def configured(query: str, tool_config):
    return {"query": query, "key": tool_config.get("api_key")}

def via_ctx(ctx, tool_config=None):
    return {"ctx": ctx.get_config("api_key"), "missing": ctx.get_config("nope", "dflt"), "param": tool_config["api_key"]}
`})
	a := h.args("cfg", "configured", `{"query":"q"}`)
	a.ToolConfig = json.RawMessage(`{"api_key":"k-1"}`)
	out, _ := h.run(a)
	wantResult(t, out, `{"query":"q","key":"k-1"}`)

	h2 := newHarness(t, map[string]string{"cfg.py": h.readTool("cfg.py")})
	a2 := h2.args("cfg", "via_ctx", `{}`)
	a2.ToolConfig = json.RawMessage(`{"api_key":"k-2"}`)
	out2, _ := h2.run(a2)
	wantResult(t, out2, `{"ctx":"k-2","missing":"dflt","param":"k-2"}`)
}

func (h *harness) readTool(name string) string {
	b, err := os.ReadFile(filepath.Join(h.tools, name))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

func TestAnnotatedFacade(t *testing.T) {
	cases := map[string]string{
		"string annotation": `
def tool(query: str, context: "ToolContextFacade"):
    return {"user": context.user_id, "q": query}
`,
		"postponed annotations": `
from __future__ import annotations

class ToolContextFacade:  # a stand-in type named like the reference's facade
    pass

def tool(query: str, context: ToolContextFacade):
    return {"user": context.user_id, "q": query}
`,
		"class annotation from str_tool": `
from str_tool import ToolContext

def tool(query: str, context: ToolContext):
    return {"user": context.user_id, "q": query}
`,
		"class named ToolContextFacade": `
class ToolContextFacade:
    pass

def tool(query: str, context: ToolContextFacade = None):
    return {"user": context.user_id, "q": query}
`,
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, map[string]string{"fac.py": src})
			out, _ := h.run(h.args("fac", "tool", `{"query":"x"}`))
			wantResult(t, out, `{"user":"user-42","q":"x"}`)
		})
	}
}

func TestFirstParameterAmongArgsGetsNoContext(t *testing.T) {
	h := newHarness(t, map[string]string{"plain.py": `
def add(a, b):
    return {"sum": a + b}
`})
	out, _ := h.run(h.args("plain", "add", `{"a": 2, "b": 3}`))
	wantResult(t, out, `{"sum":5}`)
}

func TestClassBasedTool(t *testing.T) {
	src := `
class Greeter:
    def __init__(self, tool_config):
        self.greeting = tool_config.get("greeting", "Hi")

    def greet(self, ctx, name):
        return {"text": f"{self.greeting}, {name} from {ctx.app_name}"}

    def __call__(self, name):
        return {"called": name}
`
	h := newHarness(t, map[string]string{"cls.py": src})
	a := h.args("cls", "greet", `{"name":"Ann"}`)
	a.ClassName = "Greeter"
	a.ToolConfig = json.RawMessage(`{"greeting":"Hello"}`)
	out, _ := h.run(a)
	wantResult(t, out, `{"text":"Hello, Ann from MyAgent"}`)

	h2 := newHarness(t, map[string]string{"cls.py": src})
	a2 := h2.args("cls", "", `{"name":"Bo"}`)
	a2.ClassName = "Greeter"
	out2, _ := h2.run(a2)
	wantResult(t, out2, `{"called":"Bo"}`)

	h3 := newHarness(t, map[string]string{"cls.py": "class Runner:\n    def run(self, ctx, x):\n        return {'x': x, 's': ctx.session_id}\n"})
	a3 := h3.args("cls", "", `{"x":1}`)
	a3.ClassName = "Runner"
	out3, _ := h3.run(a3)
	wantResult(t, out3, `{"x":1,"s":"web-session-abc"}`)
}

func TestNormalisation(t *testing.T) {
	src := `
import datetime, math

def as_dict(ctx):
    return {"a": [1, 2.5, None, True], "nested": {"k": "v"}}

def as_none(ctx):
    return None

def as_str(ctx):
    return "plain text"

def as_int(ctx):
    return 7

def as_list(ctx):
    return [1, "two"]

def odd_dict(ctx):
    return {"when": datetime.date(2026, 2, 9), "s": {1}, "nan": math.nan, 3: "int key"}

def error_dict(ctx):
    return {"error": "a dict is a result, whatever its keys"}
`
	cases := []struct{ fn, want string }{
		{"as_dict", `{"a":[1,2.5,null,true],"nested":{"k":"v"}}`},
		{"as_none", `{"text":null,"data_objects":[]}`},
		{"as_str", `{"text":"plain text","data_objects":[]}`},
		{"as_int", `{"text":"7","data_objects":[]}`},
		{"as_list", `{"text":"[1, 'two']","data_objects":[]}`},
		{"odd_dict", `{"when":"2026-02-09","s":"{1}","nan":"nan","3":"int key"}`},
		{"error_dict", `{"error":"a dict is a result, whatever its keys"}`},
	}
	for _, c := range cases {
		t.Run(c.fn, func(t *testing.T) {
			h := newHarness(t, map[string]string{"norm.py": src})
			out, _ := h.run(h.args("norm", c.fn, `{}`))
			wantResult(t, out, c.want)
			if c.fn == "as_none" && !bytes.Contains(out.Result, []byte(`"text": null`)) {
				t.Errorf("null text must be kept in the result: %s", out.Result)
			}
		})
	}
}

func TestImportErrors(t *testing.T) {
	tools := map[string]string{
		"present.py": "def here(ctx):\n    return None\nnot_callable = 3\n",
		"broken.py":  "import json\nraise RuntimeError('module init failed')\n",
	}
	cases := []struct {
		name, module, function, class string
		contains                      []string
	}{
		{"missing module", "no_such_module", "f", "", []string{"cannot import module 'no_such_module'", "ModuleNotFoundError"}},
		{"missing function", "present", "absent", "", []string{"module 'present' has no attribute 'absent'"}},
		{"not callable", "present", "not_callable", "", []string{"not callable"}},
		{"module raises", "broken", "f", "", []string{"RuntimeError: module init failed", "broken.py"}},
		{"missing class", "present", "run", "Nope", []string{"has no attribute 'Nope'"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, tools)
			a := h.args(c.module, c.function, `{}`)
			a.ClassName = c.class
			out, _ := h.run(a)
			wantError(t, out, KindImport, c.contains...)
		})
	}
}

func TestExecutionErrorHasTracebackTail(t *testing.T) {
	h := newHarness(t, map[string]string{"boom.py": `
def helper(depth):
    if depth == 0:
        raise ValueError("boom at the bottom")
    return helper(depth - 1)

def explode(ctx):
    return helper(50)

def wrong_args(ctx, needed):
    return None
`})
	out, _ := h.run(h.args("boom", "explode", `{}`))
	wantError(t, out, KindExecution, "ValueError: boom at the bottom", "boom.py", "in helper")
	// type and message, then at most TRACEBACK_TAIL_LINES (20) lines.
	if n := strings.Count(out.Error, "\n"); n > 20 {
		t.Errorf("traceback tail has %d lines, want at most 20:\n%s", n, out.Error)
	}

	h2 := newHarness(t, map[string]string{"boom.py": h.readTool("boom.py")})
	out2, _ := h2.run(h2.args("boom", "wrong_args", `{"unexpected": 1}`))
	wantError(t, out2, KindExecution, "do not match the tool's signature")
}

func TestToolError(t *testing.T) {
	src := `
from str_tool import ToolError

class ToolError2(Exception):
    pass

class MyErr(ToolError):
    pass

def via_module(ctx):
    raise ToolError("quota exceeded for this user")

def via_ctx(ctx):
    raise ctx.ToolError("bad input column")

def via_subclass(ctx):
    raise MyErr("subclass counts")

def own_class(ctx):
    class ToolError(Exception):
        pass
    raise ToolError("own class named ToolError")

def not_tool_error(ctx):
    raise ToolError2("only the exact name counts")
`
	cases := []struct{ fn, kind, msg string }{
		{"via_module", KindTool, "quota exceeded for this user"},
		{"via_ctx", KindTool, "bad input column"},
		{"via_subclass", KindTool, "subclass counts"},
		{"own_class", KindTool, "own class named ToolError"},
		{"not_tool_error", KindExecution, "ToolError2: only the exact name counts"},
	}
	for _, c := range cases {
		t.Run(c.fn, func(t *testing.T) {
			h := newHarness(t, map[string]string{"te.py": src})
			out, _ := h.run(h.args("te", c.fn, `{}`))
			wantError(t, out, c.kind, c.msg)
			if c.kind == KindTool && out.Error != c.msg {
				t.Errorf("tool error text = %q, want exactly %q", out.Error, c.msg)
			}
		})
	}
}

func TestStatusLinesCompleteAndOrdered(t *testing.T) {
	h := newHarness(t, map[string]string{"st.py": `
def chatty(ctx, n):
    ok = 0
    for i in range(n):
        if ctx.send_status(f"Processing row {i} of {n}... " + "x" * (i * 37 % 700)):
            ok += 1
    # a line longer than PIPE_BUF still arrives whole
    big = ctx.send_status("L" * 10000)
    return {"ok": ok, "big": big}
`})
	const n = 200
	out, lines := h.run(h.args("st", "chatty", fmt.Sprintf(`{"n": %d}`, n)))
	wantResult(t, out, fmt.Sprintf(`{"ok":%d,"big":true}`, n))
	if len(lines) != n+1 {
		t.Fatalf("got %d status lines, want %d", len(lines), n+1)
	}
	for i := 0; i < n; i++ {
		want := fmt.Sprintf("Processing row %d of %d... ", i, n) + strings.Repeat("x", i*37%700)
		if lines[i] != want {
			t.Fatalf("line %d = %q, want %q", i, lines[i], want)
		}
	}
	if lines[n] != strings.Repeat("L", 10000) {
		t.Fatalf("long line arrived as %d bytes", len(lines[n]))
	}
}

func TestSendStatusWithoutReaderReturnsFalse(t *testing.T) {
	h := newHarness(t, map[string]string{"st.py": `
def probe(ctx):
    no_reader = ctx.send_status("nobody listens")
    ctx._status_pipe = ""
    no_pipe = ctx.send_status("no pipe")
    ctx._status_pipe = "/nonexistent/status.pipe"
    missing = ctx.send_status("missing")
    return {"no_reader": no_reader, "no_pipe": no_pipe, "missing": missing}
`})
	// Run without opening the FIFO's read end: a blocking open would hang.
	if err := WriteArgs(h.argPath, h.args("st", "probe", `{}`)); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(h.python, h.runner, h.argPath)
	cmd.Env = []string{"PYTHONPATH=" + h.tools}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runner: %v\n%s", err, b)
	}
	out, err := ReadResult(h.result, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	wantResult(t, out, `{"no_reader":false,"no_pipe":false,"missing":false}`)
}

func TestContextArtifacts(t *testing.T) {
	h := newHarness(t, map[string]string{"art.py": `
def tool(ctx):
    unsafe = {}
    for name in ["", ".", "..", "a/b", "a\\b", "/etc/passwd", "nul\x00byte", "../up"]:
        try:
            ctx.save_artifact(name, b"x")
            unsafe[repr(name)] = "accepted"
        except ValueError:
            unsafe[repr(name)] = "ValueError"
    p1 = ctx.save_artifact("report.bin", b"\x00\x01", mime_type="application/x-custom")
    p2 = ctx.save_artifact("text.txt", "caf\u00e9")
    p3 = ctx.save_artifact_text("notes.md", "# notes")
    return {
        "unsafe": unsafe,
        "paths_in_output": [p.startswith(ctx._output_dir + "/") for p in (p1, p2, p3)],
        "outputs": ctx.list_output_artifacts(),
        "inputs": sorted(ctx.list_artifacts()),
        "known": ctx.load_artifact("known").decode(),
        "unknown": ctx.load_artifact("unknown"),
        "unknown_text": ctx.load_artifact_text("unknown"),
        "meta": ctx.get_artifact_metadata("known")["mime_type"],
        "ids": [ctx.user_id, ctx.session_id, ctx.app_name],
    }
`})
	known := filepath.Join(h.input, "k.txt")
	if err := os.WriteFile(known, []byte("known content"), 0o644); err != nil {
		t.Fatal(err)
	}
	a := h.args("art", "tool", `{}`)
	a.ArtifactPaths = map[string]string{"known": known}
	a.ArtifactMetadata = map[string]ArtifactMeta{"known": {Filename: "k.txt", MimeType: "text/plain", LocalPath: known}}
	out, _ := h.run(a)
	m := resultMap(t, out)
	for name, verdict := range m["unsafe"].(map[string]any) {
		if verdict != "ValueError" {
			t.Errorf("save_artifact(%s) = %v, want ValueError", name, verdict)
		}
	}
	if len(m["unsafe"].(map[string]any)) != 8 {
		t.Errorf("unsafe results: %v", m["unsafe"])
	}
	checks := map[string]any{
		"paths_in_output": []any{true, true, true},
		"outputs":         []any{"notes.md", "report.bin", "text.txt"},
		"inputs":          []any{"known"},
		"known":           "known content",
		"unknown":         nil,
		"unknown_text":    nil,
		"meta":            "text/plain",
		"ids":             []any{"user-42", "web-session-abc", "MyAgent"},
	}
	for k, want := range checks {
		if !reflect.DeepEqual(m[k], want) {
			t.Errorf("%s = %#v, want %#v", k, m[k], want)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(h.output, "text.txt")); string(got) != "café" {
		t.Errorf("text.txt = %q", got)
	}
	if !reflect.DeepEqual(out.OutputMimeTypes, map[string]string{"report.bin": "application/x-custom"}) {
		t.Errorf("OutputMimeTypes = %v", out.OutputMimeTypes)
	}
	entries, _ := os.ReadDir(h.output)
	if len(entries) != 3 {
		t.Errorf("output dir has %d entries, want 3 (unsafe names must not create files)", len(entries))
	}
}

func TestRunnerExitStatus(t *testing.T) {
	py := pythonBin(t)
	dir := t.TempDir()
	runnerPath, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	// unreadable arguments: no result can be written, exit non-zero
	cmd := exec.Command(py, runnerPath, filepath.Join(dir, "missing.json"))
	if err := cmd.Run(); err == nil {
		t.Fatal("runner exited 0 with missing arguments")
	}
	// result file in a missing directory: exit non-zero
	argPath := filepath.Join(dir, "args.json")
	if err := WriteArgs(argPath, &Args{Module: "m", Function: "f", ResultFile: filepath.Join(dir, "nodir", "result.json")}); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(py, runnerPath, argPath)
	cmd.Env = []string{"PYTHONPATH=" + dir}
	var ee *exec.ExitError
	if err := cmd.Run(); !errors.As(err, &ee) || ee.ExitCode() != 2 {
		t.Fatalf("runner with unwritable result: %v, want exit status 2", err)
	}
	// import error: a result is written, exit 0
	argPath2 := filepath.Join(dir, "args2.json")
	resultPath := filepath.Join(dir, "result.json")
	if err := WriteArgs(argPath2, &Args{Module: "m_missing", Function: "f", ResultFile: resultPath}); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(py, runnerPath, argPath2)
	cmd.Env = []string{"PYTHONPATH=" + dir}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("runner with import error exited %v: %s", err, b)
	}
	out, err := ReadResult(resultPath, 0)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, out, KindImport, "m_missing")
	// the runner does not leave its temporary file behind
	left, _ := filepath.Glob(filepath.Join(dir, ".result.json.tmp.*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestRunnerModuleNotShadowedByRunnerDir(t *testing.T) {
	// A tool module named "runner" must be the tool's, not runner.py.
	h := newHarness(t, map[string]string{"runner.py": "def f(ctx):\n    return {'mine': True}\n"})
	out, _ := h.run(h.args("runner", "f", `{}`))
	wantResult(t, out, `{"mine":true}`)
}

func TestPackageModule(t *testing.T) {
	h := newHarness(t, map[string]string{
		"pkg/__init__.py":     "",
		"pkg/sub/__init__.py": "",
		"pkg/sub/mod.py":      "def f(ctx, x):\n    return {'x': x}\n",
	})
	out, _ := h.run(h.args("pkg.sub.mod", "f", `{"x": 12345678901234567890}`))
	// big integers reach the tool exactly (args stay raw JSON in Go)
	if !bytes.Contains(out.Result, []byte("12345678901234567890")) {
		t.Fatalf("result %s lost the big integer", out.Result)
	}
}

func TestArtifactParameters(t *testing.T) {
	h := newHarness(t, map[string]string{"ap.py": `
def first_is_artifact(input_file):
    return {"path": input_file}

def listed(ctx, files, single):
    return {"files": [open(p).read() for p in files], "single": open(single).read()}
`})
	paths := map[string]string{}
	for i, name := range []string{"f0", "f1", "f2", "s"} {
		p := filepath.Join(h.input, name+".txt")
		if err := os.WriteFile(p, []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprintf("files[%d]", i)
		if name == "s" {
			key = "single"
		}
		paths[key] = p
	}
	// keys given out of order: the list is ordered by index
	paths["files[10]"] = paths["files[2]"]
	delete(paths, "files[2]")
	a := h.args("ap", "listed", `{}`)
	a.ArtifactPaths = paths
	out, _ := h.run(a)
	wantResult(t, out, `{"files":["f0","f1","f2"],"single":"s"}`)

	h2 := newHarness(t, map[string]string{"ap.py": h.readTool("ap.py")})
	a2 := h2.args("ap", "first_is_artifact", `{}`)
	a2.ArtifactPaths = map[string]string{"input_file": "/work/input/data.csv"}
	out2, _ := h2.run(a2)
	wantResult(t, out2, `{"path":"/work/input/data.csv"}`)
}

// contextShapes are the three generations of tool signatures of issue 7:
// the reference's first "def f(ctx, x)", its later "def f(ctx: Any, x)"
// (with the other spellings of Any and the facade), and a plain function
// that takes its args alone. Each body reports whether it got ctx.
var contextShapes = []struct {
	name, imports, params string
	wantCtx               bool
}{
	{"unannotated ctx", "", `ctx, message="Hello"`, true},
	{"ctx: Any", "from typing import Any, Dict", `ctx: Any, message: str = "Hello"`, true},
	{"ctx: typing.Any", "import typing", `ctx: typing.Any, message: str = "Hello"`, true},
	{"ctx: 'Any'", "", `ctx: "Any", message: str = "Hello"`, true},
	{"ctx: object", "", `ctx: object, message: str = "Hello"`, true},
	{"ctx: ToolContextFacade", "from str_tool import ToolContextFacade", `ctx: ToolContextFacade, message: str = "Hello"`, true},
	{"ctx: 'ToolContext'", "", `ctx: "ToolContext", message: str = "Hello"`, true},
	{"positional-only ctx: Any", "from typing import Any", `ctx: Any, /, message: str = "Hello"`, true},
	{"plain", "", `message: str = "Hello"`, false},
	{"plain, annotated Any but among the args", "from typing import Any", `message: Any = "Hello"`, false},
}

// contextShapeTool writes one tool of a shape, sync or async, with or
// without postponed (string) annotations.
func contextShapeTool(imports, params string, async, future bool) string {
	var b strings.Builder
	if future {
		b.WriteString("from __future__ import annotations\n")
	}
	b.WriteString(imports + "\n\n")
	if async {
		b.WriteString("async ")
	}
	fmt.Fprintf(&b, "def echo_tool(%s):\n", params)
	b.WriteString("    got = locals().get('ctx')\n")
	b.WriteString("    if got is not None:\n        got.send_status('echoing')\n")
	b.WriteString("    return {'echo': message, 'ctx': got is not None and got.user_id == 'user-42'}\n")
	return b.String()
}

func TestCallingConventionShapes(t *testing.T) {
	for _, shape := range contextShapes {
		for _, async := range []bool{false, true} {
			for _, future := range []bool{false, true} {
				name := shape.name
				if async {
					name += "/async"
				}
				if future {
					name += "/future annotations"
				}
				t.Run(name, func(t *testing.T) {
					h := newHarness(t, map[string]string{"shapes.py": contextShapeTool(shape.imports, shape.params, async, future)})
					out, lines := h.run(h.args("shapes", "echo_tool", `{"message":"hi"}`))
					wantResult(t, out, fmt.Sprintf(`{"echo":"hi","ctx":%t}`, shape.wantCtx))
					if shape.wantCtx && !reflect.DeepEqual(lines, []string{"echoing"}) {
						t.Errorf("status lines = %q", lines)
					}
					// the default of message when the args leave it out
					h2 := newHarness(t, map[string]string{"shapes.py": h.readTool("shapes.py")})
					out2, _ := h2.run(h2.args("shapes", "echo_tool", `{}`))
					if shape.name == "plain, annotated Any but among the args" {
						// message is not among the args here: it is the
						// first parameter, annotated Any, so it gets ctx.
						if m := resultMap(t, out2); !strings.Contains(fmt.Sprint(m["echo"]), "ToolContext object") {
							t.Errorf("message = %v, want the context object", m["echo"])
						}
						return
					}
					wantResult(t, out2, fmt.Sprintf(`{"echo":"Hello","ctx":%t}`, shape.wantCtx))
				})
			}
		}
	}
}

// The reference's published echo tool, verbatim in its signature.
func TestReferenceEchoToolRunsUnmodified(t *testing.T) {
	h := newHarness(t, map[string]string{"ref_tools.py": `
from typing import Any, Dict


def echo_tool(ctx: Any, message: str = "Hello") -> Dict[str, Any]:
    ctx.send_status("echoing")
    return {"echo": message, "user_id": ctx.user_id}
`})
	out, lines := h.run(h.args("ref_tools", "echo_tool", `{"message":"hi"}`))
	wantResult(t, out, `{"echo":"hi","user_id":"user-42"}`)
	if !reflect.DeepEqual(lines, []string{"echoing"}) {
		t.Errorf("status lines = %q", lines)
	}
}

func TestFirstParameterNotContext(t *testing.T) {
	src := `
def needs_name(name: str, greeting="Hi"):
    return {"text": greeting + " " + name}

def counted(n: int = 3, label="x"):
    return {"n": n, "label": label}

def config_first(tool_config, x=1):
    return {"key": tool_config.get("k"), "x": x}
`
	// a plain function whose first parameter is missing: no ctx is slipped in
	h := newHarness(t, map[string]string{"nc.py": src})
	out, _ := h.run(h.args("nc", "needs_name", `{"greeting":"Yo"}`))
	wantError(t, out, KindExecution, "do not match the tool's signature", "missing a required argument: 'name'")

	h2 := newHarness(t, map[string]string{"nc.py": src})
	out2, _ := h2.run(h2.args("nc", "counted", `{"label":"y"}`))
	wantResult(t, out2, `{"n":3,"label":"y"}`)

	h3 := newHarness(t, map[string]string{"nc.py": src})
	a3 := h3.args("nc", "config_first", `{}`)
	a3.ToolConfig = json.RawMessage(`{"k":"v"}`)
	out3, _ := h3.run(a3)
	wantResult(t, out3, `{"key":"v","x":1}`)
}

// Methods, callable instances, decorated functions and partials: the
// runner reads plain functions and methods from their code, and asks
// inspect for the rest; the rule is the same for all.
func TestCallingConventionUnusualCallables(t *testing.T) {
	src := `
import functools
from typing import Any


class Greeter:
    def greet(self, ctx: Any, name):
        return {"text": "hi " + name, "ctx": ctx.app_name}

    async def agreet(self, ctx, name):
        return {"text": "hi " + name, "ctx": ctx.app_name}

    @classmethod
    def cgreet(cls, ctx: Any, name):
        return {"text": cls.__name__ + " " + name, "ctx": ctx.app_name}

    @staticmethod
    def sgreet(ctx: Any, name):
        return {"text": "static " + name, "ctx": ctx.app_name}


class Callable:
    def __call__(self, ctx: Any, name):
        return {"text": "call " + name, "ctx": ctx.app_name}


def logged(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


@logged
def decorated(ctx: Any, name):
    return {"text": "decorated " + name, "ctx": ctx.app_name}


def _base(ctx: Any, prefix, name):
    return {"text": prefix + name, "ctx": ctx.app_name}


partial = functools.partial(_base, prefix="partial ")

instance = Callable()
bound = Greeter().greet
cgreet = Greeter.cgreet
sgreet = Greeter.sgreet
abound = Greeter().agreet


def keyword_only(ctx, *, name, extra="e"):
    return {"text": "kw " + name + extra, "ctx": ctx.app_name}


def var_keywords(ctx: Any, **kwargs):
    return {"text": "kwargs " + kwargs["name"], "ctx": ctx.app_name}


def var_positional(*args, name):
    return {"text": "varargs " + name, "ctx": bool(args) and args[0].app_name}
`
	cases := []struct{ fn, want string }{
		{"bound", `{"text":"hi Ann","ctx":"MyAgent"}`},
		{"abound", `{"text":"hi Ann","ctx":"MyAgent"}`},
		{"cgreet", `{"text":"Greeter Ann","ctx":"MyAgent"}`},
		{"sgreet", `{"text":"static Ann","ctx":"MyAgent"}`},
		{"instance", `{"text":"call Ann","ctx":"MyAgent"}`},
		{"decorated", `{"text":"decorated Ann","ctx":"MyAgent"}`},
		{"partial", `{"text":"partial Ann","ctx":"MyAgent"}`},
		{"keyword_only", `{"text":"kw Anne","ctx":"MyAgent"}`},
		{"var_keywords", `{"text":"kwargs Ann","ctx":"MyAgent"}`},
		// *args is not a positional parameter: no ctx
		{"var_positional", `{"text":"varargs Ann","ctx":false}`},
	}
	for _, c := range cases {
		t.Run(c.fn, func(t *testing.T) {
			h := newHarness(t, map[string]string{"uc.py": src})
			out, _ := h.run(h.args("uc", c.fn, `{"name":"Ann"}`))
			wantResult(t, out, c.want)
		})
	}
}

// The signature check that replaces Signature.bind must refuse what the
// call would refuse, with inspect's wording.
func TestSignatureMismatch(t *testing.T) {
	src := `
def posonly(ctx, a, /, b):
    return {}

def kwonly(ctx, *, a):
    return {}

def takes_kwargs(ctx, a=0, /, **rest):
    return {"a": a, "rest": sorted(rest)}
`
	cases := []struct{ fn, args, want string }{
		// inspect's wording varies between Python versions: the name is kept.
		{"posonly", `{"a": 1, "b": 2}`, "'a'"},
		{"kwonly", `{}`, "'a'"},
		{"kwonly", `{"a": 1, "z": 2}`, "unexpected keyword argument 'z'"},
	}
	for _, c := range cases {
		t.Run(c.fn+c.args, func(t *testing.T) {
			h := newHarness(t, map[string]string{"sm.py": src})
			out, _ := h.run(h.args("sm", c.fn, c.args))
			wantError(t, out, KindExecution, "do not match the tool's signature (ctx", c.want)
		})
	}
	// a positional-only name among the args goes into **rest, as in a call
	h := newHarness(t, map[string]string{"sm.py": src})
	out, _ := h.run(h.args("sm", "takes_kwargs", `{"a": 1}`))
	wantResult(t, out, `{"a":0,"rest":["a"]}`)
}

// startupModules are what the runner must not import for a plain tool
// (issue 10): each costs milliseconds of every cold call.
// A warm (pooled) runner imports no more of them than a cold one: what
// it preloads is paid by every pooled sandbox, used or not.
var startupModules = []string{"inspect", "json", "re", "threading", "traceback", "unicodedata", "asyncio", "importlib", "typing", "ast", "dis", "tokenize", "enum", "types"}

// baselineModules returns the modules a bare interpreter has loaded with
// the harness's environment (site may import some on its own).
func (h *harness) baselineModules() map[string]bool {
	h.t.Helper()
	cmd := exec.Command(h.python, "-c", "import sys; print(' '.join(sys.modules))")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PYTHONPATH=" + h.tools, "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"}
	b, err := cmd.Output()
	if err != nil {
		h.t.Fatal(err)
	}
	loaded := map[string]bool{}
	for _, m := range strings.Fields(string(b)) {
		loaded[m] = true
	}
	return loaded
}

func TestRunnerImportsOnlyWhatTheToolNeeds(t *testing.T) {
	src := `
import sys

WATCH = %s

def echo_tool(ctx, message="Hello"):
    ctx.send_status("echoing")
    return {"loaded": sorted(m for m in WATCH if m in sys.modules)}

async def async_echo(ctx, message="Hello"):
    return {"loaded": sorted(m for m in WATCH if m in sys.modules)}
`
	watch, _ := json.Marshal(startupModules)
	tools := map[string]string{"light.py": fmt.Sprintf(src, watch)}
	cases := []struct {
		fn   string
		warm bool
	}{
		{"echo_tool", false},
		{"async_echo", false},
		{"echo_tool", true},
		{"async_echo", true},
	}
	for _, c := range cases {
		name := c.fn
		if c.warm {
			name += "/warm"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, tools)
			base := h.baselineModules()
			out, lines := h.runMode(h.args("light", c.fn, `{"message":"hi"}`), c.warm)
			var extra []string
			for _, m := range resultMap(t, out)["loaded"].([]any) {
				if !base[m.(string)] {
					extra = append(extra, m.(string))
				}
			}
			if c.fn == "echo_tool" {
				if len(extra) != 0 {
					t.Errorf("the runner imported %v for a plain tool", extra)
				}
				if !reflect.DeepEqual(lines, []string{"echoing"}) {
					t.Errorf("status lines = %q", lines)
				}
				return
			}
			// (asyncio imports inspect and more itself)
			if !strings.Contains(fmt.Sprint(extra), "asyncio") {
				t.Errorf("asyncio not loaded for an async tool: %v", extra)
			}
		})
	}
}

// jsonCheck compares the runner's JSON functions with the json package's,
// value by value and error by error.
const jsonCheck = `
import json, math, sys
sys.path.insert(0, sys.argv[1])
import _str_runner as r

class Odd:
    pass

circular = []
circular.append(circular)
values = [
    None, True, False, 0, -1, 12345678901234567890, 1.5, 1e300, -0.0, 3.141592653589793,
    "", "plain", "caf\u00e9 \u2603 \U0001F600", "\x00\x1f\"\\/\n\t", "\ud800",
    [], {}, [1, [2, [3, {"a": None}]]], {"k": [1.0, "v"], "n": {"m": {}}},
    {1: "int key", 2.5: "float key", True: "bool key", None: "null key"},
    (1, 2), {"t": (3, 4)},
    math.nan, math.inf, -math.inf, {"x": [math.nan]},
    Odd(), {"o": Odd()}, {(1, 2): "tuple key"}, circular,
]
problems = []
for v in values:
    def outcome(fn):
        try:
            return ("ok", fn(v))
        except Exception as e:
            return (type(e).__name__, None)
    want = outcome(lambda x: json.dumps(x, allow_nan=False))
    got = outcome(r._json_dumps)
    if want != got:
        problems.append("dumps %r: json %r, runner %r" % (v, want, got))

texts = [
    '{"a": 1}', '  {"a": [1, 2.5, null, true, false, "s"]}  ', '\n\t{}\r\n', '[]', '"str"', '12', '-0.5e3',
    '{"big": 12345678901234567890, "u": "\\u00e9\\ud83d\\ude00"}', 'NaN', '[Infinity, -Infinity]',
    '', '   ', '{', '{"a": 1} x', '{"a": 1}{}', "{'a': 1}", '[1,]', '"\x01"', '\ufeff{}',
]
for text in texts:
    def outcome(fn):
        try:
            return ("ok", repr(fn(text)))
        except ValueError:
            return ("ValueError", None)
    want = outcome(json.loads)
    got = outcome(r._json_loads)
    if want != got:
        problems.append("loads %r: json %r, runner %r" % (text, want, got))
print("\n".join(problems) or "same")
`

func TestRunnerJSONMatchesJSONPackage(t *testing.T) {
	py := pythonBin(t)
	dir := t.TempDir()
	if _, err := Install(dir); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", jsonCheck, dir)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"}
	b, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(b)) != "same" {
		t.Fatalf("runner JSON differs from json (%v):\n%s", err, b)
	}
}

// Without the _json accelerator the runner falls back to the json package
// and behaves the same.
func TestRunnerWithoutJSONAccelerator(t *testing.T) {
	h := newHarness(t, map[string]string{
		// PYTHONPATH comes before lib-dynload: this hides the real _json.
		"_json.py": "raise ImportError('no accelerator in this test')\n",
		"acc.py": `
import sys

def echo_tool(ctx, message="Hello"):
    ctx.send_status("caf\u00e9")
    return {"echo": message, "json": "json" in sys.modules, "accelerated": sys.modules.get("_json") is not None}
`,
	})
	out, lines := h.run(h.args("acc", "echo_tool", `{"message":"h\u00e9 \ud83d\ude00"}`))
	wantResult(t, out, `{"echo":"hé 😀","json":true,"accelerated":false}`)
	if !reflect.DeepEqual(lines, []string{"café"}) {
		t.Errorf("status lines = %q", lines)
	}
}

// A tool module may be named like the runner's own module.
func TestToolModuleNamedLikeRunnerModule(t *testing.T) {
	h := newHarness(t, map[string]string{"_str_runner.py": "def f(ctx):\n    return {'mine': ctx.app_name}\n"})
	out, _ := h.run(h.args("_str_runner", "f", `{}`))
	wantResult(t, out, `{"mine":"MyAgent"}`)
}

func TestCompile(t *testing.T) {
	py := pythonBin(t)
	h := newHarness(t, map[string]string{"example_tools.py": specExampleTools})
	dir := filepath.Dir(h.runner)
	cache, err := Compile(dir, py)
	if err != nil {
		t.Fatal(err)
	}
	// modes are set, not left to the umask: the sandbox uid reads them
	if st, err := os.Lstat(cache); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o444 {
		t.Fatalf("cache %s: %v %v", cache, st.Mode(), err)
	}
	if st, err := os.Lstat(filepath.Dir(cache)); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("cache dir: %v %v", st.Mode(), err)
	}
	if filepath.Dir(filepath.Dir(cache)) != dir || !strings.HasPrefix(filepath.Base(cache), "_str_runner.") {
		t.Fatalf("cache path %s", cache)
	}
	// a second compile replaces the read-only cache
	if _, err := Compile(dir, py); err != nil {
		t.Fatalf("second compile: %v", err)
	}

	// python -v names the file each module's code came from.
	codeFrom := func() string {
		t.Helper()
		if err := os.Remove(h.result); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		os.Remove(h.argPath)
		if err := WriteArgs(h.argPath, h.args("example_tools", "echo_tool", `{"message":"cached"}`)); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(py, "-v", h.runner, h.argPath)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "PYTHONPATH=" + h.tools, "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8"}
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("runner: %v\n%s", err, b)
		}
		out, err := ReadResult(h.result, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		wantResult(t, out, `{"text":"Echo: cached","data_objects":[]}`)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "code object from") && strings.Contains(line, "_str_runner") {
				return line
			}
		}
		return ""
	}
	if line := codeFrom(); !strings.Contains(line, cache) {
		t.Errorf("the runner module was not loaded from its cache %s: %q", cache, line)
	}
	// a cache that does not match the source is not used
	mod := filepath.Join(dir, ModuleFileName)
	src, err := os.ReadFile(mod)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chmod(mod, 0o644))
	must(os.WriteFile(mod, bytes.Replace(src, []byte("TRACEBACK_TAIL_LINES = 20"), []byte("TRACEBACK_TAIL_LINES = 21"), 1), 0o644))
	if line := codeFrom(); strings.Contains(line, cache) {
		t.Errorf("a stale cache was used: %q", line)
	}

	// an interpreter that cannot run fails with its name in the error
	if _, err := Compile(dir, filepath.Join(dir, "no-such-python")); err == nil || !strings.Contains(err.Error(), "no-such-python") {
		t.Errorf("compile with a missing interpreter: %v", err)
	}
}

// The shipped example tools: echo_tool (def f(ctx, ...)) and reference_echo
// (the reference's def f(ctx: Any, ...)) answer alike.
func TestShippedExampleEchoTools(t *testing.T) {
	src, err := os.ReadFile("../../examples/tools/python/example_tools.py")
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"echo_tool", "reference_echo"} {
		t.Run(fn, func(t *testing.T) {
			h := newHarness(t, map[string]string{"example_tools.py": string(src)})
			out, lines := h.run(h.args("example_tools", fn, `{"message":"hi"}`))
			wantResult(t, out, `{"echo":"hi","user_id":"user-42","session_id":"web-session-abc"}`)
			if !reflect.DeepEqual(lines, []string{"echoing"}) {
				t.Errorf("status lines = %q", lines)
			}
		})
	}
}

// Class-based tools: the constructor gets tool_config when it names it,
// whether the runner reads __init__'s code or asks inspect (a metaclass).
func TestClassConstructorToolConfig(t *testing.T) {
	src := `
import abc
import dataclasses


class Plain:
    def run(self, ctx, x):
        return {"x": x}


class Inherits(Plain):
    pass


class Configured:
    def __init__(self, tool_config=None):
        self.key = (tool_config or {}).get("k")

    def run(self, ctx, x):
        return {"x": x, "key": self.key}


class Abstract(abc.ABC):
    def __init__(self, tool_config):
        self.key = tool_config.get("k")

    def run(self, ctx, x):
        return {"x": x, "key": self.key}


@dataclasses.dataclass
class Data:
    tool_config: dict

    def run(self, ctx, x):
        return {"x": x, "key": self.tool_config.get("k")}
`
	cases := []struct{ class, want string }{
		{"Plain", `{"x":1}`},
		{"Inherits", `{"x":1}`},
		{"Configured", `{"x":1,"key":"v"}`},
		{"Abstract", `{"x":1,"key":"v"}`},
		{"Data", `{"x":1,"key":"v"}`},
	}
	for _, c := range cases {
		t.Run(c.class, func(t *testing.T) {
			h := newHarness(t, map[string]string{"ctor.py": src})
			a := h.args("ctor", "run", `{"x":1}`)
			a.ClassName = c.class
			a.ToolConfig = json.RawMessage(`{"k":"v"}`)
			out, _ := h.run(a)
			wantResult(t, out, c.want)
		})
	}
}

// topLevel splits a document as json.Unmarshal into a
// map[string]json.RawMessage does (same members, same errors), with its
// values slices of the document rather than copies.
func TestTopLevelMatchesUnmarshal(t *testing.T) {
	docs := []string{
		`{}`, ` { } `, `{"result": {"a": [1, 2, {"b": "}\"]"}]}, "output_mime_types": {}}`,
		"{\n\t\"result\" :\r {\"x\":\"\\u0041\\\\\"} ,\"error\": null}", `{"a":1,"a":2}`, `{"a":-1.5e3,"b":true,"c":false,"d":null}`,
		`{"k\u00e9y":"v","\ud83d\ude00":[[],[{}]]}`, `{"a":"\"}{"}`, `null`, ` null `, `[]`, `"s"`, `1`, ``, `{`, `{"a":}`, `{"a":1,}`,
		`{"a":1} x`, "{\"a\":\"\xff\"}", `{"a":[1,2]`,
	}
	for _, d := range docs {
		var want map[string]json.RawMessage
		werr := json.Unmarshal([]byte(d), &want)
		got, gerr := topLevel([]byte(d))
		if (werr == nil) != (gerr == nil) || (werr != nil && werr.Error() != gerr.Error()) {
			t.Errorf("%q: error %v, want %v", d, gerr, werr)
			continue
		}
		if (want == nil) != (got == nil) || len(want) != len(got) {
			t.Errorf("%q: %q, want %q", d, got, want)
			continue
		}
		for k, v := range want {
			if string(got[k]) != string(v) {
				t.Errorf("%q: member %q is %q, want %q", d, k, got[k], v)
			}
		}
	}
	// No copy: the result is the document's own bytes.
	data := []byte(`{"result": {"blob": "xxxx"}}`)
	got, err := topLevel(data)
	if err != nil {
		t.Fatal(err)
	}
	if r := got["result"]; &r[0] != &data[11] || cap(r) != len(r) {
		t.Errorf("the result is not a capped slice of the document")
	}
}

// ReadResult leaves the result where it read it, with room around the
// document for the reply (Outcome.Buf).
func TestReadResultRoom(t *testing.T) {
	path := filepath.Join(t.TempDir(), "result.json")
	if err := os.WriteFile(path, []byte(`{"result": {"a": 1}, "output_mime_types": {}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := ReadResult(path, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if out.Buf == nil || &out.Buf[out.ResultAt] != &out.Result[0] || out.ResultAt < ReplyHeadRoom ||
		len(out.Buf)-out.ResultAt-len(out.Result) < ReplyTailRoom {
		t.Fatalf("Buf %d bytes, result at %d: not the result's buffer with room around it", len(out.Buf), out.ResultAt)
	}
	if string(out.Result) != `{"a": 1}` {
		t.Errorf("result %q", out.Result)
	}
}
