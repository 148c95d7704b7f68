package runner

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/launcher/hostbox"
)

// Source is runner.py, the entry point of the Python program that runs one
// tool call inside a sandbox (spec §8): it imports ModuleSource and calls
// it. Both use the standard library only (Python 3.9+).
//
//go:embed runner.py
var Source []byte

// ModuleSource is _str_runner.py, the runner itself (its docstring is the
// reference for what a run does). It is a module rather than the script so
// that Python can load it from the bytecode cache Compile writes.
//
//go:embed _str_runner.py
var ModuleSource []byte

// Command is the command line that starts the runner at path (Install's
// result) with python, then args: "python -S path args...". -S: Python's
// site module does not run at start, so no .pth file of the interpreter's
// site-packages runs, nor sitecustomize, nor the user site (on a host with
// .pth hooks that import packages, ~3-5 ms of CPU per call); the runner
// puts the interpreter's own site-packages dirs on sys.path itself
// (_str_runner.py, "Interpreter start"). The worker and the tests start
// the runner only through it.
func Command(python, path string, args ...string) []string {
	return append([]string{python, "-S", path}, args...)
}

// FileName is the name Install gives the runner's entry point inside its
// directory; ModuleFileName is the name of the module beside it.
const (
	FileName       = "runner.py"
	ModuleFileName = "_str_runner.py"
)

// Error kinds written by runner.py next to an error (spec §7.5). The worker
// maps them to IMPORT_ERROR, EXECUTION_ERROR and TOOL_ERROR.
const (
	KindImport    = "import"
	KindExecution = "execution"
	KindTool      = "tool"
)

// ArtifactMeta describes one input artifact (spec §7.3 artifact_metadata).
type ArtifactMeta struct {
	Filename  string `json:"filename"`
	MimeType  string `json:"mime_type"`
	Version   int    `json:"version"`
	LocalPath string `json:"local_path"`
}

// Args is runner_args.json (spec §7.3), the whole input of one run. Args and
// ToolConfig are kept as raw JSON so that numbers reach the tool exactly as
// the agent sent them; each must be a JSON object (empty means {}).
type Args struct {
	Module           string                  `json:"module"`
	Function         string                  `json:"function"`
	ClassName        string                  `json:"class_name"`
	Args             json.RawMessage         `json:"args"`
	ToolConfig       json.RawMessage         `json:"tool_config"`
	ArtifactPaths    map[string]string       `json:"artifact_paths"`
	ArtifactMetadata map[string]ArtifactMeta `json:"artifact_metadata"`
	StatusPipe       string                  `json:"status_pipe"`
	ResultFile       string                  `json:"result_file"`
	OutputDir        string                  `json:"output_dir"`
	UserID           string                  `json:"user_id"`
	SessionID        string                  `json:"session_id"`
	AppName          string                  `json:"app_name"`
	// Mode is ModeInvoke (also when empty) or ModeInit. In init mode the
	// runner needs only Module, ClassName (or Function), ToolConfig and
	// ResultFile: it imports the module, instantiates ClassName as for a
	// call, awaits its init(), and writes {"result": InitInfo}; for a
	// function tool it describes the function from its signature and
	// docstring (see _str_runner.py's _run_init).
	Mode string `json:"mode,omitempty"`
}

// Runner modes (Args.Mode).
const (
	// ModeInvoke calls the tool (the default).
	ModeInvoke = "invoke"
	// ModeInit describes a class-based tool for the init sub-protocol
	// (spec §14) without calling it.
	ModeInit = "init"
)

// InitInfo is what runner.py writes as the result of a ModeInit run: the
// class-based tool's own description of itself after its init(), as the
// reference's dynamic-tool base class produces it (for a function tool:
// its name, docstring and a schema from its signature, as the reference's
// agent describes a function it wraps). ToolName is the tool's own name
// (the class's tool_name, the function's __name__), not the manifest key
// the reference's replies carry. ParametersSchema is in the agent's
// Schema dialect (upper-case type names) for the schemas the runner
// builds; a class's own schema is passed as it gives it. ArtifactParams
// comes from the class's artifact_params (the reference's init reply
// leaves it, Instructions and ConfigSchema to the manifest). Absent values
// are omitted. The worker maps it onto both generations of the init reply
// (spec §14).
type InitInfo struct {
	ToolName           string                  `json:"tool_name"`
	Description        string                  `json:"description,omitempty"`
	ParametersSchema   json.RawMessage         `json:"parameters_schema,omitempty"`
	CtxFacadeParamName string                  `json:"ctx_facade_param_name,omitempty"`
	ArtifactParams     map[string]ArtifactSpec `json:"artifact_params,omitempty"`
	Instructions       string                  `json:"instructions,omitempty"`
	ConfigSchema       json.RawMessage         `json:"config_schema,omitempty"`
}

