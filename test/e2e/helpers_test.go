// Package e2e runs `str worker` (built from ./cmd/str and ./cmd/str-worker) as a subprocess
// with the real launcher and talks to it over real TCP through the dev
// broker, as an agent would.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/test/internal/strbuild"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

var strBin string

// TestMain builds str, or uses $STR_BIN when set (a binary built
// beforehand from this tree).
func TestMain(m *testing.M) {
	os.Exit(strbuild.Main(m, "../..", "e2e", &strBin))
}

// requireRoot skips (or, with STR_MUST_WORK=1, fails) when the worker's
// launcher cannot work here.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := "e2e: needs root: the worker's launcher creates namespaces and cgroups for each tool and chowns work dirs to the sandbox's uid"
	mustwork.Skip(t, msg)
}

const e2eManifest = `version: 1
tools:
  echo_tool: {module: example_tools, function: echo_tool}
  process_file: {module: example_tools, function: process_file}
  failing_tool: {module: example_tools, function: failing_tool}
  async_fetch: {module: example_tools, function: async_fetch}
  execute_python: {module: example_tools, function: execute_python, sandbox_profile: restrictive}
  escape_attempt: {module: example_tools, function: escape_attempt, sandbox_profile: restrictive}
  many_lines: {module: e2e_tools, function: many_lines}
  sleeper: {module: e2e_tools, function: sleeper}
  short: {module: e2e_tools, function: sleeper, timeout_seconds: 1}
  read_inputs: {module: e2e_tools, function: read_inputs}
  crash: {module: e2e_tools, function: crash}
  missing: {module: e2e_tools, function: nope}
`

// env is one worker's directory layout.
type env struct {
	root, tools, manifest, work, artifacts string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := t.TempDir()
	// Every sandbox runs as an unprivileged host uid of its own: the
	// worker's directories must be searchable by others, as they are
	// under /var/lib/str in a deployment (t.TempDir makes them 0700).
	must(t, os.Chmod(root, 0o755))
	must(t, os.Chmod(filepath.Dir(root), 0o755))
	e := &env{root: root, tools: filepath.Join(root, "tools"), manifest: filepath.Join(root, "manifest.yaml"),
		work: filepath.Join(root, "work"), artifacts: filepath.Join(root, "artifacts")}
	must(t, os.MkdirAll(e.tools, 0o755))
	copyFile(t, "../../examples/tools/python/example_tools.py", filepath.Join(e.tools, "example_tools.py"))
	copyFile(t, "testdata/e2e_tools.py", filepath.Join(e.tools, "e2e_tools.py"))
	writeManifest(t, e.manifest, e2eManifest)
	return e
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	must(t, err)
	must(t, os.WriteFile(to, b, 0o644))
}

// writeManifest replaces the manifest atomically.
func writeManifest(t *testing.T, path, content string) {
	t.Helper()
	must(t, os.WriteFile(path+".tmp", []byte(content), 0o644))
	must(t, os.Rename(path+".tmp", path))
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// workerProc is a running `str worker`.
type workerProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	port   int // broker port
	health int
	log    *syncbuf.Buffer
	done   chan struct{}
}

// startWorker starts `str worker` with the embedded broker (or, when
// brokerPort > 0, against that dev broker) and waits until it is ready.
func startWorker(t *testing.T, e *env, brokerPort int, extra map[string]string) *workerProc {
	t.Helper()
	w := launchWorker(t, e, brokerPort, extra)
	w.waitReady(true)
	return w
}

