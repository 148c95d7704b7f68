package worker

import (
	"context"
	"encoding/json"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// Probe settings of these tests: short, so that the tests are quick; the
// assertions wait on states, never on these durations.
const (
	testProbeInterval = 20 * time.Millisecond
	testProbeTimeout  = 300 * time.Millisecond
)

func probeConfig(c *Config) {
	c.ProbeInterval, c.ProbeTimeout = testProbeInterval, testProbeTimeout
}

// gatedReestablish holds the worker's Reestablish calls (counted) until
// the test opens the gate, so that the deaf state can be observed.
type gatedReestablish struct {
	transport.Transport
	mu    sync.Mutex
	open  bool
	calls int
}

func (g *gatedReestablish) Reestablish(cause error) {
	g.mu.Lock()
	g.calls++
	open := g.open
	g.mu.Unlock()
	if open {
		g.Transport.Reestablish(cause)
	}
}

func (g *gatedReestablish) setOpen() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
}

// readyzBroker returns /readyz's status code and "broker".
func readyzBroker(t *testing.T, srv *Server) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	var body struct{ Broker string }
	must(t, json.Unmarshal(rec.Body.Bytes(), &body))
	return rec.Code, body.Broker
}

// The broker forgets the worker's session while it still looks
// connected (memory.Bus.Forget): the probe does not come back, /readyz
// answers 503 "deaf", the re-establishment is counted and asked of the
// transport; once the transport really re-establishes (the gate opens),
// a probe comes back, /readyz is 200 "connected" and requests are served.
func TestProbeDeafReadyzAndReestablish(t *testing.T) {
	h := newHarness(t, probeConfig)
	gate := &gatedReestablish{Transport: h.bus.Client("worker", h.cfg.QueueName())}
	var err error
	h.srv, err = New(Options{Config: h.cfg, Transport: gate, Sandboxes: launchertest.Sandboxes{}, Store: h.store,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	must(t, err)
	h.start()
	if reply := h.reply(h.send("echo", map[string]any{"args": map[string]any{"message": "before"}})); !strings.Contains(string(reply), `"echo":"before"`) {
		t.Fatalf("reply %s", reply)
	}
	if code, broker := readyzBroker(t, h.srv); code != 200 || broker != "connected" {
		t.Fatalf("before: /readyz %d %q", code, broker)
	}

	h.bus.Forget("worker")
	waitFor(t, `/readyz 503 "deaf"`, func() bool {
		code, broker := readyzBroker(t, h.srv)
		return code == 503 && broker == "deaf"
	})
	if n := metricValue(t, h, "str_worker_broker_reestablished_total"); n < 1 {
		t.Fatalf("str_worker_broker_reestablished_total %v while deaf", n)
	}
	gate.mu.Lock()
	calls := gate.calls
	gate.mu.Unlock()
	if calls < 1 {
		t.Fatal("deaf, but the transport was not asked to re-establish")
	}

	gate.setOpen()
	waitFor(t, `/readyz 200 "connected" again`, func() bool {
		code, broker := readyzBroker(t, h.srv)
		return code == 200 && broker == "connected"
	})
	if reply := h.reply(h.send("echo", map[string]any{"args": map[string]any{"message": "after"}})); !strings.Contains(string(reply), `"echo":"after"`) {
		t.Fatalf("reply %s", reply)
	}
}

// With the probe off (STR_BROKER_PROBE_INTERVAL_MS=0) the worker neither
// subscribes to the probe topic nor reports anything but the transport.
func TestProbeOff(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.ProbeInterval = 0 })
	if h.srv.probe != nil {
		t.Fatal("probe built with interval 0")
	}
	h.start()
	if code, broker := readyzBroker(t, h.srv); code != 200 || broker != "connected" {
		t.Fatalf("/readyz %d %q", code, broker)
	}
}

// The reproduction, against the dev broker made to behave as the
// reference's (ReferenceSessions): worker B starts under worker A's id
// while A is still connected (a restart within a second), then A goes.
// The broker forgets B's session as A's connections end; B still says
// "connected". With the probe B notices, re-establishes its session, and
// serves requests again. (Without it, B never receives a request again:
// run this test with probeConfig replaced by ProbeInterval = 0.)
func TestProbeRecoversFromReferenceBrokerDrop(t *testing.T) {
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	srv := broker.NewServer(broker.Options{Anonymous: true, ReferenceSessions: true, Logger: log})
	must(t, srv.Listen("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close() })
	port := srv.Addr().(*net.TCPAddr).Port
	client := func(id, queue string) *devbroker.Client {
		c, err := devbroker.NewClient(devbroker.ClientOptions{Host: "127.0.0.1", Port: port, ClientID: id, QueueName: queue,
			RetryDelay: 50 * time.Millisecond, ReceiveTimeout: 100 * time.Millisecond, Logger: log})
		must(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	type worker struct {
		h    *harness
		tr   *devbroker.Client
		stop func() error // ends Run and returns its error; once
	}
	start := func() *worker {
		h := newHarness(t, probeConfig)
		w := &worker{h: h, tr: client(h.cfg.WorkerID, h.cfg.QueueName())}
		var err error
		h.srv, err = New(Options{Config: h.cfg, Transport: w.tr, Sandboxes: launchertest.Sandboxes{}, Store: h.store, Logger: log})
		must(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- h.srv.Run(ctx) }()
		w.stop = sync.OnceValue(func() error { cancel(); return <-done })
		t.Cleanup(func() { w.stop() })
		waitFor(t, "worker ready", h.srv.Ready)
		return w
	}

	a := start()
	b := start() // same SAM_WORKER_ID: takes A's session over
	if a.h.cfg.WorkerID != b.h.cfg.WorkerID {
		t.Fatalf("worker ids %q and %q", a.h.cfg.WorkerID, b.h.cfg.WorkerID)
	}
	// A stops; the end of its connections makes the broker forget B.
	must(t, a.stop())
	a.tr.Close()
	waitFor(t, "B to find its session deaf", func() bool {
		return metricValue(t, b.h, "str_worker_broker_reestablished_total") >= 1
	})
	waitFor(t, "B ready again", b.h.srv.Ready)

	// An agent's requests reach B again. A request can still be lost if
	// the broker forgets B's new session once more (its old connections'
	// ends are seen late): B then re-establishes again, and the agent
	// asks again, as a caller whose request timed out would.
	agent := client("agent", "")
	base := b.h.cfg.Base()
	must(t, agent.Connect(context.Background(), []string{base + "/sam_remote_tool/response/>"}))
	replies := make(chan string, 100)
	go func() {
		for {
			d, err := agent.Receive(context.Background())
			if err != nil {
				return
			}
			replies <- string(d.Payload)
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		id := nextID()
		payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": MethodInvoke, "params": map[string]any{
			"task_id": "task-" + id, "tool_name": "echo", "app_name": "app", "user_id": "u1", "session_id": "s1",
			"args": map[string]any{"message": "back"}}})
		must(t, agent.Publish(context.Background(), transport.Message{Topic: base + "/sam_remote_tool/invoke/echo", Payload: payload,
			UserProperties: map[string]string{PropReplyTo: base + "/sam_remote_tool/response/app/" + id}}))
		select {
		case r := <-replies:
			if !strings.Contains(r, `"echo":"back"`) {
				t.Fatalf("reply %s", r)
			}
			return
		case <-time.After(2 * time.Second): // a poll: the verdict is the deadline below
		}
		if time.Now().After(deadline) {
			t.Fatal("worker B never answered a request after worker A left: its broker session stayed deaf")
		}
	}
}
