package memory

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/securetoolruntime/str/worker/transport"
)

func connect(t *testing.T, tr transport.Transport, subs ...string) {
	t.Helper()
	if err := tr.Connect(context.Background(), subs); err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { tr.Close() })
}

func recv(t *testing.T, tr transport.Transport) *transport.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	d, err := tr.Receive(ctx)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return d
}

// none checks that nothing is waiting for tr. Delivery is synchronous in
// Publish, so a short wait suffices.
func none(t *testing.T, tr transport.Transport, who string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if d, err := tr.Receive(ctx); err == nil {
		t.Fatalf("%s received %q on %s, want nothing", who, d.Payload, d.Topic)
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: receive: %v", who, err)
	}
}

func TestRoundTripAndCopies(t *testing.T) {
	bus := NewBus()
	a, b := bus.Client("a", ""), bus.Client("b", "")
	connect(t, a)
	connect(t, b, "ns/x/>")
	payload := []byte(`{"k":1}`)
	props := map[string]string{"replyTo": "ns/r/1"}
	if err := a.Publish(context.Background(), transport.Message{Topic: "ns/x/y", Payload: payload, UserProperties: props}); err != nil {
		t.Fatal(err)
	}
	payload[0] = 'X'
	props["replyTo"] = "changed"
	d := recv(t, b)
	if d.Topic != "ns/x/y" || string(d.Payload) != `{"k":1}` || d.UserProperties["replyTo"] != "ns/r/1" {
		t.Fatalf("got %+v", d.Message)
	}
	if d.Ack() != nil || d.Nack(errors.New("x")) != nil {
		t.Fatal("ack/nack should be no-ops")
	}
	if b.State() != transport.Connected {
		t.Fatalf("state %v", b.State())
	}
}

