package devbroker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
)

// The str dev broker the client tests talk to, on a port of loopback,
// and a connection speaking its protocol by hand (as the broker's own
// tests do) to see what the client puts on the wire.

// testLogger discards log output unless -v is given.
func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

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

// raw is a test-side connection speaking the protocol by hand.
type raw struct {
	t  *testing.T
	nc net.Conn
	r  *bufio.Reader
}

func dialRaw(t *testing.T, addr net.Addr) *raw {
	t.Helper()
	nc, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &raw{t: t, nc: nc, r: bufio.NewReader(nc)}
}

func (c *raw) send(line string) {
	c.t.Helper()
	c.nc.SetWriteDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c.nc, line+"\n"); err != nil {
		c.t.Fatalf("send %s: %v", line, err)
	}
}

// read returns the next response line, decoded with numbers kept as text.
func (c *raw) read() map[string]any {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, err := c.r.ReadBytes('\n')
	if err != nil {
		c.t.Fatalf("read response: %v (partial %q)", err, line)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		c.t.Fatalf("response %q is not a JSON object: %v", line, err)
	}
	return m
}

func (c *raw) do(line string) map[string]any {
	c.t.Helper()
	c.send(line)
	return c.read()
}

// same compares a response with the expected one field by field: the same
// keys, and equal values (JSON numbers compared as their text).
func same(t *testing.T, what string, got map[string]any, want map[string]any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// connectRaw opens a connection and CONNECTs it.
func connectRaw(t *testing.T, s *broker.Server, id, queue string, subs ...string) *raw {
	t.Helper()
	c := dialRaw(t, s.Addr())
	js, _ := json.Marshal(subs)
	if subs == nil {
		js = []byte("[]")
	}
	r := c.do(fmt.Sprintf(`{"cmd": "CONNECT", "client_id": %q, "queue_name": %q, "subscriptions": %s}`, id, queue, js))
	if r["status"] != "OK" {
		t.Fatalf("CONNECT %s: %v", id, r)
	}
	return c
}

func (c *raw) publish(topic string, payload any) {
	c.t.Helper()
	p, _ := json.Marshal(payload)
	if r := c.do(fmt.Sprintf(`{"cmd": "PUBLISH", "topic": %q, "payload": %s}`, topic, p)); r["status"] != "OK" {
		c.t.Fatalf("PUBLISH %s: %v", topic, r)
	}
}
