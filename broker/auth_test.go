package broker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestListenNeedsTokenOrAnonymous: a broker is never open by omission.
func TestListenNeedsTokenOrAnonymous(t *testing.T) {
	for _, o := range []Options{{}, {Token: "t", Anonymous: true}} {
		s := NewServer(Options{Token: o.Token, Anonymous: o.Anonymous, Logger: testLogger(t)})
		if err := s.Listen("127.0.0.1:0"); err == nil {
			s.Close()
			t.Errorf("Listen with token %q, anonymous %v succeeded", o.Token, o.Anonymous)
		}
	}
}

// TestConnectWithoutTokenRefused: a CONNECT without the token, with a wrong
// one or with a mistyped one is refused, the connection closed, and nothing
// published reaches it; the right token is accepted.
func TestConnectWithoutTokenRefused(t *testing.T) {
	tok := NewToken()
	s := startServer(t, Options{Token: tok})
	s.SetTokenFile("/run/str/broker-1.token")
	good := dialRaw(t, s.Addr())
	same(t, "CONNECT with the token",
		good.Do(fmt.Sprintf(`{"cmd": "CONNECT", "client_id": "worker", "subscriptions": ["t/>"], "token": %q}`, tok)),
		map[string]any{"status": "OK", "client_id": "worker"})

	for _, bad := range []struct{ what, line string }{
		{"no token (the reference client's CONNECT)", `{"cmd": "CONNECT", "client_id": "spy", "queue_name": "q", "subscriptions": [">"]}`},
		{"wrong token", `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"], "token": "` + NewToken() + `"}`},
		{"token prefix", `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"], "token": "` + tok[:10] + `"}`},
		{"empty token", `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"], "token": ""}`},
		{"null token", `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"], "token": null}`},
		{"token not a string", `{"cmd": "CONNECT", "client_id": "spy", "subscriptions": [">"], "token": 1}`},
		{"no token, no client id", `{"cmd": "CONNECT"}`},
	} {
		c := dialRaw(t, s.Addr())
		r := c.Do(bad.line)
		errorCode(t, bad.what, r, CodeNotConnected)
		if msg := r["error_message"].(string); !strings.Contains(msg, "token") || !strings.Contains(msg, "/run/str/broker-1.token") {
			t.Errorf("%s: message %q should name the token and its file", bad.what, msg)
		}
		c.ExpectEOF()
	}
	if s.Connected("spy") {
		t.Fatal("a refused CONNECT created a client")
	}
	// A refused connection cannot go on to PUBLISH or RECEIVE either: it
	// is closed (checked above), and the one good client saw nothing.
	good.ExpectEmpty("nothing published by refused peers")

	// A second CONNECT on a good connection must carry the token too.
	errorCode(t, "re-CONNECT without the token", good.Do(`{"cmd": "CONNECT", "client_id": "worker"}`), CodeNotConnected)
	good.ExpectEOF()
	waitFor(t, "the connection's client forgotten", func() bool { return !s.Connected("worker") })
}

