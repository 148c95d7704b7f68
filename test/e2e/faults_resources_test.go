package e2e

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/testfs"
)

// Fault survival, part B (issue 11): resource and configuration faults.
// Each fault gets a code that blames the worker's side (never
// INVALID_REQUEST), /readyz reports it with the error seen, the worker
// keeps serving what it can, and once the fault is repaired everything
// works again without a restart. The faults are made on real
// filesystems: tmpfs mounts of the test's own, unmounted at its end.

// faultWait bounds the waits for /readyz to follow a fault or a repair
// (the worker re-checks at every /readyz at most once a second, and every
// 5 s on its own).
const faultWait = 30 * time.Second

type readyBody struct {
	OK               bool              `json:"ok"`
	Faults           map[string]string `json:"faults"`
	Degraded         map[string]string `json:"degraded"`
	UnavailableTools map[string]string `json:"unavailable_tools"`
}

func (w *workerProc) readyz() (int, readyBody) {
	w.t.Helper()
	code, body := w.get("/readyz")
	var b readyBody
	if err := json.Unmarshal([]byte(body), &b); err != nil {
		w.t.Fatalf("/readyz %d: %v: %q", code, err, body)
	}
	return code, b
}

// waitReadyz waits until /readyz answers code with a body cond accepts,
// and returns that body.
func (w *workerProc) waitReadyz(t *testing.T, what string, code int, cond func(readyBody) bool) readyBody {
	t.Helper()
	var last readyBody
	var lastCode int
	deadline := time.Now().Add(faultWait)
	for {
		lastCode, last = w.readyz()
		if lastCode == code && cond(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz: %s not seen within %v; last %d %+v", what, faultWait, lastCode, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// callEcho asserts that echo_tool succeeds.
func callEcho(t *testing.T, a *agent, when string) {
	t.Helper()
	if r := a.reply(a.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "hi"}}), replyWait); !isSuccess(r) {
		t.Fatalf("echo_tool %s: %s", when, r)
	}
}

// callOutputs calls process_file, which saves two outputs, and returns
// the reply.
func callOutputs(t *testing.T, a *agent) []byte {
	t.Helper()
	return a.reply(a.invoke("process_file", map[string]any{"preloaded_artifacts": map[string]any{"input_file": map[string]any{
		"filename": "in.txt", "content": "aGVsbG8gd29ybGQK"}}}), replyWait)
}

// wantCode asserts an error reply's code and that its message holds each
// of parts.
func wantCode(t *testing.T, what string, reply []byte, code string, parts ...string) {
	t.Helper()
	got, msg := errorCode(t, reply)
	if got != code {
		t.Errorf("%s: code %s (%s), want %s", what, got, msg, code)
	}
	for _, p := range parts {
		if !strings.Contains(msg, p) {
			t.Errorf("%s: message %q does not mention %q", what, msg, p)
		}
	}
}

// storeFiles lists the files under the store's scope dir other than the
// lock files: the versions and their .meta, and anything half-written.
func storeFiles(t *testing.T, base string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(base, "e2e"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != ".lock" {
			out = append(out, strings.TrimPrefix(p, base))
		}
		return nil
	})
	return out
}

