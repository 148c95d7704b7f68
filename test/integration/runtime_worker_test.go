package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/syncbuf"
	"golang.org/x/sys/unix"
)

// The worker serves a tool per runtime class (issue 33's done-when): a
// manifest of tools under namespaces (standard), gvisor (the example
// profile, loaded from SANDBOX_PROFILE_DIR) and microvm (a profile this
// str cannot run). echo and an artifact round trip (an input artifact
// read, an output artifact saved and stored) work under the first two;
// the gvisor calls run on gVisor's kernel, not the host's; the microvm
// tool is listed on /readyz and answered TOOL_NOT_AVAILABLE, each with
// the reason.
func TestWorkerServesEachRuntimeClass(t *testing.T) {
	needRunsc(t)
	dir, tools := templateWorkerDir(t, "str-it-rt-")
	const tool = `import os, platform

def echo(ctx, text="hi"):
    return {"text": text, "release": platform.release(), "uid": os.getuid()}

def round_trip(ctx):
    data = ctx.load_artifact_text("f")
    ctx.save_artifact_text("upper.txt", data.upper())
    return {"read": data, "release": platform.release()}
`
	if err := os.WriteFile(filepath.Join(tools, "rt_tools.py"), []byte(tool), 0o644); err != nil {
		t.Fatal(err)
	}
	profiles := filepath.Join(dir, "profiles")
	if err := os.Mkdir(profiles, 0o755); err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../../examples/profiles/gvisor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	microvm := strings.Replace(strings.Replace(string(example), "name: gvisor", "name: microvm-example", 1), "runtime: gvisor", "runtime: microvm", 1)
	egress := strings.Replace(strings.Replace(string(example), "name: gvisor", "name: gvisor-egress", 1), "policy: isolated", "policy: allow_egress", 1)
	for name, text := range map[string]string{"gvisor.yaml": string(example), "microvm-example.yaml": microvm, "gvisor-egress.yaml": egress} {
		if err := os.WriteFile(filepath.Join(profiles, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(`version: 1
tools:
  echo_namespaces: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: standard}
  trip_namespaces: {module: rt_tools, function: round_trip, timeout_seconds: 30, sandbox_profile: standard}
  echo_gvisor: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: gvisor}
  trip_gvisor: {module: rt_tools, function: round_trip, timeout_seconds: 30, sandbox_profile: gvisor}
  warm_gvisor: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: gvisor, warm: 1}
  tpl_gvisor: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: gvisor, warm: template}
  egress_gvisor: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: gvisor-egress}
  narrowed_gvisor: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: gvisor-egress, network: {policy: isolated}}
  echo_microvm: {module: rt_tools, function: echo, timeout_seconds: 30, sandbox_profile: microvm-example}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	artifacts := filepath.Join(dir, "artifacts")
	broker, health := freeTCPPort(t), freeTCPPort(t)
	w := startWorker(t, broker, health, map[string]string{
		"SAM_NAMESPACE": "it/", "MANIFEST_PATH": manifest, "TOOLS_PYTHON_DIR": tools, "SANDBOX_PROFILE_DIR": profiles,
		"SANDBOX_WORK_DIR": filepath.Join(dir, "work"), "STR_RUNNER_DIR": filepath.Join(dir, "runner"), "STR_SITE_DIR": filepath.Join(dir, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": artifacts,
	})
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	host := unix.ByteSliceToString(uts.Release[:])
	input := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(input, []byte("round trip"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, class := range []string{"namespaces", "gvisor"} {
		t.Run(class, func(t *testing.T) {
			onHost := class == "namespaces"
			r, out := invokeClass(t, broker, "echo_"+class, `{"text": "hello `+class+`"}`)
			if r.Result == nil || r.Result.TimedOut || r.Result.ToolResult["text"] != "hello "+class || r.Result.ToolResult["uid"] != float64(65534) {
				t.Fatalf("echo: want the text back from uid 65534; output:\n%s\nworker log:\n%s", out, w.log.String())
			}
			if got := r.Result.ToolResult["release"]; (got == host) != onHost {
				t.Errorf("echo ran on kernel %v, the host's is %s: want the host's only under namespaces", got, host)
			}
			r, out = invokeClass(t, broker, "trip_"+class, `{}`, "--artifact", "f="+input)
			if r.Result == nil || r.Result.TimedOut || r.Result.ToolResult["read"] != "round trip" ||
				len(r.Result.Created) != 1 || r.Result.Created[0].Filename != "upper.txt" {
				t.Fatalf("round trip: want the input read and upper.txt created; output:\n%s\nworker log:\n%s", out, w.log.String())
			}
			if got := r.Result.ToolResult["release"]; (got == host) != onHost {
				t.Errorf("round trip ran on kernel %v, the host's is %s", got, host)
			}
		})
	}
	// Both calls saved upper.txt: two versions in the store, each the
	// input upper-cased.
	stored, _ := filepath.Glob(filepath.Join(artifacts, "*", "*", "*", "upper.txt", "[0-9]"))
	if len(stored) != 2 {
		t.Errorf("stored versions of upper.txt: %v, want 2", stored)
	}
	for _, f := range stored {
		if b, err := os.ReadFile(f); err != nil || string(b) != "ROUND TRIP" {
			t.Errorf("%s: %q %v, want ROUND TRIP", f, b, err)
		}
	}

	// A warm pool (or a template) for a gvisor tool is refused with the
	// reason (the worker log); its calls run cold under gvisor, never
	// pooled under namespaces.
	r, out := invokeClass(t, broker, "warm_gvisor", `{"text": "warm"}`)
	if r.Result == nil || r.Result.ToolResult["text"] != "warm" || r.Result.ToolResult["release"] == host {
		t.Errorf("warm_gvisor: want the text back from gVisor's kernel; output:\n%s\nworker log:\n%s", out, w.log.String())
	}
	if !strings.Contains(w.log.String(), "a pre-built sandbox (the worker's warm pool)") {
		t.Errorf("the worker log does not say why warm_gvisor has no pool:\n%s", w.log.String())
	}
	// So is a template.
	r, out = invokeClass(t, broker, "tpl_gvisor", `{"text": "template"}`)
	if r.Result == nil || r.Result.ToolResult["text"] != "template" || r.Result.ToolResult["release"] == host {
		t.Errorf("tpl_gvisor: want the text back from gVisor's kernel; output:\n%s\nworker log:\n%s", out, w.log.String())
	}
	if !strings.Contains(w.log.String(), "not a pre-built one (the warm pool, templates, str serve)") {
		t.Errorf("the worker log does not say why tpl_gvisor has no template:\n%s", w.log.String())
	}

	// A gvisor profile whose network this str does not run under gVisor
	// yet: its calls are TOOL_NOT_AVAILABLE naming why; the same profile
	// narrowed to isolated by the manifest entry runs.
	r, out = invokeClass(t, broker, "egress_gvisor", `{}`)
	if r.Error == nil || r.Error.Code != "TOOL_NOT_AVAILABLE" || !strings.Contains(r.Error.Message, "network policy allow_egress") {
		t.Errorf("egress_gvisor: want TOOL_NOT_AVAILABLE naming the network policy; output:\n%s", out)
	}
	r, out = invokeClass(t, broker, "narrowed_gvisor", `{"text": "narrowed"}`)
	if r.Result == nil || r.Result.ToolResult["text"] != "narrowed" || r.Result.ToolResult["release"] == host {
		t.Errorf("narrowed_gvisor: want the text back from gVisor's kernel; output:\n%s\nworker log:\n%s", out, w.log.String())
	}

	const reason = "runtime microvm cannot run this sandbox here"
	r, out = invokeClass(t, broker, "echo_microvm", `{}`)
	if r.Error == nil || r.Error.Code != "TOOL_NOT_AVAILABLE" || !strings.Contains(r.Error.Message, reason) {
		t.Errorf("echo_microvm: want TOOL_NOT_AVAILABLE naming %q; output:\n%s", reason, out)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "echo_microvm") || !strings.Contains(string(body), reason) ||
		strings.Contains(string(body), "echo_gvisor") {
		t.Errorf("/readyz: want echo_microvm listed with %q, the gvisor tools not:\n%s", reason, body)
	}
}

// classReply is the part of the worker's reply the test reads.
type classReply struct {
	Result *struct {
		ToolResult map[string]any `json:"tool_result"`
		TimedOut   bool           `json:"timed_out"`
		Created    []struct {
			Filename string `json:"filename"`
		} `json:"created_artifacts"`
	} `json:"result"`
	Error *struct{ Code, Message string } `json:"error"`
}

// invokeClass is invoke with str invoke's extra flags (--artifact).
func invokeClass(t *testing.T, broker int, tool, args string, extra ...string) (classReply, string) {
	t.Helper()
	var r classReply
	out := invokeInto(t, broker, tool, args, &r, extra...)
	return r, out
}

// A gvisor call keeps the worker's result contract as a namespaces call
// does: a tool past its timeout is timed_out, a tool that dies says its
// stderr's last lines in the error, a cancel ends the call CANCELLED;
// each reply is the one the namespaces class gives.
func TestWorkerGVisorResultContract(t *testing.T) {
	needRunsc(t)
	dir, tools := templateWorkerDir(t, "str-it-rtc-")
	const tool = `import os, sys, time

def sleepy(ctx):
    time.sleep(600)

def crash(ctx):
    sys.stderr.write("the tool's last words\n")
    sys.stderr.flush()
    os._exit(3)

def wait_cancel(ctx):
    with open("started", "w") as f:
        f.write("yes")
    time.sleep(600)
`
	if err := os.WriteFile(filepath.Join(tools, "rtc_tools.py"), []byte(tool), 0o644); err != nil {
		t.Fatal(err)
	}
	profiles := filepath.Join(dir, "profiles")
	if err := os.Mkdir(profiles, 0o755); err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../../examples/profiles/gvisor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(profiles, "gvisor.yaml"), example, 0o644); err != nil {
		t.Fatal(err)
	}
	var m strings.Builder
	m.WriteString("version: 1\ntools:\n")
	for _, class := range []string{"namespaces", "gvisor"} {
		profile := map[string]string{"namespaces": "restrictive", "gvisor": "gvisor"}[class]
		fmt.Fprintf(&m, "  sleepy_%s: {module: rtc_tools, function: sleepy, timeout_seconds: 1, sandbox_profile: %s}\n", class, profile)
		fmt.Fprintf(&m, "  crash_%s: {module: rtc_tools, function: crash, timeout_seconds: 30, sandbox_profile: %s}\n", class, profile)
		fmt.Fprintf(&m, "  cancel_%s: {module: rtc_tools, function: wait_cancel, timeout_seconds: 120, sandbox_profile: %s}\n", class, profile)
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(m.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	broker, health := freeTCPPort(t), freeTCPPort(t)
	w := startWorker(t, broker, health, map[string]string{
		"SAM_NAMESPACE": "it/", "MANIFEST_PATH": manifest, "TOOLS_PYTHON_DIR": tools, "SANDBOX_PROFILE_DIR": profiles,
		"SANDBOX_WORK_DIR": work, "STR_RUNNER_DIR": filepath.Join(dir, "runner"), "STR_SITE_DIR": filepath.Join(dir, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": filepath.Join(dir, "artifacts"),
	})

	crashCode := map[string]string{}
	for _, class := range []string{"namespaces", "gvisor"} {
		r, out := invokeClass(t, broker, "sleepy_"+class, `{}`)
		if r.Result == nil || !r.Result.TimedOut {
			t.Errorf("sleepy_%s: want timed_out; output:\n%s", class, out)
		}
		r, out = invokeClass(t, broker, "crash_"+class, `{}`)
		if r.Error == nil || !strings.Contains(r.Error.Message, "the tool's last words") {
			t.Errorf("crash_%s: want an error carrying the tool's stderr; output:\n%s", class, out)
		} else {
			crashCode[class] = r.Error.Code
		}
		r, out = cancelClass(t, broker, work, "cancel_"+class)
		if r.Error == nil || r.Error.Code != "CANCELLED" {
			t.Errorf("cancel_%s: want CANCELLED; output:\n%s", class, out)
		}
	}
	if crashCode["namespaces"] != crashCode["gvisor"] {
		t.Errorf("a crash's error code differs: namespaces %q, gvisor %q", crashCode["namespaces"], crashCode["gvisor"])
	}
	if t.Failed() {
		t.Logf("worker log:\n%s", w.log.String())
	}
}

// cancelClass invokes tool, waits until its sandbox wrote "started" in
// its work dir (under work), then interrupts str invoke once (it
// publishes a cancel) and returns the reply.
func cancelClass(t *testing.T, broker int, work, tool string) (classReply, string) {
	t.Helper()
	old, _ := filepath.Glob(filepath.Join(work, "*", "started"))
	cmd := exec.Command(strBin, "invoke", tool, "--broker", "127.0.0.1:"+strconv.Itoa(broker), "--namespace", "it/", "--args", "{}", "--wait", "3m")
	out := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := eventually(2*time.Minute, func() bool {
		now, _ := filepath.Glob(filepath.Join(work, "*", "started"))
		return len(now) > len(old)
	})
	if !started {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("%s never started; output:\n%s", tool, out.String())
	}
	_ = cmd.Process.Signal(syscall.SIGINT)
	_ = cmd.Wait()
	var r classReply
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		t.Fatalf("str invoke %s: last line is not a reply (%v):\n%s", tool, err, out.String())
	}
	return r, out.String()
}
