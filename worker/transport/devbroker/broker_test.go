package devbroker

import (
	"encoding/json"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/broker/brokertest"
)

// The str dev broker the client tests talk to, on a port of loopback,
// and a connection speaking its protocol by hand (as the broker's own
// tests do) to see what the client puts on the wire.

// testLogger discards log output unless -v is given.
var testLogger = brokertest.Logger

// startServer starts a broker on 127.0.0.1 (anonymous unless opts has a
// token), closed when the test ends.
func startServer(t *testing.T, opts broker.Options) *broker.Server {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.Token == "" {
		opts.Anonymous = true
	}
	s := broker.NewServer(opts)
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitFor polls cond (for state another goroutine changes) for up to 3 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// raw is brokertest's hand-speaking connection.
type raw = brokertest.Raw

func dialRaw(t *testing.T, addr net.Addr) *raw { return brokertest.Dial(t, addr) }

var same = brokertest.Same

// connectRaw opens a connection and CONNECTs it.
func connectRaw(t *testing.T, s *broker.Server, id, queue string, subs ...string) *raw {
	t.Helper()
	c := dialRaw(t, s.Addr())
	js, _ := json.Marshal(subs)
	if subs == nil {
		js = []byte("[]")
	}
	r := c.Do(fmt.Sprintf(`{"cmd": "CONNECT", "client_id": %q, "queue_name": %q, "subscriptions": %s}`, id, queue, js))
	if r["status"] != "OK" {
		t.Fatalf("CONNECT %s: %v", id, r)
	}
	return c
}
