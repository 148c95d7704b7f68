package hostile

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/securetoolruntime/str/broker/brokertest"
	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// Hostile requesters (issue 16 §1, §2): the sandbox holds, but the worker
// around it must not trust what a request says about who sent it. Each
// test runs a real worker (`str worker --embedded-broker`) and attacks it
// from the broker side, as another tenant's agent would.

const requesterManifest = `version: 1
tools:
  echo_tool: {module: example_tools, function: echo_tool, sandbox_profile: restrictive}
  process_file: {module: example_tools, function: process_file, sandbox_profile: restrictive}
  slow_operation: {module: example_tools, function: slow_operation, sandbox_profile: restrictive}
`

// The keys file: the e2e agent acts for alice; mallory's agent for
// mallory only.
const requesterKeys = `version: 1
keys:
  - id: e2e-key
    secret: e2e-secret-0123456789abcdef0123456789ab
    apps: [e2e]
    users: [alice]
    tools: ["*"]
  - id: mallory-key
    secret: mallory-secret-0123456789abcdef01234567
    apps: [mallory]
    users: [mallory]
    tools: ["*"]
`

const (
	e2eSecret     = "e2e-secret-0123456789abcdef0123456789ab"
	mallorySecret = "mallory-secret-0123456789abcdef01234567"
)

// requesterClient is one agent on the broker: it receives on its own
// response and status topics ({base}/sam_remote_tool/response/{name}/…).
type requesterClient struct {
	t       *testing.T
	c       *devbroker.Client
	name    string
	base    string
	mu      sync.Mutex
	replies map[string]chan []byte
	running map[string]bool // ids with a status seen
}

func newRequester(t *testing.T, w *workerProc, name string) *requesterClient {
	t.Helper()
	c, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: "127.0.0.1", Port: w.port, ClientID: fmt.Sprintf("requester-%s-%d", name, time.Now().UnixNano()),
		TokenFile: broker.TokenFileFor(w.port), RetryDelay: 200 * time.Millisecond, ReceiveTimeout: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	must(t, err)
	r := &requesterClient{t: t, c: c, name: name, base: "e2e/a2a/v1", replies: map[string]chan []byte{}, running: map[string]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	must(t, c.Connect(ctx, []string{r.base + "/sam_remote_tool/response/" + name + "/>", r.base + "/sam_remote_tool/status/" + name + "/>"}))
	go func() {
		for {
			d, err := c.Receive(context.Background())
			if err != nil {
				return
			}
			if d.Ack != nil {
				d.Ack()
			}
			parts := strings.Split(d.Topic, "/")
			id := parts[len(parts)-1]
			if strings.Contains(d.Topic, "/status/") {
				r.mu.Lock()
				r.running[id] = true
				r.mu.Unlock()
				continue
			}
			r.replyChan(id) <- d.Payload
		}
	}()
	t.Cleanup(func() { c.Close() })
	return r
}

func (r *requesterClient) replyChan(id string) chan []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.replies[id] == nil {
		r.replies[id] = make(chan []byte, 8)
	}
	return r.replies[id]
}

func (r *requesterClient) isRunning(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[id]
}

func (r *requesterClient) reply(id string) reply {
	r.t.Helper()
	select {
	case b := <-r.replyChan(id):
		var rep reply
		must(r.t, json.Unmarshal(b, &rep))
		return rep
	case <-time.After(rpcWait):
		r.t.Fatalf("%s: no reply to %s", r.name, id)
		return reply{}
	}
}

// call is one request: the tool, the id, params over the defaults
// (alice's), user properties over the defaults (this agent's reply
// topics, clientId, userId = params.user_id), and how it is signed
// (keyID "" = the shared secret; secret "" = unsigned).
type call struct {
	tool, id        string
	params          map[string]any
	props           map[string]string
	keyID, secret   string
	payloadVerbatim []byte
}

func (r *requesterClient) invoke(c call) {
	r.t.Helper()
	p := map[string]any{"task_id": "task-" + c.id, "tool_name": c.tool, "app_name": r.name, "user_id": "alice", "session_id": "s-1"}
	for k, v := range c.params {
		p[k] = v
	}
	payload, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.id, "method": "sam_remote_tool/invoke", "params": p})
	must(r.t, err)
	if c.payloadVerbatim != nil {
		payload = c.payloadVerbatim
	}
	props := map[string]string{
		worker.PropReplyTo: r.base + "/sam_remote_tool/response/" + r.name + "/" + c.id, worker.PropStatusTo: r.base + "/sam_remote_tool/status/" + r.name + "/" + c.id,
		worker.PropClientID: r.name, worker.PropUserID: fmt.Sprint(p["user_id"]),
	}
	for k, v := range c.props {
		props[k] = v
	}
	r.publish(transport.Message{Topic: r.base + "/sam_remote_tool/invoke/" + c.tool, Payload: payload, UserProperties: props}, c.keyID, c.secret)
}

