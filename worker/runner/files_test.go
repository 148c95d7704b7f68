package runner

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestWriteArgs(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "runner_args.json")
	a := &Args{Module: "m", Function: "f", ResultFile: "/w/result.json", Args: json.RawMessage(` {"n": 1} `)}
	if err := WriteArgs(p, a); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("stat %v mode %v", err, st.Mode())
	}
	var doc map[string]json.RawMessage
	data, _ := os.ReadFile(p)
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	keys := []string{"module", "function", "class_name", "args", "tool_config", "artifact_paths", "artifact_metadata",
		"status_pipe", "result_file", "output_dir", "user_id", "session_id", "app_name"}
	if len(doc) != len(keys) {
		t.Errorf("runner_args.json has %d keys, want %d: %s", len(doc), len(keys), data)
	}
	for _, k := range keys {
		if _, ok := doc[k]; !ok {
			t.Errorf("key %q missing", k)
		}
	}
	for k, want := range map[string]string{"args": `{"n":1}`, "tool_config": `{}`, "artifact_paths": `{}`, "artifact_metadata": `{}`} {
		if string(doc[k]) != want {
			t.Errorf("%s = %s, want %s", k, doc[k], want)
		}
	}

	// O_EXCL: never overwrite.
	if err := WriteArgs(p, a); !errors.Is(err, os.ErrExist) {
		t.Errorf("second write: %v, want ErrExist", err)
	}
	// no symlink followed
	target := filepath.Join(dir, "target")
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteArgs(link, a); err == nil {
		t.Error("wrote through a symlink")
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Error("symlink target was created")
	}
	// every problem collected
	err = WriteArgs(filepath.Join(dir, "bad.json"), &Args{Args: json.RawMessage(`[1]`), ToolConfig: json.RawMessage(`"x"`)})
	for _, want := range []string{"module is empty", "function and class_name are both empty", "result_file is empty", "args: not a JSON object", "tool_config: not a JSON object"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

func TestReadResult(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := []struct {
		content string
		check   func(*Outcome) bool
	}{
		{`{"result": {"a": 1}}`, func(o *Outcome) bool { return string(o.Result) == `{"a": 1}` && o.Error == "" }},
		{`{"error": "x", "error_kind": "tool"}`, func(o *Outcome) bool { return o.Error == "x" && o.ErrorKind == KindTool }},
		{`{"error": "x", "error_kind": "import"}`, func(o *Outcome) bool { return o.ErrorKind == KindImport }},
		{`{"error": "reference style"}`, func(o *Outcome) bool { return o.ErrorKind == KindExecution }},
		{`{"result": {}, "output_mime_types": {"a.bin": "x/y"}}`, func(o *Outcome) bool { return o.OutputMimeTypes["a.bin"] == "x/y" }},
	}
	for i, g := range good {
		o, err := ReadResult(write("good.json", g.content), 1024)
		if err != nil || !g.check(o) {
			t.Errorf("case %d %s: %+v, %v", i, g.content, o, err)
		}
	}
	bad := map[string]string{
		`[]`:                                   "not a JSON object",
		`null`:                                 "null",
		`{"result": [1]}`:                      "result is not a JSON object",
		`{"result": "s"}`:                      "result is not a JSON object",
		`{"result": null}`:                     "result is not a JSON object",
		`{"error": "x", "error_kind": "oops"}`: `unknown error_kind "oops"`,
		`{"error": 3}`:                         "error is not a string",
		`{"result": {}, "error": "x"}`:         "both",
		`{}`:                                   "neither",
		`{"result": {}, "extra": 1}`:           `unknown key "extra"`,
		`{"result": {}, "error_kind": "tool"}`: "without",
		`{"result": {`:                         "not a JSON object",
	}
	for content, want := range bad {
		_, err := ReadResult(write("bad.json", content), 1024)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one containing %q", content, err, want)
		}
	}

	// oversized
	big := write("big.json", `{"result": {"k": "`+strings.Repeat("a", 2000)+`"}}`)
	if _, err := ReadResult(big, 1000); err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Errorf("oversized: %v", err)
	}
	if _, err := ReadResult(big, 0); err != nil {
		t.Errorf("no limit: %v", err)
	}
	// symlink to a valid result is refused
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(filepath.Join(dir, "good.json"), link); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadResult(link, 1024); err == nil || !strings.Contains(err.Error(), "symlink") {
		t.Errorf("symlink: %v", err)
	}
	// a FIFO is refused without blocking
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadResult(fifo, 1024); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("fifo: %v", err)
	}
	// a directory is refused
	if _, err := ReadResult(dir, 1024); err == nil {
		t.Error("directory accepted")
	}
	// missing file
	if _, err := ReadResult(filepath.Join(dir, "none.json"), 1024); !errors.Is(err, ErrNoResult) {
		t.Errorf("missing: %v, want ErrNoResult", err)
	}
}

func TestInstall(t *testing.T) {
	dir := t.TempDir()
	p, err := Install(dir)
	if err != nil {
		t.Fatal(err)
	}
	if p != filepath.Join(dir, FileName) {
		t.Errorf("path %s", p)
	}
	st, err := os.Lstat(p)
	if err != nil || st.Mode().Perm() != 0o444 || !st.Mode().IsRegular() {
		t.Fatalf("installed file: %v %v", st.Mode(), err)
	}
	got, _ := os.ReadFile(p)
	if !bytes.Equal(got, Source) || len(Source) == 0 {
		t.Fatal("installed content differs from Source")
	}
	mod := filepath.Join(dir, ModuleFileName)
	if st, err := os.Lstat(mod); err != nil || st.Mode().Perm() != 0o444 || !st.Mode().IsRegular() {
		t.Fatalf("installed module: %v", err)
	}
	if got, _ := os.ReadFile(mod); !bytes.Equal(got, ModuleSource) || len(ModuleSource) == 0 {
		t.Fatal("installed module differs from ModuleSource")
	}
	ino := st.Sys().(*syscall.Stat_t).Ino
	// second install keeps the identical file
	if _, err := Install(dir); err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Lstat(p)
	if st2.Sys().(*syscall.Stat_t).Ino != ino {
		t.Error("identical runner was rewritten")
	}
	// a tampered or symlinked runner is replaced atomically
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/hostname", p); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(dir); err != nil {
		t.Fatal(err)
	}
	st3, _ := os.Lstat(p)
	if !st3.Mode().IsRegular() {
		t.Error("symlink not replaced")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("install left %d entries, want runner.py and %s", len(entries), ModuleFileName)
	}
	if _, err := Install(filepath.Join(dir, "missing")); err == nil {
		t.Error("install into a missing dir succeeded")
	}
}