// ArtifactSpec describes one parameter annotated as an Artifact (or a list
// of them) in InitInfo.ArtifactParams.
type ArtifactSpec struct {
	IsList     bool `json:"is_list"`
	IsOptional bool `json:"is_optional"`
}

// ArgsMode is the mode of runner_args.json (set explicitly, whatever the
// umask): the sandbox's uid reads it, the worker owns it.
const ArgsMode = 0o644

// EncodeArgs validates a and returns it as JSON (what WriteArgs writes;
// a warm sandbox's runner reads it from a pipe instead of a file).
func EncodeArgs(a *Args) ([]byte, error) {
	if a == nil {
		return nil, errors.New("nil arguments")
	}
	// 1. validate: everything the runner cannot run without, collected.
	var problems []string
	if a.Module == "" {
		problems = append(problems, "module is empty")
	}
	if a.Function == "" && a.ClassName == "" {
		problems = append(problems, "function and class_name are both empty")
	}
	switch a.Mode {
	case "", ModeInvoke, ModeInit:
	default:
		problems = append(problems, fmt.Sprintf("mode %q is neither %q nor %q", a.Mode, ModeInvoke, ModeInit))
	}
	if a.ResultFile == "" {
		problems = append(problems, "result_file is empty")
	}
	argsJSON, err := objectOrEmpty(a.Args)
	if err != nil {
		problems = append(problems, "args: "+err.Error())
	}
	configJSON, err := objectOrEmpty(a.ToolConfig)
	if err != nil {
		problems = append(problems, "tool_config: "+err.Error())
	}
	if len(problems) > 0 {
		return nil, errors.New(strings.Join(problems, "; "))
	}

	// 2. encode, with nil maps as {} (the runner treats null as {} too, but
	// the file is read by people debugging a run).
	doc := *a
	doc.Args, doc.ToolConfig = argsJSON, configJSON
	if doc.ArtifactPaths == nil {
		doc.ArtifactPaths = map[string]string{}
	}
	if doc.ArtifactMetadata == nil {
		doc.ArtifactMetadata = map[string]ArtifactMeta{}
	}
	data, err := json.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	return data, nil
}

