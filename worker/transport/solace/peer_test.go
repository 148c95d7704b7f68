package solace_test

// These tests run the Solace C library's peer-to-peer mode: a service with
// host "listen:127.0.0.1:PORT" (the "peer", playing the agent) accepts the
// worker's transport connecting with "tcp://127.0.0.1:PORT". They exchange
// real SMF direct messages; no broker runs. Guaranteed messaging does not
// exist in this mode (see broker_test.go).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	messaging "solace.dev/go/messaging"
	sol "solace.dev/go/messaging/pkg/solace"
	"solace.dev/go/messaging/pkg/solace/config"
	"solace.dev/go/messaging/pkg/solace/message"
	"solace.dev/go/messaging/pkg/solace/resource"

	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/solace"
)

// bound is the most any single step may take before the test gives up. It
// is a liveness bound (the test fails instead of hanging), not a latency
// assertion.
const bound = 20 * time.Second

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pick a free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// peer is the agent side: a listening service with a direct publisher and
// a direct receiver.
type peer struct {
	t         *testing.T
	svc       sol.MessagingService
	pub       sol.DirectMessagePublisher
	rx        sol.DirectMessageReceiver
	connected <-chan error
}

// listen starts a peer on port; its Connect completes only when the other
// side has connected, so waitConnected is called after the transport's
// Connect.
func listen(t *testing.T, port int) *peer {
	t.Helper()
	svc, err := messaging.NewMessagingServiceBuilder().FromConfigurationProvider(config.ServicePropertyMap{
		config.TransportLayerPropertyHost:                fmt.Sprintf("listen:127.0.0.1:%d", port),
		config.ServicePropertyVPNName:                    "default",
		config.AuthenticationPropertySchemeBasicUserName: "agent",
		config.AuthenticationPropertySchemeBasicPassword: "",
	}).Build()
	if err != nil {
		t.Fatalf("peer: build listening service on port %d: %v", port, err)
	}
	return &peer{t: t, svc: svc, connected: svc.ConnectAsync()}
}

// relisten starts a peer on port again, right after the previous one
// closed: the C library may fail the new listening session while the old
// one's teardown is still in progress ("condition variable destroyed
// while waiting for connection in progress", seen in CI), so a failed
// listener is closed and a new one started, until bound.
func relisten(t *testing.T, port int) *peer {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		p := listen(t, port)
		select {
		case err := <-p.connected:
			if err == nil {
				ok := make(chan error, 1)
				ok <- nil
				p.connected = ok
				return p
			}
			p.close()
			if time.Now().After(deadline) {
				t.Fatalf("peer: no listener on port %d connected within %v: %v", port, bound, err)
			}
			t.Logf("peer: listening again on port %d: %v", port, err)
			time.Sleep(100 * time.Millisecond)
		case <-time.After(bound):
			t.Fatalf("peer: no connection from the transport within %v", bound)
		}
	}
}

func (p *peer) waitConnected() {
	p.t.Helper()
	select {
	case err := <-p.connected:
		if err != nil {
			p.t.Fatalf("peer: listening service did not connect: %v", err)
		}
	case <-time.After(bound):
		p.t.Fatalf("peer: no connection from the transport within %v", bound)
	}
	pub, err := p.svc.CreateDirectMessagePublisherBuilder().OnBackPressureWait(16).Build()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := pub.Start(); err != nil {
		p.t.Fatalf("peer: start publisher: %v", err)
	}
	rx, err := p.svc.CreateDirectMessageReceiverBuilder().OnBackPressureDropOldest(64).Build()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := rx.Start(); err != nil {
		p.t.Fatalf("peer: start receiver: %v", err)
	}
	p.pub, p.rx = pub, rx
}

