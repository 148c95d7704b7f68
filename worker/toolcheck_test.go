package worker

import (
	"context"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/worker/transport"
)

// One bad manifest entry never takes the others down: the worker starts,
// serves the good entries, answers the bad one TOOL_NOT_AVAILABLE with
// the manifest's reason, and lists it on /readyz (200). A reload that
// breaks one more entry is applied the same way, and its repair too.
func TestUnavailableEntryServesTheOthers(t *testing.T) {
	h := newHarness(t, nil)
	broken := testManifest + "  bad_runtime: {runtime: node, module: testtools, function: echo}\n" +
		"  typo: {module: testtools, function: echo, timeout_second: 5}\n"
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(broken), 0o644))
	h.start()

	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Fatal("a good tool beside bad entries is not served")
	}
	code, msg := errorCode(t, h.reply(h.send("bad_runtime", nil)))
	if code != "TOOL_NOT_AVAILABLE" || !strings.Contains(msg, `tools.bad_runtime.runtime: "node" is not supported`) {
		t.Errorf("bad entry answered %s %q, want TOOL_NOT_AVAILABLE with the manifest's reason", code, msg)
	}
	status, body := readyz(t, h)
	if status != http.StatusOK || !body.OK {
		t.Errorf("/readyz %d %+v, want 200: a bad entry does not make the worker unready", status, body)
	}
	if !strings.Contains(body.Unavailable["typo"], `unknown field "timeout_second"`) || !strings.Contains(body.Unavailable["bad_runtime"], "runtime") {
		t.Errorf("/readyz unavailable_tools %v", body.Unavailable)
	}
	// The bad entry's topic stays subscribed: asked again, answered again.
	if code, _ := errorCode(t, h.reply(h.send("bad_runtime", nil))); code != "TOOL_NOT_AVAILABLE" {
		t.Errorf("second call of the bad entry: %s", code)
	}

	// A reload breaking "plain": applied, plain unavailable, echo serves.
	rewrite := func(content string) {
		must(t, os.WriteFile(h.cfg.ManifestPath+".tmp", []byte(content), 0o644))
		must(t, os.Rename(h.cfg.ManifestPath+".tmp", h.cfg.ManifestPath))
	}
	rewrite(strings.Replace(broken, "plain: {module: testtools, function: plain}", "plain: {module: testtools, function: plain, warm: 99}", 1))
	waitFor(t, "plain listed unavailable", func() bool {
		_, b := readyz(t, h)
		return strings.Contains(b.Unavailable["plain"], "tools.plain.warm: 99 is not between 0 and 16")
	})
	code, msg = errorCode(t, h.reply(h.send("plain", map[string]any{"args": map[string]any{"message": "m"}})))
	if code != "TOOL_NOT_AVAILABLE" || !strings.Contains(msg, "warm: 99") {
		t.Errorf("plain after the breaking reload: %s %q", code, msg)
	}
	if _, ok := shapeResult(h.reply(h.send("echo", nil))); !ok {
		t.Fatal("echo not served after another entry broke")
	}
	// Repaired: served again.
	rewrite(broken)
	waitFor(t, "plain repaired", func() bool {
		_, b := readyz(t, h)
		_, bad := b.Unavailable["plain"]
		return !bad
	})
	if _, ok := shapeResult(h.reply(h.send("plain", map[string]any{"args": map[string]any{"message": "m"}}))); !ok {
		t.Fatal("plain not served after its repair")
	}
}

// blockingNotices is a transport whose publishes on init and removed
// topics wait until released: a broker that is slow for notices.
type blockingNotices struct {
	transport.Transport
	release chan struct{}
	once    sync.Once
	blocked chan struct{} // closed at the first blocked publish
}

func (b *blockingNotices) Publish(ctx context.Context, m transport.Message) error {
	if strings.Contains(m.Topic, "/sam_remote_tool/init/") || strings.Contains(m.Topic, "/sam_remote_tool/removed/") {
		b.once.Do(func() { close(b.blocked) })
		select {
		case <-b.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return b.Transport.Publish(ctx, m)
}

// A broker that does not take the notices holds neither the receive loop
// nor a reload: calls are answered and a reload (whose removal notice
// waits too) is applied; released, the notices follow in order.
func TestNoticesDoNotBlock(t *testing.T) {
	h, _ := newInitHarness(t)
	tr := &blockingNotices{Transport: h.bus.Client("worker", h.cfg.QueueName()), release: make(chan struct{}), blocked: make(chan struct{})}
	h.rebuild(h.srv.sb, tr)
	h.start()
	<-tr.blocked // the first start-up broadcast waits for the broker
	// The receive loop answers a call (the stub runner refuses it: any
	// reply will do).
	if code, _ := errorCode(t, h.reply(h.send("fn", nil))); code != "EXECUTION_ERROR" {
		t.Fatalf("call answered %s, want the stub's EXECUTION_ERROR", code)
	}
	// A reload dropping fn and adding fn2 is applied: fn2 answers.
	updated := strings.Replace(initManifest, "  fn: {", "  fn2: {", 1)
	must(t, os.WriteFile(h.cfg.ManifestPath+".tmp", []byte(updated), 0o644))
	must(t, os.Rename(h.cfg.ManifestPath+".tmp", h.cfg.ManifestPath))
	waitFor(t, "fn2 served", func() bool {
		select {
		case r := <-h.replyChan(h.send("fn2", nil)):
			code, _ := errorCode(t, r)
			return code == "EXECUTION_ERROR"
		case <-time.After(time.Second): // not subscribed yet: no answer; ask again
			return false
		}
	})
	// Released: the notices queued meanwhile arrive.
	close(tr.release)
	seen := map[string]bool{}
	for len(seen) < 5 {
		topic, _ := h.nextNotice("the queued notices")
		seen[strings.TrimPrefix(topic, h.cfg.Base()+"/sam_remote_tool/")] = true
	}
	for _, want := range []string{"init/dyn", "init/fn", "init/schema_only", "removed/fn", "init/fn2"} {
		if !seen[want] {
			t.Errorf("notice %s not seen (seen %v)", want, seen)
		}
	}
}
