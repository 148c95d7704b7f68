package broker

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLoginLineLimitCutsOff: 64 MiB sent before CONNECT, on one line. The
// server answers INVALID_COMMAND after LoginLineBytes and closes without
// reading the rest, so the sender's write fails with a reset or broken
// pipe (not its own timeout): the server neither held nor drained it.
func TestLoginLineLimitCutsOff(t *testing.T) {
	s := startServer(t, Options{LoginLineBytes: 1024})
	c := dialRaw(t, s.Addr())
	writeErr := make(chan error, 1)
	go func() {
		chunk := []byte(`{"cmd":"CONNECT","pad":"` + strings.Repeat("a", 1<<20))
		c.NC.SetWriteDeadline(time.Now().Add(30 * time.Second))
		for range 64 {
			if _, err := c.NC.Write(chunk); err != nil {
				writeErr <- err
				return
			}
			chunk = []byte(strings.Repeat("a", 1<<20))
		}
		writeErr <- nil
	}()
	r := c.Read()
	errorCode(t, "over-long line before CONNECT", r, CodeInvalidCommand)
	if !strings.Contains(r["error_message"].(string), "1024") {
		t.Fatalf("error names no limit: %v", r)
	}
	c.ExpectEOF()
	err := <-writeErr
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("64 MiB write before CONNECT: %v, want a reset or broken pipe (server still reading)", err)
	}
	waitFor(t, "login line counted", func() bool { return s.Stats().LoginLineTooLong == 1 })
	waitFor(t, "connection gone", func() bool { return s.Stats().Conns == 0 && s.Stats().Unauthenticated == 0 })
}

// TestLoginLineLimitOnlyBeforeConnect: a CONNECT and, in the same write, a
// PUBLISH longer than LoginLineBytes: the PUBLISH is measured against
// MaxLineBytes, the limit after CONNECT (the reader does not read ahead
// under the login limit).
func TestLoginLineLimitOnlyBeforeConnect(t *testing.T) {
	s := startServer(t, Options{LoginLineBytes: 256, MaxLineBytes: 64 << 10})
	sub := connectRaw(t, s, "sub", "", "t")
	c := dialRaw(t, s.Addr())
	payload := strings.Repeat("p", 8<<10)
	c.Send(`{"cmd":"CONNECT","client_id":"pub"}` + "\n" + `{"cmd":"PUBLISH","topic":"t","payload":"` + payload + `"}`)
	if r := c.Read(); r["status"] != StatusOK {
		t.Fatalf("CONNECT: %v", r)
	}
	if r := c.Read(); r["status"] != StatusOK {
		t.Fatalf("8 KiB PUBLISH right after CONNECT: %v", r)
	}
	if p, _ := sub.Next(); p != payload {
		t.Fatalf("payload of %d bytes, want %d", len(p.(string)), len(payload))
	}
}

// TestUnauthenticatedConnectionCap: MaxUnauthenticated connections that
// have not CONNECTed; the next is accepted and closed at once (counted);
// a CONNECT frees a place.
func TestUnauthenticatedConnectionCap(t *testing.T) {
	s := startServer(t, Options{MaxUnauthenticated: 3})
	var first []*raw
	for range 3 {
		first = append(first, dialRaw(t, s.Addr()))
	}
	waitFor(t, "3 unauthenticated connections", func() bool { return s.Stats().Unauthenticated == 3 })
	over := dialRaw(t, s.Addr())
	over.ExpectEOF()
	if n := s.Stats().OverUnauthenticated; n != 1 {
		t.Fatalf("refusals counted: %d, want 1", n)
	}
	// Those already in are served.
	if r := first[0].Do(`{"cmd":"CONNECT","client_id":"a"}`); r["status"] != StatusOK {
		t.Fatalf("CONNECT of an admitted connection: %v", r)
	}
	waitFor(t, "2 unauthenticated connections", func() bool { return s.Stats().Unauthenticated == 2 })
	next := dialRaw(t, s.Addr())
	if r := next.Do(`{"cmd":"CONNECT","client_id":"b"}`); r["status"] != StatusOK {
		t.Fatalf("CONNECT after a place was freed: %v", r)
	}
}

// TestLoginTimeout: a connection that sends nothing, and one that sends
// only commands other than CONNECT, are closed after LoginTimeout.
func TestLoginTimeout(t *testing.T) {
	s := startServer(t, Options{LoginTimeout: 50 * time.Millisecond})
	silent := dialRaw(t, s.Addr())
	chatty := dialRaw(t, s.Addr())
	errorCode(t, "RECEIVE before CONNECT", chatty.Do(`{"cmd":"RECEIVE","timeout_ms":0}`), CodeNotConnected)
	silent.ExpectEOFWithin(time.Minute)
	chatty.ExpectEOFWithin(time.Minute)
	waitFor(t, "both counted", func() bool { return s.Stats().LoginTimeout == 2 })
	waitFor(t, "both gone", func() bool { return s.Stats().Conns == 0 && s.Stats().Unauthenticated == 0 })
}

// TestIdleTimeout: a connected client that sends nothing is closed after
// IdleTimeout; a RECEIVE waiting longer than that is not idle (it is
// answered, TIMEOUT, and only then does the clock run).
func TestIdleTimeout(t *testing.T) {
	s := startServer(t, Options{IdleTimeout: 100 * time.Millisecond})
	c := connectRaw(t, s, "idle", "", "t")
	c.NC.SetReadDeadline(time.Now().Add(time.Minute))
	c.Send(`{"cmd":"RECEIVE","timeout_ms":400}`)
	same(t, "RECEIVE longer than the idle timeout", c.Read(), map[string]any{"status": "TIMEOUT"})
	c.ExpectEOFWithin(time.Minute)
	waitFor(t, "idle close counted", func() bool { return s.Stats().IdleTimeout == 1 })
	waitFor(t, "client forgotten", func() bool { return !s.Connected("idle") })
}

// TestMaxConnsCap: at most MaxConns connections of any kind; the next is
// accepted and closed at once (counted).
func TestMaxConnsCap(t *testing.T) {
	s := startServer(t, Options{MaxConns: 3})
	connectRaw(t, s, "a", "")
	connectRaw(t, s, "b", "")
	dialRaw(t, s.Addr())
	waitFor(t, "3 connections", func() bool { return s.Stats().Conns == 3 })
	over := dialRaw(t, s.Addr())
	over.ExpectEOF()
	if n := s.Stats().OverMaxConns; n != 1 {
		t.Fatalf("refusals counted: %d, want 1", n)
	}
}

// TestDerivedMaxConnsBelowFileLimit: by default the broker takes at most
// a quarter of the process's descriptors.
func TestDerivedMaxConnsBelowFileLimit(t *testing.T) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	s := NewServer(Options{Anonymous: true, Logger: testLogger(t)})
	want := max(int(min(rl.Cur/4, 1<<31-1)), minDerivedMaxConns)
	if s.maxConns != want || (rl.Cur >= 4*minDerivedMaxConns && uint64(s.maxConns) > rl.Cur/4) {
		t.Fatalf("MaxConns %d with RLIMIT_NOFILE %d, want %d", s.maxConns, rl.Cur, want)
	}
}
