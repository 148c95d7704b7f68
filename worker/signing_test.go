package worker

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/worker/transport"
)

// sendSigned publishes an invoke signed with secret at now (str-sign-v2);
// tamper, when set, changes the message after signing.
func (h *harness) sendSigned(tool, id string, payload []byte, secret string, now time.Time, tamper func(*transport.Message)) {
	h.t.Helper()
	base := h.cfg.Base()
	m := transport.Message{Topic: base + "/sam_remote_tool/invoke/" + tool, Payload: payload, UserProperties: map[string]string{
		PropReplyTo: base + "/sam_remote_tool/response/app/" + id, PropStatusTo: base + "/sam_remote_tool/status/app/" + id,
		PropClientID: "app", PropUserID: "u1",
	}}
	SignMessage(secret, &m, now)
	if tamper != nil {
		tamper(&m)
	}
	must(h.t, h.client.Publish(context.Background(), m))
}

// TestSigningStringExact pins the signed string byte for byte (the
// scheme agents implement from docs/protocol.md).
func TestSigningStringExact(t *testing.T) {
	got, ok := SigningString("ns/a2a/v1/sam_remote_tool/invoke/echo", map[string]string{
		PropTimestamp: "1700000000000", PropReplyTo: "r", PropStatusTo: "", PropClientID: "c", PropUserID: "u", "other": "x",
	}, []byte("{}"))
	want := "str-sign-v2\n1700000000000\nns/a2a/v1/sam_remote_tool/invoke/echo\nr\n\nc\nu\n" +
		"44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a" // sha256("{}")
	if !ok || got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
	if _, ok := SigningString("t", map[string]string{PropReplyTo: "a\nb"}, nil); ok {
		t.Fatal("a newline in a signed field was accepted")
	}
	// HMAC-SHA256 with key "k" over want, computed with Python's hmac:
	// hmac.new(b"k", s, hashlib.sha256).hexdigest()
	if got := hmacHex("k", want); got != "16bd9e4bc7842597eaaa9f96ccea8c991e942b45653f81fa886f04f5cb119e20" {
		t.Fatalf("hmac %s", got)
	}
}

// TestSigningV2: issue 9 item 4. The signature covers the routing and
// identifying user properties and a timestamp; a replay within the window,
// a stale timestamp and any changed property are AUTHENTICATION_FAILED.
// Issue 16 §2: such a request is not answered (its replyTo is not
// authenticated): the refusal is logged and counted only.
func TestSigningV2(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SigningSecret = "s3cret" })
	h.start()
	payload := func(id string) []byte {
		return []byte(`{"jsonrpc":"2.0","id":"` + id + `","method":"sam_remote_tool/invoke","params":{"task_id":"t-` + id + `","tool_name":"echo","app_name":"a","user_id":"u1","session_id":"s"}}`)
	}
	// A correctly signed request is served.
	h.sendSigned("echo", "good", payload("good"), "s3cret", time.Now(), nil)
	if _, ok := shapeResult(h.reply("good")); !ok {
		t.Fatal("a correctly signed request was refused")
	}
	cases := []struct {
		name   string
		now    time.Time
		tamper func(*transport.Message)
	}{
		{"replyTo redirected", time.Now(), func(m *transport.Message) {
			m.UserProperties[PropReplyTo] = strings.Replace(m.UserProperties[PropReplyTo], "/app/", "/app/x", 1)
		}},
		{"statusTo redirected", time.Now(), func(m *transport.Message) { m.UserProperties[PropStatusTo] += "x" }},
		{"clientId changed", time.Now(), func(m *transport.Message) { m.UserProperties[PropClientID] = "other" }},
		{"userId changed", time.Now(), func(m *transport.Message) { m.UserProperties[PropUserID] = "victim" }},
		{"timestamp changed", time.Now(), func(m *transport.Message) { m.UserProperties[PropTimestamp] += "1" }},
		{"stale", time.Now().Add(-SigningWindow - time.Minute), nil},
		{"from the future", time.Now().Add(SigningWindow + time.Minute), nil},
		{"no timestamp", time.Now(), func(m *transport.Message) { delete(m.UserProperties, PropTimestamp) }},
		{"payload-only v1 signature", time.Now(), func(m *transport.Message) {
			m.UserProperties[PropSignature] = hmacHex("s3cret", string(m.Payload))
		}},
		{"unknown keyId", time.Now(), func(m *transport.Message) { m.UserProperties[PropKeyID] = "k1" }},
	}
	// An exact replay of an accepted message.
	m := transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/invoke/echo", Payload: payload("once"), UserProperties: map[string]string{
		PropReplyTo: h.cfg.Base() + "/sam_remote_tool/response/app/once", PropUserID: "u1", PropClientID: "app"}}
	SignMessage("s3cret", &m, time.Now())
	must(t, h.client.Publish(context.Background(), m))
	if reply := h.reply("once"); !isResult(reply) {
		t.Fatalf("first delivery refused: %s", reply)
	}
	before := metricValue(t, h, `str_worker_errors_total{code="AUTHENTICATION_FAILED"}`)
	for i, c := range cases {
		id := fmt.Sprintf("bad%d", i)
		h.sendSigned("echo", id, payload(id), "s3cret", c.now, c.tamper)
	}
	must(t, h.client.Publish(context.Background(), m)) // the replay
	want := before + float64(len(cases)+1)
	waitFor(t, "every bad signature counted", func() bool {
		return metricValue(t, h, `str_worker_errors_total{code="AUTHENTICATION_FAILED"}`) == want
	})
	// The refusals were counted in the receive loop, before the next
	// request; a good request's reply comes after anything they published.
	h.sendSigned("echo", "after", payload("after"), "s3cret", time.Now(), nil)
	h.reply("after")
	for i, c := range cases {
		for _, id := range []string{fmt.Sprintf("bad%d", i), fmt.Sprintf("xbad%d", i), "once"} {
			if n := len(h.replyChan(id)); n != 0 {
				t.Errorf("%s: %d replies published to the unauthenticated replyTo %s", c.name, n, id)
			}
		}
	}
}

func isResult(reply []byte) bool {
	_, ok := shapeResult(reply)
	return ok
}
