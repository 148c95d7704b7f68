package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Tools of the work dir cap tests (issue 11: a restrictive tool wrote
// 3,000 MiB and 184,865 files to the host's work filesystem).
const capTools = `
import os, time

def fill_bytes(ctx, mb=400, chunk_mb=16, hold=0):
    # Files of chunk_mb (below RLIMIT_FSIZE) until the work dir is full.
    data = b"x" * (int(chunk_mb) << 20)
    written, error = 0, ""
    try:
        for i in range(int(mb) // int(chunk_mb)):
            with open("fill-%d" % i, "wb") as f:
                f.write(data)
            written += int(chunk_mb)
    except OSError as e:
        error = "%s: %s" % (type(e).__name__, e)
    ctx.send_status("full")
    time.sleep(float(hold))
    for name in os.listdir("."):
        if name.startswith("fill-"):
            os.remove(name)
    st = os.statvfs(".")
    return {"written_mb": written, "error": error, "size_mb": st.f_blocks * st.f_frsize >> 20}

def fill_and_answer(ctx, chunk_mb=16, inodes=0):
    # Fills its work dir and leaves it full (bytes, or inodes), catches
    # ENOSPC and answers: the runner's own files are not on the cap.
    data = b"x" * (int(chunk_mb) << 20)
    written, made, error = 0, 0, ""
    try:
        if int(inodes):
            while True:
                os.close(os.open("i%d" % made, os.O_CREAT | os.O_WRONLY, 0o600))
                made += 1
        while True:
            with open("fill-%d" % written, "wb") as f:
                f.write(data)
            written += 1
    except OSError as e:
        error = "%s: %s" % (type(e).__name__, e)
    ctx.send_status("full")
    st = os.statvfs(".")
    return {"written_chunks": written, "made": made, "error": error, "free_bytes": st.f_bavail * st.f_frsize,
            "free_inodes": st.f_favail}

def fill_inodes(ctx, n=100000):
    os.mkdir("many")
    made, error = 0, ""
    try:
        for i in range(int(n)):
            os.close(os.open("many/%d" % i, os.O_CREAT | os.O_WRONLY, 0o600))
            made += 1
    except OSError as e:
        error = "%s: %s" % (type(e).__name__, e)
    for name in os.listdir("many"):
        os.remove("many/" + name)
    return {"made": made, "error": error}
`

const capManifest = `  fill_bytes: {module: cap_tools, function: fill_bytes, sandbox_profile: restrictive}
  fill_inodes: {module: cap_tools, function: fill_inodes, sandbox_profile: restrictive}
  fill_and_answer: {module: cap_tools, function: fill_and_answer, sandbox_profile: restrictive}
`

func newCapEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "cap_tools.py"), []byte(capTools), 0o644))
	writeManifest(t, e.manifest, e2eManifest+capManifest)
	return e
}

// workDirMounts lists the work dir tmpfs mounts under base.
func workDirMounts(t *testing.T, base string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	must(t, err)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], base+"/") && strings.Contains(line, " - tmpfs str-workdir ") {
			out = append(out, f[4])
		}
	}
	return out
}

func capResult(t *testing.T, reply []byte) map[string]any {
	t.Helper()
	var r struct {
		Result struct {
			ToolResult map[string]any `json:"tool_result"`
		} `json:"result"`
	}
	must(t, json.Unmarshal(reply, &r))
	if r.Result.ToolResult == nil {
		t.Fatalf("not a result: %s", reply)
	}
	return r.Result.ToolResult
}

// A restrictive tool writing past its work dir's 256 MiB gets ENOSPC,
// and a concurrent call of another tool (its own work dir) is unaffected;
// no work dir tmpfs is left mounted afterwards.
func TestWorkDirCapBytes(t *testing.T) {
	requireRoot(t)
	e := newCapEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	id := a.invoke("fill_bytes", map[string]any{"args": map[string]any{"mb": 400, "hold": 3}})
	waitFor(t, "the work dir full", 60*time.Second, func() bool { return len(a.status(id)) > 0 })
	// While it is full: other tools run and write outputs.
	pid := a.invoke("process_file", map[string]any{"preloaded_artifacts": map[string]any{"input_file": map[string]any{
		"filename": "in.txt", "content": "aGVsbG8K"}}})
	if r := a.reply(a.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "hi"}}), replyWait); !isSuccess(r) {
		t.Fatalf("a concurrent call failed: %s", r)
	}
	if r := a.reply(pid, replyWait); !isSuccess(r) {
		t.Fatalf("a concurrent call with an output failed: %s", r)
	}
	res := capResult(t, a.reply(id, replyWait))
	if !strings.Contains(res["error"].(string), "No space left") {
		t.Fatalf("the tool was not stopped by the cap: %v", res)
	}
	if mb := res["written_mb"].(float64); mb > 256 || mb < 128 {
		t.Errorf("written %v MiB before ENOSPC, want up to the 256 MiB cap", mb)
	}
	if size := res["size_mb"].(float64); size != 256 {
		t.Errorf("the work dir's filesystem has %v MiB, want the profile's 256", size)
	}
	waitFor(t, "the work dir tmpfs unmounted", 30*time.Second, func() bool { return len(workDirMounts(t, e.work)) == 0 })
}

// Inodes are capped too (restrictive: 65536).
func TestWorkDirCapInodes(t *testing.T) {
	requireRoot(t)
	e := newCapEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	res := capResult(t, a.reply(a.invoke("fill_inodes", map[string]any{"args": map[string]any{"n": 100000}}), 2*replyWait))
	if !strings.Contains(res["error"].(string), "No space left") {
		t.Fatalf("the tool was not stopped by the inode cap: %v", res)
	}
	if made := res["made"].(float64); made > 65536 {
		t.Errorf("%v files made, the cap is 65536", made)
	}
}

// A tool that fills its work dir and leaves it full (bytes, or inodes)
// still returns its answer (issue 18 §2): the runner's arguments, result
// and status FIFO live on a tmpfs of their own, not on the tool's cap.
// Cold and pooled (the pool's work areas are made the same way).
func TestWorkDirFullToolStillAnswers(t *testing.T) {
	requireRoot(t)
	for _, c := range []struct {
		name   string
		inodes bool
	}{{"bytes", false}, {"inodes", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newCapEnv(t)
			w := startWorker(t, e, 0, nil)
			a := newAgent(t, w.port)
			id := a.invoke("fill_and_answer", map[string]any{"args": map[string]any{"inodes": c.inodes}})
			res := capResult(t, a.reply(id, 2*replyWait))
			if !strings.Contains(res["error"].(string), "No space left") {
				t.Fatalf("the tool did not fill its work dir: %v", res)
			}
			if c.inodes && res["free_inodes"].(float64) != 0 || !c.inodes && res["free_bytes"].(float64) >= 16<<20 {
				t.Fatalf("the work dir was not left full: %v", res)
			}
			if st := a.status(id); len(st) == 0 {
				t.Error("the status line sent with the work dir full was lost")
			}
			waitFor(t, "the work dir tmpfs unmounted", 30*time.Second, func() bool { return len(workDirMounts(t, e.work)) == 0 })
		})
	}
}