func (r *requesterClient) cancel(id, user, keyID, secret string) {
	r.t.Helper()
	r.publish(transport.Message{Topic: r.base + "/sam_remote_tool/cancel/" + id, Payload: []byte(`{}`),
		UserProperties: map[string]string{worker.PropClientID: r.name, worker.PropUserID: user}}, keyID, secret)
}

func (r *requesterClient) publish(m transport.Message, keyID, secret string) {
	r.t.Helper()
	if secret != "" {
		if keyID != "" {
			m.UserProperties[worker.PropKeyID] = keyID
		}
		worker.SignMessage(secret, &m, time.Now())
	}
	must(r.t, r.c.Publish(context.Background(), m))
}

// counted reads str_worker_errors_total{code} from /metrics.
func counted(t *testing.T, w *workerProc, code string) int {
	t.Helper()
	_, page := w.get("/metrics")
	m := regexp.MustCompile(`(?m)^str_worker_errors_total\{code="` + code + `"\} (\d+)$`).FindStringSubmatch(page)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func keyedWorker(t *testing.T, e *env) *workerProc {
	keys := filepath.Join(e.root, "keys.yaml")
	must(t, os.WriteFile(keys, []byte(requesterKeys), 0o600))
	return startWorker(t, e, map[string]string{"STR_SIGNING_KEYS": keys})
}

// TestRequesterImpersonation: a request whose signed userId is mallory
// and whose params.user_id is alice ran, and acted on alice's artifacts;
// mallory's own agent key claiming alice, and an unsigned request
// claiming alice, are refused. A verified call is audited as verified.
func TestRequesterImpersonation(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, requesterManifest)
	w := keyedWorker(t, e)
	alice := newRequester(t, w, "e2e")
	mallory := newRequester(t, w, "mallory")
	// 1. The signed userId is not params.user_id: answered (the signature
	// is valid, the replyTo the signer's), refused.
	alice.invoke(call{tool: "echo_tool", id: "imp-1", props: map[string]string{worker.PropUserID: "mallory"}, keyID: "e2e-key", secret: e2eSecret})
	if r := alice.reply("imp-1"); r.Error == nil || r.Error.Code != "AUTHENTICATION_FAILED" || !strings.Contains(r.Error.Message, `"userId" ("mallory") is not params.user_id ("alice")`) {
		t.Errorf("signed mallory, params alice: %+v", r)
	}
	// 2. Mallory's agent key claiming alice.
	mallory.invoke(call{tool: "echo_tool", id: "imp-2", keyID: "mallory-key", secret: mallorySecret})
	if r := mallory.reply("imp-2"); r.Error == nil || r.Error.Code != "AUTHENTICATION_FAILED" || !strings.Contains(r.Error.Message, `may not claim params.user_id "alice"`) {
		t.Errorf("mallory's key claiming alice: %+v", r)
	}
	// 3. Mallory's key, signing for alice's agent and replyTo, and 4. an
	// unsigned request claiming alice: refused, and not answered (their
	// replyTo is not the signer's).
	before := counted(t, w, "AUTHENTICATION_FAILED")
	mallory.invoke(call{tool: "echo_tool", id: "imp-3", keyID: "mallory-key", secret: mallorySecret, props: map[string]string{
		worker.PropReplyTo: alice.base + "/sam_remote_tool/response/e2e/imp-3", worker.PropStatusTo: "", worker.PropClientID: "e2e"}})
	mallory.invoke(call{tool: "echo_tool", id: "imp-4", props: map[string]string{
		worker.PropReplyTo: alice.base + "/sam_remote_tool/response/e2e/imp-4", worker.PropStatusTo: ""}})
	waitFor(t, "both refused", 2*time.Minute, func() bool { return counted(t, w, "AUTHENTICATION_FAILED") >= before+2 })
	// 5. Alice's own call runs and is audited as verified.
	content := base64.StdEncoding.EncodeToString([]byte("one\ntwo\n"))
	alice.invoke(call{tool: "process_file", id: "imp-5", keyID: "e2e-key", secret: e2eSecret, params: map[string]any{
		"args":                map[string]any{"input_file": "in.txt"},
		"preloaded_artifacts": map[string]any{"input_file": map[string]any{"filename": "in.txt", "content": content}},
	}})
	if r := alice.reply("imp-5"); r.Result == nil {
		t.Fatalf("alice's verified call: %+v", r.Error)
	}
	for _, id := range []string{"imp-3", "imp-4"} {
		if len(alice.replyChan(id)) != 0 {
			t.Errorf("%s was answered on alice's reply topic", id)
		}
	}
	f, err := os.Open(filepath.Join(e.artifacts, ".audit", "audit.jsonl"))
	must(t, err)
	defer f.Close()
	saves := 0
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var l struct{ Op, User, Requester, VerifiedBy string }
		var raw map[string]any
		must(t, json.Unmarshal(sc.Bytes(), &raw))
		l.Op, _ = raw["op"].(string)
		l.User, _ = raw["user"].(string)
		l.Requester, _ = raw["requester"].(string)
		l.VerifiedBy, _ = raw["verified_by"].(string)
		if l.Op != "save" {
			continue
		}
		saves++
		if l.User != "alice" || l.Requester != "verified:alice" || l.VerifiedBy != "key:e2e-key" {
			t.Errorf("audit line: %s", sc.Bytes())
		}
	}
	if saves == 0 {
		t.Error("no save in the audit log")
	}
}

