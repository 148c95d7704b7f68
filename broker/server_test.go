package broker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker/brokertest"
	"golang.org/x/sys/unix"
)

// testLogger discards log output unless -v is given.
var testLogger = brokertest.Logger

func startServer(t *testing.T, opts Options) *Server {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	if opts.Token == "" {
		opts.Anonymous = true
	}
	s := NewServer(opts)
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// raw is brokertest's hand-speaking connection.
type raw = brokertest.Raw

func dialRaw(t *testing.T, addr net.Addr) *raw { return brokertest.Dial(t, addr) }

var same = brokertest.Same

func errorCode(t *testing.T, what string, got map[string]any, code string) {
	t.Helper()
	if got["status"] != StatusError || got["error_code"] != code {
		t.Fatalf("%s: got %v, want status ERROR with %s", what, got, code)
	}
	if msg, ok := got["error_message"].(string); !ok || msg == "" {
		t.Fatalf("%s: no error_message in %v", what, got)
	}
	if len(got) != 3 {
		t.Fatalf("%s: want exactly status, error_code, error_message; got %v", what, got)
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestSpecExchange replays a whole agent/worker exchange with the exact
// request lines of spec §10 (Python's json.dumps spacing included) and
// checks every response field by field.
func TestSpecExchange(t *testing.T) {
	s := startServer(t, Options{})
	worker := dialRaw(t, s.Addr())
	agent := dialRaw(t, s.Addr())

	errorCode(t, "RECEIVE before CONNECT", worker.Do(`{"cmd": "RECEIVE", "timeout_ms": 10}`), CodeNotConnected)

	same(t, "worker CONNECT", worker.Do(`{"cmd": "CONNECT", "client_id": "sandbox-worker-001", "queue_name": "ns/q/sandbox/sandbox-worker-001", "subscriptions": ["ns/a2a/v1/sam_remote_tool/invoke/echo_tool", "ns/a2a/v1/discovery/>"]}`),
		map[string]any{"status": "OK", "client_id": "sandbox-worker-001"})
	same(t, "agent CONNECT", agent.Do(`{"cmd":"CONNECT","client_id":"agent-1","queue_name":"q-agent-1","subscriptions":["ns/a2a/v1/sam_remote_tool/response/agent-1/>"]}`),
		map[string]any{"status": "OK", "client_id": "agent-1"})

	invoke := `{"cmd": "PUBLISH", "topic": "ns/a2a/v1/sam_remote_tool/invoke/echo_tool", "payload": {"jsonrpc": "2.0", "id": "r-1", "method": "sam_remote_tool/invoke", "params": {"tool_name": "echo_tool", "args": {"message": "hi <&>"}}}, "user_properties": {"replyTo": "ns/a2a/v1/sam_remote_tool/response/agent-1/c-1", "statusTo": "ns/a2a/v1/sam_remote_tool/status/agent-1/c-1", "timestamp": 1700000000123}}`
	pub := agent.Do(invoke)
	if len(pub) != 2 || pub["status"] != "OK" || !uuidRE.MatchString(fmt.Sprint(pub["message_id"])) {
		t.Fatalf("PUBLISH response %v, want status OK and a UUID message_id only", pub)
	}

	var req map[string]any
	dec := json.NewDecoder(strings.NewReader(invoke))
	dec.UseNumber()
	if err := dec.Decode(&req); err != nil {
		t.Fatal(err)
	}
	same(t, "worker RECEIVE", worker.Do(`{"cmd": "RECEIVE", "timeout_ms": 2000}`), map[string]any{
		"status": "OK",
		"message": map[string]any{
			"message_id":      pub["message_id"],
			"topic":           "ns/a2a/v1/sam_remote_tool/invoke/echo_tool",
			"payload":         req["payload"],
			"user_properties": req["user_properties"],
		},
	})
	same(t, "worker ACK", worker.Do(fmt.Sprintf(`{"cmd": "ACK", "message_id": %q}`, pub["message_id"])), map[string]any{"status": "OK"})
	same(t, "worker RECEIVE nothing", worker.Do(`{"cmd": "RECEIVE", "timeout_ms": 20}`), map[string]any{"status": "TIMEOUT"})

	// The worker's reply: a second connection of the worker publishes.
	workerPub := dialRaw(t, s.Addr())
	same(t, "worker publisher CONNECT", workerPub.Do(`{"cmd": "CONNECT", "client_id": "sandbox-worker-001-pub", "queue_name": "", "subscriptions": []}`),
		map[string]any{"status": "OK", "client_id": "sandbox-worker-001-pub"})
	reply := `{"cmd": "PUBLISH", "topic": "ns/a2a/v1/sam_remote_tool/response/agent-1/c-1", "payload": {"jsonrpc": "2.0", "id": "r-1", "result": {"ok": true}}, "user_properties": {}}`
	if r := workerPub.Do(reply); r["status"] != "OK" {
		t.Fatalf("reply PUBLISH: %v", r)
	}
	got := agent.Do(`{"cmd": "RECEIVE"}`) // default timeout_ms
	msg, _ := got["message"].(map[string]any)
	if got["status"] != "OK" || msg["topic"] != "ns/a2a/v1/sam_remote_tool/response/agent-1/c-1" ||
		!reflect.DeepEqual(msg["user_properties"], map[string]any{}) {
		t.Fatalf("agent RECEIVE: %v", got)
	}

	same(t, "SUBSCRIBE", agent.Do(`{"cmd": "SUBSCRIBE", "topic_pattern": "ns/a2a/v1/sam_remote_tool/status/agent-1/>"}`), map[string]any{"status": "OK"})
	same(t, "UNSUBSCRIBE", agent.Do(`{"cmd": "UNSUBSCRIBE", "topic_pattern": "ns/a2a/v1/sam_remote_tool/status/agent-1/>"}`), map[string]any{"status": "OK"})
	same(t, "DISCONNECT", agent.Do(`{"cmd": "DISCONNECT"}`), map[string]any{"status": "OK"})
	agent.ExpectEOF()
}

func TestCONNECTWithoutClientID(t *testing.T) {
	s := startServer(t, Options{})
	c := dialRaw(t, s.Addr())
	r := c.Do(`{"cmd":"CONNECT"}`)
	if r["status"] != "OK" || !uuidRE.MatchString(fmt.Sprint(r["client_id"])) || len(r) != 2 {
		t.Fatalf("CONNECT without client_id: %v, want a generated UUID", r)
	}
}

// TestInvalidCommands sends garbage of every kind and checks each gets
// INVALID_COMMAND (or NOT_CONNECTED, in the reference's order of checks)
// while the connection keeps working.
func TestInvalidCommands(t *testing.T) {
	s := startServer(t, Options{})
	c := dialRaw(t, s.Addr())

	errorCode(t, "bad JSON before CONNECT", c.Do(`{"cmd": "CONNECT",`), CodeInvalidCommand)
	errorCode(t, "unknown cmd before CONNECT", c.Do(`{"cmd": "FROB"}`), CodeNotConnected)
	errorCode(t, "lower-case connect", c.Do(`{"cmd": "connect", "client_id": "x"}`), CodeNotConnected)
	errorCode(t, "client_id not a string", c.Do(`{"cmd": "CONNECT", "client_id": 7}`), CodeInvalidCommand)
	errorCode(t, "subscriptions not strings", c.Do(`{"cmd": "CONNECT", "client_id": "x", "subscriptions": [1]}`), CodeInvalidCommand)
	errorCode(t, "empty subscription", c.Do(`{"cmd": "CONNECT", "client_id": "x", "subscriptions": [""]}`), CodeInvalidCommand)
	if r := c.Do(`{"cmd": "CONNECT", "client_id": "x", "subscriptions": ["t/>"]}`); r["status"] != "OK" {
		t.Fatalf("CONNECT: %v", r)
	}

	for _, bad := range []struct{ what, line string }{
		{"truncated JSON", `{"cmd": "PUBLISH", "topic": "t/a"`},
		{"not JSON", `hello`},
		{"empty line", ``},
		{"array", `[1, 2]`},
		{"null", `null`},
		{"string", `"RECEIVE"`},
		{"unknown cmd", `{"cmd": "FROB"}`},
		{"missing cmd", `{"topic": "t/a"}`},
		{"cmd not a string", `{"cmd": 5}`},
		{"PUBLISH without topic", `{"cmd": "PUBLISH", "payload": {}}`},
		{"PUBLISH topic not a string", `{"cmd": "PUBLISH", "topic": ["t"]}`},
		{"PUBLISH user_properties not an object", `{"cmd": "PUBLISH", "topic": "t/a", "user_properties": [1]}`},
		{"SUBSCRIBE without topic_pattern", `{"cmd": "SUBSCRIBE"}`},
		{"UNSUBSCRIBE empty topic_pattern", `{"cmd": "UNSUBSCRIBE", "topic_pattern": ""}`},
		{"RECEIVE timeout_ms not a number", `{"cmd": "RECEIVE", "timeout_ms": "10"}`},
		{"invalid UTF-8", "{\"cmd\": \"PUBLISH\", \"topic\": \"t/\xff\"}"},
	} {
		errorCode(t, bad.what, c.Do(bad.line), CodeInvalidCommand)
	}

	// The connection still works: it receives what another client
	// publishes.
	other := dialRaw(t, s.Addr())
	if r := other.Do(`{"cmd": "CONNECT", "client_id": "y", "subscriptions": []}`); r["status"] != "OK" {
		t.Fatal(r)
	}
	if r := other.Do(`{"cmd": "PUBLISH", "topic": "t/a", "payload": "still here"}`); r["status"] != "OK" {
		t.Fatal(r)
	}
	r := c.Do(`{"cmd": "RECEIVE", "timeout_ms": 2000}`)
	if m, _ := r["message"].(map[string]any); r["status"] != "OK" || m["payload"] != "still here" {
		t.Fatalf("RECEIVE after garbage: %v", r)
	}
	// An absent payload is null and absent user_properties are {}.
	if r := other.Do(`{"cmd": "PUBLISH", "topic": "t/b"}`); r["status"] != "OK" {
		t.Fatal(r)
	}
	r = c.Do(`{"cmd": "RECEIVE", "timeout_ms": 2000}`)
	m, _ := r["message"].(map[string]any)
	if p, ok := m["payload"]; !ok || p != nil || !reflect.DeepEqual(m["user_properties"], map[string]any{}) {
		t.Fatalf("RECEIVE of a bare PUBLISH: %v", r)
	}
}

func TestLineTooLong(t *testing.T) {
	s := startServer(t, Options{MaxLineBytes: 1024})
	c := dialRaw(t, s.Addr())
	if r := c.Do(`{"cmd": "CONNECT", "client_id": "x", "subscriptions": ["t"]}`); r["status"] != "OK" {
		t.Fatal(r)
	}
	long := `{"cmd": "PUBLISH", "topic": "t", "payload": "` + strings.Repeat("a", 200<<10) + `"}`
	errorCode(t, "200 KiB line", c.Do(long), CodeInvalidCommand)
	over := `{"cmd":"FROB","pad":"` + strings.Repeat("b", 1025-23) + `"}`
	if len(over) != 1025 {
		t.Fatalf("test bug: line is %d bytes", len(over))
	}
	errorCode(t, "1025-byte line", c.Do(over), CodeInvalidCommand)
	// Exactly at the limit is accepted (and is an unknown command).
	atLimit := `{"cmd":"FROB","pad":"` + strings.Repeat("b", 1024-23) + `"}`
	if len(atLimit) != 1024 {
		t.Fatalf("test bug: line is %d bytes", len(atLimit))
	}
	r := c.Do(atLimit)
	if r["error_code"] != CodeInvalidCommand || !strings.Contains(fmt.Sprint(r["error_message"]), "Unknown command") {
		t.Fatalf("1024-byte line: %v", r)
	}
	same(t, "after long lines", c.Do(`{"cmd": "RECEIVE", "timeout_ms": 0}`), map[string]any{"status": "TIMEOUT"})
}

// connectRaw opens a connection and CONNECTs it.
func connectRaw(t *testing.T, s *Server, id, queue string, subs ...string) *raw {
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

// TestRouting checks the wildcards and the no-echo rule. Negative checks
// need no waiting: delivery happens inside PUBLISH, so a message that was
// wrongly routed would already be queued when RECEIVE with timeout 0 runs.
func TestRouting(t *testing.T) {
	s := startServer(t, Options{})
	pub := connectRaw(t, s, "pub", "", "t/>")
	star := connectRaw(t, s, "star", "", "t/*/c")
	rest := connectRaw(t, s, "rest", "", "t/a/>")
	exact := connectRaw(t, s, "exact", "", "t/a/c")
	literal := connectRaw(t, s, "literal", "", "t/a*")

	pub.Publish("t/a/c", "1")
	for _, c := range []*raw{star, rest, exact} {
		if p, topic := c.Next(); p != "1" || topic != "t/a/c" {
			t.Fatalf("got %v on %s", p, topic)
		}
	}
	literal.ExpectEmpty("t/a* is literal for the dev broker")
	pub.ExpectEmpty("publisher must not get its own message")

	pub.Publish("t/a", "2")
	for _, c := range []*raw{star, rest, exact, literal} {
		c.ExpectEmpty("t/a matches none of */c, a/>, a/c, a*")
	}
	pub.Publish("t/a*", "3")
	if p, _ := literal.Next(); p != "3" {
		t.Fatalf("literal got %v", p)
	}
	pub.Publish("t/a/b/c", "4")
	if p, _ := rest.Next(); p != "4" {
		t.Fatalf("rest got %v", p)
	}
	star.ExpectEmpty("* is one level")

	// Another client publishing reaches "pub".
	exact.Publish("t/x", "5")
	if p, _ := pub.Next(); p != "5" {
		t.Fatalf("pub got %v", p)
	}

	// SUBSCRIBE and UNSUBSCRIBE take effect for the next PUBLISH.
	same(t, "SUBSCRIBE", star.Do(`{"cmd": "SUBSCRIBE", "topic_pattern": "u/*"}`), map[string]any{"status": "OK"})
	same(t, "UNSUBSCRIBE", star.Do(`{"cmd": "UNSUBSCRIBE", "topic_pattern": "t/*/c"}`), map[string]any{"status": "OK"})
	pub.Publish("t/b/c", "6")
	pub.Publish("u/v", "7")
	if p, topic := star.Next(); p != "7" {
		t.Fatalf("star got %v on %s, want 7 (t/*/c was unsubscribed)", p, topic)
	}
}

func TestQueueGroups(t *testing.T) {
	s := startServer(t, Options{})
	pub := connectRaw(t, s, "agent", "")
	var members []*raw
	for i := range 3 {
		members = append(members, connectRaw(t, s, fmt.Sprintf("worker-%d", i), "pool", "jobs/>"))
	}
	solo := []*raw{
		connectRaw(t, s, "solo-1", "queue-solo-1", "jobs/>"),
		connectRaw(t, s, "solo-2", "", "jobs/*"),
	}
	for i := range 30 {
		pub.Publish("jobs/run", i)
	}
	// Members asking in turn get one each from the group's queue.
	seen := make(map[string]int)
	for range 10 {
		for _, m := range members {
			p, _ := m.Next()
			seen[fmt.Sprint(p)]++
		}
	}
	for i, m := range members {
		m.ExpectEmpty(fmt.Sprintf("member %d after the group's 30", i))
	}
	if len(seen) != 30 {
		t.Fatalf("the group saw %d distinct messages, want 30: %v", len(seen), seen)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("message %s went to the group %d times", k, n)
		}
	}
	for _, c := range solo {
		for i := range 30 {
			if p, _ := c.Next(); fmt.Sprint(p) != fmt.Sprint(i) {
				t.Fatalf("unique-queue client got %v, want %d", p, i)
			}
		}
		c.ExpectEmpty("unique-queue client after 30")
	}
	// A member that leaves stops getting work; the others share it.
	members[2].Do(`{"cmd": "DISCONNECT"}`)
	waitFor(t, "worker-2 forgotten", func() bool { return !s.Connected("worker-2") })
	for i := range 4 {
		pub.Publish("jobs/run", 100+i)
	}
	for range 2 {
		for _, m := range members[:2] {
			m.Next()
		}
	}
	for _, m := range members[:2] {
		m.ExpectEmpty("after 2 each")
	}
}

func TestQueueBoundDropsOldest(t *testing.T) {
	s := startServer(t, Options{QueueSize: 3})
	pub := connectRaw(t, s, "p", "")
	sub := connectRaw(t, s, "s", "", "t")
	for i := range 5 {
		pub.Publish("t", i)
	}
	for _, want := range []string{"2", "3", "4"} {
		if p, _ := sub.Next(); fmt.Sprint(p) != want {
			t.Fatalf("got %v, want %s (oldest two dropped)", p, want)
		}
	}
	sub.ExpectEmpty("after the 3 kept")
}

// waitFor polls cond (for state another goroutine changes) for up to 3 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForWithin(t, 3*time.Second, what, cond)
}

// waitForWithin is waitFor with a bound of d, for conditions that take
// the machine's effort (a flood in progress).
func waitForWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDisconnectCleansUp(t *testing.T) {
	s := startServer(t, Options{})
	pub := connectRaw(t, s, "p", "")

	a1 := connectRaw(t, s, "a", "", "t")
	pub.Publish("t", "queued")
	same(t, "DISCONNECT", a1.Do(`{"cmd": "DISCONNECT"}`), map[string]any{"status": "OK"})
	a1.ExpectEOF()
	waitFor(t, "client a forgotten", func() bool { return !s.Connected("a") })

	// Back under the same id without subscriptions: nothing old remains.
	pub.Publish("t", "lost")
	a3 := connectRaw(t, s, "a", "")
	pub.Publish("t", "also lost")
	a3.ExpectEmpty("the old subscription and queue are gone")
}

// TestReceiveAbortedByPeerClose checks that a RECEIVE whose connection died
// sends nothing and leaves the client gone (the message it would have
// taken goes with the client, which no other connection shares).
func TestReceiveAbortedByPeerClose(t *testing.T) {
	s := startServer(t, Options{})
	pub := connectRaw(t, s, "p", "")
	a1 := connectRaw(t, s, "a", "", "t")
	a1.Send(`{"cmd": "RECEIVE", "timeout_ms": 60000}`)
	a1.NC.Close()
	waitFor(t, "a1 gone", func() bool { return s.Stats().Conns == 1 && !s.Connected("a") })
	pub.Publish("t", "for nobody")
	a2 := connectRaw(t, s, "a", "", "t")
	a2.ExpectEmpty("a new connection under the id starts empty")
}

func TestCloseEndsEverything(t *testing.T) {
	s := NewServer(Options{Logger: testLogger(t), Anonymous: true})
	if err := s.Listen("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c := connectRaw(t, s, "a", "", "t")
	c.Send(`{"cmd": "RECEIVE", "timeout_ms": 60000}`)
	waitFor(t, "connection registered", func() bool { return s.Stats().Conns == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	c.ExpectEOF()
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Listen("127.0.0.1:0"); err == nil {
		t.Fatal("Listen after Close succeeded")
	}
}

func TestUnterminatedLastLine(t *testing.T) {
	s := startServer(t, Options{})
	c := dialRaw(t, s.Addr())
	if _, err := io.WriteString(c.NC, `{"cmd": "CONNECT", "client_id": "x"}`); err != nil {
		t.Fatal(err)
	}
	c.NC.(*net.TCPConn).CloseWrite()
	same(t, "CONNECT without newline at EOF", c.Read(), map[string]any{"status": "OK", "client_id": "x"})
}

// FuzzRequest feeds arbitrary request lines to a connected session and
// checks that each gets a well-formed reply (or, for a RECEIVE cut short by
// the peer leaving, none) and never a panic.
func FuzzRequest(f *testing.F) {
	for _, seed := range []string{
		`{"cmd": "PUBLISH", "topic": "t/a", "payload": {"x": [1, 2.5, null]}, "user_properties": {"n": 1}}`,
		`{"cmd": "SUBSCRIBE", "topic_pattern": "t/>"}`,
		`{"cmd": "UNSUBSCRIBE", "topic_pattern": "t/*"}`,
		`{"cmd": "RECEIVE", "timeout_ms": 1e308}`,
		`{"cmd": "RECEIVE", "timeout_ms": -1}`,
		`{"cmd": "CONNECT", "client_id": "other", "subscriptions": ["t/>"]}`,
		`{"cmd": "CONNECT", "subscriptions": null, "queue_name": null}`,
		`{"cmd": "ACK"}`,
		`{"cmd": "DISCONNECT"}`,
		`{"cmd": "PUBLISH", "topic": "t", "user_properties": "x"}`,
		`{"cmd": {"a": 1}}`,
		`{`, `[]`, `null`, `0`, "\xff", ``,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s := NewServer(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), QueueSize: 4, Anonymous: true})
		gone := make(chan struct{})
		close(gone) // the peer has left: a RECEIVE must not wait
		c := &conn{gone: gone}
		log := s.log
		if r, _ := s.handle(c, line{data: []byte(`{"cmd":"CONNECT","client_id":"me","subscriptions":["t/>"]}`)}, log); r.Status != StatusOK {
			t.Fatalf("setup CONNECT: %+v", r)
		}
		peer := &conn{gone: gone}
		if r, _ := s.handle(peer, line{data: []byte(`{"cmd":"CONNECT","client_id":"peer"}`)}, log); r.Status != StatusOK {
			t.Fatalf("setup CONNECT: %+v", r)
		}
		s.handle(peer, line{data: []byte(`{"cmd":"PUBLISH","topic":"t/x","payload":1}`)}, log)

		resp, _ := s.handle(c, line{data: data}, log)
		if resp == nil {
			var req struct{ Cmd string }
			if json.Unmarshal(data, &req) != nil || req.Cmd != CmdReceive {
				t.Fatalf("no reply to %q", data)
			}
			return
		}
		out, err := EncodeLine(resp)
		if err != nil {
			t.Fatalf("reply to %q does not encode: %v", data, err)
		}
		var back map[string]any
		if err := json.Unmarshal(out, &back); err != nil || out[len(out)-1] != '\n' || bytes.Count(out, []byte("\n")) != 1 {
			t.Fatalf("reply to %q is not one JSON line: %q", data, out)
		}
		switch resp.Status {
		case StatusOK, StatusTimeout:
		case StatusError:
			switch resp.ErrorCode {
			case CodeInvalidCommand, CodeNotConnected, CodeInternalError:
			default:
				t.Fatalf("reply to %q has error code %q", data, resp.ErrorCode)
			}
		default:
			t.Fatalf("reply to %q has status %q", data, resp.Status)
		}
	})
}

// ReferenceSessions reproduces the reference broker's client-id handling:
// a second CONNECT under a connected id takes it over, and the first
// connection's end then forgets the id, which now belongs to the second:
// that one stays connected (RECEIVE answers) and gets nothing more.
// Without the option the second CONNECT is refused.
func TestReferenceSessionsStrandAndForget(t *testing.T) {
	s := startServer(t, Options{ReferenceSessions: true})
	pub := connectRaw(t, s, "p", "")
	old := connectRaw(t, s, "w", "", "t")
	fresh := connectRaw(t, s, "w", "", "t") // takes "w" over
	pub.Publish("t", 1)
	if p, _ := fresh.Next(); fmt.Sprint(p) != "1" {
		t.Fatalf("the connection holding the id got %v", p)
	}
	old.ExpectEmpty("the stranded connection")
	conns := s.Stats().Conns
	old.NC.Close()
	waitFor(t, "the broker to see the old connection end", func() bool { return s.Stats().Conns < conns })
	pub.Publish("t", 2)
	fresh.ExpectEmpty("the connection whose id the old one's end forgot (deaf)")
	if s.Connected("w") {
		t.Fatal(`"w" is still registered`)
	}

	strict := startServer(t, Options{})
	connectRaw(t, strict, "w", "", "t")
	second := dialRaw(t, strict.Addr())
	errorCode(t, "second CONNECT without ReferenceSessions",
		second.Do(`{"cmd": "CONNECT", "client_id": "w", "subscriptions": ["t"]}`), CodeNotConnected)
}

// TestQueueGroupSharedQueue: a queue group's messages wait in one queue
// for whichever member asks, so a member that stops asking (busy,
// stopped, cut off) takes nothing more, and what it never took is there
// for the others, also after it has gone. A group's queue goes with its
// last member.
func TestQueueGroupSharedQueue(t *testing.T) {
	s := startServer(t, Options{})
	pub := connectRaw(t, s, "agent", "")
	busy := connectRaw(t, s, "worker-busy", "pool", "jobs/>")
	idle := connectRaw(t, s, "worker-idle", "pool", "jobs/>")
	other := connectRaw(t, s, "worker-other-tools", "pool", "other/>")
	for i := range 6 {
		pub.Publish("jobs/run", i)
	}
	// One member takes all six, in order, while the other never asks.
	for i := range 6 {
		if p, _ := idle.Next(); fmt.Sprint(p) != fmt.Sprint(i) {
			t.Fatalf("worker-idle got %v, want %d", p, i)
		}
	}
	busy.ExpectEmpty("worker-busy after worker-idle took all six")
	other.ExpectEmpty("a member whose subscriptions match none of them")

	// Messages held for the group outlive the member that leaves.
	for i := range 3 {
		pub.Publish("jobs/run", 10+i)
	}
	same(t, "DISCONNECT", idle.Do(`{"cmd": "DISCONNECT"}`), map[string]any{"status": "OK"})
	waitFor(t, "worker-idle forgotten", func() bool { return !s.Connected("worker-idle") })
	for i := range 3 {
		if p, _ := busy.Next(); fmt.Sprint(p) != fmt.Sprint(10+i) {
			t.Fatalf("worker-busy got %v, want %d", p, 10+i)
		}
	}

	// A message the first member does not match waits for one that does.
	pub.Publish("other/x", "o")
	busy.ExpectEmpty("worker-busy does not match other/x")
	if p, _ := other.Next(); p != "o" {
		t.Fatalf("worker-other-tools got %v", p)
	}

	// A RECEIVE already waiting is woken by the publish.
	got := make(chan any, 1)
	go func() {
		p, _ := busy.Next()
		got <- p
	}()
	time.Sleep(100 * time.Millisecond) // let the RECEIVE start waiting (the test holds either way)
	pub.Publish("jobs/run", "late")
	if p := <-got; p != "late" {
		t.Fatalf("waiting RECEIVE got %v", p)
	}

	// The last member leaving takes the group's queue with it.
	pub.Publish("jobs/run", "orphan")
	for _, c := range []*raw{busy, other} {
		same(t, "DISCONNECT", c.Do(`{"cmd": "DISCONNECT"}`), map[string]any{"status": "OK"})
	}
	waitFor(t, "group gone", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.groups) == 0
	})
	again := connectRaw(t, s, "worker-new", "pool", "jobs/>")
	again.ExpectEmpty("a new member of a group that had ended")
}