// WriteArgs validates a and writes it as JSON to path, which must not exist
// yet (O_EXCL, no symlink followed), mode ArgsMode.
func WriteArgs(path string, a *Args) error {
	data, err := EncodeArgs(a)
	if err != nil {
		return fmt.Errorf("runner: write args %s: %w", path, err)
	}

	// 3. create exclusively, set the mode on the descriptor (the umask
	// must not take the sandbox's read access: under UMask=0027 an
	// open(0644) gives 0640, which the sandbox's uid cannot read), write.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, ArgsMode)
	if err != nil {
		return fmt.Errorf("runner: write args %s: create: %w", path, err)
	}
	if err := f.Chmod(ArgsMode); err != nil {
		f.Close()
		return fmt.Errorf("runner: write args %s: chmod %o: %w", path, ArgsMode, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("runner: write args %s: write: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("runner: write args %s: close: %w", path, err)
	}
	return nil
}

// objectOrEmpty returns raw if it is a JSON object, {} if it is empty or null.
func objectOrEmpty(raw json.RawMessage) (json.RawMessage, error) {
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return json.RawMessage("{}"), nil
	}
	if trimmed[0] != '{' || !json.Valid(trimmed) {
		return nil, errors.New("not a JSON object")
	}
	return json.RawMessage(trimmed), nil
}

// Outcome is what a run produced, read from result.json (spec §7.5).
// Exactly one of Result (a JSON object, the tool_result) and Error is set;
// ErrorKind is one of KindImport, KindExecution, KindTool when Error is.
type Outcome struct {
	Result json.RawMessage
	// Buf, set by ReadResult, is the buffer Result is a slice of (at
	// ResultAt): the document with ReplyHeadRoom bytes before it and at
	// least ReplyTailRoom after, so that the worker can write its reply
	// around the result where it is, not copy it (a result may be most of
	// a broker message). Result may not be used once Buf is.
	Buf       []byte
	ResultAt  int
	Error     string
	ErrorKind string
	// OutputMimeTypes holds the mime types the tool passed to
	// ctx.save_artifact, by output filename. The worker may prefer them
	// over the extension table; files not listed use the table.
	OutputMimeTypes map[string]string
}

// The room ReadResult leaves before and after the document in its buffer
// (Outcome.Buf): the reply's envelope before the result (its id is at
// most a few hundred bytes) and after it (timings, artifacts, denials);
// a reply that does not fit is built in a buffer of its own.
const (
	ReplyHeadRoom = 1 << 10
	ReplyTailRoom = 16 << 10
)

// ErrNoResult is wrapped by ReadResult when the result file does not exist
// (the runner died before writing it).
var ErrNoResult = errors.New("no result file")

// ReadResult reads and checks the result file at path. It refuses a
// symlink or any non-regular file (the sandboxed tool can write the work
// dir, so the file is untrusted), a file over maxBytes, a document that is
// not exactly {"result": {...}} or {"error": "...", "error_kind": "..."}
// (plus the optional "output_mime_types"), and an unknown error_kind. A
// missing error_kind (a reference-style runner) is read as "execution".
func ReadResult(path string, maxBytes int64) (*Outcome, error) {
	// 1. open without following a symlink and without blocking on a FIFO.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("runner: read result %s: %w", path, ErrNoResult)
		}
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("runner: read result %s: refusing a symlink: %w", path, err)
		}
		return nil, fmt.Errorf("runner: read result %s: open: %w", path, err)
	}
	defer f.Close()

	// 2. a regular file within the size limit.
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("runner: read result %s: stat: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("runner: read result %s: not a regular file (%s)", path, st.Mode().Type())
	}
	if maxBytes > 0 && st.Size() > maxBytes {
		return nil, fmt.Errorf("runner: read result %s: %d bytes exceeds the limit of %d", path, st.Size(), maxBytes)
	}
	// Into one buffer of the size stat gave, plus a byte that shows a
	// file still growing (then read on, within the limit): a result may
	// be most of a broker message, and io.ReadAll's doubling held up to
	// twice it, then dropped all but the last buffer.
	buf := make([]byte, ReplyHeadRoom+st.Size()+1+ReplyTailRoom)
	data := buf[ReplyHeadRoom : ReplyHeadRoom+st.Size()+1]
	n, err := io.ReadFull(f, data)
	switch {
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
		data = data[:n]
	case err != nil:
		return nil, fmt.Errorf("runner: read result %s: read: %w", path, err)
	default:
		reader := io.Reader(f)
		if maxBytes > 0 {
			reader = io.LimitReader(f, maxBytes+1-int64(len(data)))
		}
		more, err := io.ReadAll(reader)
		if err != nil {
			return nil, fmt.Errorf("runner: read result %s: read: %w", path, err)
		}
		data = append(data[:len(data):len(data)], more...)
		buf = nil // a new array: no room around it
	}
	if maxBytes > 0 && int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("runner: read result %s: grew beyond the limit of %d bytes", path, maxBytes)
	}

	// 3. decode strictly.
	out, err := parseResult(data)
	if err != nil {
		return nil, fmt.Errorf("runner: read result %s: %w", path, err)
	}
	if at := resultOffset(data, out.Result); buf != nil && at >= 0 {
		// Result is a slice of data (parseResult does not copy it).
		out.Buf, out.ResultAt = buf, ReplyHeadRoom+at
	}
	return out, nil
}

// DecodeResult is ReadResult for a document already in memory (a
// template call's, sent on its socket): at most maxBytes, decoded as
// strictly.
func DecodeResult(data []byte, maxBytes int64) (*Outcome, error) {
	if int64(len(data)) > maxBytes {
		return nil, fmt.Errorf("runner: result of %d bytes, the limit is %d", len(data), maxBytes)
	}
	return parseResult(data)
}

