package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/profiles/profileyaml"
	"github.com/securetoolruntime/str/worker/runner"
)

// templateFor starts a per-tool template of module (from
// testdata/template) under profile, with the runner and the tools bound
// read-only.
func templateFor(t *testing.T, profile, module, function string) (*template.Template, error) {
	t.Helper()
	return templateWith(t, profile, module, function, "")
}

// templateWith is templateFor with each call's work dir mounted at
// workTarget ("" for none).
func templateWith(t *testing.T, profile, module, function, workTarget string) (*template.Template, error) {
	t.Helper()
	return templateIn(t, "", profile, module, function, workTarget)
}

// templateIn is templateWith with the profiles of profileDir loaded too.
func templateIn(t *testing.T, profileDir, profile, module, function, workTarget string) (*template.Template, error) {
	t.Helper()
	needRoot(t)
	l, err := launcher.New(launcher.Options{ProfileDir: profileDir, Decoder: profileyaml.Decoder{}})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rdir := filepath.Join(dir, "runner")
	if err := os.Mkdir(rdir, 0o755); err != nil {
		t.Fatal(err)
	}
	rpath, err := runner.Install(rdir)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := filepath.Abs("testdata/template")
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncbuf.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("template stderr:\n%s", stderr.String())
		}
	})
	argv := runner.Command("/usr/bin/python3", "/opt/str-runner/"+filepath.Base(rpath), "--template", "3", module, function)
	tpl, err := template.Start(context.Background(), l, template.Request{SourceHash: "test", WorkDirTarget: workTarget, Request: launcher.Request{
		Profile: profile,
		Argv:    argv,
		Env:     []string{"PYTHONPATH=/opt/str-tools", "PYTHONDONTWRITEBYTECODE=1"},
		Binds:   []launcher.Bind{{Source: rdir, Target: "/opt/str-runner"}, {Source: tools, Target: "/opt/str-tools"}},
		Stderr:  stderr,
	}})
	if err == nil {
		t.Cleanup(tpl.Close)
	}
	return tpl, err
}

// templateCall makes one call; on failure it reports it (t.Errorf: it
// runs in the tests' goroutines too) and returns nil.
func templateCall(t *testing.T, tpl *template.Template, module, function string, args map[string]any) (*template.CallResult, map[string]any) {
	t.Helper()
	raw, _ := json.Marshal(args)
	a, err := runner.EncodeArgs(&runner.Args{Module: module, Function: function, Args: raw, ResultFile: "/dev/null", OutputDir: "/tmp"})
	if err != nil {
		t.Error(err)
		return nil, nil
	}
	res, err := tpl.Call(context.Background(), a, template.CallOptions{Timeout: time.Minute})
	if err != nil {
		t.Errorf("template call: %v", err)
		return nil, nil
	}
	var doc struct {
		Result map[string]any `json:"result"`
		Error  string         `json:"error"`
	}
	if err := json.Unmarshal(res.Document, &doc); err != nil || doc.Error != "" {
		t.Errorf("call document %s: %v %s", res.Document, err, doc.Error)
		return nil, nil
	}
	return res, doc.Result
}

