package e2e

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Tools of the execution tests, beside example_tools and e2e_tools.
const execTools = `"""Tools of test/e2e/execution_test.go."""
import os, sys


def stderr_crash(ctx):
    sys.stderr.write("the beginning of a long complaint\n" + "x" * 20000 + "\n")
    sys.stderr.write("ValueError: the last words of the tool\n")
    sys.stderr.flush()
    os._exit(3)


def sized_result(ctx, size):
    # .str/result.json of exactly size bytes, written as a hostile tool can.
    head = '{"result": {"x": "'
    with open(".str/result.json", "w") as f:
        f.write(head + "a" * (int(size) - len(head) - 3) + '"}}')
    os._exit(0)
`

const execManifest = `  stderr_crash: {module: exec_tools, function: stderr_crash}
  sized_result: {module: exec_tools, function: sized_result}
`

// newExecEnv is newEnv with the execution tests' tools in the manifest.
func newExecEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "exec_tools.py"), []byte(execTools), 0o644))
	writeManifest(t, e.manifest, e2eManifest+execManifest)
	return e
}

// TestWorkerUnderUmask0027: the worker started with the systemd unit's
// UMask=0027 still runs tools (before, every call failed with
// SANDBOX_FAILED "died without a result (exit code 2)": the runner dir,
// the work dir and runner_args.json were unreadable by the sandbox's
// uid). Only the worker's process gets the umask (through a wrapper).
func TestWorkerUnderUmask0027(t *testing.T) {
	requireRoot(t)
	e := newExecEnv(t)
	wrapper := filepath.Join(t.TempDir(), "str-umask")
	must(t, os.WriteFile(wrapper, []byte("#!/bin/sh\numask 0027\nexec '"+strBin+"' \"$@\"\n"), 0o755))
	var w *workerProc
	saved := strBin
	strBin = wrapper
	func() {
		defer func() { strBin = saved }()
		w = startWorker(t, e, 0, nil)
	}()
	a := newAgent(t, w.port)
	id := a.invoke("process_file", map[string]any{"preloaded_artifacts": map[string]any{"input_file": map[string]any{
		"filename": "in.txt", "content": base64.StdEncoding.EncodeToString([]byte("one\ntwo\n")), "mime_type": "text/plain"}}})
	if r := a.reply(id, replyWait); !isSuccess(r) || !strings.Contains(string(r), `"lines":2`) {
		t.Fatalf("under umask 0027: %s", r)
	}
	if r := a.reply(a.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "hi"}}), replyWait); !isSuccess(r) {
		t.Fatalf("echo under umask 0027: %s", r)
	}
}

// TestCrashReportsStderr: a tool dying before result.json is reported with
// the end of its stderr, in the reply and in the worker's log.
func TestCrashReportsStderr(t *testing.T) {
	requireRoot(t)
	e := newExecEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	code, msg := errorCode(t, a.reply(a.invoke("stderr_crash", nil), replyWait))
	if code != "SANDBOX_FAILED" || !strings.Contains(msg, "exit code 3") || !strings.Contains(msg, "ValueError: the last words of the tool") {
		t.Fatalf("%s %.300s…", code, msg)
	}
	if strings.Contains(msg, "the beginning of a long complaint") || len(msg) > 9*1024 {
		t.Fatalf("the stderr in the message is not the last 8 KiB (%d bytes)", len(msg))
	}
	waitFor(t, "the stderr in the log", replyWait, func() bool {
		return strings.Contains(w.log.String(), "ValueError: the last words of the tool")
	})
}

// TestOversizedResultIsAnswered: a result that fits 16 MiB but not a
// broker message once wrapped used to be refused by the broker while the
// worker logged success (the agent got nothing); it is a TOOL_ERROR now.
func TestOversizedResultIsAnswered(t *testing.T) {
	requireRoot(t)
	e := newExecEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	code, msg := errorCode(t, a.reply(a.invoke("sized_result", map[string]any{"args": map[string]any{"size": 16_777_100}}), replyWait))
	if code != "TOOL_ERROR" || !strings.Contains(msg, "too large") {
		t.Fatalf("%s %s", code, msg)
	}
	if m := w.metricLine(`str_worker_invocations_total{outcome="success",tool="sized_result"}`); m != "" {
		t.Fatalf("counted as a success: %s", m)
	}
}

// TestArtifactAuditLogByDefault: the filesystem store's audit log is on by
// default at <ARTIFACT_BASE_PATH>/.audit/audit.jsonl and records the
// input read and the outputs written by a call.
func TestArtifactAuditLogByDefault(t *testing.T) {
	requireRoot(t)
	e := newExecEnv(t)
	dir := filepath.Join(e.artifacts, "e2e", "u-1", "s-1", "data.txt")
	must(t, os.MkdirAll(dir, 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "0"), []byte("a\nb\nc\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "0.meta"), []byte(`{"mime_type": "text/plain"}`), 0o644))
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	r := a.reply(a.invoke("process_file", map[string]any{"artifact_references": map[string]any{"input_file": map[string]any{"filename": "data.txt"}}}), replyWait)
	if !isSuccess(r) {
		t.Fatalf("%s", r)
	}
	b, err := os.ReadFile(filepath.Join(e.artifacts, ".audit", "audit.jsonl"))
	must(t, err)
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var l struct{ Op, Filename, User, Session, SHA256 string }
		must(t, json.Unmarshal([]byte(line), &l))
		if l.User != "u-1" || l.Session != "s-1" || l.SHA256 == "" {
			t.Errorf("audit line %s", line)
		}
		got = append(got, l.Op+" "+l.Filename)
	}
	if want := "load data.txt|save summary.txt|save upper.txt"; strings.Join(got, "|") != want {
		t.Fatalf("audit log %q, want %q", got, want)
	}
}

// metricLine returns the /metrics line starting with prefix ("" if none).
func (w *workerProc) metricLine(prefix string) string {
	_, body := w.get("/metrics")
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestWorkerSIGTERMBeforeBroker: a worker stopped before it ever reached
// its broker exits 0 without "worker failed" (issue 7: it logged an error
// and exited 1, which a supervisor reads as a crash).
func TestWorkerSIGTERMBeforeBroker(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := launchWorker(t, e, freePort(t), nil) // nothing listens there
	waitFor(t, "a failed connect attempt in the log", 30*time.Second, func() bool {
		return strings.Contains(w.log.String(), "connect failed, retrying")
	})
	w.stop(syscall.SIGTERM)
	if code := w.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM before the first connection, want 0", code)
	}
	if strings.Contains(w.log.String(), "worker failed") {
		t.Errorf("the log says the worker failed:\n%s", tail(w.log.String(), 20))
	}
}
