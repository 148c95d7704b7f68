// Package brokertest has what the dev broker's tests and its clients'
// tests share: a connection that speaks the broker's line protocol by
// hand, so a test can send exactly the bytes it means.
package brokertest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Raw is a test-side connection speaking the protocol by hand.
type Raw struct {
	T  *testing.T
	NC net.Conn
	R  *bufio.Reader
}

// Dial connects to addr; the connection is closed when the test ends.
func Dial(t *testing.T, addr net.Addr) *Raw {
	t.Helper()
	nc, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &Raw{T: t, NC: nc, R: bufio.NewReader(nc)}
}

// Send writes one request line.
func (c *Raw) Send(line string) {
	c.T.Helper()
	c.NC.SetWriteDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(c.NC, line+"\n"); err != nil {
		c.T.Fatalf("send %s: %v", line, err)
	}
}

// Read returns the next response line, decoded with numbers kept as text.
func (c *Raw) Read() map[string]any {
	c.T.Helper()
	c.NC.SetReadDeadline(time.Now().Add(3 * time.Second))
	line, err := c.R.ReadBytes('\n')
	if err != nil {
		c.T.Fatalf("read response: %v (partial %q)", err, line)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		c.T.Fatalf("response %q is not a JSON object: %v", line, err)
	}
	return m
}

// Do sends a line and reads the response.
func (c *Raw) Do(line string) map[string]any {
	c.T.Helper()
	c.Send(line)
	return c.Read()
}

// ExpectEOF checks that the server closed the connection. A reset counts
// too: closing a socket with unread input makes the kernel send RST.
func (c *Raw) ExpectEOF() {
	c.T.Helper()
	c.ExpectEOFWithin(3 * time.Second)
}

// ExpectEOFWithin is ExpectEOF with a wait long enough for a server-side
// timer on a loaded machine: the server must close, however long it takes
// up to d.
func (c *Raw) ExpectEOFWithin(d time.Duration) {
	c.T.Helper()
	c.NC.SetReadDeadline(time.Now().Add(d))
	if b, err := c.R.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
		c.T.Fatalf("want EOF, got byte %q err %v", b, err)
	}
}

// Publish publishes payload (as JSON) to topic and wants OK.
func (c *Raw) Publish(topic string, payload any) {
	c.T.Helper()
	p, _ := json.Marshal(payload)
	if r := c.Do(fmt.Sprintf(`{"cmd": "PUBLISH", "topic": %q, "payload": %s}`, topic, p)); r["status"] != "OK" {
		c.T.Fatalf("PUBLISH %s: %v", topic, r)
	}
}

// Next returns the payload and topic of the next message, failing on
// TIMEOUT.
func (c *Raw) Next() (payload any, topic string) {
	c.T.Helper()
	r := c.Do(`{"cmd": "RECEIVE", "timeout_ms": 2000}`)
	m, ok := r["message"].(map[string]any)
	if r["status"] != "OK" || !ok {
		c.T.Fatalf("RECEIVE: %v", r)
	}
	return m["payload"], m["topic"].(string)
}

// ExpectEmpty wants no message queued (RECEIVE with timeout 0).
func (c *Raw) ExpectEmpty(what string) {
	c.T.Helper()
	Same(c.T, what, c.Do(`{"cmd": "RECEIVE", "timeout_ms": 0}`), map[string]any{"status": "TIMEOUT"})
}

// Same compares a response with the expected one field by field: the same
// keys, and equal values (JSON numbers compared as their text).
func Same(t *testing.T, what string, got map[string]any, want map[string]any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("%s:\n got %s\nwant %s", what, g, w)
	}
}

// Logger is a test's logger: discarded unless -v is given, then into the
// test's own log at debug level.
func Logger(t *testing.T) *slog.Logger {
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
