package devbroker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker/transport"
)

func portOf(t *testing.T, a net.Addr) int {
	t.Helper()
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		t.Fatalf("address %v is not TCP", a)
	}
	return ta.Port
}

// newClient returns an unconnected client for port with short test delays.
func newClient(t *testing.T, port int, opts ClientOptions) *Client {
	t.Helper()
	opts.Host = "127.0.0.1"
	opts.Port = port
	if opts.RetryDelay == 0 {
		opts.RetryDelay = 20 * time.Millisecond
	}
	if opts.ReceiveTimeout == 0 {
		opts.ReceiveTimeout = 100 * time.Millisecond
	}
	if opts.CommandTimeout == 0 {
		opts.CommandTimeout = 3 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t).With("test_client", opts.ClientID)
	}
	c, err := NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func connectClient(t *testing.T, s *broker.Server, opts ClientOptions, subs ...string) *Client {
	t.Helper()
	c := newClient(t, portOf(t, s.Addr()), opts)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Connect(ctx, subs); err != nil {
		t.Fatalf("connect %s: %v", opts.ClientID, err)
	}
	return c
}

func receive(t *testing.T, c *Client) *transport.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	d, err := c.Receive(ctx)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return d
}

func publish(t *testing.T, c *Client, topic, payload string, props map[string]string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Publish(ctx, transport.Message{Topic: topic, Payload: []byte(payload), UserProperties: props}); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}

func TestClientRoundTrip(t *testing.T) {
	s := startServer(t, broker.Options{})
	worker := connectClient(t, s, ClientOptions{ClientID: "worker", QueueName: "q/worker"}, "ns/invoke/echo")
	agent := connectClient(t, s, ClientOptions{ClientID: "agent"}, "ns/response/agent/>")
	if worker.State() != transport.Connected {
		t.Fatalf("state %v after Connect", worker.State())
	}

	publish(t, agent, "ns/invoke/echo", `{"jsonrpc": "2.0", "id": "r1"}`,
		map[string]string{"replyTo": "ns/response/agent/c1", "statusTo": "ns/status/agent/c1"})
	d := receive(t, worker)
	if d.Topic != "ns/invoke/echo" || string(d.Payload) != `{"jsonrpc":"2.0","id":"r1"}` ||
		d.UserProperties["replyTo"] != "ns/response/agent/c1" || d.UserProperties["statusTo"] != "ns/status/agent/c1" ||
		len(d.UserProperties) != 2 {
		t.Fatalf("worker got %q %q %v", d.Topic, d.Payload, d.UserProperties)
	}
	if d.Ack() != nil || d.Nack(errors.New("x")) != nil {
		t.Fatal("Ack/Nack must be no-ops")
	}

	// A payload that is not JSON travels as a JSON string and comes back
	// as the same bytes.
	publish(t, worker, d.UserProperties["replyTo"], "plain <text> \"quoted\"", nil)
	r := receive(t, agent)
	if r.Topic != "ns/response/agent/c1" || string(r.Payload) != "plain <text> \"quoted\"" || len(r.UserProperties) != 0 {
		t.Fatalf("agent got %q %q %v", r.Topic, r.Payload, r.UserProperties)
	}
}

