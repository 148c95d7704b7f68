package worker

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/worker/transport"
)

// Request signing, scheme "str-sign-v2" (required whenever
// STR_SIGNING_SECRET is set; the payload-only scheme of earlier versions is
// no longer accepted). The exact rules, for agent-side implementations,
// are in the package documentation (doc.go, "Request signing").

// User properties that route or identify a request, covered by the
// signature besides the payload, the topic and the timestamp.
const (
	PropClientID = "clientId"
	PropUserID   = "userId"
)

// SigningScheme is the first line of every signed string.
const SigningScheme = "str-sign-v2"

// SigningWindow is how far a request's timestamp may be from the worker's
// clock, either way; a signature seen within it is not accepted again.
const SigningWindow = 5 * time.Minute

// SigningString is the exact byte string whose HMAC-SHA256 is the
// signature: eight lines joined by "\n" (no trailing newline): the scheme,
// the timestamp property, the topic, the replyTo, statusTo, clientId and
// userId properties ("" when absent), and the lowercase hex SHA-256 of the
// payload bytes. ok is false when a field contains "\n" (such a request
// cannot be signed unambiguously and is refused).
func SigningString(topic string, props map[string]string, payload []byte) (s string, ok bool) {
	sum := sha256.Sum256(payload)
	fields := []string{
		SigningScheme, props[PropTimestamp], topic,
		props[PropReplyTo], props[PropStatusTo], props[PropClientID], props[PropUserID],
		hex.EncodeToString(sum[:]),
	}
	for _, f := range fields {
		if strings.Contains(f, "\n") {
			return "", false
		}
	}
	return strings.Join(fields, "\n"), true
}

// SignMessage sets the timestamp (now, epoch milliseconds) and signature
// user properties of an invoke message (for clients such as str invoke).
func SignMessage(secret string, m *transport.Message, now time.Time) {
	if m.UserProperties == nil {
		m.UserProperties = map[string]string{}
	}
	m.UserProperties[PropTimestamp] = strconv.FormatInt(now.UnixMilli(), 10)
	s, _ := SigningString(m.Topic, m.UserProperties, m.Payload)
	m.UserProperties[PropSignature] = hmacHex(secret, s)
}

func hmacHex(secret, s string) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(s))
	return hex.EncodeToString(mac.Sum(nil))
}

// replayGuard remembers the signatures accepted within SigningWindow.
type replayGuard struct {
	mu    sync.Mutex
	seen  map[string]time.Time // signature -> when it stops mattering
	sweep time.Time
}

func newReplayGuard() *replayGuard { return &replayGuard{seen: map[string]time.Time{}} }

// first records sig and reports whether it had not been seen (unexpired).
func (g *replayGuard) first(sig string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Sub(g.sweep) > time.Minute {
		for k, until := range g.seen {
			if now.After(until) {
				delete(g.seen, k)
			}
		}
		g.sweep = now
	}
	if until, ok := g.seen[sig]; ok && !now.After(until) {
		return false
	}
	// A timestamp is accepted up to SigningWindow either side of now, so
	// the same message could come back until 2 windows from now.
	g.seen[sig] = now.Add(2 * SigningWindow)
	return true
}

// checkSignature verifies one delivery against the scheme, in order:
// signature present and hex; timestamp present, an integer, within
// SigningWindow of now; no newline in a signed field; the HMAC (constant
// time); not a replay. Every failure is AUTHENTICATION_FAILED.
func (s *Server) checkSignature(d *transport.Delivery, now time.Time) *Error {
	fail := func(format string, a ...any) *Error {
		return errorf(CodeAuthenticationFailed, "request signature ("+SigningScheme+"): "+format, a...)
	}
	props := d.UserProperties
	// 1. the signature.
	sig := props[PropSignature]
	if sig == "" {
		return fail("user property %q missing", PropSignature)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return fail("user property %q is not 64 hex digits", PropSignature)
	}
	// 2. the timestamp, within the window.
	ts, err := strconv.ParseInt(props[PropTimestamp], 10, 64)
	if err != nil {
		return fail("user property %q missing or not epoch milliseconds", PropTimestamp)
	}
	if skew := now.Sub(time.UnixMilli(ts)); skew > SigningWindow || skew < -SigningWindow {
		return fail("timestamp %s is more than %s from the worker's clock (a replay, or clocks out of sync)",
			time.UnixMilli(ts).UTC().Format(time.RFC3339), SigningWindow)
	}
	// 3. the HMAC over the signing string.
	str, ok := SigningString(d.Topic, props, d.Payload)
	if !ok {
		return fail("a signed field contains a newline")
	}
	want, _ := hex.DecodeString(hmacHex(s.cfg.SigningSecret, str))
	if !hmac.Equal(got, want) {
		return fail("does not match the payload, topic and user properties")
	}
	// 4. not seen before within the window.
	if !s.replays.first(strings.ToLower(sig), now) {
		return fail("replayed: this signature was already accepted")
	}
	return nil
}