// Each call of a template, seen from inside and verified from the host:
// PID 1 of its own pid namespace, a host uid no other live call has, 7
// namespaces of its own, a /tmp no other call wrote to, seccomp on, no
// capability, no netlink.
func TestTemplateCallIsolation(t *testing.T) {
	tpl, err := templateFor(t, "restrictive", "probe_tool", "probe")
	if err != nil {
		t.Fatal(err)
	}
	const calls = 6
	var mu sync.Mutex
	seenNS := map[string]map[float64]int{}
	uids := map[int]int{}
	var wg sync.WaitGroup
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tag := string(rune('a' + i))
			// All at once, each holding a second: their host uids are live together.
			res, got := templateCall(t, tpl, "probe_tool", "probe", map[string]any{"tag": tag, "hold": 1})
			if got == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if got["pid"] != float64(1) {
				t.Errorf("call %s: pid %v, want 1", tag, got["pid"])
			}
			if tb := got["tmp_before"].([]any); len(tb) != 0 {
				t.Errorf("call %s: /tmp already holds %v (another call's files)", tag, tb)
			}
			if procs := got["procs"].([]any); len(procs) != 1 || procs[0] != "1" {
				t.Errorf("call %s: /proc lists %v, want only 1", tag, procs)
			}
			// Inside, the profile's uid, as a cold sandbox's tool
			// (restrictive.yaml: 65534, nobody): the one id mapped.
			um := got["uid_map"].([]any)
			if len(um) != 3 || um[0] != "65534" || um[2] != "1" {
				t.Errorf("call %s: uid_map %v, want 65534 HOST 1 (the profile's uid)", tag, um)
			}
			if uid := strings.Fields(got["Uid"].(string)); len(uid) != 4 || uid[0] != "65534" || uid[1] != "65534" || uid[2] != "65534" || uid[3] != "65534" {
				t.Errorf("call %s: Uid %v, want the profile's 65534 in all four", tag, got["Uid"])
			}
			// The lower id reads in the template's user namespace, where the
			// supervisor mapped the pair's host id (verified from the host:
			// res.Child.HostUID in /proc/PID/status).
			if want := strconv.Itoa(res.Child.MappedID); len(um) == 3 && um[1] != want {
				t.Errorf("call %s: uid_map maps to %v, the supervisor mapped %s (host %d)", tag, um[1], want, res.Child.HostUID)
			}
			for k, want := range map[string]string{"Seccomp": "2", "CapEff": "0000000000000000", "CapBnd": "0000000000000000", "NoNewPrivs": "1", "netlink": "EPERM"} {
				if got[k] != want {
					t.Errorf("call %s: %s = %v, want %s", tag, k, got[k], want)
				}
			}
			for n, v := range got["ns"].(map[string]any) {
				if seenNS[n] == nil {
					seenNS[n] = map[float64]int{}
				}
				seenNS[n][v.(float64)]++
			}
			uids[res.Child.HostUID]++
		}()
	}
	wg.Wait()
	for n, m := range seenNS {
		for ino, k := range m {
			if k > 1 {
				t.Errorf("%s namespace %v shared by %d calls", n, ino, k)
			}
		}
	}
	if len(seenNS) != 7 {
		t.Errorf("saw %d namespace kinds, want 7", len(seenNS))
	}
	// All the calls were live at once (each holds a second, and there
	// are more pairs than calls): each had a host uid of its own.
	if len(uids) != calls {
		t.Errorf("host uids %v: want %d distinct pairs for %d live calls", uids, calls, calls)
	}
}

// The tool's import-time code gains nothing: every namespace and mount
// call fails at import (in the template) and at call time (in the call).
func TestTemplateHostileNamespaces(t *testing.T) {
	tpl, err := templateFor(t, "restrictive", "hostile_ns", "run")
	if err != nil {
		t.Fatal(err)
	}
	_, got := templateCall(t, tpl, "hostile_ns", "run", nil)
	if got == nil {
		t.FailNow()
	}
	for _, when := range []string{"import", "call"} {
		m := got[when].(map[string]any)
		if len(m) < 18 {
			t.Errorf("%s: only %d attempts reported: %v", when, len(m), m)
		}
		for k, v := range m {
			if v != "EPERM" {
				t.Errorf("%s: %s = %v, want EPERM", when, k, v)
			}
		}
	}
	// The template served on: a second call still works.
	if _, got := templateCall(t, tpl, "hostile_ns", "run", nil); got == nil || got["call"] == nil {
		t.Errorf("second call: %v", got)
	}
}

// A template whose import leaves something every call would share is
// refused before any call.
func TestTemplateRefusesShared(t *testing.T) {
	for _, c := range []struct{ module, want string }{
		{"hostile_thread", "threads"},
		{"hostile_shared", "maps"},
		{"hostile_memfd", "/memfd:"},
		{"hostile_fd", "descriptor"},
	} {
		t.Run(c.module, func(t *testing.T) {
			tpl, err := templateFor(t, "restrictive", c.module, "run")
			if err == nil {
				tpl.Close()
				t.Fatalf("template of %s accepted", c.module)
			}
			if !errors.Is(err, template.ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("template of %s: %v, want template.ErrRefused naming %q", c.module, err, c.want)
			}
		})
	}
}