// TestClientWireForms checks what the client puts on the wire and how it
// reads what Python clients send: string payloads, numeric properties.
func TestClientWireForms(t *testing.T) {
	s := startServer(t, broker.Options{})
	c := connectClient(t, s, ClientOptions{ClientID: "go"}, "in/>")
	py := connectRaw(t, s, "python", "", "out/>")

	publish(t, c, "out/1", "not json", map[string]string{"k": "v"})
	publish(t, c, "out/2", `[1, 2]`, nil)
	publish(t, c, "out/3", ``, nil)
	for _, want := range []struct {
		payload any
		props   map[string]any
	}{
		{"not json", map[string]any{"k": "v"}},
		{[]any{json.Number("1"), json.Number("2")}, map[string]any{}},
		{"", map[string]any{}},
	} {
		r := py.Do(`{"cmd": "RECEIVE", "timeout_ms": 2000}`)
		m, _ := r["message"].(map[string]any)
		same(t, "payload on the wire", map[string]any{"payload": m["payload"], "user_properties": m["user_properties"]},
			map[string]any{"payload": want.payload, "user_properties": want.props})
	}

	py.Send(`{"cmd": "PUBLISH", "topic": "in/1", "payload": "a \"string\" payload", "user_properties": {"timestamp": 1700000000123, "ok": true, "ratio": 0.5, "none": null, "obj": {"a": [1, 2]}, "s": "x"}}`)
	if r := py.Read(); r["status"] != "OK" {
		t.Fatal(r)
	}
	d := receive(t, c)
	if string(d.Payload) != `a "string" payload` {
		t.Fatalf("string payload handed as %q", d.Payload)
	}
	wantProps := map[string]string{"timestamp": "1700000000123", "ok": "true", "ratio": "0.5", "none": "null", "obj": `{"a":[1,2]}`, "s": "x"}
	if fmt.Sprint(d.UserProperties) != fmt.Sprint(wantProps) {
		t.Fatalf("properties %v, want %v", d.UserProperties, wantProps)
	}
	// An object payload is handed over as its JSON text: key order and
	// characters as sent, whitespace compacted.
	if r := py.Do(`{"cmd": "PUBLISH", "topic": "in/2", "payload": {"b": 2, "a": "<&>\u00e9"}}`); r["status"] != "OK" {
		t.Fatal(r)
	}
	if d := receive(t, c); string(d.Payload) != `{"b":2,"a":"<&>\u00e9"}` {
		t.Fatalf("object payload handed as %q", d.Payload)
	}
}

// TestClientPublisherIdentity: with the default PublisherID the publishing
// connection is another client id, so a client subscribed to a topic it
// publishes gets its message back (as with the reference broker); with
// PublisherID == ClientID str's broker refuses the publishing connection
// (one connection per client id).
func TestClientPublisherIdentity(t *testing.T) {
	s := startServer(t, broker.Options{})
	other := connectRaw(t, s, "other", "")

	distinct := connectClient(t, s, ClientOptions{ClientID: "d"}, "echo/d")
	publish(t, distinct, "echo/d", `"mine"`, nil)
	if d := receive(t, distinct); string(d.Payload) != "mine" {
		t.Fatalf("distinct publisher id: got %q", d.Payload)
	}

	other.Publish("echo/d", "marker")
	if d := receive(t, distinct); string(d.Payload) != "marker" {
		t.Fatalf("distinct publisher id: got %q", d.Payload)
	}

	shared := newClient(t, portOf(t, s.Addr()), ClientOptions{ClientID: "s", PublisherID: "s", Retries: 1})
	err := shared.Connect(context.Background(), []string{"echo/s"})
	var be *BrokerError
	if !errors.As(err, &be) || be.Code != broker.CodeNotConnected || !strings.Contains(be.Message, "already connected") {
		t.Fatalf("PublisherID == ClientID: Connect = %v, want the publishing CONNECT refused", err)
	}
}

func TestClientSubscribeUnsubscribe(t *testing.T) {
	s := startServer(t, broker.Options{})
	c := connectClient(t, s, ClientOptions{ClientID: "c"}, "m")
	p := connectRaw(t, s, "p", "")
	ctx := context.Background()

	if err := c.Subscribe(ctx, "x/*"); err != nil {
		t.Fatal(err)
	}
	p.Publish("x/1", "one")
	if d := receive(t, c); string(d.Payload) != "one" || d.Topic != "x/1" {
		t.Fatalf("got %q on %s", d.Payload, d.Topic)
	}
	if err := c.Unsubscribe(ctx, "x/*"); err != nil {
		t.Fatal(err)
	}
	p.Publish("x/2", "two")
	p.Publish("m", "marker")
	if d := receive(t, c); string(d.Payload) != "marker" {
		t.Fatalf("got %q, want the marker (x/* was unsubscribed)", d.Payload)
	}
	if err := c.Subscribe(ctx, ""); err == nil {
		t.Fatal("empty pattern accepted")
	}
}

