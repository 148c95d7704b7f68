package e2e

// Tests of `str invoke` and `str broker` that need no worker (and so no
// root): the broker is a real `str broker`, the worker an in-process client
// of it that answers like one.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// startStrBroker runs `str broker` on a free port with extra flags and
// waits until it accepts connections (and, unless anonymous, has written
// its token file).
func startStrBroker(t *testing.T, extra ...string) (port int, log *syncbuf.Buffer) {
	t.Helper()
	port = freePort(t)
	log = &syncbuf.Buffer{}
	cmd := exec.Command(strBin, append([]string{"broker", "--listen", "127.0.0.1:" + strconv.Itoa(port)}, extra...)...)
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = log, log
	must(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		if t.Failed() {
			t.Logf("broker log:\n%s", tail(log.String(), 40))
		}
	})
	waitFor(t, "str broker listening", 10*time.Second, func() bool {
		return strings.Contains(log.String(), `"msg":"dev broker listening`)
	})
	return port, log
}

// cleanEnv is this process's environment without the dev broker settings,
// so that each test says exactly what `str invoke` sees.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEV_BROKER_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// fakeWorker serves one tool on the broker at port like a worker would:
// it records each request and cancel, and answers a request only if reply
// is set.
type fakeWorker struct {
	c        *devbroker.Client
	mu       sync.Mutex
	requests []transport.Message
	cancels  []transport.Message
}

func newFakeWorker(t *testing.T, port int, namespace, tool string, reply func(id string) string) *fakeWorker {
	t.Helper()
	c, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: "127.0.0.1", Port: port, ClientID: newID("fake-worker"), TokenFile: broker.TokenFileFor(port),
		RetryDelay: 100 * time.Millisecond, ReceiveTimeout: 100 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	must(t, err)
	base := strings.TrimRight(namespace, "/") + "/a2a/v1/sam_remote_tool"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t, c.Connect(ctx, []string{base + "/invoke/" + tool, base + "/cancel/>"}))
	f := &fakeWorker{c: c}
	go func() {
		for {
			d, err := c.Receive(context.Background())
			if err != nil {
				return
			}
			f.mu.Lock()
			if strings.Contains(d.Topic, "/cancel/") {
				f.cancels = append(f.cancels, d.Message)
				f.mu.Unlock()
				continue
			}
			f.requests = append(f.requests, d.Message)
			f.mu.Unlock()
			if reply == nil {
				continue
			}
			var req struct{ ID string }
			json.Unmarshal(d.Payload, &req)
			c.Publish(context.Background(), transport.Message{Topic: d.UserProperties["replyTo"], Payload: []byte(reply(req.ID))})
		}
	}()
	t.Cleanup(func() { c.Close() })
	return f
}

func (f *fakeWorker) counts() (requests, cancels int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests), len(f.cancels)
}

// invokeProc is a running `str invoke`.
type invokeProc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncbuf.Buffer
	done           chan struct{}
}