// launchWorker starts `str worker` as startWorker does, without waiting
// for it to be ready.
func launchWorker(t *testing.T, e *env, brokerPort int, extra map[string]string) *workerProc {
	t.Helper()
	w := &workerProc{t: t, health: freePort(t), log: &syncbuf.Buffer{}, done: make(chan struct{})}
	vars := map[string]string{
		"SAM_NAMESPACE": "e2e/", "MANIFEST_PATH": e.manifest, "TOOLS_PYTHON_DIR": e.tools,
		"SANDBOX_WORK_DIR": e.work, "STR_RUNNER_DIR": filepath.Join(e.root, "runner"), "STR_SITE_DIR": filepath.Join(e.root, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": e.artifacts,
		"HEALTH_PORT": strconv.Itoa(w.health), "STR_MANIFEST_POLL_MS": "200", "STR_LOG_LEVEL": "debug",
	}
	args := []string{"worker"}
	if brokerPort > 0 {
		w.port = brokerPort
		vars["DEV_BROKER_HOST"] = "127.0.0.1"
		vars["DEV_BROKER_PORT"] = strconv.Itoa(brokerPort)
		vars["CONNECT_RETRY_DELAY_MS"] = "200"
	} else {
		w.port = freePort(t)
		args = append(args, "--embedded-broker", "127.0.0.1:"+strconv.Itoa(w.port))
	}
	for k, v := range extra {
		vars[k] = v
	}
	w.cmd = exec.Command(strBin, args...)
	w.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		w.cmd.Env = append(w.cmd.Env, k+"="+v)
	}
	w.cmd.Stdout, w.cmd.Stderr = w.log, w.log
	must(t, w.cmd.Start())
	go func() { w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		w.stop(syscall.SIGTERM)
		if t.Failed() {
			t.Logf("worker log:\n%s", tail(w.log.String(), 60))
		}
	})
	return w
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (w *workerProc) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

// stop signals the worker and waits for it to exit.
func (w *workerProc) stop(sig syscall.Signal) {
	if !w.alive() {
		return
	}
	w.cmd.Process.Signal(sig)
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
		w.t.Errorf("worker did not stop after %v", sig)
	}
}