// TestFaultManifestGarbage: the manifest replaced by garbage, then by
// valid YAML breaking the schema: the worker keeps serving the last good
// manifest, logs why, and /readyz stays 200 with degraded.manifest
// saying why; the file repaired, the degradation is gone and a new edit
// is applied again.
func TestFaultManifestGarbage(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	callEcho(t, a, "before the fault")

	for _, c := range []struct{ name, content, want string }{
		{"garbage", "\x00\x01\xfe tools: [[[ {{", "invalid manifest"},
		// A problem of the whole file (an entry's own only makes that
		// entry unavailable: TestReferenceManifestServesGoodEntries).
		{"schema", "version: 1\nfunktion: echo_tool\ntools:\n  echo_tool: {module: example_tools, function: echo_tool}\n", "funktion"},
	} {
		writeManifest(t, e.manifest, c.content)
		b := w.waitReadyz(t, c.name+" reported under degraded.manifest", 200, func(b readyBody) bool {
			return strings.Contains(b.Degraded["manifest"], c.want)
		})
		if !b.OK || b.Faults != nil || !strings.Contains(b.Degraded["manifest"], "keeping the previous") {
			t.Errorf("%s: /readyz %+v", c.name, b)
		}
		// the last good manifest still serves, all of it.
		callEcho(t, a, "with a "+c.name+" manifest")
		if r := a.reply(a.invoke("sleeper", map[string]any{"args": map[string]any{"seconds": 0}}), replyWait); !isSuccess(r) {
			t.Errorf("%s: a tool of the last good manifest: %s", c.name, r)
		}
		if !strings.Contains(w.log.String(), c.want) {
			t.Errorf("%s: the worker log does not say why (%q)", c.name, c.want)
		}
	}

	// repaired with an edit: applied, the degradation gone.
	writeManifest(t, e.manifest, e2eManifest+"  echo_again: {module: example_tools, function: echo_tool}\n")
	w.waitReadyz(t, "the degradation cleared", 200, func(b readyBody) bool { return b.OK && b.Degraded == nil })
	if r := a.reply(a.invoke("echo_again", map[string]any{"args": map[string]any{"message": "x"}}), replyWait); !isSuccess(r) {
		t.Errorf("a tool added by the repairing edit: %s", r)
	}
	callEcho(t, a, "after the repair")
}

// TestFaultToolsDirRemoved: the tools dir removed while serving: calls
// are TOOL_NOT_AVAILABLE (the worker's configuration, never the caller),
// /readyz lists the tools as unavailable; restored, they serve again
// without a restart.
func TestFaultToolsDirRemoved(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	callEcho(t, a, "before the fault")

	must(t, os.RemoveAll(e.tools))
	wantCode(t, "echo_tool without its tools dir", a.reply(a.invoke("echo_tool", nil), replyWait),
		"TOOL_NOT_AVAILABLE", "Tool 'echo_tool' is not available on this worker")
	wantCode(t, "sleeper without its tools dir", a.reply(a.invoke("sleeper", nil), replyWait), "TOOL_NOT_AVAILABLE")
	b := w.waitReadyz(t, "the tools listed unavailable", 200, func(b readyBody) bool {
		return strings.Contains(b.UnavailableTools["echo_tool"], e.tools) && b.UnavailableTools["sleeper"] != ""
	})
	if len(b.UnavailableTools) != strings.Count(e2eManifest, "module:") {
		t.Errorf("unavailable tools: %v, want every manifest tool", b.UnavailableTools)
	}

	// restored: served again, the same subscriptions.
	must(t, os.MkdirAll(e.tools, 0o755))
	copyFile(t, "../../examples/tools/python/example_tools.py", filepath.Join(e.tools, "example_tools.py"))
	copyFile(t, "testdata/e2e_tools.py", filepath.Join(e.tools, "e2e_tools.py"))
	w.waitReadyz(t, "no tool unavailable", 200, func(b readyBody) bool { return b.UnavailableTools == nil })
	callEcho(t, a, "after the tools dir is restored")
	if r := a.reply(a.invoke("sleeper", map[string]any{"args": map[string]any{"seconds": 0}}), replyWait); !isSuccess(r) {
		t.Errorf("sleeper after the tools dir is restored: %s", r)
	}
}