// TestRequesterCancel: a cancel is honoured only from the requester that
// started the task: unsigned, or signed as mallory, it is refused.
func TestRequesterCancel(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, requesterManifest)
	w := keyedWorker(t, e)
	alice := newRequester(t, w, "e2e")
	mallory := newRequester(t, w, "mallory")
	slow := map[string]any{"args": map[string]any{"steps": 3, "delay": 1}}
	alice.invoke(call{tool: "slow_operation", id: "c-1", params: slow, keyID: "e2e-key", secret: e2eSecret})
	waitFor(t, "alice's call running", 2*time.Minute, func() bool { return alice.isRunning("c-1") })
	before := counted(t, w, "AUTHENTICATION_FAILED")
	mallory.cancel("c-1", "", "", "")                              // unsigned
	mallory.cancel("c-1", "mallory", "mallory-key", mallorySecret) // signed, as mallory
	mallory.cancel("c-1", "alice", "mallory-key", mallorySecret)   // mallory's key claiming alice
	waitFor(t, "the three cancels refused", 2*time.Minute, func() bool { return counted(t, w, "AUTHENTICATION_FAILED") >= before+3 })
	if r := alice.reply("c-1"); r.Result == nil {
		t.Fatalf("a foreign cancel was honoured: %+v", r.Error)
	}
	alice.invoke(call{tool: "slow_operation", id: "c-2", params: map[string]any{"args": map[string]any{"steps": 100, "delay": 1}}, keyID: "e2e-key", secret: e2eSecret})
	waitFor(t, "alice's call running", 2*time.Minute, func() bool { return alice.isRunning("c-2") })
	alice.cancel("c-2", "alice", "e2e-key", e2eSecret)
	if r := alice.reply("c-2"); r.Error == nil || r.Error.Code != "CANCELLED" {
		t.Fatalf("alice's own cancel: %+v", r)
	}
}