// TestVanishedPeerDetection: every accepted connection has TCP keep-alive
// and TCP_USER_TIMEOUT set, so a peer that vanishes without closing (its
// host cut off the network) frees its client_id in bounded time.
func TestVanishedPeerDetection(t *testing.T) {
	s := startServer(t, Options{})
	connectRaw(t, s, "w", "")
	var nc net.Conn
	waitFor(t, "the connection registered", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for c := range s.conns {
			nc = c.nc
		}
		return nc != nil
	})
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	rc.Control(func(fd uintptr) {
		for name, opt := range map[string][2]int{
			"SO_KEEPALIVE":     {unix.SOL_SOCKET, unix.SO_KEEPALIVE},
			"TCP_KEEPIDLE":     {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
			"TCP_KEEPINTVL":    {unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
			"TCP_USER_TIMEOUT": {unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
		} {
			v, err := unix.GetsockoptInt(int(fd), opt[0], opt[1])
			if err != nil {
				t.Errorf("getsockopt %s: %v", name, err)
			}
			got[name] = v
		}
	})
	want := map[string]int{"SO_KEEPALIVE": 1, "TCP_KEEPIDLE": int(peerIdle.Seconds()),
		"TCP_KEEPINTVL": int(peerProbeInterval.Seconds()), "TCP_USER_TIMEOUT": int(peerUserTimeout.Milliseconds())}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s = %d, want %d", name, got[name], w)
		}
	}
}

