package broker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker/brokertest"
	"golang.org/x/sys/unix"
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

// halfLine dials s from local address from ("" for any) and sends half
// a request line, as a token-less peer holding a place would: it is
// accepted at once (TCP_DEFER_ACCEPT holds back only silent connections)
// and waits for the rest.
func halfLine(t *testing.T, s *Server, from string) *raw {
	t.Helper()
	d := net.Dialer{}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	nc, err := d.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	if _, err := io.WriteString(nc, `{"cmd":`); err != nil {
		t.Fatal(err)
	}
	return &raw{T: t, NC: nc, R: bufio.NewReader(nc)}
}

// readAll waits until the server has read every byte sent so far on each
// connection waiting for its CONNECT (so which one gives way next does
// not depend on how soon its reader ran).
func readAll(t *testing.T, s *Server) {
	t.Helper()
	waitFor(t, "the server to read what the waiting connections sent", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			if !c.unauth {
				continue
			}
			unread := -1
			c.raw.Control(func(fd uintptr) { unread, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
			if unread != 0 {
				return false
			}
		}
		return true
	})
}

// TestUnauthenticatedConnectionCap: MaxUnauthenticated connections that
// have not CONNECTed; for the next one the oldest of them gives way
// (closed, counted), except that one whose first line was answered and
// which still has no session goes first; connected clients are not
// touched, and a connection that gave way cannot CONNECT any more.
func TestUnauthenticatedConnectionCap(t *testing.T) {
	s := startServer(t, Options{MaxUnauthenticated: 3})
	in := connectRaw(t, s, "in", "", "t")
	var first []*raw
	for i := range 3 {
		first = append(first, halfLine(t, s, ""))
		waitFor(t, fmt.Sprintf("%d unauthenticated connections", i+1), func() bool { return s.Stats().Unauthenticated == i+1 })
	}

	// The oldest gives way to a fourth.
	readAll(t, s)
	fourth := halfLine(t, s, "")
	first[0].ExpectEOF()
	waitFor(t, "one gave way, three wait", func() bool {
		st := s.Stats()
		return st.GaveWay == 1 && st.Unauthenticated == 3 && st.Conns == 4
	})

	// A connection whose first line was not a CONNECT goes before older
	// ones.
	first[2].Send(`"RECEIVE"}`)
	errorCode(t, "RECEIVE before CONNECT", first[2].Read(), CodeNotConnected)
	readAll(t, s)
	halfLine(t, s, "")
	first[2].ExpectEOF()
	waitFor(t, "two gave way", func() bool { return s.Stats().GaveWay == 2 })

	// The others are still served.
	if r := first[1].Do(`"CONNECT","client_id":"b"}`); r["status"] != StatusOK {
		t.Fatalf("CONNECT of a connection that kept its place: %v", r)
	}
	if r := fourth.Do(`"CONNECT","client_id":"d"}`); r["status"] != StatusOK {
		t.Fatalf("CONNECT of the connection that took a place: %v", r)
	}
	same(t, "the connected client", in.Do(`{"cmd": "RECEIVE", "timeout_ms": 0}`), map[string]any{"status": "TIMEOUT"})
}

// TestGiveWayBySource: when the places are full, a connection from the
// peer address holding the most of them gives way, even when one from
// another address is older.
func TestGiveWayBySource(t *testing.T) {
	s := startServer(t, Options{MaxUnauthenticated: 4})
	other := halfLine(t, s, "127.0.0.2")
	waitFor(t, "the other host's connection", func() bool { return s.Stats().Unauthenticated == 1 })
	var flood []*raw
	for i := range 3 {
		flood = append(flood, halfLine(t, s, "127.0.0.1"))
		waitFor(t, "the flood's connections", func() bool { return s.Stats().Unauthenticated == 2+i })
	}
	readAll(t, s)
	halfLine(t, s, "127.0.0.2")
	flood[0].ExpectEOF()
	if r := other.Do(`"CONNECT","client_id":"other"}`); r["status"] != StatusOK {
		t.Fatalf("CONNECT of the older connection from the other address: %v", r)
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

// TestMaxConnsCap: at most MaxConns connections of any kind; a connection
// waiting for its CONNECT gives way to the next one, and when all are
// connected clients the next is accepted and closed at once (counted).
func TestMaxConnsCap(t *testing.T) {
	s := startServer(t, Options{MaxConns: 3})
	connectRaw(t, s, "a", "")
	connectRaw(t, s, "b", "")
	waiting := halfLine(t, s, "")
	waitFor(t, "3 connections", func() bool { return s.Stats().Conns == 3 })
	// The one waiting for its CONNECT gives way to a new one...
	next := halfLine(t, s, "")
	waiting.ExpectEOF()
	waitFor(t, "one gave way", func() bool { return s.Stats().GaveWay == 1 && s.Stats().Conns == 3 })
	// ...which, once connected, leaves only connected clients: the next
	// is refused.
	if r := next.Do(`"CONNECT","client_id":"c"}`); r["status"] != StatusOK {
		t.Fatalf("CONNECT: %v", r)
	}
	over := halfLine(t, s, "")
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

// TestPreLoginFloodCannotLockOut: a token-less client holds every one of
// the default MaxUnauthenticated places and reopens each connection the
// server closes, as fast as it can; meanwhile 20 clients with the token
// log in, each with one connection and one attempt, started one after
// another as the flood turns all the places over again, and each free to
// take as long as the loaded machine makes it. All 20 get in, and the
// flood still holds every place afterwards (it was not simply outlasted).
func TestPreLoginFloodCannotLockOut(t *testing.T) {
	tok := NewToken()
	s := startServer(t, Options{Token: tok})
	flood := brokertest.StartFlood(t, s.Addr().String(), 2*DefaultMaxUnauthenticated)
	waitForWithin(t, time.Minute, "the flood holding every unauthenticated place", func() bool {
		return s.Stats().Unauthenticated == DefaultMaxUnauthenticated && flood.Reopened.Load() > 0
	})

	const logins = 20
	errs := make(chan error, logins)
	for i := range logins {
		// Each login starts once the flood has had as many connections
		// closed under it as there are places since the last one, so
		// all 20 meet a flood in full swing.
		turned := flood.Reopened.Load() + DefaultMaxUnauthenticated
		waitForWithin(t, time.Minute, "the flood to turn the places over", func() bool { return flood.Reopened.Load() >= turned })
		go func() { errs <- brokertest.Login(s.Addr().String(), tok, fmt.Sprintf("real-%02d", i)) }()
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
	waitForWithin(t, time.Minute, "the flood still holding every unauthenticated place", func() bool {
		return s.Stats().Unauthenticated == DefaultMaxUnauthenticated
	})
	flood.Stop()
	t.Logf("the server closed %d flood connections", flood.Reopened.Load())
}