func (w *workerProc) get(path string) (int, string) {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", w.health, path))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (w *workerProc) waitReady(ready bool) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := w.get("/readyz")
		if (code == 200) == ready {
			return
		}
		if !w.alive() {
			w.t.Fatalf("worker exited:\n%s", tail(w.log.String(), 40))
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("worker not ready=%v after 30 s:\n%s", ready, tail(w.log.String(), 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metric reads one unlabelled sample from /metrics.
func (w *workerProc) metric(name string) float64 {
	w.t.Helper()
	_, body := w.get("/metrics")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		w.t.Fatalf("metric %s not found", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	must(w.t, err)
	return v
}

// agent is a client of the dev broker behaving like a SAM agent.
type agent struct {
	t    *testing.T
	c    *devbroker.Client
	base string

	mu       sync.Mutex
	statuses map[string][][]byte
	replies  map[string]chan []byte
	removed  chan string
	// notices are the messages without an id seen on init topics (init
	// broadcasts; the agent's own init requests are skipped).
	notices chan notice
}

// notice is a message seen on a notification topic.
type notice struct {
	topic   string
	payload map[string]any
}

// startDevBroker starts `str broker` on port and waits until it listens.
func startDevBroker(t *testing.T, port int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(strBin, "broker", "--listen", "127.0.0.1:"+strconv.Itoa(port), "--log-level", "warn")
	must(t, cmd.Start())
	waitFor(t, "broker listening", 10*time.Second, func() bool {
		c, err := netDial(port)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return cmd
}

func newAgent(t *testing.T, port int) *agent {
	t.Helper()
	c, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: "127.0.0.1", Port: port, ClientID: fmt.Sprintf("e2e-agent-%d", time.Now().UnixNano()),
		TokenFile:  broker.TokenFileFor(port), // the broker's token (str broker --help)
		RetryDelay: 200 * time.Millisecond, ReceiveTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	must(t, err)
	a := &agent{t: t, c: c, base: "e2e/a2a/v1", statuses: map[string][][]byte{}, replies: map[string]chan []byte{}, removed: make(chan string, 10),
		notices: make(chan notice, 256)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t, c.Connect(ctx, []string{a.base + "/sam_remote_tool/response/e2e/>", a.base + "/sam_remote_tool/status/e2e/>",
		a.base + "/sam_remote_tool/removed/>", a.base + "/sam_remote_tool/init/>"}))
	go a.loop()
	t.Cleanup(func() { c.Close() })
	return a
}

func (a *agent) loop() {
	for {
		d, err := a.c.Receive(context.Background())
		if err != nil {
			return
		}
		if d.Ack != nil {
			d.Ack()
		}
		parts := strings.Split(d.Topic, "/")
		last := parts[len(parts)-1]
		switch {
		case strings.Contains(d.Topic, "/status/"):
			a.mu.Lock()
			a.statuses[last] = append(a.statuses[last], d.Payload)
			a.mu.Unlock()
		case strings.Contains(d.Topic, "/response/"):
			a.replyChan(last) <- d.Payload
		case strings.Contains(d.Topic, "/removed/"):
			a.removed <- last
		case strings.Contains(d.Topic, "/sam_remote_tool/init/"):
			var m map[string]any
			if json.Unmarshal(d.Payload, &m) != nil || m["id"] != nil {
				continue // not a notification: an init request (ours)
			}
			select {
			case a.notices <- notice{topic: d.Topic, payload: m}:
			default: // a test that does not read them
			}
		}
	}
}

func (a *agent) replyChan(id string) chan []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.replies[id]
	if c == nil {
		c = make(chan []byte, 4)
		a.replies[id] = c
	}
	return c
}

func (a *agent) status(id string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, p := range a.statuses[id] {
		var st struct {
			Params struct {
				StatusText string `json:"status_text"`
			} `json:"params"`
		}
		json.Unmarshal(p, &st)
		out = append(out, st.Params.StatusText)
	}
	return out
}

var seq struct {
	sync.Mutex
	n int
}

func newID(prefix string) string {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), seq.n)
}

// invoke publishes a request; params override the defaults (nil deletes).
func (a *agent) invoke(tool string, params map[string]any) string {
	id := newID("req")
	p := map[string]any{"task_id": "task-" + id, "tool_name": tool, "app_name": "e2e", "user_id": "u-1", "session_id": "s-1"}
	for k, v := range params {
		if v == nil {
			delete(p, k)
		} else {
			p[k] = v
		}
	}
	payload, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "sam_remote_tool/invoke", "params": p})
	must(a.t, err)
	a.publishInvoke(tool, id, payload)
	return id
}

func (a *agent) publishInvoke(tool, id string, payload []byte) {
	a.t.Helper()
	must(a.t, a.c.Publish(context.Background(), transport.Message{
		Topic: a.base + "/sam_remote_tool/invoke/" + tool, Payload: payload,
		UserProperties: map[string]string{
			"replyTo":  a.base + "/sam_remote_tool/response/e2e/" + id,
			"statusTo": a.base + "/sam_remote_tool/status/e2e/" + id,
			"clientId": "e2e", "userId": "u-1",
		}}))
}

// initRequest publishes an init request as a reference agent does: kind
// "init" (the older generation, method sam_remote_tool/init) or
// "init_request" (the newer); it returns the id.
func (a *agent) initRequest(kind, tool string, toolConfig map[string]any) string {
	a.t.Helper()
	id := newID("init")
	method := "sam_remote_tool/init"
	if kind == "init_request" {
		method = "sam_remote_tool/init_request"
	}
	if toolConfig == nil {
		toolConfig = map[string]any{}
	}
	payload, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method,
		"params": map[string]any{"tool_name": tool, "tool_config": toolConfig}})
	must(a.t, err)
	must(a.t, a.c.Publish(context.Background(), transport.Message{
		Topic: a.base + "/sam_remote_tool/" + kind + "/" + tool, Payload: payload,
		UserProperties: map[string]string{"replyTo": a.base + "/sam_remote_tool/response/e2e/" + id, "clientId": "e2e"}}))
	return id
}

// nextNotice returns the next notification seen on an init topic.
func (a *agent) nextNotice(what string, within time.Duration) notice {
	a.t.Helper()
	select {
	case n := <-a.notices:
		return n
	case <-time.After(within):
		a.t.Fatalf("no notice within %v: %s", within, what)
		return notice{}
	}
}