// TestDuplicatePublishRoutedOnce: a PUBLISH again under a publish_id the
// same client_id used (a retry whose first answer was lost) is answered
// with the first message_id and not routed again, also on the client's
// next connection; another client's same publish_id, and a PUBLISH with
// none, are routed as usual.
func TestDuplicatePublishRoutedOnce(t *testing.T) {
	s := startServer(t, Options{})
	sub := connectRaw(t, s, "sub", "", "t/>")
	pub := connectRaw(t, s, "pub", "")
	line := `{"cmd": "PUBLISH", "topic": "t/reply", "payload": 1, "publish_id": "r-1"}`
	first := pub.Do(line)
	again := pub.Do(line)
	if first["status"] != "OK" || again["status"] != "OK" || first["message_id"] != again["message_id"] {
		t.Fatalf("first %v, again %v: want OK twice with one message_id", first, again)
	}
	if p, _ := sub.Next(); fmt.Sprint(p) != "1" {
		t.Fatalf("got %v", p)
	}
	sub.ExpectEmpty("the retried PUBLISH")

	// The retry on the publisher's next connection.
	same(t, "DISCONNECT", pub.Do(`{"cmd": "DISCONNECT"}`), map[string]any{"status": "OK"})
	waitFor(t, "pub forgotten", func() bool { return !s.Connected("pub") })
	pub = connectRaw(t, s, "pub", "")
	if r := pub.Do(line); r["message_id"] != first["message_id"] {
		t.Fatalf("retry on a new connection: %v, want message_id %v", r, first["message_id"])
	}
	sub.ExpectEmpty("the PUBLISH retried on a new connection")

	// Another client's publish_id is its own; no publish_id, no check.
	other := connectRaw(t, s, "other", "")
	other.Do(`{"cmd": "PUBLISH", "topic": "t/reply", "payload": 2, "publish_id": "r-1"}`)
	pub.Do(`{"cmd": "PUBLISH", "topic": "t/reply", "payload": 3}`)
	pub.Do(`{"cmd": "PUBLISH", "topic": "t/reply", "payload": 3}`)
	for _, want := range []string{"2", "3", "3"} {
		if p, _ := sub.Next(); fmt.Sprint(p) != want {
			t.Fatalf("got %v, want %s", p, want)
		}
	}

	// Bounded: an over-long publish_id is refused.
	long := fmt.Sprintf(`{"cmd": "PUBLISH", "topic": "t/reply", "payload": 4, "publish_id": %q}`, strings.Repeat("x", MaxPublishIDBytes+1))
	if r := pub.Do(long); r["status"] != "ERROR" || r["error_code"] != CodeInvalidCommand {
		t.Fatalf("a %d-byte publish_id: %v", MaxPublishIDBytes+1, r)
	}
}

