package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher/launchertest"
	"github.com/securetoolruntime/str/launcher/workdir"

	"github.com/securetoolruntime/str/internal/testfs"
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

// processIn reports whether a process of this test has dir as its
// working directory (the host double's tool runs in its work dir).
func processIn(dir string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && cwd == dir {
			return true
		}
	}
	return false
}

// TestResultBeforeCancelIsNotCancelled: a tool whose result is complete
// (and which has exited) before a cancel message, or before the end of
// the shutdown grace period, is answered with its result, never
// CANCELLED; in a cold sandbox and in a pooled one. The reply is held
// after the result by a status line the broker takes long to accept; the
// cancellation comes in that window.
func TestResultBeforeCancelIsNotCancelled(t *testing.T) {
	for _, c := range []struct{ how, tool string }{
		{"cancel message", "echo"}, {"shutdown", "echo"},
		{"cancel message", "remember"}, {"shutdown", "remember"},
	} {
		t.Run(c.how+" "+c.tool, func(t *testing.T) {
			var logs logBuffer
			sb := &statusBroker{release: make(chan struct{})}
			grace := func(c *Config) { c.ShutdownGrace = 100 * time.Millisecond }
			var h *harness
			if c.tool == "remember" { // warm: 2
				h = newWarmHarness(t, grace)
				sb.Transport = h.bus.Client("worker-warm", h.cfg.QueueName())
				var err error
				h.srv, err = New(Options{Config: h.cfg, Transport: sb, Sandboxes: launchertest.Sandboxes{}, Store: h.store, Logger: logs.logger()})
				must(t, err)
			} else {
				h = newExecHarness(t, grace, func(o *Options) {
					sb.Transport = o.Transport
					o.Transport = sb
					o.Logger = logs.logger()
				})
			}
			h.start()
			if c.tool == "remember" {
				waitPoolSize(t, h, "remember", 2)
			}
			id := h.send(c.tool, nil)
			// The call's work dir: its own, or a pooled sandbox's work
			// area (the one with a result).
			var dir string
			waitFor(t, "the result written", func() bool {
				for _, d := range append([]string{"task-" + id}, testfs.Names(h.cfg.WorkDir)...) {
					if _, err := os.Stat(filepath.Join(h.cfg.WorkDir, d, workdir.RunnerDirName, workdir.RunnerResultName)); err == nil {
						dir = filepath.Join(h.cfg.WorkDir, d)
						return true
					}
				}
				return false
			})
			waitFor(t, "the tool gone", func() bool { return !processIn(dir) })
			waitFor(t, "the status line waiting for the broker", func() bool { return sb.count() > 0 })
			switch c.how {
			case "cancel message":
				must(t, h.client.Publish(context.Background(), transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/cancel/" + id}))
				waitFor(t, "the cancel taken", func() bool { return strings.Contains(logs.String(), `"msg":"cancel requested"`) })
			case "shutdown":
				h.cancel()
				h.cancel = nil
				waitFor(t, "the grace period over", func() bool {
					return strings.Contains(logs.String(), "shutdown grace period over: stopping running tools")
				})
			}
			close(sb.release)
			r := h.reply(id)
			if res, ok := shapeResult(r); !ok || res["tool_result"] == nil {
				t.Fatalf("a result complete before the %s was answered %s", c.how, r)
			}
			if c.how == "shutdown" {
				select {
				case err := <-h.done:
					if err != nil {
						t.Errorf("Run: %v", err)
					}
				case <-time.After(30 * time.Second):
					t.Error("Run did not return")
				}
			}
		})
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