// A child that skipped part of what it does to itself (the tool's import
// rewrote the runner's setup in the template: the uid change, the
// bounding set, capset, close_range, the call filter) is caught by the
// supervisor's verification (C9) before the call is sent: the call
// fails, naming the check, and the template is retired.
func TestTemplateVerifiesBeforeCall(t *testing.T) {
	for _, c := range []struct{ module, want string }{
		{"hostile_keepuid", "Uid is"},
		{"hostile_skip_bounding", "CapBnd is"},
		{"hostile_skip_capset", "Cap"},
		{"hostile_skip_close", "holds descriptors"},
		{"hostile_skip_filter", "Seccomp_filters is"},
	} {
		t.Run(c.module, func(t *testing.T) {
			tpl, err := templateFor(t, "restrictive", c.module, "run")
			if err != nil {
				t.Fatal(err)
			}
			a, err := runner.EncodeArgs(&runner.Args{Module: c.module, Function: "run", ResultFile: "/dev/null", OutputDir: "/tmp"})
			if err != nil {
				t.Fatal(err)
			}
			res, err := tpl.Call(context.Background(), a, template.CallOptions{Timeout: time.Minute})
			if err == nil {
				t.Fatalf("the call ran: %s", res.Document)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("call error %v, want the check %q", err, c.want)
			}
			if !errors.Is(tpl.Retired(), template.ErrRetired) || tpl.Why() != template.RetiredFailedCheck {
				t.Errorf("template not retired for a failed check after a child failed verification: %v (%q)", tpl.Retired(), tpl.Why())
			}
		})
	}
}

// Many calls, four in flight: calls end while others fork (their SIGCHLD
// must not make the template's ordered clone restart into a refused
// second one), and every call succeeds on the same template.
func TestTemplateManyCalls(t *testing.T) {
	tpl, err := templateFor(t, "restrictive", "probe_tool", "probe")
	if err != nil {
		t.Fatal(err)
	}
	const calls, inFlight = 48, 4
	next := make(chan int, calls)
	for i := range calls {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range inFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				_, got := templateCall(t, tpl, "probe_tool", "probe", map[string]any{"tag": strconv.Itoa(i)})
				if got != nil && got["pid"] != float64(1) {
					t.Errorf("call %d: pid %v", i, got["pid"])
				}
			}
		}()
	}
	wg.Wait()
	if err := tpl.Retired(); err != nil {
		t.Errorf("template retired after %d calls: %v", calls, err)
	}
}

// Each call gets its own work dir from the host, made for its host ids
// and mounted at the template's work dir target: it reads the input put
// there, its output lands on the host owned by its pair, and the next
// call sees only its own.
func TestTemplateWorkDir(t *testing.T) {
	tpl, err := templateWith(t, "restrictive", "probe_tool", "workdir", "/work")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"first", "second"} {
		var dir string
		opts := template.CallOptions{Timeout: time.Minute, WorkDir: func(uid, gid int) (string, error) {
			dir = filepath.Join(t.TempDir(), "wd")
			if err := os.Mkdir(dir, 0o700); err != nil {
				return "", err
			}
			if err := os.WriteFile(filepath.Join(dir, "in.txt"), []byte("input of "+name), 0o644); err != nil {
				return "", err
			}
			return dir, os.Chown(dir, uid, gid)
		}}
		raw, _ := json.Marshal(map[string]any{"name": name})
		a, err := runner.EncodeArgs(&runner.Args{Module: "probe_tool", Function: "workdir", Args: raw, ResultFile: "/dev/null", OutputDir: "/work"})
		if err != nil {
			t.Fatal(err)
		}
		res, err := tpl.Call(context.Background(), a, opts)
		if err != nil {
			t.Fatalf("call %s: %v", name, err)
		}
		var doc struct {
			Result struct {
				In string   `json:"in"`
				Ls []string `json:"ls"`
			} `json:"result"`
			Error string `json:"error"`
		}
		if err := json.Unmarshal(res.Document, &doc); err != nil || doc.Error != "" {
			t.Fatalf("call %s: %s", name, res.Document)
		}
		if doc.Result.In != "input of "+name || strings.Join(doc.Result.Ls, ",") != "in.txt,out-"+name+".txt" {
			t.Errorf("call %s saw in=%q ls=%v", name, doc.Result.In, doc.Result.Ls)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(dir, "out-"+name+".txt"), &st); err != nil {
			t.Fatalf("call %s: output not on the host: %v", name, err)
		}
		if int(st.Uid) != res.Child.HostUID || int(st.Gid) != res.Child.HostUID {
			t.Errorf("call %s: output owned by %d:%d on the host, want the call's pair %d", name, st.Uid, st.Gid, res.Child.HostUID)
		}
	}
}