// TestFaultArtifactStoreFull: the store's filesystem full: a call saving
// outputs is RESOURCE_EXHAUSTED and leaves nothing in the store, /readyz
// is 503 naming artifact_store with the errno seen, calls without
// outputs succeed; space freed, everything works again.
func TestFaultArtifactStoreFull(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	testfs.Tmpfs(t, e.artifacts, "size=2m,mode=0755")
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	if r := callOutputs(t, a); !isSuccess(r) {
		t.Fatalf("outputs before the fault: %s", r)
	}
	before := storeFiles(t, e.artifacts)
	if len(before) != 4 {
		t.Fatalf("store after one call: %q, want two versions and their .meta", before)
	}

	testfs.FillBytes(t, filepath.Join(e.artifacts, "filler"))
	wantCode(t, "outputs on a full store", callOutputs(t, a), "RESOURCE_EXHAUSTED", "no space left on device", "nothing was saved")
	if after := storeFiles(t, e.artifacts); strings.Join(after, " ") != strings.Join(before, " ") {
		t.Errorf("a failed save changed the store: %q, was %q", after, before)
	}
	b := w.waitReadyz(t, "the artifact_store fault", 503, func(b readyBody) bool { return b.Faults["artifact_store"] != "" })
	if f := b.Faults["artifact_store"]; b.OK || !strings.Contains(f, e.artifacts) || !strings.Contains(f, "no space left on device") {
		t.Errorf("/readyz with the store full: %+v", b)
	}
	const gauge = `str_worker_faults{kind="fault",name="artifact_store"}`
	if v := w.metric(gauge); v != 1 {
		t.Errorf("%s = %v with the store full, want 1", gauge, v)
	}
	callEcho(t, a, "(no outputs) with the store full")

	must(t, os.Remove(filepath.Join(e.artifacts, "filler")))
	w.waitReadyz(t, "the fault cleared", 200, func(b readyBody) bool { return b.OK && b.Faults == nil })
	if v := w.metric(gauge); v != 0 {
		t.Errorf("%s = %v once cleared, want 0", gauge, v)
	}
	if r := callOutputs(t, a); !isSuccess(r) {
		t.Errorf("outputs after freeing space: %s", r)
	}
	if got := len(storeFiles(t, e.artifacts)); got != 8 {
		t.Errorf("store after freeing space and one more call: %d files, want 8", got)
	}
}