func TestClientQueueGroup(t *testing.T) {
	s := startServer(t, broker.Options{})
	pub := connectClient(t, s, ClientOptions{ClientID: "agent"})
	var members []*Client
	for i := range 3 {
		members = append(members, connectClient(t, s, ClientOptions{ClientID: fmt.Sprintf("w%d", i), QueueName: "pool"}, "jobs/>"))
	}
	unique := []*Client{
		connectClient(t, s, ClientOptions{ClientID: "u1", QueueName: "u1"}, "jobs/>"),
		connectClient(t, s, ClientOptions{ClientID: "u2"}, "jobs/*"),
	}
	for i := range 30 {
		publish(t, pub, "jobs/run", fmt.Sprint(i), nil)
	}
	// The members share the group's queue, each taking what it asks for
	// (pull): together they get every message exactly once.
	got := make(chan string, 64)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, m := range members {
		go func() {
			for {
				d, err := m.Receive(ctx)
				if err != nil {
					return
				}
				got <- string(d.Payload)
			}
		}()
	}
	seen := make(map[string]bool)
	for len(seen) < 30 {
		select {
		case p := <-got:
			if seen[p] {
				t.Fatalf("message %s delivered twice to the group", p)
			}
			seen[p] = true
		case <-time.After(10 * time.Second):
			t.Fatalf("group got %d distinct messages, want 30", len(seen))
		}
	}
	cancel()
	for _, u := range unique {
		for i := range 30 {
			if p := string(receive(t, u).Payload); p != fmt.Sprint(i) {
				t.Fatalf("unique-queue client got %s, want %d", p, i)
			}
		}
	}
}