func (p *peer) publish(topic string, payload []byte, props map[string]string) {
	p.t.Helper()
	b := p.svc.MessageBuilder()
	for k, v := range props {
		b = b.WithProperty(config.MessageProperty(k), v)
	}
	m, err := b.BuildWithByteArrayPayload(payload)
	if err != nil {
		p.t.Fatal(err)
	}
	if err := p.pub.Publish(m, resource.TopicOf(topic)); err != nil {
		p.t.Fatalf("peer: publish to %q: %v", topic, err)
	}
}

// close disconnects the peer. Its receiver is not terminated first: with
// the other side gone, Terminate waits 10 s for unsubscribe confirmations;
// Disconnect ends the receiver and publisher with the service.
func (p *peer) close() {
	if p.svc.IsConnected() {
		if err := p.svc.Disconnect(); err != nil {
			p.t.Logf("peer: disconnect: %v", err)
		}
	}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// connectPair starts a peer and a direct-mode transport connected to it
// with subs.
func connectPair(t *testing.T, subs ...string) (*peer, *solace.Transport, int) {
	t.Helper()
	port := freePort(t)
	p := listen(t, port)
	tr, err := solace.New(solace.Config{
		Host:               fmt.Sprintf("tcp://127.0.0.1:%d", port),
		VPN:                "default",
		Username:           "worker",
		Mode:               solace.ModeDirect,
		ReconnectRetries:   -1,
		ReconnectInterval:  200 * time.Millisecond,
		BackPressureBuffer: 64,
	}, testLogger(t))
	if err != nil {
		t.Fatalf("transport: New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := tr.Connect(ctx, subs); err != nil {
		t.Fatalf("transport: Connect: %v", err)
	}
	p.waitConnected()
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Logf("transport: close: %v", err)
		}
		p.close()
	})
	return p, tr, port
}

func receive(t *testing.T, tr *solace.Transport) *transport.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatalf("transport: Receive: %v", err)
	}
	return d
}

// allBytes is a payload with every byte value, to prove no text encoding
// touches it.
func allBytes() []byte {
	b := []byte(`{"jsonrpc":"2.0","id":"é✓"}`)
	for i := range 256 {
		b = append(b, byte(i))
	}
	return b
}