// TestForgedConnectClaimingConnectedID: a peer that CONNECTs with the id of
// a connected client (the worker's, to take its queue-group share, read its
// requests or subscribe it to a flood) is refused, on a new connection or
// by re-CONNECTing an existing one; the id is free again once its owner
// has gone.
func TestForgedConnectClaimingConnectedID(t *testing.T) {
	s := startServer(t, Options{})
	agent := connectRaw(t, s, "agent", "")
	worker := connectRaw(t, s, "sandbox-worker-001", "ns/q/sandbox/sandbox-worker-001", "ns/invoke/echo")
	workerPub := connectRaw(t, s, "sandbox-worker-001-pub", "")

	for _, id := range []string{"sandbox-worker-001", "sandbox-worker-001-pub"} {
		forged := dialRaw(t, s.Addr())
		r := forged.Do(fmt.Sprintf(`{"cmd": "CONNECT", "client_id": %q, "queue_name": "ns/q/sandbox/sandbox-worker-001", "subscriptions": ["ns/invoke/echo", "ns/flood"]}`, id))
		errorCode(t, "forged CONNECT as "+id, r, CodeNotConnected)
		if !strings.Contains(r["error_message"].(string), "already connected") {
			t.Fatalf("forged CONNECT as %s: %v", id, r)
		}
		forged.ExpectEOF()
	}
	// Moving an established connection onto the id is refused as well.
	mover := connectRaw(t, s, "mover", "")
	errorCode(t, "re-CONNECT onto a connected id",
		mover.Do(`{"cmd": "CONNECT", "client_id": "sandbox-worker-001", "subscriptions": ["ns/flood"]}`), CodeNotConnected)
	mover.ExpectEOF()

	// The worker got nothing extra and lost nothing.
	for i := range 3 {
		agent.Publish("ns/invoke/echo", i)
	}
	agent.Publish("ns/flood", "flood")
	for i := range 3 {
		if p, _ := worker.Next(); fmt.Sprint(p) != fmt.Sprint(i) {
			t.Fatalf("worker got %v, want %d", p, i)
		}
	}
	worker.ExpectEmpty("the worker is not subscribed to the flood topic")
	workerPub.ExpectEmpty("the publisher connection is not subscribed to anything")

	// Once the owner disconnects, the id may be used again.
	same(t, "DISCONNECT", worker.Do(`{"cmd": "DISCONNECT"}`), map[string]any{"status": "OK"})
	worker.ExpectEOF()
	waitFor(t, "worker forgotten", func() bool { return !s.Connected("sandbox-worker-001") })
	connectRaw(t, s, "sandbox-worker-001", "", "ns/invoke/echo")
}

// queued returns the messages and bytes held for client id, summed from
// the queue itself rather than from the running counter.
func (s *Server) queued(id string) (n, bytes int, dropped uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cl := s.clients[id]
	if cl == nil {
		return 0, 0, 0
	}
	for _, m := range cl.pending {
		bytes += m.size()
	}
	if bytes != cl.pendingBytes {
		panic(fmt.Sprintf("pendingBytes %d, queue holds %d", cl.pendingBytes, bytes))
	}
	return len(cl.pending), bytes, cl.dropped
}

// TestSlowSubscriberByteBound: a subscriber that never RECEIVEs, flooded
// with 200 messages of 16 KiB (3.2 MB, far under the message-count bound),
// holds at most MaxQueueBytes; the oldest are dropped and counted, and the
// newest are the ones delivered.
func TestSlowSubscriberByteBound(t *testing.T) {
	const bound = 256 << 10
	s := startServer(t, Options{MaxQueueBytes: bound})
	pub := connectRaw(t, s, "flooder", "")
	slow := connectRaw(t, s, "slow", "", "flood")
	pad := strings.Repeat("x", 16<<10)
	for i := range 200 {
		pub.Publish("flood", fmt.Sprintf("%03d%s", i, pad))
		if _, b, _ := s.queued("slow"); b > bound {
			t.Fatalf("after %d messages the slow client holds %d bytes, bound %d", i+1, b, bound)
		}
	}
	n, b, dropped := s.queued("slow")
	if n == 0 || n >= 200 || dropped != uint64(200-n) {
		t.Fatalf("queued %d (%d bytes), dropped %d: want some kept, the rest dropped and counted", n, b, dropped)
	}
	// The kept ones are the newest, in order.
	for i := 200 - n; i < 200; i++ {
		p, _ := slow.Next()
		if got := p.(string)[:3]; got != fmt.Sprintf("%03d", i) {
			t.Fatalf("got message %s, want %03d", got, i)
		}
	}
	slow.ExpectEmpty("after the kept messages")
	if _, b, _ := s.queued("slow"); b != 0 {
		t.Fatalf("%d bytes accounted after draining", b)
	}

	// A message larger than the bound by itself is dropped, not queued.
	huge := strings.Repeat("y", bound+1)
	pub.Publish("flood", huge)
	if n, _, d := s.queued("slow"); n != 0 || d != dropped+1 {
		t.Fatalf("oversized message: queued %d, dropped %d", n, d)
	}
	pub.Publish("flood", "small")
	if p, _ := slow.Next(); p != "small" {
		t.Fatalf("after the oversized message got %v", p)
	}
}