// TestRequesterReplyInjection: the worker is never made to publish on a
// request topic (an invoke whose replyTo was a victim's cancel topic
// made the worker cancel the victim), and a request copying a live
// request's id and replyTo from another requester injects nothing into
// the victim's reply topic. Without auth (the reference's model) and
// with per-agent keys.
func TestRequesterReplyInjection(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, requesterManifest)
	w := startWorker(t, e, nil)
	victim := newRequester(t, w, "e2e")
	mallory := newRequester(t, w, "mallory")
	slow := map[string]any{"args": map[string]any{"steps": 3, "delay": 1}}
	victim.invoke(call{tool: "slow_operation", id: "v-1", params: slow})
	waitFor(t, "the victim running", 2*time.Minute, func() bool { return victim.isRunning("v-1") })
	// 1. replyTo = the victim's cancel topic; a malformed request is
	// answered at once.
	mallory.invoke(call{tool: "echo_tool", id: "x-1", payloadVerbatim: []byte(`{"jsonrpc":"2.0","id":"x-1"}`),
		props: map[string]string{worker.PropReplyTo: victim.base + "/sam_remote_tool/cancel/v-1"}})
	// 2. The victim's id and replyTo, another user.
	mallory.invoke(call{tool: "echo_tool", id: "v-1", params: map[string]any{"user_id": "mallory", "task_id": "mallory-task"},
		props: map[string]string{worker.PropReplyTo: victim.base + "/sam_remote_tool/response/e2e/v-1"}})
	if r := victim.reply("v-1"); r.Result == nil {
		t.Fatalf("the victim's first reply is not its result: %+v", r.Error)
	}
	if len(victim.replyChan("v-1")) != 0 {
		t.Errorf("a second reply on the victim's topic: %s", <-victim.replyChan("v-1"))
	}
	// 3. With per-agent keys, mallory cannot sign for the victim's
	// replyTo at all: refused, not answered there.
	keys := filepath.Join(e.root, "keys.yaml")
	must(t, os.WriteFile(keys, []byte(requesterKeys), 0o600))
	w2 := startWorker(t, e, map[string]string{"STR_SIGNING_KEYS": keys})
	victim2 := newRequester(t, w2, "e2e")
	mallory2 := newRequester(t, w2, "mallory")
	victim2.invoke(call{tool: "slow_operation", id: "v-2", params: slow, keyID: "e2e-key", secret: e2eSecret})
	waitFor(t, "the victim running", 2*time.Minute, func() bool { return victim2.isRunning("v-2") })
	mallory2.invoke(call{tool: "echo_tool", id: "v-2", params: map[string]any{"user_id": "mallory", "task_id": "mallory-task"},
		keyID: "mallory-key", secret: mallorySecret, props: map[string]string{
			worker.PropReplyTo:  victim2.base + "/sam_remote_tool/response/e2e/v-2",
			worker.PropStatusTo: victim2.base + "/sam_remote_tool/status/e2e/v-2", worker.PropClientID: "mallory"}})
	if r := victim2.reply("v-2"); r.Result == nil {
		t.Fatalf("the victim's first reply is not its result: %+v", r.Error)
	}
	if len(victim2.replyChan("v-2")) != 0 {
		t.Errorf("a second reply on the victim's topic: %s", <-victim2.replyChan("v-2"))
	}
}

// TestRequesterStrInvokeKeyed: `str invoke --key-id` signs invokes and
// its cancel (Ctrl-C) with an agent key: the worker serves alice's call,
// refuses bob (the key may not claim him) and honours the signed cancel.
func TestRequesterStrInvokeKeyed(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, requesterManifest)
	w := keyedWorker(t, e)
	invoke := func(args ...string) *exec.Cmd {
		cmd := exec.Command(strBin, append([]string{"invoke"}, args...)...)
		cmd.Args = append(cmd.Args, "--broker", "127.0.0.1:"+strconv.Itoa(w.port), "--namespace", "e2e/", "--app", "e2e",
			"--key-id", "e2e-key", "--signing-secret", e2eSecret, "--token-file", broker.TokenFileFor(w.port))
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		return cmd
	}
	if out, err := invoke("echo_tool", "--user", "alice").CombinedOutput(); err != nil || !strings.Contains(string(out), `"tool_result"`) {
		t.Fatalf("alice: %v\n%s", err, out)
	}
	out, err := invoke("echo_tool", "--user", "bob").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), `may not claim params.user_id \"bob\"`) {
		t.Fatalf("bob: %v\n%s", err, out)
	}
	cmd := invoke("slow_operation", "--user", "alice", "--args", `{"steps": 100, "delay": 1}`, "--wait", "10m")
	var stdout syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	must(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	waitFor(t, "the call running", 2*time.Minute, func() bool { return strings.Contains(stdout.String(), "status: Step 1") })
	must(t, cmd.Process.Signal(syscall.SIGINT))
	select {
	case <-done:
	case <-time.After(rpcWait):
		t.Fatalf("no answer to the signed cancel:\n%s", stdout.String())
	}
	if !strings.Contains(stdout.String(), `"code":"CANCELLED"`) {
		t.Fatalf("the signed cancel was not honoured:\n%s", stdout.String())
	}
}

