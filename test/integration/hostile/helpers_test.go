package hostile

// Minimal copies of test/e2e's helpers: a real `str worker` with the
// embedded broker, and an agent of the dev broker that invokes tools.

import (
	"context"
	"encoding/json"
	"flag"
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
	"sync/atomic"
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

// TestMain uses $STR_BIN or builds str. The cases only wait on the
// worker, which bounds how many sandboxes run at once: unless -parallel
// was given, up to 32 cases wait at the same time.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "32")
	}
	os.Exit(strbuild.Main(m, "../../..", "hostile", &strBin))
}

// requireRoot skips (or, with STR_MUST_WORK=1, fails) unless root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := "hostile: needs root: the worker's launcher creates namespaces and cgroups for each tool and gives each sandbox host uids of its own"
	mustwork.Skip(t, msg)
}

type env struct {
	root, tools, manifest, work, artifacts string
}

// templateMode (STR_HOSTILE_TEMPLATE=1) runs every tool of the battery
// from a per-tool template (manifest warm: template): their environment
// is then made under templateRoot, outside /tmp and /var, under which a
// template call's fresh /tmp (every profile) or /var (permissive) would
// hide the binds (the launcher refuses such a template and the calls
// would run cold).
var templateMode = os.Getenv("STR_HOSTILE_TEMPLATE") == "1"

// templateRoot holds the battery's environment in template mode: /run,
// outside every profile's fresh mounts (/tmp, /var, /dev/shm).
const templateRoot = "/run"