// TestFaultArtifactStoreReadOnly: the store remounted read-only: outputs
// are ARTIFACT_ERROR (the worker's side), /readyz is 503 naming
// artifact_store; then its audit log's filesystem (a mount of its own)
// read-only: outputs are ARTIFACT_ERROR naming the audit log (fail
// closed), /readyz names artifact_audit_log. Each remounted read-write,
// everything works again.
func TestFaultArtifactStoreReadOnly(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	auditDir := filepath.Join(e.root, "audit")
	testfs.Tmpfs(t, e.artifacts, "size=2m,mode=0755")
	testfs.Tmpfs(t, auditDir, "size=1m,mode=0700")
	auditLog := filepath.Join(auditDir, "audit.jsonl")
	w := startWorker(t, e, 0, map[string]string{"ARTIFACT_AUDIT_LOG": auditLog})
	a := newAgent(t, w.port)
	if r := callOutputs(t, a); !isSuccess(r) {
		t.Fatalf("outputs before the fault: %s", r)
	}

	// 1. the store read-only.
	testfs.Remount(t, e.artifacts, true)
	wantCode(t, "outputs on a read-only store", callOutputs(t, a), "ARTIFACT_ERROR", "read-only file system", "nothing was saved")
	b := w.waitReadyz(t, "the artifact_store fault", 503, func(b readyBody) bool { return b.Faults["artifact_store"] != "" })
	if f := b.Faults["artifact_store"]; !strings.Contains(f, e.artifacts) || !strings.Contains(f, "read-only file system") || b.Faults["artifact_audit_log"] != "" {
		t.Errorf("/readyz with the store read-only: %+v", b)
	}
	callEcho(t, a, "(no outputs) with the store read-only")
	testfs.Remount(t, e.artifacts, false)
	w.waitReadyz(t, "the store fault cleared", 200, func(b readyBody) bool { return b.OK && b.Faults == nil })
	if r := callOutputs(t, a); !isSuccess(r) {
		t.Errorf("outputs after remounting the store read-write: %s", r)
	}

	// 2. the audit log read-only (the store writable).
	testfs.Remount(t, auditDir, true)
	// The agent's reply names the log by its role, never the worker's
	// host path (issue 15 §6); /readyz and the worker log keep the path.
	r := callOutputs(t, a)
	wantCode(t, "outputs with a read-only audit log", r, "ARTIFACT_ERROR", "audit log <artifact audit log>", "read-only file system")
	if strings.Contains(string(r), auditDir) {
		t.Errorf("the reply names the host path %s: %s", auditDir, r)
	}
	b = w.waitReadyz(t, "the artifact_audit_log fault", 503, func(b readyBody) bool { return b.Faults["artifact_audit_log"] != "" })
	if f := b.Faults["artifact_audit_log"]; !strings.Contains(f, auditLog) || !strings.Contains(f, "read-only file system") || b.Faults["artifact_store"] != "" {
		t.Errorf("/readyz with the audit log read-only: %+v", b)
	}
	callEcho(t, a, "(no outputs) with the audit log read-only")
	testfs.Remount(t, auditDir, false)
	w.waitReadyz(t, "the audit log fault cleared", 200, func(b readyBody) bool { return b.OK && b.Faults == nil })
	if r := callOutputs(t, a); !isSuccess(r) {
		t.Errorf("outputs after remounting the audit log read-write: %s", r)
	}
	data, err := os.ReadFile(auditLog)
	must(t, err)
	if n := strings.Count(string(data), `"op":"save"`); n < 4 {
		t.Errorf("audit log has %d save lines after recovering, want at least 4:\n%s", n, data)
	}
}

// TestFaultWorkDirFull: the work dir's filesystem full (bytes and
// inodes: a call's files go to its own capped tmpfs, only its directory
// to the work base): calls are RESOURCE_EXHAUSTED, /readyz is 503 naming
// work_dir with the errno seen; freed, calls work again.
func TestFaultWorkDirFull(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	fsDir := filepath.Join(e.root, "workfs")
	testfs.Tmpfs(t, fsDir, "size=2m,nr_inodes=256,mode=0755")
	e.work = filepath.Join(fsDir, "work")
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	callEcho(t, a, "before the fault")
	// The call's work dir is removed after its reply (runTask): fill only
	// once it is gone, or its removal frees what the fill took and the
	// faulted call finds room (seen in CI: the call below succeeded).
	waitFor(t, "the first call's work dir removed", 30*time.Second, func() bool { return len(testfs.Names(e.work)) == 0 })

	testfs.FillBytes(t, filepath.Join(fsDir, "filler"))
	testfs.FillInodes(t, filepath.Join(fsDir, "many"))
	wantCode(t, "a call with the work dir full", a.reply(a.invoke("echo_tool", nil), replyWait), "RESOURCE_EXHAUSTED", "no disk space for the work dir")
	b := w.waitReadyz(t, "the work_dir fault", 503, func(b readyBody) bool { return b.Faults["work_dir"] != "" })
	if f := b.Faults["work_dir"]; b.OK || !strings.Contains(f, e.work) || !strings.Contains(f, "no space left on device") {
		t.Errorf("/readyz with the work dir full: %+v", b)
	}

	must(t, os.RemoveAll(filepath.Join(fsDir, "many")))
	must(t, os.Remove(filepath.Join(fsDir, "filler")))
	w.waitReadyz(t, "the fault cleared", 200, func(b readyBody) bool { return b.OK && b.Faults == nil })
	callEcho(t, a, "after freeing the work dir")
	if r := callOutputs(t, a); !isSuccess(r) {
		t.Errorf("outputs after freeing the work dir: %s", r)
	}
}
