package worker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/securetoolruntime/str/worker/transport"
)

// statusBroker wraps a transport: status publishes wait for release to
// be closed (a broker that takes long) and then fail when fail is set (a
// broker that could not be reached for the whole wait); every status
// publish attempt is counted.
type statusBroker struct {
	transport.Transport
	release  chan struct{}
	fail     bool
	mu       sync.Mutex
	attempts int
}

func (b *statusBroker) Publish(ctx context.Context, m transport.Message) error {
	if !strings.Contains(m.Topic, "/status/") {
		return b.Transport.Publish(ctx, m)
	}
	b.mu.Lock()
	b.attempts++
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the broker connection: %w", ctx.Err())
	}
	if b.fail {
		return errors.New("waiting for the broker connection: context deadline exceeded")
	}
	return b.Transport.Publish(ctx, m)
}

func (b *statusBroker) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attempts
}

// TestStatusOutageEndsStatusPublishing: 100 status lines written while
// the broker cannot take them cost one wait for the broker, not 100: the
// first failed publish ends the task's status publishing, the lines are
// counted lost (str_worker_status_lines_lost_total), the failure is
// logged once, and the reply goes out.
func TestStatusOutageEndsStatusPublishing(t *testing.T) {
	var logs logBuffer
	sb := &statusBroker{release: make(chan struct{}), fail: true}
	close(sb.release) // each attempt fails at once: only the count matters
	h := newExecHarness(t, nil, func(o *Options) {
		sb.Transport = o.Transport
		o.Transport = sb
		o.Logger = logs.logger()
	})
	h.start()
	const n = 100
	id := h.send("many_lines", map[string]any{"args": map[string]any{"n": n}})
	if _, ok := shapeResult(h.reply(id)); !ok {
		t.Fatal("no result")
	}
	if got := sb.count(); got != 1 {
		t.Errorf("%d status publishes attempted during the outage, want 1 (each line waited for the broker)", got)
	}
	// The lines are counted before the reply is published.
	if m := metricsText(t, h); !strings.Contains(m, "str_worker_status_lines_lost_total "+strconv.Itoa(n)+"\n") {
		t.Errorf("want %d lost status lines:\n%s", n, grepLines(m, "status_lines"))
	}
	if got := strings.Count(logs.String(), "publishing a status line failed"); got != 1 {
		t.Errorf("the status failure logged %d times, want once", got)
	}
	if st := h.status(id); len(st) != 0 {
		t.Errorf("status lines published despite the failure: %q", st)
	}
}

// TestReplyLostIsCounted: a reply that never reaches the broker is logged
// and counted lost; one the broker refuses but whose replacing error
// reply is published is not lost (the agent has an answer).
func TestReplyLostIsCounted(t *testing.T) {
	saved := replyRetryWindow
	replyRetryWindow = 0 // the task's own deadline only
	t.Cleanup(func() { replyRetryWindow = saved })
	for _, c := range []struct {
		name           string
		always, refuse bool
		wantLost       int
	}{
		{"unreachable", true, false, 1},
		{"refused, error reply published", false, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs logBuffer
			h := newExecHarness(t, nil, func(o *Options) {
				o.Transport = &flakyTransport{Transport: o.Transport, always: c.always, refuse: c.refuse}
				o.Logger = logs.logger()
			})
			h.start()
			h.send("echo", map[string]any{"timeout_seconds": 0.1})
			m := waitMetric(t, h, `str_worker_invocations_total{outcome="reply_failed",tool="echo"} 1`)
			if want := fmt.Sprintf("str_worker_replies_lost_total %d\n", c.wantLost); !strings.Contains(m, want) {
				t.Errorf("want %q:\n%s", want, grepLines(m, "replies_lost"))
			}
			if got := strings.Count(logs.String(), "reply lost: the agent got no answer"); got != c.wantLost {
				t.Errorf("%d \"reply lost\" log lines, want %d:\n%s", got, c.wantLost, logs.String())
			}
		})
	}
}