func startInvoke(t *testing.T, env []string, args ...string) *invokeProc {
	t.Helper()
	p := &invokeProc{cmd: exec.Command(strBin, append([]string{"invoke"}, args...)...),
		stdout: &syncbuf.Buffer{}, stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	must(t, p.cmd.Start())
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// exitCode waits for the process. The bound only keeps a broken build from
// hanging the test run; every case here exits long before it, or never
// (--wait 10m) when the behaviour under test is missing.
func (p *invokeProc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("str invoke still running after 60 s\nstdout: %s\nstderr: %s", p.stdout, p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

const okReply = `{"jsonrpc":"2.0","id":%q,"result":{"tool_result":{"ok":true},"timed_out":false}}`

// TestInvokeBrokerPortFromEnv: DEV_BROKER_PORT without DEV_BROKER_HOST
// selects 127.0.0.1:DEV_BROKER_PORT (it used to be ignored, and str invoke
// went to 55554).
func TestInvokeBrokerPortFromEnv(t *testing.T) {
	port, _ := startStrBroker(t)
	newFakeWorker(t, port, "e2e/", "echo_tool", func(id string) string { return fmt.Sprintf(okReply, id) })
	p := startInvoke(t, cleanEnv("DEV_BROKER_PORT="+strconv.Itoa(port)), "echo_tool", "--namespace", "e2e/", "--wait", "10m")
	if code := p.exitCode(t); code != 0 || !strings.Contains(p.stdout.String(), `"tool_result":{"ok":true}`) {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, p.stdout, p.stderr)
	}
}

// TestInvokeNoWorker: a tool nobody serves gets a note on stderr naming the
// topic, then exit status 3 with its own message once --wait is over.
func TestInvokeNoWorker(t *testing.T) {
	port, _ := startStrBroker(t)
	p := startInvoke(t, cleanEnv(), "nobody_serves_this", "--broker", "127.0.0.1:"+strconv.Itoa(port),
		"--namespace", "e2e/", "--wait", "2s")
	code := p.exitCode(t)
	stderr := p.stderr.String()
	if code != 3 {
		t.Fatalf("exit %d, want 3 (no reply within --wait)\nstderr: %s", code, stderr)
	}
	for _, want := range []string{
		"no worker has answered yet",
		"e2e/a2a/v1/sam_remote_tool/invoke/nobody_serves_this",
		"no worker answered within 2s (--wait)",
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if p.stdout.String() != "" {
		t.Errorf("stdout: %s", p.stdout)
	}
}

// TestInvokeSecondInterrupt: the first Ctrl-C publishes a cancel and keeps
// waiting; the second exits at once (130), without a reply.
func TestInvokeSecondInterrupt(t *testing.T) {
	port, _ := startStrBroker(t)
	w := newFakeWorker(t, port, "e2e/", "slow_tool", nil) // never replies
	p := startInvoke(t, cleanEnv(), "slow_tool", "--broker", "127.0.0.1:"+strconv.Itoa(port), "--namespace", "e2e/", "--wait", "10m")
	waitFor(t, "the request at the worker", 20*time.Second, func() bool { n, _ := w.counts(); return n == 1 })
	must(t, p.cmd.Process.Signal(syscall.SIGINT))
	waitFor(t, "the cancel at the worker", 20*time.Second, func() bool { _, n := w.counts(); return n == 1 })
	select {
	case <-p.done:
		t.Fatalf("exited after the first Ctrl-C\nstderr: %s", p.stderr)
	default:
	}
	must(t, p.cmd.Process.Signal(syscall.SIGINT))
	if code := p.exitCode(t); code != 130 {
		t.Fatalf("exit %d after the second Ctrl-C, want 130\nstderr: %s", code, p.stderr)
	}
	if !strings.Contains(p.stderr.String(), "interrupted") {
		t.Errorf("stderr: %s", p.stderr)
	}
}

// TestInvokeSIGTERM: SIGTERM exits at once (143), without waiting for the
// reply.
func TestInvokeSIGTERM(t *testing.T) {
	port, _ := startStrBroker(t)
	w := newFakeWorker(t, port, "e2e/", "slow_tool", nil)
	p := startInvoke(t, cleanEnv(), "slow_tool", "--broker", "127.0.0.1:"+strconv.Itoa(port), "--namespace", "e2e/", "--wait", "10m")
	waitFor(t, "the request at the worker", 20*time.Second, func() bool { n, _ := w.counts(); return n == 1 })
	must(t, p.cmd.Process.Signal(syscall.SIGTERM))
	if code := p.exitCode(t); code != 143 {
		t.Fatalf("exit %d after SIGTERM, want 143\nstderr: %s", code, p.stderr)
	}
}

// rawCONNECT sends one CONNECT line to the broker and returns the reply.
func rawCONNECT(t *testing.T, port int, line string) map[string]any {
	t.Helper()
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	must(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, line+"\n")
	must(t, err)
	b, err := bufio.NewReader(c).ReadBytes('\n')
	must(t, err)
	var r map[string]any
	must(t, json.Unmarshal(b, &r))
	return r
}

// TestBrokerRequiresToken: `str broker` refuses a CONNECT without its
// token (the reference client's CONNECT, or a forged one), accepts the
// token from its file, and str invoke finds that file by itself; with
// --anonymous it writes no token and accepts any CONNECT.
func TestBrokerRequiresToken(t *testing.T) {
	port, _ := startStrBroker(t)
	path := broker.TokenFileFor(port)
	fi, err := os.Stat(path)
	must(t, err)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	tok, err := broker.ReadTokenFile(path)
	must(t, err)

	if r := rawCONNECT(t, port, `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"]}`); r["status"] != "ERROR" || r["error_code"] != "NOT_CONNECTED" {
		t.Fatalf("CONNECT without token: %v", r)
	}
	if r := rawCONNECT(t, port, `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"], "token": "guess"}`); r["status"] != "ERROR" {
		t.Fatalf("CONNECT with a wrong token: %v", r)
	}
	if r := rawCONNECT(t, port, fmt.Sprintf(`{"cmd": "CONNECT", "client_id": "ok", "token": %q}`, tok)); r["status"] != "OK" {
		t.Fatalf("CONNECT with the token: %v", r)
	}

	// str invoke with a token file that is not the broker's is refused,
	// and says where it looked.
	bad := t.TempDir() + "/bad.token"
	must(t, os.WriteFile(bad, []byte(broker.NewToken()), 0o600))
	p := startInvoke(t, cleanEnv(), "echo_tool", "--broker", "127.0.0.1:"+strconv.Itoa(port), "--namespace", "e2e/",
		"--token-file", bad, "--wait", "10m")
	if code := p.exitCode(t); code != 1 || !strings.Contains(p.stderr.String(), "missing or wrong token") ||
		!strings.Contains(p.stderr.String(), bad) {
		t.Fatalf("wrong token file: exit %d\nstderr: %s", code, p.stderr)
	}

	// --anonymous: no token file, and any CONNECT is accepted. A token
	// file a dead broker left on its port (SIGKILLed, so it could not
	// remove it) is removed: clients would send a token no broker holds.
	aport := freePort(t)
	must(t, broker.WriteTokenFile(broker.DefaultTokenFile(aport), broker.NewToken()))
	t.Cleanup(func() { os.Remove(broker.DefaultTokenFile(aport)) })
	_, alog := startStrBroker(t, "--anonymous", "--listen", "127.0.0.1:"+strconv.Itoa(aport))
	if _, err := os.Stat(broker.TokenFileFor(aport)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("anonymous broker's token file: %v", err)
	}
	if !strings.Contains(alog.String(), "removed a stale token file") {
		t.Errorf("anonymous broker did not report the stale token file it removed:\n%s", alog)
	}
	if r := rawCONNECT(t, aport, `{"cmd": "CONNECT", "client_id": "reference-client", "subscriptions": []}`); r["status"] != "OK" {
		t.Fatalf("anonymous broker refused a CONNECT: %v", r)
	}
	if !strings.Contains(alog.String(), "WITHOUT authentication") {
		t.Errorf("anonymous broker did not warn:\n%s", alog)
	}
}

// TestEmbeddedBrokerRefusesForgedCONNECT: the worker's embedded broker
// refuses a CONNECT without its token (the reference client's, or a tool's
// on the host network), and one with the token that claims the worker's
// own client id (to join its queue group and answer other users' calls);
// the worker keeps serving.
func TestEmbeddedBrokerRefusesForgedCONNECT(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	path := broker.TokenFileFor(w.port)
	tok, err := broker.ReadTokenFile(path)
	must(t, err)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v %v", path, fi, err)
	}
	if r := rawCONNECT(t, w.port, `{"cmd": "CONNECT", "client_id": "spy", "queue_name": "e2e/q/sandbox/sandbox-worker-001", "subscriptions": ["e2e/a2a/v1/sam_remote_tool/invoke/>"]}`); r["status"] != "ERROR" || r["error_code"] != "NOT_CONNECTED" {
		t.Fatalf("CONNECT without the token: %v", r)
	}
	for _, id := range []string{"sandbox-worker-001", "sandbox-worker-001-pub"} {
		r := rawCONNECT(t, w.port, fmt.Sprintf(`{"cmd": "CONNECT", "client_id": %q, "queue_name": "e2e/q/sandbox/sandbox-worker-001", "subscriptions": ["e2e/a2a/v1/sam_remote_tool/invoke/echo_tool"], "token": %q}`, id, tok))
		if r["status"] != "ERROR" || !strings.Contains(fmt.Sprint(r["error_message"]), "already connected") {
			t.Fatalf("CONNECT claiming %s: %v", id, r)
		}
	}
	a := newAgent(t, w.port)
	for range 3 {
		if r := a.reply(a.invoke("echo_tool", nil), replyWait); !isSuccess(r) {
			t.Fatalf("after the forged CONNECTs: %s", r)
		}
	}
	w.stop(syscall.SIGTERM)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file after the worker stopped: %v", err)
	}
}