// A manifest tool with `warm: template` is served by a template through
// the worker end to end: PID 1 of its own pid namespace, an id mapped
// from the template's (100000 and up inside the template), its work dir
// its cwd, and a second call too.
func TestWorkerTemplateTool(t *testing.T) {
	needRoot(t)
	dir, tools := templateWorkerDir(t, "str-it-tpl-")
	const tool = `import os

def where(ctx, text="hi"):
    with open("note.txt", "w") as f:
        f.write(text)
    with open("note.txt") as f:
        back = f.read()
    with open("/proc/self/uid_map") as f:
        lower = int(f.read().split()[1])
    return {"cwd": os.getcwd(), "read_back": back, "pid": os.getpid(), "lower": lower}
`
	if err := os.WriteFile(filepath.Join(tools, "tpl_tools.py"), []byte(tool), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(`version: 1
tools:
  where: {module: tpl_tools, function: where, timeout_seconds: 60, sandbox_profile: restrictive, warm: template}
  where_net:
    module: tpl_tools
    function: where
    timeout_seconds: 60
    sandbox_profile: standard
    warm: template
    network: {policy: restricted, allowed_hosts: [svc.test]}
    credentials: [{name: TPL_KEY, from: "env:STR_TEST_TPL_KEY", hosts: [svc.test], header: Authorization}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	broker, health := freeTCPPort(t), freeTCPPort(t)
	w := startWorker(t, broker, health, map[string]string{
		"SAM_NAMESPACE": "it/", "MANIFEST_PATH": manifest, "TOOLS_PYTHON_DIR": tools,
		"SANDBOX_WORK_DIR": filepath.Join(dir, "work"), "STR_RUNNER_DIR": filepath.Join(dir, "runner"), "STR_SITE_DIR": filepath.Join(dir, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": filepath.Join(dir, "artifacts"),
		"STR_TEST_TPL_KEY": "not-a-secret",
	})
	// The template is started at the manifest's load, in the background:
	// a call before it is ready would run cold.
	waitMetrics(t, health, w, map[string]float64{`str_worker_templates_live`: 1})
	for i := range 2 {
		r, out := invoke(t, broker, "where", `{"text": "template"}`)
		if r.Result == nil || r.Result.TimedOut {
			t.Fatalf("call %d: no result; output:\n%s\nworker log:\n%s", i, out, w.log.String())
		}
		got := r.Result.ToolResult
		if got["read_back"] != "template" || got["cwd"] != "/str/work" || got["pid"] != float64(1) {
			t.Errorf("call %d: %v, want the text read back in /str/work as PID 1", i, got)
		}
		if lower, _ := got["lower"].(float64); lower < 100000 {
			t.Errorf("call %d: uid_map lower id %v: not a template call's\nworker log:\n%s", i, got["lower"], w.log.String())
		}
	}
	if !strings.Contains(w.log.String(), "template started") {
		t.Errorf("the worker log does not say it started a template:\n%s", w.log.String())
	}
	wantMetrics(t, health, w, map[string]float64{
		`str_worker_templates_started_total{tool="where"}`: 1,
		`str_worker_template_calls_total{tool="where"}`:    2,
		`str_worker_templates_live`:                        1,
	})

	// The module changes on disk: the next call retires the template,
	// starts another in the background and runs cold (not_ready); once
	// that one is ready, it serves the calls.
	if err := os.WriteFile(filepath.Join(tools, "tpl_tools.py"), []byte(tool+"# changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, out := invoke(t, broker, "where", `{"text": "changed"}`); r.Result == nil || r.Result.ToolResult["read_back"] != "changed" {
		t.Fatalf("after the change: no result; output:\n%s\nworker log:\n%s", out, w.log.String())
	}
	waitMetrics(t, health, w, map[string]float64{`str_worker_templates_started_total{tool="where"}`: 2, `str_worker_templates_live`: 1})
	if r, out := invoke(t, broker, "where", `{"text": "changed"}`); r.Result == nil || r.Result.ToolResult["read_back"] != "changed" {
		t.Fatalf("after the new template: no result; output:\n%s\nworker log:\n%s", out, w.log.String())
	}
	// A tool with credentials may not run in a template (each call's
	// placeholders are its own; a template's environment is fixed): cold.
	if r, out := invoke(t, broker, "where_net", `{"text": "net"}`); r.Result == nil || r.Result.ToolResult["read_back"] != "net" {
		t.Fatalf("where_net: no result; output:\n%s\nworker log:\n%s", out, w.log.String())
	}
	wantMetrics(t, health, w, map[string]float64{
		`str_worker_templates_started_total{tool="where"}`:            2,
		`str_worker_templates_retired_total{reason="source_changed"}`: 1,
		`str_worker_template_calls_total{tool="where"}`:               3,
		`str_worker_templates_live`:                                   1,
		`str_worker_template_fallbacks_total{reason="not_eligible"}`:  1,
		`str_worker_template_fallbacks_total{reason="not_ready"}`:     1,
		`str_worker_template_calls_total{tool="where_net"}`:           0,
		`str_worker_templates_started_total{tool="where_net"}`:        0,
	})
}

// wantMetrics reads the worker's /metrics (its health port) and checks
// each sample's value (a sample not printed reads 0).
func wantMetrics(t *testing.T, health int, w *worker, want map[string]float64) {
	t.Helper()
	got, body := readMetrics(t, health)
	for sample, v := range want {
		if got[sample] != v {
			t.Errorf("%s = %v, want %v", sample, got[sample], v)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s\nworker log:\n%s", body, w.log.String())
	}
}

// readMetrics reads the worker's /metrics: each sample's value, and the
// page.
func readMetrics(t *testing.T, health int) (map[string]float64, string) {
	t.Helper()
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/metrics", health))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for l := range strings.Lines(string(body)) {
		name, val, ok := strings.Cut(strings.TrimSpace(l), " ")
		if ok && !strings.HasPrefix(name, "#") {
			got[name], _ = strconv.ParseFloat(val, 64)
		}
	}
	return got, string(body)
}

// waitMetrics waits (up to 2 minutes, a backstop) until every sample of
// want has its value, then checks them as wantMetrics does.
func waitMetrics(t *testing.T, health int, w *worker, want map[string]float64) {
	t.Helper()
	eventually(2*time.Minute, func() bool {
		got, _ := readMetrics(t, health)
		for sample, v := range want {
			if got[sample] != v {
				return false
			}
		}
		return true
	})
	wantMetrics(t, health, w, want)
}

// A dead template never holds a call (issue 29 item 5). The template of
// a warm: template tool is killed (SIGKILL, its every process), and its
// replacement's import does not end (it waits while a file exists) with
// a start timeout of a day: a call that waited for the replacement would
// hang to the end of str invoke's --wait. Each call runs cold at once
// instead (counted, not_ready: the replacement starts in the
// background); once the import ends, the new template serves the calls.
func TestWorkerDeadTemplateRunsCold(t *testing.T) {
	needRoot(t)
	dir, tools := templateWorkerDir(t, "str-it-tpl-dead-")
	hold := filepath.Join(tools, "hold-import")
	const tool = `import os, sys, time

# A template's import (the runner's --template) waits while the file
# hold-import exists beside the module; a cold call's does not.
_hold = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hold-import")
while "--template" in sys.argv and os.path.exists(_hold):
    time.sleep(0.05)

def where(ctx, text="hi"):
    return {"text": text, "pid": os.getpid()}
`
	if err := os.WriteFile(filepath.Join(tools, "dead_tools.py"), []byte(tool), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(`version: 1
tools:
  where: {module: dead_tools, function: where, timeout_seconds: 60, sandbox_profile: restrictive, warm: template}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	broker, health := freeTCPPort(t), freeTCPPort(t)
	w := startWorker(t, broker, health, map[string]string{
		"SAM_NAMESPACE": "it/", "MANIFEST_PATH": manifest, "TOOLS_PYTHON_DIR": tools,
		"SANDBOX_WORK_DIR": filepath.Join(dir, "work"), "STR_RUNNER_DIR": filepath.Join(dir, "runner"), "STR_SITE_DIR": filepath.Join(dir, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": filepath.Join(dir, "artifacts"),
		"STR_TEMPLATE_START_TIMEOUT_SECONDS": "86400",
	})
	call := func(what string) {
		t.Helper()
		r, out := invoke(t, broker, "where", `{"text": "`+what+`"}`)
		if r.Result == nil || r.Result.ToolResult["text"] != what {
			t.Fatalf("%s: no result; output:\n%s\nworker log:\n%s", what, out, w.log.String())
		}
	}
	waitMetrics(t, health, w, map[string]float64{`str_worker_templates_live`: 1})
	call("first")
	wantMetrics(t, health, w, map[string]float64{`str_worker_template_calls_total{tool="where"}`: 1})

	// The template's pid, from the worker's log; the process and its
	// descendants SIGKILLed, once the next import is held.
	m := regexp.MustCompile(`template started.*?"pid":(\d+)`).FindStringSubmatch(w.log.String())
	if m == nil {
		t.Fatalf("no template pid in the worker log:\n%s", w.log.String())
	}
	pid, _ := strconv.Atoi(m[1])
	if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); !strings.Contains(string(cmd), "--template") {
		t.Fatalf("pid %d is not the template (cmdline %q)", pid, cmd)
	}
	if err := os.WriteFile(hold, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	killTree(t, pid)

	// Two calls: the first may still find the dead template in service
	// (its end not yet seen: the call's fork order fails and it runs cold,
	// retired_before_call); the second finds it retired. Neither waits
	// for the replacement, whose import is held.
	call("after the kill")
	call("again")
	got, page := readMetrics(t, health)
	if got[`str_worker_template_fallbacks_total{reason="not_ready"}`] < 1 || got[`str_worker_template_calls_total{tool="where"}`] != 1 ||
		got[`str_worker_templates_live`] != 0 || got[`str_worker_templates_started_total{tool="where"}`] != 1 {
		t.Errorf("after the kill: want both calls cold (at least one not_ready), still one template call, none live, one started:\n%s", grepMetrics(page, "str_worker_template"))
	}

	// The import goes on: the replacement serves the next call.
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitMetrics(t, health, w, map[string]float64{`str_worker_templates_started_total{tool="where"}`: 2, `str_worker_templates_live`: 1})
	call("replaced")
	wantMetrics(t, health, w, map[string]float64{`str_worker_template_calls_total{tool="where"}`: 2})
}

// killTree SIGKILLs pid and every descendant, children first found.
func killTree(t *testing.T, pid int) {
	t.Helper()
	todo := []int{pid}
	var all []int
	for len(todo) > 0 {
		p := todo[0]
		todo = todo[1:]
		all = append(all, p)
		for _, c := range processChildren(t, p) {
			if n, err := strconv.Atoi(c); err == nil {
				todo = append(todo, n)
			}
		}
	}
	for _, p := range all {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			t.Fatalf("kill %d: %v", p, err)
		}
	}
}

// grepMetrics is the lines of page that contain sub.
func grepMetrics(page, sub string) string {
	var out []string
	for l := range strings.Lines(page) {
		if strings.Contains(l, sub) && !strings.HasPrefix(l, "#") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return strings.Join(out, "\n")
}

// A result document larger than one socket buffer (a SOCK_SEQPACKET
// message must fit wmem_default, ~208 KiB) arrives whole, in pieces
// (launcher.recvDocument), and the template goes on serving.
func TestTemplateLargeResult(t *testing.T) {
	tpl, err := templateFor(t, "restrictive", "probe_tool", "big")
	if err != nil {
		t.Fatal(err)
	}
	for _, kib := range []int{1024, 1} {
		res, got := templateCall(t, tpl, "probe_tool", "big", map[string]any{"kib": kib})
		if got == nil {
			t.Fatalf("%d KiB: no result", kib)
		}
		if blob, _ := got["blob"].(string); len(blob) != kib<<10 {
			t.Fatalf("%d KiB: a blob of %d bytes (document %d bytes)", kib, len(blob), len(res.Document))
		}
	}
	if err := tpl.Retired(); err != nil {
		t.Errorf("template retired after a large result: %v", err)
	}
}

// templateWorkerDir makes a worker's directory (removed when the test
// ends) and its tools dir in it, under /var/tmp, not /tmp: a template
// call gets a fresh /tmp, which would hide binds below it (the template
// is refused then, and the calls run cold).
func templateWorkerDir(t *testing.T, prefix string) (dir, tools string) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	tools = filepath.Join(dir, "tools")
	if err := os.Mkdir(tools, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, tools
}

// A template retired while a call runs in it (recycled after its calls or
// age, or replaced) is drained: the call in flight answers, calls that
// come after the retirement are refused (they run cold), and only then
// does the template end. Killing it at once killed the call (CI of a
// worker at 4 in flight: "no hello from the child" at the 500th call).
func TestTemplateDrainLetsCallsFinish(t *testing.T) {
	tpl, err := templateFor(t, "restrictive", "probe_tool", "probe")
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res map[string]any
		err error
	}
	held := make(chan answer, 1)
	go func() {
		raw, _ := json.Marshal(map[string]any{"tag": "held", "hold": 2})
		a, err := runner.EncodeArgs(&runner.Args{Module: "probe_tool", Function: "probe", Args: raw, ResultFile: "/dev/null", OutputDir: "/tmp"})
		if err != nil {
			held <- answer{err: err}
			return
		}
		res, err := tpl.Call(context.Background(), a, template.CallOptions{Timeout: time.Minute})
		if err != nil {
			held <- answer{err: err}
			return
		}
		var doc struct {
			Result map[string]any `json:"result"`
			Error  string         `json:"error"`
		}
		if derr := json.Unmarshal(res.Document, &doc); derr != nil || doc.Error != "" {
			err = fmt.Errorf("document %s: %v %s", res.Document, derr, doc.Error)
		}
		held <- answer{res: doc.Result, err: err}
	}()
	// The held call is in flight once the template has a child (its call).
	for len(processChildren(t, tpl.Pid())) == 0 {
		select {
		case a := <-held:
			t.Fatalf("the held call ended before the drain: %+v", a)
		case <-time.After(10 * time.Millisecond):
		}
	}
	drained := make(chan struct{})
	go func() { tpl.Drain(); close(drained) }()
	// The retirement comes first: a new call is refused, not queued.
	for tpl.Retired() == nil {
		time.Sleep(time.Millisecond)
	}
	if _, err := tpl.Call(context.Background(), nil, template.CallOptions{Timeout: time.Minute}); !errors.Is(err, template.ErrRetired) {
		t.Errorf("a call after the retirement: %v, want template.ErrRetired", err)
	}
	a := <-held
	if a.err != nil {
		t.Fatalf("the call in flight during the drain failed: %v", a.err)
	}
	if a.res["pid"] != float64(1) {
		t.Errorf("the held call's answer: %v", a.res)
	}
	<-drained
	if err := syscall.Kill(tpl.Pid(), 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the template (pid %d) is still there after Drain: kill 0: %v", tpl.Pid(), err)
	}
}

// processChildren lists pid's children (every thread's).
func processChildren(t *testing.T, pid int) []string {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		kids = append(kids, strings.Fields(string(b))...)
	}
	return kids
}

// RNG state: each call of a template reseeds the generators the tool
// imported (Python's random, numpy's global one) from the kernel; without
// it every call, a copy of the template, draws the same numbers.
func TestTemplateReseedsGenerators(t *testing.T) {
	tpl, err := templateFor(t, "restrictive", "rng_tool", "draw")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]map[float64]bool{"random": {}, "numpy": {}}
	for range 3 {
		_, got := templateCall(t, tpl, "rng_tool", "draw", map[string]any{})
		if got == nil {
			t.FailNow()
		}
		for k := range seen {
			v, ok := got[k].(float64)
			if !ok {
				t.Fatalf("call result %v: no number %q", got, k)
			}
			if seen[k][v] {
				t.Errorf("two calls drew the same %s number %v: the template's generator state was not reseeded", k, v)
			}
			seen[k][v] = true
		}
	}
}