func parseResult(data []byte) (*Outcome, error) {
	doc, err := topLevel(data)
	if err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if doc == nil {
		return nil, errors.New("not a JSON object: null")
	}
	for k := range doc {
		switch k {
		case "result", "error", "error_kind", "output_mime_types":
		default:
			return nil, fmt.Errorf("unknown key %q", k)
		}
	}
	out := &Outcome{}
	if raw, ok := doc["output_mime_types"]; ok {
		if err := json.Unmarshal(raw, &out.OutputMimeTypes); err != nil {
			return nil, fmt.Errorf("output_mime_types: %w", err)
		}
	}
	rawResult, hasResult := doc["result"]
	rawError, hasError := doc["error"]
	switch {
	case hasResult && hasError:
		return nil, errors.New(`both "result" and "error" are present`)
	case hasResult:
		if _, ok := doc["error_kind"]; ok {
			return nil, errors.New(`"error_kind" without "error"`)
		}
		trimmed := bytes.TrimSpace(rawResult)
		if len(trimmed) == 0 || trimmed[0] != '{' {
			return nil, fmt.Errorf("result is not a JSON object: %.64s", trimmed)
		}
		out.Result = json.RawMessage(trimmed)
		return out, nil
	case hasError:
		if err := json.Unmarshal(rawError, &out.Error); err != nil {
			return nil, fmt.Errorf("error is not a string: %w", err)
		}
		out.ErrorKind = KindExecution
		if rawKind, ok := doc["error_kind"]; ok {
			if err := json.Unmarshal(rawKind, &out.ErrorKind); err != nil {
				return nil, fmt.Errorf("error_kind is not a string: %w", err)
			}
		}
		switch out.ErrorKind {
		case KindImport, KindExecution, KindTool:
		default:
			return nil, fmt.Errorf("unknown error_kind %q", out.ErrorKind)
		}
		return out, nil
	default:
		return nil, errors.New(`neither "result" nor "error" is present`)
	}
}

// topLevel is json.Unmarshal(data, &doc) for a map[string]json.RawMessage
// doc (the same document accepted, the same errors, a repeated key's
// last value kept), except that the values are slices of data, not
// copies: a result is most of its document, and Unmarshal copied it
// whole. An object is split here once json.Valid has passed it (so
// every string, number and nesting below is well formed); anything else
// goes to Unmarshal, for its error or its nil (null).
func topLevel(data []byte) (map[string]json.RawMessage, error) {
	i := skipSpace(data, 0)
	if !json.Valid(data) || i == len(data) || data[i] != '{' {
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(data, &doc); err != nil {
			return nil, err
		}
		return doc, nil
	}
	doc := map[string]json.RawMessage{}
	i = skipSpace(data, i+1)
	if data[i] == '}' {
		return doc, nil
	}
	for {
		// "key" : value , or }
		end := valueEnd(data, i)
		var key string
		if err := json.Unmarshal(data[i:end], &key); err != nil {
			return nil, err
		}
		i = skipSpace(data, skipSpace(data, end)+1) // past the ':'
		end = valueEnd(data, i)
		doc[key] = json.RawMessage(data[i:end:end])
		i = skipSpace(data, end)
		if data[i] == '}' {
			return doc, nil
		}
		i = skipSpace(data, i+1) // past the ','
	}
}

// resultOffset is where r, a slice of data, starts in it (-1: r is
// empty or not a slice of data). The result comes first in a runner's
// document: the loop ends after a few bytes.
func resultOffset(data, r []byte) int {
	if len(r) == 0 {
		return -1
	}
	for i := range data {
		if &data[i] == &r[0] {
			return i
		}
	}
	return -1
}

// skipSpace is the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// valueEnd is the index just past the JSON value that starts at i, in a
// document json.Valid accepted.
func valueEnd(data []byte, i int) int {
	depth := 0
	for ; i < len(data); i++ {
		switch c := data[i]; c {
		case '"':
			for i++; data[i] != '"'; i++ {
				if data[i] == '\\' {
					i++
				}
			}
			if depth == 0 {
				return i + 1
			}
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return i + 1
			}
			if depth < 0 { // the end of the enclosing object: a scalar ended
				return i
			}
		case ',', ' ', '\t', '\n', '\r', ':':
			if depth == 0 {
				return i
			}
		}
	}
	return i
}

// Install writes runner.py and _str_runner.py into dir as read-only (0444)
// files and returns the path of runner.py, the program to run. An identical
// read-only regular file already there is kept; anything else is replaced
// atomically (temporary file in dir, fsync, rename), so a sandbox never
// sees a half-written runner. The module is installed before the entry
// point that imports it. The sandbox's uid must read dir and the files:
// dir gets r-x for group and others and the files 0444, set with
// fchmod whatever the umask (under UMask=0027 a mkdir(0755) gives 0750
// and no sandbox could start the runner).
func Install(dir string) (string, error) {
	if err := openable(dir); err != nil {
		return "", fmt.Errorf("runner: install into %s: %w", dir, err)
	}
	if err := installFile(dir, ModuleFileName, ModuleSource); err != nil {
		return "", err
	}
	if err := installFile(dir, FileName, Source); err != nil {
		return "", err
	}
	return filepath.Join(dir, FileName), nil
}