func TestRoutingRules(t *testing.T) {
	bus := NewBus()
	pub := bus.Client("pub", "")
	star := bus.Client("star", "")
	exact := bus.Client("exact", "")
	self := bus.Client("pub", "") // same client id as the publisher
	connect(t, pub, "t/>")
	connect(t, star, "t/*")
	connect(t, exact, "t/a/b")
	connect(t, self, "t/>")

	if err := pub.Publish(context.Background(), transport.Message{Topic: "t/a/b", Payload: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, exact); string(d.Payload) != "1" {
		t.Fatalf("exact got %q", d.Payload)
	}
	none(t, star, "star (t/* must not match t/a/b)")
	none(t, pub, "publisher")
	none(t, self, "client with the publisher's id")

	if err := pub.Publish(context.Background(), transport.Message{Topic: "t/a", Payload: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, star); string(d.Payload) != "2" {
		t.Fatalf("star got %q", d.Payload)
	}
	none(t, exact, "exact")

	// Unsubscribe stops delivery; Subscribe starts it.
	if err := star.Unsubscribe(context.Background(), "t/*"); err != nil {
		t.Fatal(err)
	}
	if err := exact.Subscribe(context.Background(), "t/*"); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(context.Background(), transport.Message{Topic: "t/c", Payload: []byte("3")}); err != nil {
		t.Fatal(err)
	}
	none(t, star, "unsubscribed star")
	if d := recv(t, exact); string(d.Payload) != "3" {
		t.Fatalf("exact got %q", d.Payload)
	}
}

func TestQueueGroupRoundRobin(t *testing.T) {
	bus := NewBus()
	pub := bus.Client("pub", "")
	connect(t, pub)
	var members []transport.Transport
	for i := range 3 {
		m := bus.Client(fmt.Sprintf("w%d", i), "pool")
		connect(t, m, "jobs/>")
		members = append(members, m)
	}
	solo1, solo2 := bus.Client("s1", "q1"), bus.Client("s2", "q2")
	connect(t, solo1, "jobs/>")
	connect(t, solo2, "jobs/>")

	for i := range 30 {
		if err := pub.Publish(context.Background(), transport.Message{Topic: "jobs/run", Payload: fmt.Appendf(nil, "%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	seen := make(map[string]int)
	for i, m := range members {
		for range 10 {
			seen[string(recv(t, m).Payload)]++
		}
		none(t, m, fmt.Sprintf("member %d after 10", i))
	}
	if len(seen) != 30 {
		t.Fatalf("group saw %d distinct messages, want 30", len(seen))
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("message %s delivered %d times to the group", k, n)
		}
	}
	for _, s := range []transport.Transport{solo1, solo2} {
		for i := range 30 {
			if got := string(recv(t, s).Payload); got != fmt.Sprint(i) {
				t.Fatalf("unique queue got %s, want %d", got, i)
			}
		}
	}
}

func TestLifecycle(t *testing.T) {
	bus := NewBus()
	c := bus.Client("c", "")
	if err := c.Publish(context.Background(), transport.Message{Topic: "x"}); !errors.Is(err, ErrNotConnected) {
		t.Fatalf("publish before connect: %v", err)
	}
	if c.State() != transport.Disconnected {
		t.Fatal("state before connect")
	}
	connect(t, c, "x")
	errc := make(chan error, 1)
	go func() { _, err := c.Receive(context.Background()); errc <- err }()
	time.Sleep(10 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, transport.ErrClosed) {
			t.Fatalf("receive after close: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Receive did not return after Close")
	}
	if err := c.Publish(context.Background(), transport.Message{Topic: "x"}); !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("publish after close: %v", err)
	}
	if c.State() != transport.Disconnected {
		t.Fatal("state after close")
	}
	// A closed client no longer receives.
	other := bus.Client("o", "")
	connect(t, other)
	if err := other.Publish(context.Background(), transport.Message{Topic: "x"}); err != nil {
		t.Fatal(err)
	}
	if len(bus.clients) != 1 {
		t.Fatalf("bus holds %d clients, want 1", len(bus.clients))
	}
}

// PublishToSelf comes back to the publisher (Publish does not); Forget
// makes the client deaf while it still looks connected, and Reestablish
// makes it hear again, with the subscriptions it had.
func TestPublishToSelfForgetReestablish(t *testing.T) {
	bus := NewBus()
	a, b := bus.Client("a", ""), bus.Client("b", "")
	connect(t, a, "ns/probe/a/*")
	connect(t, b, "ns/x")
	ctx := context.Background()
	probe := transport.Message{Topic: "ns/probe/a/1", Payload: []byte("p")}
	if err := a.Publish(ctx, probe); err != nil {
		t.Fatal(err)
	}
	none(t, a, "a after its own Publish")
	if err := a.PublishToSelf(ctx, probe); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, a); d.Topic != probe.Topic || string(d.Payload) != "p" {
		t.Fatalf("got %+v", d.Message)
	}
	bus.Forget("a")
	if a.State() != transport.Connected {
		t.Fatalf("a forgotten client looks %v, want connected (that is the failure)", a.State())
	}
	must(t, a.PublishToSelf(ctx, probe))
	must(t, b.Publish(ctx, transport.Message{Topic: "ns/probe/a/2"}))
	none(t, a, "a forgotten client")
	a.Reestablish(errors.New("test"))
	must(t, b.Publish(ctx, transport.Message{Topic: "ns/probe/a/3"}))
	if d := recv(t, a); d.Topic != "ns/probe/a/3" {
		t.Fatalf("after Reestablish: got %s", d.Topic)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestLimitAndRefuse: a message over the bus's limit, and one to a topic
// given to Refuse, are refused (transport.ErrRefused) and delivered to
// nobody; a message at the limit goes through.
func TestLimitAndRefuse(t *testing.T) {
	bus := NewBus()
	a, b := bus.Client("a", ""), bus.Client("b", "")
	connect(t, a)
	connect(t, b, ">")
	if got := a.MaxMessageBytes(); got != DefaultMaxMessageBytes {
		t.Fatalf("MaxMessageBytes = %d, want %d", got, DefaultMaxMessageBytes)
	}
	bus.SetMaxMessageBytes(16)
	ctx := context.Background()
	at := transport.Message{Topic: "t", Payload: []byte("0123456789"), UserProperties: map[string]string{"ab": "cde"}} // 1+10+2+3
	if err := a.Publish(ctx, at); err != nil {
		t.Fatalf("a message at the limit: %v", err)
	}
	recv(t, b)
	at.Payload = append(at.Payload, 'x')
	if err := a.Publish(ctx, at); !errors.Is(err, transport.ErrRefused) {
		t.Fatalf("a message over the limit: %v, want ErrRefused", err)
	}
	bus.SetMaxMessageBytes(DefaultMaxMessageBytes)
	bus.Refuse("deny/>")
	if err := a.Publish(ctx, transport.Message{Topic: "deny/x"}); !errors.Is(err, transport.ErrRefused) {
		t.Fatalf("a refused topic: %v, want ErrRefused", err)
	}
	none(t, b, "b")
	if err := a.Publish(ctx, transport.Message{Topic: "allow/x"}); err != nil {
		t.Fatalf("another topic: %v", err)
	}
	recv(t, b)
}

// TestStall: a publish to a stalled destination waits (announced on
// entered) while a publish to another goes through, and is delivered once
// released; a stalled publish whose context ends returns its error.
func TestStall(t *testing.T) {
	bus := NewBus()
	a, b := bus.Client("a", ""), bus.Client("b", "")
	connect(t, a)
	connect(t, b, ">")
	entered, release := bus.Stall("slow/>")
	done := make(chan error, 1)
	go func() { done <- a.Publish(context.Background(), transport.Message{Topic: "slow/1"}) }()
	if topic := <-entered; topic != "slow/1" {
		t.Fatalf("entered %q", topic)
	}
	if err := a.Publish(context.Background(), transport.Message{Topic: "fast/1"}); err != nil {
		t.Fatal(err)
	}
	if d := recv(t, b); d.Topic != "fast/1" {
		t.Fatalf("first delivery %q, want fast/1 (slow/1 is stalled)", d.Topic)
	}
	select {
	case err := <-done:
		t.Fatalf("the stalled publish returned before release: %v", err)
	default:
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d := recv(t, b); d.Topic != "slow/1" {
		t.Fatalf("after release: %q", d.Topic)
	}
	_, release2 := bus.Stall("slow/>")
	defer release2()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Publish(ctx, transport.Message{Topic: "slow/2"}); err == nil {
		t.Fatal("a stalled publish with an ended context succeeded")
	}
}
