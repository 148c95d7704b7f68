package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/worker/transport"
)

// sendID is h.send with the request id chosen by the caller (its reply
// topic is known before it is sent) and the requester's user id.
func sendID(h *harness, id, user, tool string, params map[string]any) {
	p := map[string]any{"task_id": "task-" + id, "tool_name": tool, "app_name": "app", "user_id": user, "session_id": "s1"}
	for k, v := range params {
		p[k] = v
	}
	payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": MethodInvoke, "params": p})
	h.sendRaw(tool, id, payload, nil)
}

// replyTopic is the reply topic h.sendRaw gives request id.
func replyTopic(h *harness, id string) string {
	return h.cfg.Base() + "/sam_remote_tool/response/app/" + id
}

// noReplyYet fails when id has been answered.
func noReplyYet(t *testing.T, h *harness, id, when string) {
	t.Helper()
	select {
	case r := <-h.replyChan(id):
		t.Fatalf("%s: %s was answered while its publish is stalled: %.200s", when, id, r)
	default:
	}
}

// TestStalledRejectionHoldsNothing: the broker does not take the answer
// to one requester's refused call (its publish stalls, decided under the
// dispatch lock); meanwhile the manifest is reloaded (which takes that
// lock) and another requester's call to the new tool is received, run
// and answered. Only then is the stalled publish released, and that same
// publish delivers the refusal. Before the outbox, the receive loop
// published the refusal itself, holding the lock: nothing else was
// received until the publish gave up (30 s), and the refusal was lost.
func TestStalledRejectionHoldsNothing(t *testing.T) {
	h := newHarness(t, nil)
	logs := h.rebuild(nil, nil)
	h.start()
	// 1. A's refusal (an unknown sandbox profile: refused in dispatch
	// step 8, under s.mu) is stalled in the broker.
	a := nextID()
	entered, release := h.bus.Stall(replyTopic(h, a))
	defer release()
	sendID(h, a, "user-a", "echo", map[string]any{"sandbox_profile": "no-such-profile"})
	if topic := <-entered; topic != replyTopic(h, a) {
		t.Fatalf("stalled publish to %s", topic)
	}
	// 2. A reload adds a tool, and B calls it: answered.
	m, err := os.ReadFile(h.cfg.ManifestPath)
	must(t, err)
	must(t, os.WriteFile(h.cfg.ManifestPath, append(m, "  echo_added: {module: testtools, function: echo}\n"...), 0o644))
	waitFor(t, "the reload applied", func() bool {
		h.srv.mu.RLock()
		defer h.srv.mu.RUnlock()
		return h.srv.manifest.Tools["echo_added"] != nil
	})
	b := nextID()
	sendID(h, b, "user-b", "echo_added", nil)
	if _, ok := shapeResult(h.reply(b)); !ok {
		t.Fatal("B's call: no result")
	}
	// 3. A's publish is still the stalled one: nothing delivered, nothing
	// given up.
	noReplyYet(t, h, a, "after B's answer")
	if strings.Contains(logs.String(), "reply lost") {
		t.Fatalf("A's refusal was given up while stalled:\n%s", grepLines(logs.String(), "reply lost"))
	}
	release()
	if code, msg := errorCode(t, h.reply(a)); code != "INVALID_REQUEST" || !strings.Contains(msg, "no-such-profile") {
		t.Fatalf("A's refusal: %s %q", code, msg)
	}
}

// TestStalledCancelAnswerHoldsNothing: a queued call is cancelled and its
// CANCELLED answer stalls in the broker; meanwhile the receive loop takes
// another requester's call, and a cancel of the running call that freed
// the only executor, and that call is run and answered. Only then is the
// stalled answer released, and it arrives. Before, the receive loop ran
// the queued call's answer itself (retrying for at least 30 s): nothing
// else was received meanwhile, and the answer was lost.
func TestStalledCancelAnswerHoldsNothing(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.MaxConcurrent = 1 })
	h.start()
	// 1. the only executor busy, A queued behind it, A's answer stalled.
	running := nextID()
	sendID(h, running, "user-r", "sleeper", map[string]any{"args": map[string]any{"seconds": 600}})
	waitFor(t, "the tool running", func() bool { return len(h.status(running)) > 0 })
	a := nextID()
	entered, release := h.bus.Stall(replyTopic(h, a))
	defer release()
	sendID(h, a, "user-a", "echo", nil)
	waitFor(t, "A queued", func() bool { _, ok := h.srv.inflight.Load("id:" + a); return ok })
	cancel := func(id string) {
		must(t, h.client.Publish(context.Background(), transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/cancel/" + id}))
	}
	cancel(a)
	if topic := <-entered; topic != replyTopic(h, a) {
		t.Fatalf("stalled publish to %s", topic)
	}
	// 2. B queued, the running call cancelled: B runs and is answered.
	b := nextID()
	sendID(h, b, "user-b", "echo", nil)
	cancel(running)
	if code, _ := errorCode(t, h.reply(running)); code != "CANCELLED" {
		t.Fatalf("the running call: %s", code)
	}
	if _, ok := shapeResult(h.reply(b)); !ok {
		t.Fatal("B's call: no result")
	}
	// 3. A's answer is still the stalled publish; released, it arrives.
	noReplyYet(t, h, a, "after B's answer")
	release()
	if code, _ := errorCode(t, h.reply(a)); code != "CANCELLED" {
		t.Fatalf("A: %s", code)
	}
}

// TestOutboxOrderAndBounds: one destination's messages are published in
// the order posted, each reported sent after its publish; a destination
// the broker stalls holds neither the others nor post; the number of
// destinations waiting is bounded (post refuses one more, and takes it
// again once a writer has finished).
func TestOutboxOrderAndBounds(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	o := h.srv.out
	base := h.cfg.Base() + "/sam_remote_tool/response/app/"
	sent := make(chan string, 16)
	note := func(what string) func(error) {
		return func(err error) {
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
			sent <- what
		}
	}
	// 1. every reply topic stalled; outboxMaxDests destinations waiting:
	// the bound is reached.
	entered, release := h.bus.Stall(base + "*")
	defer release()
	for i := range outboxMaxDests {
		if !o.post(fmt.Sprintf("%sstalled-%d", base, i), []byte(`{"n":0}`), func(error) {}) {
			t.Fatalf("post to destination %d refused below the bound", i)
		}
	}
	<-entered
	if o.post(base+"one-more", []byte(`{}`), note("one-more")) {
		t.Fatalf("post to destination %d accepted beyond the bound", outboxMaxDests+1)
	}
	// A destination already waiting still takes more (its queue grows).
	if !o.post(base+"stalled-0", []byte(`{"n":1}`), func(error) {}) {
		t.Fatal("post to a waiting destination refused")
	}
	// 2. released: every writer ends; a new destination is taken again,
	// and its messages go out in order.
	release()
	waitFor(t, "the writers to finish", func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		return len(o.dests) == 0 && o.bytes == 0
	})
	for i := range 5 {
		if !o.post(base+"ordered", []byte(fmt.Sprintf(`{"n":%d}`, i)), note(fmt.Sprint(i))) {
			t.Fatalf("post %d refused", i)
		}
	}
	for i := range 5 {
		if got := <-sent; got != fmt.Sprint(i) {
			t.Fatalf("sent %s, want %d", got, i)
		}
		var doc struct{ N int }
		must(t, json.Unmarshal(h.reply("ordered"), &doc))
		if doc.N != i {
			t.Fatalf("delivered n=%d, want %d", doc.N, i)
		}
	}
}