// TestPreLoginFloodAgainstWorker: issue 29 §7. A local peer without the
// token keeps every place of the worker's embedded broker before CONNECT
// taken, reopening each connection the broker closes, as fast as it can;
// 20 logins with the token (one connection, one attempt each) all get in
// (before, 4 of 20 did), and an agent connecting through the flood has
// its call served.
func TestPreLoginFloodAgainstWorker(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, requesterManifest)
	w := startWorker(t, e, nil)
	tok, err := broker.ReadTokenFile(broker.TokenFileFor(w.port))
	must(t, err)
	addr := "127.0.0.1:" + strconv.Itoa(w.port)
	flood := brokertest.StartFlood(t, addr, 2*broker.DefaultMaxUnauthenticated)
	// The broker closing connections under the flood is the sign that it
	// holds every place.
	waitFor(t, "the flood to hold every place", rpcWait, func() bool { return flood.Reopened.Load() >= 2*broker.DefaultMaxUnauthenticated })
	const logins = 20
	errs := make(chan error, logins)
	for i := range logins {
		go func() { errs <- brokertest.Login(addr, tok, fmt.Sprintf("flood-login-%02d", i)) }()
	}
	failed := 0
	for range logins {
		if err := <-errs; err != nil {
			t.Error(err)
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d logins with the token failed under a pre-login flood", failed, logins)
	}
	alice := newRequester(t, w, "e2e")
	alice.invoke(call{tool: "echo_tool", id: "through-flood"})
	if r := alice.reply("through-flood"); r.Result == nil {
		t.Fatalf("a call through the flood: %+v", r.Error)
	}
	flood.Stop()
	t.Logf("the broker closed %d flood connections", flood.Reopened.Load())
}

// TestAgentKeyShareAgainstWorker: issue 29 §7. An agent key allowed users
// "mallory*" sends 12 long calls, each as a new user (so each within its
// user's caps), to a worker of 4 slots and 16 queue places: the key's
// caps (auto: 3 running, 4 waiting) hold over all its users, the other 5
// calls are RESOURCE_EXHAUSTED naming the key, and alice's agent's call
// runs meanwhile. Before, the made-up users took every slot and place.
func TestAgentKeyShareAgainstWorker(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, requesterManifest)
	keys := filepath.Join(e.root, "keys.yaml")
	must(t, os.WriteFile(keys, []byte(strings.Replace(requesterKeys, "users: [mallory]", `users: ["mallory*"]`, 1)), 0o600))
	w := startWorker(t, e, map[string]string{"STR_SIGNING_KEYS": keys, "SANDBOX_MAX_CONCURRENT": "4", "SANDBOX_MAX_QUEUED": "16",
		"SHUTDOWN_GRACE_SECONDS": "1"})
	alice := newRequester(t, w, "e2e")
	mallory := newRequester(t, w, "mallory")
	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("share-%02d", i)
		ids = append(ids, id)
		mallory.invoke(call{tool: "slow_operation", id: id, keyID: "mallory-key", secret: mallorySecret,
			params: map[string]any{"user_id": fmt.Sprintf("mallory%02d", i), "args": map[string]any{"steps": 600, "delay": 1}}})
	}
	for _, id := range ids[7:] {
		if r := mallory.reply(id); r.Error == nil || r.Error.Code != "RESOURCE_EXHAUSTED" || !strings.Contains(r.Error.Message, `agent key "mallory-key"`) {
			t.Errorf("%s, over the key's caps: %+v", id, r)
		}
	}
	for _, id := range ids[:3] {
		waitFor(t, id+" running", rpcWait, func() bool { return mallory.isRunning(id) })
	}
	alice.invoke(call{tool: "echo_tool", id: "beside-mallory", keyID: "e2e-key", secret: e2eSecret})
	if r := alice.reply("beside-mallory"); r.Result == nil {
		t.Fatalf("alice's call beside mallory's key: %+v", r.Error)
	}
	// None of the 4 waiting runs, while the 3 running have not ended
	// (the restrictive profile's 60 s would end them on a slow machine:
	// then a waiting one may run, and this says nothing).
	var over []string
	for _, id := range ids[3:7] {
		if mallory.isRunning(id) {
			over = append(over, id)
		}
	}
	for _, id := range ids[:3] {
		if len(mallory.replyChan(id)) > 0 {
			t.Logf("%s ended before the check of the waiting calls (its timeout): not checked", id)
			return
		}
	}
	if len(over) > 0 {
		t.Errorf("%v run: mallory's key has more than its 3 running", over)
	}
}