// TestPeerModeCanary proves that the C library's peer mode works at all,
// with the library alone. If it fails, every other test here is moot: it
// fails loudly rather than skipping.
func TestPeerModeCanary(t *testing.T) {
	port := freePort(t)
	p := listen(t, port)
	defer p.close()
	// The listening side binds its port asynchronously after ConnectAsync,
	// so the first attempts may be refused; a failed Connect ends its
	// service, so each attempt builds a new one.
	var svc sol.MessagingService
	deadline := time.Now().Add(bound)
	for attempt := 1; ; attempt++ {
		s, err := messaging.NewMessagingServiceBuilder().FromConfigurationProvider(config.ServicePropertyMap{
			config.TransportLayerPropertyHost:                fmt.Sprintf("tcp://127.0.0.1:%d", port),
			config.ServicePropertyVPNName:                    "default",
			config.AuthenticationPropertySchemeBasicUserName: "canary",
			config.AuthenticationPropertySchemeBasicPassword: "",
		}).Build()
		if err != nil {
			t.Fatal(err)
		}
		err = s.Connect()
		if err == nil {
			t.Logf("canary: connected to the listening peer on attempt %d", attempt)
			svc = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CANARY: peer mode broken: tcp://127.0.0.1:%d could not connect to a listen: service for %v (%d attempts): %v", port, bound, attempt, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer func() { _ = svc.Disconnect() }()
	p.waitConnected()
	rx, err := svc.CreateDirectMessageReceiverBuilder().OnBackPressureDropLatest(8).
		WithSubscriptions(resource.TopicSubscriptionOf("canary/>")).Build()
	if err != nil {
		t.Fatal(err)
	}
	if err := rx.Start(); err != nil {
		t.Fatalf("CANARY: start receiver: %v", err)
	}
	defer func() { _ = rx.Terminate(time.Second) }()
	p.publish("canary/ping", []byte("ping"), map[string]string{"k": "v"})
	m, err := rx.ReceiveMessage(bound)
	if err != nil {
		t.Fatalf("CANARY: peer mode broken: no message crossed the peer connection: %v", err)
	}
	got, _ := m.GetPayloadAsBytes()
	if m.GetDestinationName() != "canary/ping" || string(got) != "ping" {
		t.Fatalf("CANARY: got topic %q payload %q, want canary/ping ping", m.GetDestinationName(), got)
	}
}

// TestInvokeStatusReply runs one exchange as the worker sees it: the agent
// publishes an invoke with the four user properties; the worker sends a
// status to statusTo and the reply to replyTo, each with user properties.
func TestInvokeStatusReply(t *testing.T) {
	base := "ns1/a2a/v1"
	invoke := base + "/sam_remote_tool/invoke/echo_tool"
	p, tr, _ := connectPair(t, invoke)
	if tr.State() != transport.Connected {
		t.Fatalf("State after Connect = %v, want connected", tr.State())
	}
	replyTo := base + "/sam_remote_tool/response/MyAgent/corr-1"
	statusTo := base + "/sam_remote_tool/status/MyAgent/corr-1"
	if err := p.rx.AddSubscription(resource.TopicSubscriptionOf(base + "/sam_remote_tool/*/MyAgent/>")); err != nil {
		t.Fatal(err)
	}

	// 1. agent → worker: exact properties, byte-exact payload.
	props := map[string]string{"replyTo": replyTo, "statusTo": statusTo, "clientId": "client-7", "userId": "user-42 ü"}
	payload := allBytes()
	p.publish(invoke, payload, props)
	d := receive(t, tr)
	if d.Topic != invoke {
		t.Errorf("topic = %q, want %q", d.Topic, invoke)
	}
	if !bytes.Equal(d.Payload, payload) {
		t.Errorf("payload differs:\n got %q\nwant %q", d.Payload, payload)
	}
	if !maps.Equal(d.UserProperties, props) {
		t.Errorf("user properties = %v, want exactly %v", d.UserProperties, props)
	}

	// 2. worker → agent: status then reply, properties as strings.
	ctx := context.Background()
	status := []byte(`{"jsonrpc":"2.0","method":"sam_remote_tool/status","params":{"task_id":"t","status_text":"half"}}`)
	reply := []byte(`{"jsonrpc":"2.0","id":"1","result":{"tool_result":{"text":"hi"}}}`)
	wprops := map[string]string{"timestamp": "1760000000000"}
	if err := tr.Publish(ctx, transport.Message{Topic: d.UserProperties["statusTo"], Payload: status, UserProperties: wprops}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(ctx, transport.Message{Topic: d.UserProperties["replyTo"], Payload: reply, UserProperties: wprops}); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(); err != nil {
		t.Errorf("direct Ack = %v, want no-op nil", err)
	}
	for _, want := range []struct {
		topic   string
		payload []byte
	}{{statusTo, status}, {replyTo, reply}} {
		m, err := p.rx.ReceiveMessage(bound)
		if err != nil {
			t.Fatalf("agent: waiting for %s: %v", want.topic, err)
		}
		got, _ := m.GetPayloadAsBytes()
		if m.GetDestinationName() != want.topic || !bytes.Equal(got, want.payload) {
			t.Errorf("agent got %q %q, want %q %q", m.GetDestinationName(), got, want.topic, want.payload)
		}
		if gp := stringProps(m); !maps.Equal(gp, wprops) {
			t.Errorf("agent got user properties %v, want %v", gp, wprops)
		}
	}

	// 3. reserved keys are refused rather than silently becoming headers.
	err := tr.Publish(ctx, transport.Message{Topic: replyTo, Payload: reply,
		UserProperties: map[string]string{"solace.messaging.message.priority": "9"}})
	if err == nil || !strings.Contains(err.Error(), "reserved prefix") {
		t.Errorf("publish with a solace.messaging.* property: err = %v, want a reserved-prefix error", err)
	}
}

func stringProps(m message.InboundMessage) map[string]string {
	out := map[string]string{}
	for k, v := range m.GetProperties() {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// syncUntil publishes a marker on a topic the transport is subscribed to and
// collects every topic received before it. Direct messages from one
// publisher over one connection arrive in order, so anything published
// before the marker that was going to arrive has arrived.
func syncUntil(t *testing.T, p *peer, tr *solace.Transport, marker string) []string {
	t.Helper()
	p.publish(marker, []byte("marker"), nil)
	var got []string
	for {
		d := receive(t, tr)
		if d.Topic == marker {
			return got
		}
		got = append(got, d.Topic)
	}
}

// TestRuntimeSubscriptions adds and removes subscriptions on a live
// session, as a manifest reload does.
func TestRuntimeSubscriptions(t *testing.T) {
	marker := "ns/sync"
	p, tr, _ := connectPair(t, marker)
	ctx := context.Background()
	a, b := "ns/a2a/v1/sam_remote_tool/invoke/tool_a", "ns/a2a/v1/sam_remote_tool/invoke/tool_b"

	// 1. not yet subscribed: nothing arrives.
	p.publish(a, []byte("1"), nil)
	if got := syncUntil(t, p, tr, marker); len(got) != 0 {
		t.Fatalf("before Subscribe received %v, want nothing", got)
	}
	// 2. subscribe both at runtime.
	for _, s := range []string{a, b} {
		if err := tr.Subscribe(ctx, s); err != nil {
			t.Fatalf("Subscribe(%q): %v", s, err)
		}
	}
	p.publish(a, []byte("2"), nil)
	p.publish(b, []byte("3"), nil)
	if got := syncUntil(t, p, tr, marker); !slices.Equal(got, []string{a, b}) {
		t.Fatalf("after Subscribe received %v, want [%s %s]", got, a, b)
	}
	// 3. remove a: it is no longer delivered, b still is.
	if err := tr.Unsubscribe(ctx, a); err != nil {
		t.Fatalf("Unsubscribe(%q): %v", a, err)
	}
	p.publish(a, []byte("4"), nil)
	p.publish(b, []byte("5"), nil)
	if got := syncUntil(t, p, tr, marker); !slices.Equal(got, []string{b}) {
		t.Fatalf("after Unsubscribe(%s) received %v, want only [%s]", a, got, b)
	}
}

// TestWildcards checks that the transport's subscriptions follow Solace's
// wildcard rules (spec §1): '*' is one non-empty level, or a level-final
// prefix; '>' is one or more trailing levels; elsewhere both are literal.
func TestWildcards(t *testing.T) {
	marker := "wc/sync"
	p, tr, _ := connectPair(t, marker, "w1/a/*/c", "w2/a/b*", "w3/a/>", "w4/a*b/c")
	cases := []struct {
		topic string
		match bool
	}{
		{"w1/a/b/c", true},
		{"w1/a/xyz/c", true},
		{"w1/a/c", false},     // '*' is exactly one level
		{"w1/a/b/d/c", false}, // not two
		{"w1/a/b/cd", false},
		{"w2/a/bcd", true}, // level-final prefix
		{"w2/a/b", true},   // the prefix matches zero more characters
		{"w2/a/b/c", false},
		{"w2/a/xb", false},
		{"w3/a/b", true},
		{"w3/a/b/c/d", true},
		{"w3/a", false}, // '>' needs at least one level
		{"w3/ab", false},
		{"w4/a*b/c", true},  // '*' inside a level is a literal character
		{"w4/axb/c", false}, // so it does not match other characters
	}
	var want []string
	for _, c := range cases {
		p.publish(c.topic, []byte(c.topic), nil)
		if c.match {
			want = append(want, c.topic)
		}
	}
	got := syncUntil(t, p, tr, marker)
	if !slices.Equal(got, want) {
		t.Errorf("wildcards: received %v\nwant %v", got, want)
		for _, c := range cases {
			if slices.Contains(got, c.topic) != c.match {
				t.Errorf("  %s: delivered=%v, want %v", c.topic, !c.match, c.match)
			}
		}
	}
}

// TestReconnect takes the peer away and brings a new one up on the same
// port: the transport reports disconnected, reconnects by itself,
// re-applies its subscriptions (including one added at runtime) and
// receives again.
func TestReconnect(t *testing.T) {
	topic := "ns/a2a/v1/sam_remote_tool/invoke/echo_tool"
	p, tr, port := connectPair(t, topic)
	late := "ns/a2a/v1/sam_remote_tool/invoke/late_tool"
	if err := tr.Subscribe(context.Background(), late); err != nil {
		t.Fatal(err)
	}
	p.publish(late, []byte("before"), nil)
	if d := receive(t, tr); string(d.Payload) != "before" {
		t.Fatalf("before the drop got %q", d.Payload)
	}

	// 1. the peer goes away.
	p.close()
	deadline := time.Now().Add(bound)
	for tr.State() != transport.Disconnected {
		if time.Now().After(deadline) {
			t.Fatalf("State stayed %v for %v after the peer went away", tr.State(), bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("state after the peer went away: %v", tr.State())

	// 2. the manifest changes while the connection is down: the library
	// will re-apply what it had, the transport fixes the difference.
	whileDown := "ns/a2a/v1/sam_remote_tool/invoke/while_down"
	if err := tr.Subscribe(context.Background(), whileDown); err != nil {
		t.Fatalf("Subscribe while down: %v", err)
	}
	if err := tr.Unsubscribe(context.Background(), late); err != nil {
		t.Fatalf("Unsubscribe while down: %v", err)
	}

	// 3. a new peer on the same port.
	p2 := relisten(t, port)
	defer p2.close()
	p2.waitConnected()
	deadline = time.Now().Add(bound)
	for tr.State() != transport.Connected {
		if time.Now().After(deadline) {
			t.Fatalf("State stayed %v for %v after the peer came back", tr.State(), bound)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// 4. served again: the initial subscription and the one added while
	// down; not the one removed while down. The reconciliation after a
	// reconnect runs in the background, so repeat until the delivered set
	// is exactly right (each round ends with a marker on the initial
	// topic).
	deadline = time.Now().Add(bound)
	for {
		p2.publish(late, []byte("late"), nil)
		p2.publish(whileDown, []byte("down"), nil)
		got := syncUntil(t, p2, tr, topic)
		t.Logf("after reconnect, round received %v", got)
		if slices.Equal(got, []string{whileDown}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after reconnect received %v, want only [%s] (%s was unsubscribed while down)", got, whileDown, late)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// 5. and replies still go out.
	if err := p2.rx.AddSubscription(resource.TopicSubscriptionOf("ns/reply")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(context.Background(), transport.Message{Topic: "ns/reply", Payload: []byte("r")}); err != nil {
		t.Fatalf("publish after reconnect: %v", err)
	}
	if m, err := p2.rx.ReceiveMessage(bound); err != nil {
		t.Fatalf("agent: reply after reconnect: %v", err)
	} else if b, _ := m.GetPayloadAsBytes(); string(b) != "r" {
		t.Fatalf("agent: reply after reconnect = %q", b)
	}
}

// TestFirstConnectRetried starts the transport before any peer listens:
// the first attempts fail (each ends its service), and Connect returns
// once a peer appears, on a new service.
func TestFirstConnectRetried(t *testing.T) {
	port := freePort(t)
	tr, err := solace.New(solace.Config{
		Host: fmt.Sprintf("tcp://127.0.0.1:%d", port), VPN: "default", Mode: solace.ModeDirect,
		ReconnectRetries: 3, ReconnectInterval: 100 * time.Millisecond, BackPressureBuffer: 8,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- tr.Connect(ctx, []string{"x/y"}) }()
	time.Sleep(500 * time.Millisecond) // let several attempts fail
	if tr.State() != transport.Disconnected {
		t.Fatalf("State before any peer = %v", tr.State())
	}
	select {
	case err := <-errc:
		t.Fatalf("Connect returned %v with no peer listening", err)
	default:
	}
	p := listen(t, port)
	defer p.close()
	if err := <-errc; err != nil {
		t.Fatalf("Connect after the peer appeared: %v", err)
	}
	p.waitConnected()
	p.publish("x/y", []byte("hello"), nil)
	if d := receive(t, tr); string(d.Payload) != "hello" {
		t.Fatalf("got %q", d.Payload)
	}
}

// TestConnectGivesUpWithContext: with nobody listening, Connect returns the
// context's error, naming the host.
func TestConnectGivesUpWithContext(t *testing.T) {
	port := freePort(t)
	tr, err := solace.New(solace.Config{
		Host: fmt.Sprintf("tcp://127.0.0.1:%d", port), VPN: "default", Mode: solace.ModeDirect,
		ReconnectInterval: 50 * time.Millisecond, BackPressureBuffer: 8,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	err = tr.Connect(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprint(port)) {
		t.Fatalf("Connect with nobody listening = %v, want an error naming port %d", err, port)
	}
}

// TestClose: Receive and Publish return ErrClosed after Close.
func TestClose(t *testing.T) {
	_, tr, _ := connectPair(t, "c/d")
	errc := make(chan error, 1)
	go func() {
		_, err := tr.Receive(context.Background())
		errc <- err
	}()
	if err := tr.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-errc; err != transport.ErrClosed {
		t.Errorf("Receive after Close = %v, want ErrClosed", err)
	}
	if err := tr.Publish(context.Background(), transport.Message{Topic: "c/d"}); err != transport.ErrClosed {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	if tr.State() != transport.Disconnected {
		t.Errorf("State after Close = %v", tr.State())
	}
}

// waitState polls State until it is want (bounded).
func waitState(t *testing.T, tr *solace.Transport, want transport.State) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for tr.State() != want {
		if time.Now().After(deadline) {
			t.Fatalf("State stayed %v for %v, want %v", tr.State(), bound, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRebuildAfterLibraryGivesUp: with ReconnectRetries=1 the library gives
// up while the peer is away (service interrupted for good); the transport
// builds new services until the peer is back, with the subscriptions that
// were changed while it was down: one added, one removed.
func TestRebuildAfterLibraryGivesUp(t *testing.T) {
	port := freePort(t)
	p := listen(t, port)
	tr, err := solace.New(solace.Config{
		Host: fmt.Sprintf("tcp://127.0.0.1:%d", port), VPN: "default", Mode: solace.ModeDirect,
		ReconnectRetries: 1, ReconnectInterval: 100 * time.Millisecond, BackPressureBuffer: 8,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	kept, dropped, added, marker := "r/kept", "r/dropped", "r/added", "r/sync"
	if err := tr.Connect(ctx, []string{kept, dropped, marker}); err != nil {
		t.Fatal(err)
	}
	p.waitConnected()

	// 1. the peer goes away for longer than 1 retry × 100 ms.
	p.close()
	waitState(t, tr, transport.Disconnected)
	time.Sleep(600 * time.Millisecond) // the library's one retry is long over
	// 2. the manifest changes while disconnected.
	if err := tr.Subscribe(ctx, added); err != nil {
		t.Fatalf("Subscribe while disconnected: %v", err)
	}
	if err := tr.Unsubscribe(ctx, dropped); err != nil {
		t.Fatalf("Unsubscribe while disconnected: %v", err)
	}
	// 3. the peer comes back; a new service connects.
	p2 := listen(t, port)
	defer p2.close()
	p2.waitConnected()
	waitState(t, tr, transport.Connected)
	for _, topic := range []string{dropped, kept, added} {
		p2.publish(topic, []byte(topic), nil)
	}
	if got := syncUntil(t, p2, tr, marker); !slices.Equal(got, []string{kept, added}) {
		t.Fatalf("after the rebuild received %v, want [%s %s] (%s was unsubscribed while down)", got, kept, added, dropped)
	}
}

// TestReestablish: the worker's probe found the session deaf and asks for
// a new one. The transport drops the live session at once (State
// Disconnected) and builds a new service with the subscriptions, which
// delivers again (the peer, whose connection the teardown ended, comes
// back as a new listener, as a broker would take the new connection).
func TestReestablish(t *testing.T) {
	kept, marker := "re/kept", "re/sync"
	p, tr, port := connectPair(t, kept, marker)
	tr.Reestablish(errors.New("test: probe lost"))
	if s := tr.State(); s != transport.Disconnected {
		t.Fatalf("state right after Reestablish: %v, want disconnected", s)
	}
	p.close()
	p2 := relisten(t, port)
	defer p2.close()
	p2.waitConnected()
	waitState(t, tr, transport.Connected)
	p2.publish(kept, []byte("k"), nil)
	if got := syncUntil(t, p2, tr, marker); !slices.Equal(got, []string{kept}) {
		t.Fatalf("after Reestablish received %v, want [%s]", got, kept)
	}
}

// TestPublishToSelfRefusedForAPool: a pool's queue is shared, so a probe
// published to it could reach another worker; PublishToSelf says so
// instead of publishing (the worker then runs without the probe).
func TestPublishToSelfRefusedForAPool(t *testing.T) {
	tr, err := solace.New(solace.Config{
		Host: "tcp://127.0.0.1:1", VPN: "default", Mode: solace.ModeGuaranteed, PoolName: "p", QueueName: "ns/q/sandbox/pool/p",
		ReconnectRetries: 0, ReconnectInterval: 100 * time.Millisecond, BackPressureBuffer: 8,
	}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.PublishToSelf(context.Background(), transport.Message{Topic: "ns/a2a/v1/str/v1/probe/w/1"})
	if !errors.Is(err, transport.ErrNoSelfDelivery) || !strings.Contains(err.Error(), "ns/q/sandbox/pool/p") {
		t.Fatalf("PublishToSelf in a pool: %v, want ErrNoSelfDelivery naming the queue", err)
	}
}

// TestPublishRefusals: through the real library, what can never be sent
// is a refusal (transport.ErrRefused): a message over MaxMessageBytes
// (checked before sending), a user property in the library's reserved
// namespace, a topic longer than Solace takes (the library's own
// refusal); the session goes on serving.
func TestPublishRefusals(t *testing.T) {
	p, tr, _ := connectPair(t)
	if err := p.rx.AddSubscription(resource.TopicSubscriptionOf("ns/>")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for name, m := range map[string]transport.Message{
		"over MaxMessageBytes": {Topic: "ns/big", Payload: make([]byte, tr.MaxMessageBytes())},
		"reserved property":    {Topic: "ns/prop", UserProperties: map[string]string{"solace.messaging.message.priority": "1"}},
		"topic too long":       {Topic: "ns/" + strings.Repeat("t", 300)},
	} {
		if err := tr.Publish(ctx, m); !errors.Is(err, transport.ErrRefused) {
			t.Errorf("%s: %v, want a refusal (transport.ErrRefused)", name, err)
		}
	}
	if err := tr.Publish(ctx, transport.Message{Topic: "ns/ok", Payload: []byte(`{}`)}); err != nil {
		t.Fatalf("after the refusals: %v", err)
	}
	m, err := p.rx.ReceiveMessage(bound)
	if err != nil || m.GetDestinationName() != "ns/ok" {
		t.Fatalf("the peer got %v (%v), want ns/ok", m, err)
	}
}