// newReferenceEnv is a worker layout with testdata/reference_manifest.yaml
// (the reference's example manifest plus str's additions) over the modules
// of testdata/reference_tools.
func newReferenceEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	ents, err := os.ReadDir("testdata/reference_tools")
	must(t, err)
	for _, ent := range ents {
		copyFile(t, filepath.Join("testdata/reference_tools", ent.Name()), filepath.Join(e.tools, ent.Name()))
	}
	b, err := os.ReadFile("testdata/reference_manifest.yaml")
	must(t, err)
	writeManifest(t, e.manifest, string(b))
	return e
}

func (a *agent) reply(id string, within time.Duration) []byte {
	a.t.Helper()
	select {
	case r := <-a.replyChan(id):
		return r
	case <-time.After(within):
		a.t.Fatalf("no reply to %s within %v", id, within)
		return nil
	}
}

func (a *agent) noReply(id string, within time.Duration) {
	a.t.Helper()
	select {
	case r := <-a.replyChan(id):
		a.t.Fatalf("unexpected reply to %s: %s", id, r)
	case <-time.After(within):
	}
}

var (
	execTimeRE  = regexp.MustCompile(`"execution_time_ms":\d+`)
	timestampRE = regexp.MustCompile(`"timestamp":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00"`)
)

// checkGolden compares a reply with testdata/golden/<name> where "ID" is
// the request id, "TASK" the task id and execution_time_ms is 0.
func checkGolden(t *testing.T, name, id string, got []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	must(t, err)
	want := strings.NewReplacer(`"id":"ID"`, `"id":"`+id+`"`, `"task_id":"TASK"`, `"task_id":"task-`+id+`"`).Replace(string(b))
	norm := execTimeRE.ReplaceAllString(string(got), `"execution_time_ms":0`)
	norm = timestampRE.ReplaceAllString(norm, `"timestamp":"TS"`)
	if norm != want {
		t.Errorf("%s:\n got %s\nwant %s", name, got, want)
	}
}

func errorCode(t *testing.T, reply []byte) (string, string) {
	t.Helper()
	var r struct {
		ID    string
		Error *struct{ Code, Message string }
	}
	must(t, json.Unmarshal(reply, &r))
	if r.Error == nil {
		t.Fatalf("not an error reply: %s", reply)
	}
	return r.Error.Code, r.Error.Message
}

func isSuccess(reply []byte) bool {
	var r struct {
		Result *struct {
			TimedOut bool `json:"timed_out"`
		}
	}
	return json.Unmarshal(reply, &r) == nil && r.Result != nil && !r.Result.TimedOut
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func messageTo(topic string) transport.Message {
	return transport.Message{Topic: topic, Payload: []byte(`{}`)}
}

func netDial(port int) (net.Conn, error) {
	return net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
}

// stat is what the tests read of /proc/PID/stat.
type stat struct {
	comm  string // field 2, without its parentheses
	state string // field 3: R, S, Z, ...
	ppid  int    // field 4
	start string // field 22, the start time: with pid, a process's identity
}

// readStat reads /proc/PID/stat (false: the process is gone).
func readStat(pid int) (stat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return stat{}, false
	}
	// The command name may hold spaces and parentheses: the fields after
	// it count from its last ')'.
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return stat{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 20 {
		return stat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return stat{comm: s[open+1 : end], state: f[0], ppid: ppid, start: f[19]}, true
}

// allPids lists the pids in /proc now.
func allPids() []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// referenceDefaults are what a reference agent puts in every request.
var referenceDefaults = map[string]any{"sandbox_profile": "standard", "timeout_seconds": 300}

// referenceCall invokes tool as a reference agent does: its defaults,
// then params.
func (a *agent) referenceCall(tool string, params map[string]any) string {
	p := map[string]any{}
	for k, v := range referenceDefaults {
		p[k] = v
	}
	for k, v := range params {
		p[k] = v
	}
	return a.invoke(tool, p)
}
