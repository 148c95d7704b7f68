package e2e

import (
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
)

// Issue 15 §4, as it was seen: a worker restarted within about a second
// of the previous one, against a broker that drops a session by client
// id, reconnects, says "connected" and never receives a request again.
// The dev broker here behaves as the reference's (ReferenceSessions): the
// new worker B takes over the old worker A's client ids, and A's
// connections ending later make the broker forget B's session. B's probe
// (STR_BROKER_PROBE_*) notices, B re-establishes its session, and an
// agent's request is answered again.
func TestBrokerLivenessAfterRestartUnderSameID(t *testing.T) {
	requireRoot(t)
	srv := broker.NewServer(broker.Options{Anonymous: true, ReferenceSessions: true,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(t, srv.Listen("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close() })
	port := srv.Addr().(*net.TCPAddr).Port
	extra := map[string]string{"SAM_WORKER_ID": "liveness-worker",
		// Short, so the test is quick; nothing below waits on them.
		"STR_BROKER_PROBE_INTERVAL_MS": "100", "STR_BROKER_PROBE_TIMEOUT_MS": "2000"}

	a := startWorker(t, newEnv(t), port, extra)
	b := startWorker(t, newEnv(t), port, extra) // takes A's client ids over
	// A stops: its connections end, and the broker forgets B's session.
	// (Had A's own probe taken the ids back meanwhile, B would be
	// stranded already: deaf either way.)
	a.stop(syscall.SIGTERM)
	waitFor(t, "B to find its broker session deaf", 60*time.Second, func() bool {
		return b.metric("str_worker_broker_reestablished_total") >= 1
	})
	b.waitReady(true)
	if code, body := b.get("/readyz"); code != 200 || !strings.Contains(body, `"broker":"connected"`) {
		t.Fatalf("B /readyz %d %s", code, body)
	}

	// B serves again. A request can still be lost if the broker forgets
	// B's new session once more (it saw B's old connections end late): B
	// re-establishes again and the agent asks again, as a caller whose
	// request timed out would.
	ag := newAgent(t, port)
	deadline := time.Now().Add(90 * time.Second)
	for {
		id := ag.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "alive"}})
		select {
		case r := <-ag.replyChan(id):
			if !strings.Contains(string(r), "alive") {
				t.Fatalf("reply %s", r)
			}
			return
		case <-time.After(3 * time.Second): // a poll; the verdict is the deadline
		}
		if time.Now().After(deadline) {
			t.Fatalf("B never answered after A left: its broker session stayed deaf\n%s", tail(b.log.String(), 40))
		}
	}
}