// templateManifest is manifest with warm: template on every tool: each
// profile's, and those with a network policy of their own (h_restricted:
// a template call gets a cold call's egress).
func templateManifest(manifest string) string {
	var out []string
	for _, line := range strings.Split(manifest, "\n") {
		templated := strings.Contains(line, "sandbox_profile: ")
		if templated && strings.HasSuffix(line, "}") && !strings.Contains(line, "warm:") {
			line = strings.TrimSuffix(line, "}") + ", warm: template}"
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}

func newEnv(t *testing.T, manifest string) *env {
	t.Helper()
	root := t.TempDir()
	if templateMode {
		// A directory of our own above root: its mode is set below
		// (never a system directory's).
		dir, err := os.MkdirTemp(templateRoot, "str-hostile-tpl-")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		root = filepath.Join(dir, "env")
		must(t, os.Mkdir(root, 0o755))
		manifest = templateManifest(manifest)
	}
	must(t, os.Chmod(root, 0o755))
	must(t, os.Chmod(filepath.Dir(root), 0o755))
	e := &env{root: root, tools: filepath.Join(root, "tools"), manifest: filepath.Join(root, "manifest.yaml"),
		work: filepath.Join(root, "work"), artifacts: filepath.Join(root, "artifacts")}
	must(t, os.MkdirAll(e.tools, 0o755))
	copyFile(t, "../../../examples/tools/python/example_tools.py", filepath.Join(e.tools, "example_tools.py"))
	copyFile(t, "testdata/hostile_tools.py", filepath.Join(e.tools, "hostile_tools.py"))
	must(t, os.WriteFile(e.manifest, []byte(manifest), 0o644))
	return e
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	must(t, err)
	must(t, os.WriteFile(to, b, 0o644))
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

type workerProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	port   int
	health int
	log    *syncbuf.Buffer
	done   chan struct{}
}

// startWorker starts `str worker --embedded-broker` with extra
// environment variables and waits until it is ready.
func startWorker(t *testing.T, e *env, extra map[string]string) *workerProc {
	t.Helper()
	w := &workerProc{t: t, health: freePort(t), port: freePort(t), log: &syncbuf.Buffer{}, done: make(chan struct{})}
	vars := map[string]string{
		"SAM_NAMESPACE": "e2e/", "MANIFEST_PATH": e.manifest, "TOOLS_PYTHON_DIR": e.tools,
		"SANDBOX_WORK_DIR": e.work, "STR_RUNNER_DIR": filepath.Join(e.root, "runner"), "STR_SITE_DIR": filepath.Join(e.root, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": e.artifacts,
		"HEALTH_PORT": strconv.Itoa(w.health), "STR_LOG_LEVEL": "info",
	}
	for k, v := range extra {
		vars[k] = v
	}
	w.cmd = exec.Command(strBin, "worker", "--embedded-broker", "127.0.0.1:"+strconv.Itoa(w.port))
	w.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range vars {
		w.cmd.Env = append(w.cmd.Env, k+"="+v)
	}
	w.cmd.Stdout, w.cmd.Stderr = w.log, w.log
	must(t, w.cmd.Start())
	go func() { w.cmd.Wait(); close(w.done) }()
	t.Cleanup(func() {
		w.stop()
		if t.Failed() {
			t.Logf("worker log:\n%s", tail(w.log.String(), 80))
		}
	})
	// Generous: the installation cases' workers install their packages
	// (a sandbox each) before they are ready, while the battery loads
	// the machine.
	deadline := time.Now().Add(rpcWait)
	for {
		if code, _ := w.get("/readyz"); code == 200 {
			break
		}
		if !w.alive() || time.Now().After(deadline) {
			t.Fatalf("worker not ready:\n%s", tail(w.log.String(), 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if templateMode {
		w.awaitTemplates(t, e, deadline)
	}
	return w
}

// awaitTemplates waits until every warm: template tool of e's manifest
// (one without credentials: those always run cold) has its template
// started or its start failed: the worker starts them in the background
// at its start, and a call that came before would run cold.
func (w *workerProc) awaitTemplates(t *testing.T, e *env, deadline time.Time) {
	t.Helper()
	m, err := os.ReadFile(e.manifest)
	must(t, err)
	want := 0
	for _, l := range strings.Split(string(m), "\n") {
		if strings.Contains(l, "warm: template") && !strings.Contains(l, "credentials") {
			want++
		}
	}
	sample := regexp.MustCompile(`(?m)^str_worker_(templates_live|template_start_failures_total\{[^}]*\}) (\d+)$`)
	for {
		_, page := w.get("/metrics")
		n := 0
		for _, m := range sample.FindAllStringSubmatch(page, -1) {
			v, _ := strconv.Atoi(m[2])
			n += v
		}
		if n >= want {
			return
		}
		if !w.alive() || time.Now().After(deadline) {
			t.Fatalf("%d of %d templates started:\n%s", n, want, tail(w.log.String(), 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
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

func (w *workerProc) stop() {
	if !w.alive() {
		return
	}
	w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-w.done:
	case <-time.After(60 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
		w.t.Errorf("worker did not stop after SIGTERM")
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

// agent is a client of the dev broker behaving like a SAM agent.
type agent struct {
	t    *testing.T
	c    *devbroker.Client
	base string

	mu       sync.Mutex
	statuses map[string][]string
	replies  map[string]chan []byte
}

func newAgent(t *testing.T, port int) *agent {
	t.Helper()
	c, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: "127.0.0.1", Port: port, ClientID: fmt.Sprintf("hostile-agent-%d", time.Now().UnixNano()),
		TokenFile:  broker.TokenFileFor(port),
		RetryDelay: 200 * time.Millisecond, ReceiveTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	must(t, err)
	a := &agent{t: t, c: c, base: "e2e/a2a/v1", statuses: map[string][]string{}, replies: map[string]chan []byte{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t, c.Connect(ctx, []string{a.base + "/sam_remote_tool/response/e2e/>", a.base + "/sam_remote_tool/status/e2e/>"}))
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
			var st struct {
				Params struct {
					StatusText string `json:"status_text"`
				} `json:"params"`
			}
			json.Unmarshal(d.Payload, &st)
			a.mu.Lock()
			a.statuses[last] = append(a.statuses[last], st.Params.StatusText)
			a.mu.Unlock()
		case strings.Contains(d.Topic, "/response/"):
			a.replyChan(last) <- d.Payload
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
	return append([]string(nil), a.statuses[id]...)
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
	must(a.t, a.c.Publish(context.Background(), transport.Message{
		Topic: a.base + "/sam_remote_tool/invoke/" + tool, Payload: payload,
		UserProperties: map[string]string{
			"replyTo":  a.base + "/sam_remote_tool/response/e2e/" + id,
			"statusTo": a.base + "/sam_remote_tool/status/e2e/" + id,
			"clientId": "e2e", "userId": "u-1",
		}}))
	return id
}

func (a *agent) cancel(id string) {
	must(a.t, a.c.Publish(context.Background(), transport.Message{Topic: a.base + "/sam_remote_tool/cancel/" + id, Payload: []byte(`{}`)}))
}

// reply waits for the reply to id; within bounds the wait (the battery's
// requests queue behind each other, so it is generous).
func (a *agent) reply(t *testing.T, id string, within time.Duration) []byte {
	t.Helper()
	select {
	case r := <-a.replyChan(id):
		return r
	case <-time.After(within):
		t.Fatalf("no reply to %s within %v", id, within)
		return nil
	}
}

func (a *agent) hasReply(id string) bool {
	return len(a.replyChan(id)) > 0
}

// reply is the part of a reply the battery reads.
type reply struct {
	Result *struct {
		ToolResult json.RawMessage `json:"tool_result"`
		TimedOut   bool            `json:"timed_out"`
		Created    []struct {
			Filename  string `json:"filename"`
			SizeBytes int64  `json:"size_bytes"`
		} `json:"created_artifacts"`
		Skipped []struct {
			Filename, Reason string
		} `json:"skipped_outputs"`
		Violations []struct {
			Kind, Reason, Host string
			Port               int
		} `json:"violations"`
	} `json:"result"`
	Error *struct{ Code, Message string } `json:"error"`
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
			t.Fatalf("gave up after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hostAddress is one of the host's non-loopback IPv4 addresses, if any.
func hostAddress() string {
	ifas, _ := net.InterfaceAddrs()
	for _, a := range ifas {
		if pn, ok := a.(*net.IPNet); ok && pn.IP.To4() != nil && !pn.IP.IsLoopback() {
			return pn.IP.String()
		}
	}
	return ""
}

// findProcs returns the host pids whose command line contains marker.
func findProcs(marker string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(strings.ReplaceAll(string(cl), "\x00", " "), marker) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// statusesWith returns every status line received that contains s.
func (a *agent) statusesWith(s string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, l := range a.statuses {
		for _, st := range l {
			if strings.Contains(st, s) {
				out = append(out, st)
			}
		}
	}
	return out
}

// countingListener listens on addr until the test ends and counts in n
// every connection it accepts (and closes): a host listener a sandbox
// must not reach.
func countingListener(t *testing.T, network, addr string, n *atomic.Int64) net.Listener {
	t.Helper()
	ln, err := net.Listen(network, addr)
	must(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln
}