// TestRemoveStaleTokenFile: the port's token file goes when it is a
// regular file; a missing one is no error; anything else is refused, not
// removed.
func TestRemoveStaleTokenFile(t *testing.T) {
	t.Setenv("STR_STATE_DIR", t.TempDir())
	path := DefaultTokenFile(7)
	if err := WriteTokenFile(path, NewToken()); err != nil {
		t.Fatal(err)
	}
	if got, removed, err := RemoveStaleTokenFile(7); err != nil || !removed || got != path {
		t.Fatalf("RemoveStaleTokenFile = %q, %v, %v; want %q, true, nil", got, removed, err, path)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale token file still there: %v", err)
	}
	if _, removed, err := RemoveStaleTokenFile(7); err != nil || removed {
		t.Fatalf("no file: removed %v, %v", removed, err)
	}
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, removed, err := RemoveStaleTokenFile(7); err == nil || removed || !strings.Contains(err.Error(), path) {
		t.Fatalf("a directory in its place: removed %v, %v", removed, err)
	}
}

func TestTokenFile(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "str")
	path := filepath.Join(dir, "broker-1.token")
	tok := NewToken()
	if len(tok) != 64 || tok == NewToken() {
		t.Fatalf("token %q", tok)
	}
	if err := WriteTokenFile(path, tok); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, path: 0o600} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	if got, err := ReadTokenFile(path); err != nil || got != tok {
		t.Fatalf("ReadTokenFile = %q, %v", got, err)
	}
	// A stale file is replaced.
	tok2 := NewToken()
	if err := WriteTokenFile(path, tok2); err != nil {
		t.Fatal(err)
	}
	// RemoveTokenFile leaves another broker's token alone.
	if err := RemoveTokenFile(path, tok); err != nil {
		t.Fatal(err)
	}
	if got, _ := ReadTokenFile(path); got != tok2 {
		t.Fatalf("RemoveTokenFile removed or changed another token: %q", got)
	}
	if err := RemoveTokenFile(path, tok2); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("token file still there: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left behind: %v", entries)
	}

	// A directory others can write to is refused (someone could swap the
	// file), and so is a symlink in its place.
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := WriteTokenFile(filepath.Join(open, "b.token"), tok); err == nil || !strings.Contains(err.Error(), "writable by no one else") {
		t.Fatalf("world-writable dir: %v", err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteTokenFile(filepath.Join(link, "b.token"), tok); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("symlinked dir: %v", err)
	}
}

func TestDefaultTokenFile(t *testing.T) {
	got := DefaultTokenFile(55554)
	if os.Geteuid() == 0 {
		if got != "/run/str/broker-55554.token" {
			t.Fatalf("as root: %s", got)
		}
	} else {
		t.Setenv("XDG_RUNTIME_DIR", "/run/user/1000")
		if got := DefaultTokenFile(55554); got != "/run/user/1000/str/broker-55554.token" {
			t.Fatalf("with XDG_RUNTIME_DIR: %s", got)
		}
		t.Setenv("XDG_RUNTIME_DIR", "")
		if got := DefaultTokenFile(7); got != filepath.Join(os.TempDir(), fmt.Sprintf("str-%d", os.Geteuid()), "broker-7.token") {
			t.Fatalf("without XDG_RUNTIME_DIR: %s", got)
		}
	}
	t.Setenv(TokenFileEnv, "/somewhere/else")
	if got := TokenFileFor(55554); got != "/somewhere/else" {
		t.Fatalf("TokenFileFor with %s set: %s", TokenFileEnv, got)
	}
}