// TestClientReconnect stops the broker, changes subscriptions while the
// client is cut off, starts a new broker on the same port and checks that
// the client comes back by itself with the right subscription set and that
// a Publish made during the outage completes.
func TestClientReconnect(t *testing.T) {
	s1 := startServer(t, broker.Options{})
	port := portOf(t, s1.Addr())
	c := connectClient(t, s1, ClientOptions{ClientID: "w", QueueName: "q/w"}, "a")
	ctx := context.Background()
	if err := c.Subscribe(ctx, "b"); err != nil { // added after the first CONNECT
		t.Fatal(err)
	}
	if err := c.Subscribe(ctx, "c"); err != nil {
		t.Fatal(err)
	}

	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "client notices the drop", func() bool { return c.State() == transport.Disconnected })
	if err := c.Subscribe(ctx, "d"); err != nil { // while disconnected
		t.Fatal(err)
	}
	if err := c.Unsubscribe(ctx, "c"); err != nil { // while disconnected
		t.Fatal(err)
	}
	published := make(chan error, 1)
	go func() {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		published <- c.Publish(pctx, transport.Message{Topic: "during/outage", Payload: []byte(`{}`)})
	}()

	s2 := broker.NewServer(broker.Options{Logger: testLogger(t), Anonymous: true})
	if err := s2.Listen(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	waitFor(t, "client reconnects", func() bool { return c.State() == transport.Connected })
	select {
	case err := <-published:
		if err != nil {
			t.Fatalf("publish during the outage: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publish during the outage did not return")
	}

	p := connectRaw(t, s2, "p", "")
	for _, topic := range []string{"a", "b", "c", "d"} {
		p.Publish(topic, "on "+topic)
	}
	for _, want := range []string{"a", "b", "d"} { // c was unsubscribed
		if d := receive(t, c); d.Topic != want {
			t.Fatalf("after reconnect got %q on %s, want topic %s", d.Payload, d.Topic, want)
		}
	}
	publish(t, c, "still/works", `{}`, nil)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := portOf(t, ln.Addr())
	ln.Close()
	return port
}

func TestClientConnectRetriesThenFails(t *testing.T) {
	c := newClient(t, freePort(t), ClientOptions{ClientID: "w", Retries: 2, RetryDelay: 5 * time.Millisecond})
	err := c.Connect(context.Background(), []string{"a"})
	if err == nil || !strings.Contains(err.Error(), "after 3 attempt(s)") {
		t.Fatalf("Connect with nothing listening: %v, want failure after 3 attempts", err)
	}
	if c.State() != transport.Disconnected {
		t.Fatal("state after failed Connect")
	}
	if err := c.Publish(context.Background(), transport.Message{Topic: "x"}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("publish after failed Connect: %v", err)
	}
}

func TestClientConnectHonoursContext(t *testing.T) {
	c := newClient(t, freePort(t), ClientOptions{ClientID: "w", RetryDelay: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Connect(ctx, nil) }()
	time.Sleep(30 * time.Millisecond) // a few failed attempts
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Connect after cancel: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Connect ignored its context")
	}
}

// TestClientConnectWaitsForBroker: with Retries 0 Connect keeps trying
// until the broker appears (a worker may start before the broker).
func TestClientConnectWaitsForBroker(t *testing.T) {
	port := freePort(t)
	c := newClient(t, port, ClientOptions{ClientID: "w"})
	errc := make(chan error, 1)
	go func() { errc <- c.Connect(context.Background(), []string{"t"}) }()
	time.Sleep(50 * time.Millisecond)
	s := broker.NewServer(broker.Options{Logger: testLogger(t), Anonymous: true})
	if err := s.Listen(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Connect did not succeed once the broker was up")
	}
	connectRaw(t, s, "p", "").Publish("t", "hello")
	if d := receive(t, c); string(d.Payload) != "hello" {
		t.Fatalf("got %q", d.Payload)
	}
}

func TestClientClose(t *testing.T) {
	s := startServer(t, broker.Options{})
	c := connectClient(t, s, ClientOptions{ClientID: "w"}, "t")
	errc := make(chan error, 1)
	go func() { _, err := c.Receive(context.Background()); errc <- err }()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("Receive after Close: %v", err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Receive did not return after Close")
	}
	if err := c.Publish(context.Background(), transport.Message{Topic: "t"}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
	if err := c.Subscribe(context.Background(), "u"); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("Subscribe after Close: %v", err)
	}
	if c.State() != transport.Disconnected {
		t.Fatal("state after Close")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The broker forgets both connections' clients.
	waitFor(t, "broker forgets w and w-pub", func() bool { return !s.Connected("w") && !s.Connected("w-pub") })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	c2 := connectClient(t, s, ClientOptions{ClientID: "w2"})
	if _, err := c2.Receive(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive with an expiring context: %v", err)
	}
}

func TestNewClientValidation(t *testing.T) {
	_, err := NewClient(ClientOptions{Port: 70000, Retries: -1, RetryDelay: -time.Second})
	if err == nil {
		t.Fatal("invalid options accepted")
	}
	for _, want := range []string{"host is empty", "port 70000", "client id is empty", "retries -1", "RetryDelay"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	c, err := NewClient(ClientOptions{Host: "h", ClientID: "w"})
	if err != nil {
		t.Fatal(err)
	}
	if c.addr != "h:55555" || c.opts.PublisherID != "w-pub" || c.opts.RetryDelay != 3*time.Second {
		t.Fatalf("defaults: addr %s publisher %s delay %v", c.addr, c.opts.PublisherID, c.opts.RetryDelay)
	}
}

// TestClientConnectLinesAndCatchUp plays the broker by hand to check the
// exact lines the client sends, and that subscription changes made while
// the CONNECT is in flight are sent right after it.
func TestClientConnectLinesAndCatchUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := newClient(t, portOf(t, ln.Addr()), ClientOptions{ClientID: "w", QueueName: "q/w"})
	connected := make(chan error, 1)
	go func() { connected <- c.Connect(context.Background(), []string{"a", "a", "x/>"}) }()

	accept := func() *raw {
		t.Helper()
		ln.(*net.TCPListener).SetDeadline(time.Now().Add(3 * time.Second))
		nc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return &raw{T: t, NC: nc, R: bufio.NewReader(nc)}
	}
	expectLine := func(r *raw, want string) {
		t.Helper()
		r.NC.SetReadDeadline(time.Now().Add(3 * time.Second))
		got, err := r.R.ReadString('\n')
		if err != nil || got != want+"\n" {
			t.Fatalf("client sent %q (err %v), want %q", got, err, want)
		}
	}

	recv := accept()
	expectLine(recv, `{"cmd":"CONNECT","client_id":"w","queue_name":"q/w","subscriptions":["a","x/>"]}`)
	// The CONNECT is unanswered: these only change the desired set.
	if err := c.Subscribe(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	if err := c.Unsubscribe(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	recv.Send(`{"status": "OK", "client_id": "w"}`)

	pub := accept()
	expectLine(pub, `{"cmd":"CONNECT","client_id":"w-pub","queue_name":"","subscriptions":[]}`)
	pub.Send(`{"status": "OK", "client_id": "w-pub"}`)

	expectLine(recv, `{"cmd":"SUBSCRIBE","topic_pattern":"b"}`)
	recv.Send(`{"status": "OK"}`)
	expectLine(recv, `{"cmd":"UNSUBSCRIBE","topic_pattern":"a"}`)
	recv.Send(`{"status": "OK"}`)
	select {
	case err := <-connected:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Connect did not return")
	}
	expectLine(recv, `{"cmd":"RECEIVE","timeout_ms":100}`)
	recv.Send(`{"status": "OK", "message": {"message_id": "m1", "topic": "x/y", "payload": "hi", "user_properties": {"n": 5}}}`)
	if d := receive(t, c); d.Topic != "x/y" || string(d.Payload) != "hi" || d.UserProperties["n"] != "5" {
		t.Fatalf("got %q %q %v", d.Topic, d.Payload, d.UserProperties)
	}

	errc := make(chan error, 1)
	go func() {
		errc <- c.Publish(context.Background(), transport.Message{Topic: "r/1", Payload: []byte(`{"ok": true}`), UserProperties: map[string]string{"k": "v"}, ID: "p-1"})
	}()
	expectLine(pub, `{"cmd":"PUBLISH","topic":"r/1","payload":{"ok":true},"user_properties":{"k":"v"},"publish_id":"p-1"}`)
	pub.Send(`{"status": "ERROR", "error_code": "INTERNAL_ERROR", "error_message": "boom"}`)
	var be *BrokerError
	if err := <-errc; !errors.As(err, &be) || be.Code != broker.CodeInternalError || be.Message != "boom" {
		t.Fatalf("publish refused by the broker: %v", err)
	}
}

// A client whose session the broker forgot (ReferenceSessions: a second
// client took its id over and then left) still reports Connected, and its
// PublishToSelf no longer comes back; after Reestablish (repeated while
// the broker may still be finishing the old connections, as the worker's
// probe does) its own publish comes back again.
func TestClientPublishToSelfAndReestablish(t *testing.T) {
	s := startServer(t, broker.Options{ReferenceSessions: true})
	probe := func(c *Client, n int) string {
		topic := fmt.Sprintf("probe/w/%d", n)
		publish(t, c, topic, `"p"`, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond) // a poll, not a verdict
		defer cancel()
		for {
			d, err := c.Receive(ctx)
			if err != nil {
				return ""
			}
			if d.Topic == topic {
				return d.Topic
			}
		}
	}
	w := connectClient(t, s, ClientOptions{ClientID: "w"}, "probe/w/*")
	ctx := context.Background()
	if err := w.PublishToSelf(ctx, transport.Message{Topic: "probe/w/0", Payload: []byte(`"p"`)}); err != nil {
		t.Fatal(err)
	}
	if d := receive(t, w); d.Topic != "probe/w/0" {
		t.Fatalf("own publish: got %s", d.Topic)
	}
	// A second client under the same ids takes the session over, then
	// leaves: the broker forgets "w" and "w-pub" for good.
	intruder := connectClient(t, s, ClientOptions{ClientID: "w"}, "probe/w/*")
	conns := s.Stats().Conns
	intruder.Close()
	waitFor(t, "the broker to see the intruder's connections end", func() bool { return s.Stats().Conns <= conns-2 })
	if w.State() != transport.Connected {
		t.Fatalf("state %v: the failure is that it still looks connected", w.State())
	}
	if s.Connected("w") {
		t.Fatal(`"w" still registered: the reproduction did not happen`)
	}
	w.Reestablish(errors.New("test: probe lost"))
	deadline := time.Now().Add(20 * time.Second)
	for n := 1; probe(w, n) == ""; n++ {
		if time.Now().After(deadline) {
			t.Fatal("own publishes never came back after Reestablish")
		}
		w.Reestablish(errors.New("test: probe lost again"))
	}
	if !s.Connected("w") {
		t.Fatal(`"w" not registered after Reestablish`)
	}

	same := newClient(t, portOf(t, s.Addr()), ClientOptions{ClientID: "x", PublisherID: "x"})
	if err := same.PublishToSelf(ctx, transport.Message{Topic: "t"}); !errors.Is(err, transport.ErrNoSelfDelivery) {
		t.Fatalf("PublisherID == ClientID: %v, want ErrNoSelfDelivery", err)
	}
}

// TestClientCloseGivesBack: a message the client fetched but never handed
// to Receive is not lost at Close: it goes back to the broker, and the
// queue group's other member gets it, with its user properties.
func TestClientCloseGivesBack(t *testing.T) {
	s := startServer(t, broker.Options{})
	pub := connectClient(t, s, ClientOptions{ClientID: "agent"})
	leaving := connectClient(t, s, ClientOptions{ClientID: "w-leaving", QueueName: "pool"}, "jobs/>")
	publish(t, pub, "jobs/run", `{"n":1}`, map[string]string{"replyTo": "r/1"})
	// The leaving member's receive loop fetches it (nobody calls Receive).
	waitFor(t, "the message fetched by w-leaving", func() bool { return s.GroupQueued("pool") == 0 })
	staying := connectClient(t, s, ClientOptions{ClientID: "w-staying", QueueName: "pool"}, "jobs/>")
	if err := leaving.Close(); err != nil {
		t.Fatal(err)
	}
	d := receive(t, staying)
	if d.Topic != "jobs/run" || string(d.Payload) != `{"n":1}` || d.UserProperties["replyTo"] != "r/1" {
		t.Fatalf("given back: %s %s %v", d.Topic, d.Payload, d.UserProperties)
	}
}

// TestClientKeepAliveOutlivesIdleTimeout: the client's publishing
// connection, which carries nothing while there is nothing to publish, is
// kept alive across several of the server's idle timeouts, and the
// session is never re-established.
func TestClientKeepAliveOutlivesIdleTimeout(t *testing.T) {
	const idle = 2 * time.Second
	s := startServer(t, broker.Options{IdleTimeout: idle})
	c := connectClient(t, s, ClientOptions{ClientID: "w", KeepAlive: 20 * time.Millisecond, ReceiveTimeout: 20 * time.Millisecond}, "t")
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	start := time.Now()
	for time.Since(start) < 3*idle {
		if n := s.Stats().IdleTimeout; n != 0 {
			t.Fatalf("idle timeout closed %d connection(s) of a keep-alive client", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.mu.Lock()
	same := c.sess == sess
	c.mu.Unlock()
	if !same || s.Stats().IdleTimeout != 0 {
		t.Fatal("the client's session was re-established: a connection was closed as idle")
	}
}

// TestClientTokenFile: the client reads TokenFile before every connection
// attempt, so it gets in once the file appears and follows a restarted
// broker's new token; without it, Connect reports the refusal.
func TestClientTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "str", "broker.token")
	tok := broker.NewToken()
	s1 := startServer(t, broker.Options{Token: tok})
	port := portOf(t, s1.Addr())

	// No file yet: refused, with the broker's message.
	c0 := newClient(t, port, ClientOptions{ClientID: "early", TokenFile: path, Retries: 1})
	if err := c0.Connect(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "missing or wrong token") {
		t.Fatalf("Connect without the file: %v", err)
	}

	if err := broker.WriteTokenFile(path, tok); err != nil {
		t.Fatal(err)
	}
	c := connectClient(t, s1, ClientOptions{ClientID: "w", TokenFile: path}, "a")

	// Restart with a new token in the file: the client follows.
	if err := s1.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "client notices the drop", func() bool { return c.State() == transport.Disconnected })
	tok2 := broker.NewToken()
	if err := broker.WriteTokenFile(path, tok2); err != nil {
		t.Fatal(err)
	}
	s2 := broker.NewServer(broker.Options{Token: tok2, Logger: testLogger(t)})
	if err := s2.Listen(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s2.Close() })
	waitFor(t, "client reconnects with the new token", func() bool { return c.State() == transport.Connected })
	p := connectClient(t, s2, ClientOptions{ClientID: "p", Token: tok2})
	publish(t, p, "a", "after restart", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if d, err := c.Receive(ctx); err != nil || string(d.Payload) != "after restart" {
		t.Fatalf("after restart: %v %v", d, err)
	}

	if _, err := NewClient(ClientOptions{Host: "h", ClientID: "x", Token: "a", TokenFile: "b"}); err == nil {
		t.Fatal("NewClient accepted both Token and TokenFile")
	}
}

// TestClientPublishRefusal: the broker's ERROR to a PUBLISH (here: a line
// over its limit) is a refusal (transport.ErrRefused, the BrokerError
// kept), and MaxMessageBytes is the line limit.
func TestClientPublishRefusal(t *testing.T) {
	const limit = 64 << 10
	s := startServer(t, broker.Options{MaxLineBytes: limit})
	c := connectClient(t, s, ClientOptions{ClientID: "w", MaxLineBytes: limit})
	if got := c.MaxMessageBytes(); got != limit {
		t.Fatalf("MaxMessageBytes = %d, want %d", got, limit)
	}
	publish(t, c, "t", strings.Repeat("a", limit/2), nil)
	err := c.Publish(context.Background(), transport.Message{Topic: "t", Payload: []byte(strings.Repeat("a", limit))})
	var be *BrokerError
	if !errors.Is(err, transport.ErrRefused) || !errors.As(err, &be) {
		t.Fatalf("a PUBLISH over the line limit: %v, want a refusal carrying the BrokerError", err)
	}
	// The session is intact: the next publish goes through.
	publish(t, c, "t", "after", nil)
}

// TestClientPublishID: a message published again under the same
// transport.Message.ID (a reply's retry after an answer lost to a cut
// connection) reaches the subscriber once, also with an ID longer than the
// broker's publish_id bound (the client hashes it); messages without an
// ID each get their own.
func TestClientPublishID(t *testing.T) {
	s := startServer(t, broker.Options{})
	sub := connectClient(t, s, ClientOptions{ClientID: "agent"}, "r/>")
	w := connectClient(t, s, ClientOptions{ClientID: "worker"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	long := strings.Repeat("k", broker.MaxPublishIDBytes+50)
	for _, m := range []transport.Message{
		{Topic: "r/1", Payload: []byte(`{"n":"once"}`), ID: "reply-1"},
		{Topic: "r/1", Payload: []byte(`{"n":"once"}`), ID: "reply-1"},
		{Topic: "r/2", Payload: []byte(`{"n":"long"}`), ID: long},
		{Topic: "r/2", Payload: []byte(`{"n":"long"}`), ID: long},
		{Topic: "r/3", Payload: []byte(`{"n":"plain"}`)},
		{Topic: "r/3", Payload: []byte(`{"n":"plain"}`)},
	} {
		if err := w.Publish(ctx, m); err != nil {
			t.Fatalf("publish %s: %v", m.Topic, err)
		}
	}
	for _, want := range []string{`{"n":"once"}`, `{"n":"long"}`, `{"n":"plain"}`, `{"n":"plain"}`} {
		if d := receive(t, sub); string(d.Payload) != want {
			t.Fatalf("got %s on %s, want %s", d.Payload, d.Topic, want)
		}
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer rcancel()
	if d, err := sub.Receive(rctx); err == nil {
		t.Fatalf("a duplicate was routed: %s on %s", d.Payload, d.Topic)
	}
}

// publishLine is broker.EncodeLine's line for every payload, topic and
// property set (the payload compacted, nothing escaped).
func TestPublishLineIsEncodeLine(t *testing.T) {
	payloads := []string{`{}`, `{"a": [1, 2, {"b": "x y"}], "c": null}`, "{\n \"html\": \"<a href='x'>&</a>\", \"ls\": \"\u2028\u2029\"}",
		`"a string"`, `123`, `{"esc": "\"payload\":0 \\u0041"}`, ` [ true , false ] `, `{"a":"x y","b":["\"",{"c":" "}]}`, `{"a":"\\"}`}
	topics := []string{"a/b/c", `we"ird/"payload":0/top`, "é/<&>"}
	for _, p := range payloads {
		for _, topic := range topics {
			req := publishRequest{Cmd: broker.CmdPublish, Topic: topic, Payload: json.RawMessage(p),
				UserProperties: map[string]string{"k": `"payload":0`}, PublishID: "id-1"}
			want, err := broker.EncodeLine(req)
			if err != nil {
				t.Fatal(err)
			}
			pieces, err := publishLine(req)
			if err != nil {
				t.Fatal(err)
			}
			if got := bytes.Join(pieces, nil); string(got) != string(want) {
				t.Errorf("payload %q topic %q:\n got %s\nwant %s", p, topic, got, want)
			}
			// A compact payload is sent as it is, not copied.
			if compact([]byte(p)) && &pieces[1][0] != &req.Payload[0] {
				t.Errorf("payload %q: copied, though compact", p)
			}
		}
	}
}
