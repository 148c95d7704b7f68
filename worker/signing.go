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

// Request signing, scheme "str-sign-v2" with the shared secret
// (STR_SIGNING_SECRET) and "str-sign-v3" with a per-agent key of the keys
// file (STR_SIGNING_KEYS, auth.go); one of them is required whenever either
// is configured (the payload-only scheme of earlier versions is no longer
// accepted). The exact rules, for agent-side implementations, are in the
// documentation (docs/protocol.md, "Request signing").

// User properties that route or identify a request, covered by the
// signature besides the payload, the topic and the timestamp.
const (
	PropClientID = "clientId"
	PropUserID   = "userId"
	// PropKeyID names the key of STR_SIGNING_KEYS a request is signed
	// with (str-sign-v3); absent, the shared secret (str-sign-v2).
	PropKeyID = "keyId"
)

// SigningScheme is the first line of a string signed with the shared
// secret; SigningSchemeKeyed of one signed with a key of the keys file.
const (
	SigningScheme      = "str-sign-v2"
	SigningSchemeKeyed = "str-sign-v3"
)

// SigningWindow is how far a request's timestamp may be from the worker's
// clock, either way; a signature seen within it is not accepted again.
const SigningWindow = 5 * time.Minute

// SigningString is the exact byte string whose HMAC-SHA256 is the
// signature. Without a keyId property (str-sign-v2): eight lines joined by
// "\n" (no trailing newline): the scheme, the timestamp property, the
// topic, the replyTo, statusTo, clientId and userId properties ("" when
// absent), and the lowercase hex SHA-256 of the payload bytes (which holds
// the request id and params.user_id). With a keyId property
// (str-sign-v3): nine lines, "str-sign-v3", the keyId, then the same seven.
// ok is false when a field contains "\n" (such a request cannot be signed
// unambiguously and is refused).
func SigningString(topic string, props map[string]string, payload []byte) (s string, ok bool) {
	sum := sha256.Sum256(payload)
	fields := []string{SigningScheme}
	if kid, keyed := props[PropKeyID]; keyed {
		fields = []string{SigningSchemeKeyed, kid}
	}
	fields = append(fields, props[PropTimestamp], topic,
		props[PropReplyTo], props[PropStatusTo], props[PropClientID], props[PropUserID],
		hex.EncodeToString(sum[:]))
	for _, f := range fields {
		if strings.Contains(f, "\n") {
			return "", false
		}
	}
	return strings.Join(fields, "\n"), true
}

// SignMessage sets the timestamp (now, epoch milliseconds) and signature
// user properties of an invoke or cancel message (for clients such as str
// invoke). To sign with a key of a keys file, set the keyId property
// first and pass that key's secret.
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
// SigningWindow of now; the secret: the keyId property's key of the keys
// file (str-sign-v3), else the shared secret (str-sign-v2); no newline in
// a signed field; the HMAC (constant time); not a replay. It returns the
// key that verified it (nil for the shared secret). Every failure is
// AUTHENTICATION_FAILED.
func (s *Server) checkSignature(d *transport.Delivery, now time.Time) (*signingKey, *Error) {
	scheme := SigningScheme
	if _, keyed := d.UserProperties[PropKeyID]; keyed {
		scheme = SigningSchemeKeyed
	}
	fail := func(format string, a ...any) (*signingKey, *Error) {
		return nil, errorf(CodeAuthenticationFailed, "request signature ("+scheme+"): "+format, a...)
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
	// 3. the secret: the named key, or the shared one.
	var key *signingKey
	secret := s.cfg.SigningSecret
	if scheme == SigningSchemeKeyed {
		kid := props[PropKeyID]
		if s.auth.keys == nil {
			return fail("user property %q is %q, but this worker has no keys file (STR_SIGNING_KEYS)", PropKeyID, truncateName(kid))
		}
		if key = s.auth.keys.get().byID[kid]; key == nil {
			return fail("key %q is not in the keys file %s", truncateName(kid), s.auth.keys.path)
		}
		secret = key.Secret
	} else if secret == "" {
		return fail("user property %q missing: this worker accepts only requests signed with a key of its keys file", PropKeyID)
	}
	// 4. the HMAC over the signing string.
	str, ok := SigningString(d.Topic, props, d.Payload)
	if !ok {
		return fail("a signed field contains a newline")
	}
	want, _ := hex.DecodeString(hmacHex(secret, str))
	if !hmac.Equal(got, want) {
		return fail("does not match the payload, topic and user properties")
	}
	// 5. not seen before within the window.
	if !s.replays.first(strings.ToLower(sig), now) {
		return fail("replayed: this signature was already accepted")
	}
	return key, nil
}