// TestRecentPublishesBounded: the duplicate check keeps each client's
// last recentPerClient publish_ids, for at most recentClientsMax clients,
// the least lately used dropped first; one client's traffic never pushes
// out another's.
func TestRecentPublishesBounded(t *testing.T) {
	var r recentPublishes
	r.add("quiet", "q-1", "m-q")
	for i := range recentPerClient + 10 {
		r.add("busy", fmt.Sprint(i), fmt.Sprint(i))
	}
	if ring := r.clients["busy"]; len(ring.ids) != recentPerClient {
		t.Fatalf("%d ids kept for busy, want %d", len(ring.ids), recentPerClient)
	}
	if _, ok := r.seen("busy", "0"); ok {
		t.Fatal("busy's oldest publish_id is still remembered")
	}
	if id, ok := r.seen("busy", fmt.Sprint(recentPerClient+9)); !ok || id != fmt.Sprint(recentPerClient+9) {
		t.Fatalf("busy's newest: %q %v", id, ok)
	}
	if id, ok := r.seen("quiet", "q-1"); !ok || id != "m-q" {
		t.Fatal("another client's traffic pushed out quiet's publish_id")
	}
	r.add("quiet", "q-2", "m-q2") // quiet used after busy: busy is the least lately used
	for i := range recentClientsMax - 1 {
		r.add(fmt.Sprint("c", i), "x", "y")
	}
	if len(r.clients) != recentClientsMax {
		t.Fatalf("%d clients kept, want %d", len(r.clients), recentClientsMax)
	}
	if _, ok := r.seen("busy", fmt.Sprint(recentPerClient+9)); ok {
		t.Fatal("the least lately used client's ring was kept over the bound")
	}
	if _, ok := r.seen("quiet", "q-2"); !ok {
		t.Fatal("a lately used client's ring was dropped")
	}
}