// openable makes the directory dir readable and searchable by group and
// others (r-x added to its mode, nothing removed), through a descriptor
// opened without following a symlink.
func openable(dir string) error {
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open dir: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat dir: %w", err)
	}
	const need = 0o055
	if st.Mode().Perm()&need != need {
		// Bits beyond the permissions (sticky, setgid) are kept.
		mode := st.Mode().Perm() | need | st.Mode()&(os.ModeSticky|os.ModeSetgid|os.ModeSetuid)
		if err := f.Chmod(mode); err != nil {
			return fmt.Errorf("chmod dir to %o: %w", mode.Perm(), err)
		}
	}
	return nil
}

// installFile writes content to dir/name, read-only, unless an identical
// read-only regular file is already there.
func installFile(dir, name string, content []byte) error {
	path := filepath.Join(dir, name)

	// 1. already installed?
	if st, err := os.Lstat(path); err == nil && st.Mode().IsRegular() && st.Mode().Perm() == 0o444 {
		if existing, err := os.ReadFile(path); err == nil && bytes.Equal(existing, content) {
			return nil
		}
	}

	// 2. write a temporary file next to it.
	tmp, err := os.CreateTemp(dir, ".runner-*.py")
	if err != nil {
		return fmt.Errorf("runner: install %s: create temporary file: %w", path, err)
	}
	tmpName := tmp.Name()
	fail := func(step string, err error) error {
		tmp.Close()
		os.Remove(tmpName)
		return fmt.Errorf("runner: install %s: %s %s: %w", path, step, tmpName, err)
	}
	if _, err := tmp.Write(content); err != nil {
		return fail("write", err)
	}
	if err := tmp.Chmod(0o444); err != nil {
		return fail("chmod", err)
	}
	if err := tmp.Sync(); err != nil {
		return fail("fsync", err)
	}
	if err := tmp.Close(); err != nil {
		return fail("close", err)
	}

	// 3. rename over the final name.
	if err := os.Rename(tmpName, path); err != nil {
		os.Remove(tmpName)
		return fmt.Errorf("runner: install %s: rename %s: %w", path, tmpName, err)
	}
	return nil
}

// compileScript writes the bytecode cache of the module named by argv[1]:
// a checked-hash .pyc (Python re-hashes the source before using it, so a
// cache that does not match the installed source is never used), mode
// 0444 in a 0755 __pycache__ whatever the umask, and prints its path.
const compileScript = `import importlib.util, os, py_compile, sys
src = sys.argv[1]
cache = importlib.util.cache_from_source(src)
os.makedirs(os.path.dirname(cache), mode=0o755, exist_ok=True)
os.chmod(os.path.dirname(cache), 0o755)
py_compile.compile(src, cfile=cache, doraise=True,
                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
os.chmod(cache, 0o444)
print(cache)
`

// compileTimeout bounds Compile: compiling one module takes milliseconds.
const compileTimeout = 30 * time.Second

// Compile writes the bytecode cache of the installed _str_runner.py in dir
// with python, the interpreter the sandboxes run, and returns the cache's
// path. It runs on the host, before any tool, on the worker's own embedded
// source: "-I -S" keeps the environment, the user's and the system's site
// packages (and their .pth files) out of it. A failure is not fatal to the
// caller: without a cache every run compiles the module from source, which
// costs about 5 ms of CPU more per tool call. A sandbox whose Python has a
// different version looks for another cache file and compiles from source.
func Compile(dir, python string) (string, error) {
	src := filepath.Join(dir, ModuleFileName)
	ctx, cancel := context.WithTimeout(context.Background(), compileTimeout)
	defer cancel()
	out, err := hostbox.Python(ctx, python, compileScript, src)
	if err != nil {
		return "", fmt.Errorf("runner: compile %s: %w", src, err)
	}
	cache := strings.TrimSpace(string(out))
	if !filepath.IsAbs(cache) {
		return "", fmt.Errorf("runner: compile %s with %s: unexpected output %q", src, python, cache)
	}
	return cache, nil
}
