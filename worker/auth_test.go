package worker

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/memory"
)

// invokeAs publishes an invoke of tool with id as the agent app: params
// (user_id, app_name, …) over the defaults, props over the default user
// properties (replyTo and statusTo of agent "app", clientId "app",
// userId = params.user_id; "" deletes), signed by sign when given.
func (h *harness) invokeAs(tool, id string, params map[string]any, props map[string]string, sign func(*transport.Message)) {
	h.t.Helper()
	p := map[string]any{"task_id": "task-" + id, "tool_name": tool, "app_name": "app", "user_id": "u1", "session_id": "s1"}
	for k, v := range params {
		p[k] = v
	}
	payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": MethodInvoke, "params": p})
	base := h.cfg.Base()
	up := map[string]string{PropReplyTo: base + "/sam_remote_tool/response/app/" + id,
		PropStatusTo: base + "/sam_remote_tool/status/app/" + id, PropClientID: "app", PropUserID: fmt.Sprint(p["user_id"])}
	for k, v := range props {
		if v == "" {
			delete(up, k)
		} else {
			up[k] = v
		}
	}
	m := transport.Message{Topic: base + "/sam_remote_tool/invoke/" + tool, Payload: payload, UserProperties: up}
	if sign != nil {
		sign(&m)
	}
	must(h.t, h.client.Publish(context.Background(), m))
}

// cancelAs publishes a cancel of id with props, signed by sign when given.
func (h *harness) cancelAs(id string, props map[string]string, sign func(*transport.Message)) {
	h.t.Helper()
	m := transport.Message{Topic: h.cfg.Base() + "/sam_remote_tool/cancel/" + id, Payload: []byte(`{}`), UserProperties: props}
	if m.UserProperties == nil {
		m.UserProperties = map[string]string{}
	}
	if sign != nil {
		sign(&m)
	}
	must(h.t, h.client.Publish(context.Background(), m))
}

func withSecret(secret string) func(*transport.Message) {
	return func(m *transport.Message) { SignMessage(secret, m, time.Now()) }
}

func withKey(id, secret string) func(*transport.Message) {
	return func(m *transport.Message) {
		m.UserProperties[PropKeyID] = id
		SignMessage(secret, m, time.Now())
	}
}

const authFailed = `str_worker_errors_total{code="AUTHENTICATION_FAILED"}`

// waitCounted waits until the AUTHENTICATION_FAILED counter reaches n.
func (h *harness) waitCounted(n float64) {
	h.t.Helper()
	waitFor(h.t, fmt.Sprintf("%v authentication failures counted", n), func() bool { return metricValue(h.t, h, authFailed) == n })
}

// noReply checks that nothing was published to the reply topics of ids
// (call after a later request's reply: the refusals came before it).
func (h *harness) noReply(ids ...string) {
	h.t.Helper()
	for _, id := range ids {
		if n := len(h.replyChan(id)); n != 0 {
			h.t.Errorf("%d replies published on %s's reply topic: %s", n, id, <-h.replyChan(id))
		}
	}
}

// TestSignedIdentityBinding: issue 16 §1. With signing on, a request whose
// signed userId is mallory and whose params.user_id is alice does not run
// (it did). Its signature is valid and its replyTo its agent's, so the
// refusal is answered there. A signed clientId that is not the agent of
// replyTo (or statusTo) is refused without an answer: the reply topics
// are not the signer's.
func TestSignedIdentityBinding(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SigningSecret = "s3cret" })
	h.start()
	h.invokeAs("echo", "alice-ok", map[string]any{"user_id": "alice"}, nil, withSecret("s3cret"))
	if r := h.reply("alice-ok"); !isResult(r) {
		t.Fatalf("a correctly signed request was refused: %s", r)
	}
	for i, c := range []struct {
		name  string
		props map[string]string
		want  string
	}{
		{"signed userId mallory, params alice", map[string]string{PropUserID: "mallory"}, `"userId" ("mallory") is not params.user_id ("alice")`},
		{"no userId", map[string]string{PropUserID: ""}, `"userId" ("") is not params.user_id`},
	} {
		id := fmt.Sprintf("bind%d", i)
		h.invokeAs("echo", id, map[string]any{"user_id": "alice"}, c.props, withSecret("s3cret"))
		code, msg := errorCode(t, h.reply(id))
		if code != "AUTHENTICATION_FAILED" || !strings.Contains(msg, c.want) {
			t.Errorf("%s: %s %q, want AUTHENTICATION_FAILED containing %q", c.name, code, msg, c.want)
		}
	}
	h.invokeAs("echo", "other-agent", map[string]any{"user_id": "alice"}, map[string]string{PropClientID: "other"}, withSecret("s3cret"))
	h.invokeAs("echo", "other-status", map[string]any{"user_id": "alice"},
		map[string]string{PropStatusTo: h.cfg.Base() + "/sam_remote_tool/status/other/x"}, withSecret("s3cret"))
	h.waitCounted(4)
	h.invokeAs("echo", "after", map[string]any{"user_id": "alice"}, nil, withSecret("s3cret"))
	h.reply("after")
	h.noReply("other-agent", "other-status")
}

// TestReplyTopicsRefused: issue 16 §2. replyTo and statusTo must be reply
// topics of the protocol in this namespace. An unsigned invoke whose
// replyTo was a victim's cancel topic made the worker cancel the victim
// itself; now it is refused, logged and acked, and nothing is published.
func TestReplyTopicsRefused(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	base := h.cfg.Base()
	victim := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 3}})
	waitFor(t, "the victim running", func() bool { return len(h.status(victim)) > 0 })
	// The attack: a malformed request (answered at once) whose replyTo is
	// the victim's cancel topic.
	h.sendRaw("echo", "attack", []byte(`{"jsonrpc":"2.0","id":"attack"}`), map[string]string{
		PropReplyTo: base + "/sam_remote_tool/cancel/" + victim})
	if r := h.reply(victim); !isResult(r) {
		t.Fatalf("the victim was not served (cancelled through the worker's own reply?): %s", r)
	}
	refused := []map[string]string{
		{PropReplyTo: base + "/sam_remote_tool/invoke/echo"},
		{PropReplyTo: base + "/sam_remote_tool/init_request/echo"},
		{PropReplyTo: "other/ns/a2a/v1/sam_remote_tool/response/app/x"},
		{PropReplyTo: base + "/sam_remote_tool/response/app"},
		{PropReplyTo: base + "/sam_remote_tool/response/app//x"},
		{PropReplyTo: base + "/sam_remote_tool/response/*/x"},
		{PropStatusTo: base + "/sam_remote_tool/cancel/" + victim},
		{PropStatusTo: base + "/sam_remote_tool/response/app/x"},
	}
	for i, props := range refused {
		h.sendRaw("echo", fmt.Sprintf("r%d", i), []byte(`{"jsonrpc":"2.0","id":"r"}`), props)
	}
	waitFor(t, "every refusal counted", func() bool {
		return metricValue(t, h, `str_worker_errors_total{code="INVALID_REQUEST"}`) == float64(len(refused)+1)
	})
	ok := h.send("echo", nil)
	if r := h.reply(ok); !isResult(r) {
		t.Fatalf("a request with protocol reply topics refused: %s", r)
	}
	h.noReply("r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "x")
}

// TestForeignDuplicateID: issue 16 §2. A request copying a live
// request's id and replyTo from another requester is refused without a
// word to that replyTo (it got the victim an INVALID_REQUEST error).
func TestForeignDuplicateID(t *testing.T) {
	h := newHarness(t, nil)
	h.start()
	victim := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 2}})
	waitFor(t, "the victim running", func() bool { return len(h.status(victim)) > 0 })
	h.invokeAs("echo", victim, map[string]any{"user_id": "mallory", "task_id": "mallory-task"}, nil, nil)
	if r := h.reply(victim); !isResult(r) {
		t.Fatalf("the victim's first reply is not its result: %s", r)
	}
	h.noReply(victim)
	// The same requester's duplicate is still answered.
	again := h.send("sleeper", map[string]any{"args": map[string]any{"seconds": 2}})
	waitFor(t, "running", func() bool { return len(h.status(again)) > 0 })
	h.invokeAs("echo", again, map[string]any{"task_id": "other-task"}, nil, nil)
	if code, _ := errorCode(t, h.reply(again)); code != "INVALID_REQUEST" {
		t.Fatalf("own duplicate: %s", code)
	}
	h.reply(again)
}

// TestCancelIdentity: issue 16 §2. With signing on, a cancel is honoured
// only when signed as the requester that started the task.
func TestCancelIdentity(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.SigningSecret = "s3cret" })
	h.start()
	sleeper := map[string]any{"user_id": "alice", "args": map[string]any{"seconds": 2}}
	h.invokeAs("sleeper", "v1", sleeper, nil, withSecret("s3cret"))
	waitFor(t, "the victim running", func() bool { return len(h.status("v1")) > 0 })
	h.cancelAs("v1", nil, nil)                                                                            // unsigned
	h.cancelAs("v1", map[string]string{PropUserID: "mallory", PropClientID: "app"}, withSecret("s3cret")) // another user
	h.cancelAs("v1", map[string]string{PropUserID: "alice"}, withSecret("wrong"))                         // forged
	h.waitCounted(3)
	if r := h.reply("v1"); !isResult(r) {
		t.Fatalf("a foreign cancel was honoured: %s", r)
	}
	h.invokeAs("sleeper", "v2", map[string]any{"user_id": "alice", "args": map[string]any{"seconds": 60}}, nil, withSecret("s3cret"))
	waitFor(t, "running", func() bool { return len(h.status("v2")) > 0 })
	h.cancelAs("v2", map[string]string{PropUserID: "alice", PropClientID: "app"}, withSecret("s3cret"))
	if code, _ := errorCode(t, h.reply("v2")); code != "CANCELLED" {
		t.Fatalf("the requester's own cancel: %s", code)
	}
}

const keysFileV1 = `version: 1
keys:
  - id: orders
    secret: orders-secret-0123456789abcdef0123456789
    apps: [app]
    users: ["*@orders.example"]
    tools: [echo]
  - id: ops
    secret: ops-secret-0123456789abcdef0123456789abcd
    apps: ["*"]
    users: ["*"]
    tools: ["*"]
`

// TestSigningKeys: issue 16 §1. Per-agent keys: a key claims only its
// apps, users and tools (a leaked agent key is not every user's); the
// key id is signed; the file is reloaded on change; the shared secret
// still works beside it.
func TestSigningKeys(t *testing.T) {
	var keys string
	h := newHarness(t, func(c *Config) {
		keys = filepath.Join(t.TempDir(), "keys.yaml")
		must(t, os.WriteFile(keys, []byte(keysFileV1), 0o600))
		c.SigningKeys = keys
		c.SigningSecret = "shared"
	})
	h.start()
	orders := withKey("orders", "orders-secret-0123456789abcdef0123456789")
	h.invokeAs("echo", "k-ok", map[string]any{"user_id": "bob@orders.example"}, nil, orders)
	if r := h.reply("k-ok"); !isResult(r) {
		t.Fatalf("a request within its key's claims was refused: %s", r)
	}
	h.invokeAs("echo", "s-ok", nil, nil, withSecret("shared"))
	if r := h.reply("s-ok"); !isResult(r) {
		t.Fatalf("the shared secret no longer works: %s", r)
	}
	// Answered: signed with a known key, claiming what it may not.
	for i, c := range []struct {
		params map[string]any
		props  map[string]string
		tool   string
		want   string
	}{
		{map[string]any{"user_id": "alice@bank.example"}, nil, "echo", `may not claim params.user_id "alice@bank.example"`},
		{map[string]any{"user_id": "bob@orders.example", "app_name": "billing"}, nil, "echo", `may not claim params.app_name "billing"`},
		{map[string]any{"user_id": "bob@orders.example"}, nil, "plain", `may not claim tool "plain"`},
	} {
		id := fmt.Sprintf("claim%d", i)
		h.invokeAs(c.tool, id, c.params, c.props, orders)
		reply := h.reply(id)
		if code, msg := errorCode(t, reply); code != "AUTHENTICATION_FAILED" || !strings.Contains(msg, c.want) {
			t.Errorf("%d: %s %q, want %q", i, code, msg, c.want)
		}
	}
	// Not answered: another agent's reply topics (the key's apps do not
	// hold it), the key id changed after signing (the id is signed), an
	// unknown key, the shared secret under a key id.
	h.invokeAs("echo", "claim3", map[string]any{"user_id": "bob@orders.example", "app_name": "billing"}, map[string]string{
		PropReplyTo: h.cfg.Base() + "/sam_remote_tool/response/billing/claim3", PropStatusTo: "", PropClientID: "billing"}, orders)
	h.invokeAs("echo", "swap", map[string]any{"user_id": "alice@bank.example"}, nil, func(m *transport.Message) {
		orders(m)
		m.UserProperties[PropKeyID] = "ops"
	})
	h.invokeAs("echo", "unknown", nil, nil, withKey("nobody", "orders-secret-0123456789abcdef0123456789"))
	h.invokeAs("echo", "sharedkey", nil, nil, withKey("orders", "shared"))
	h.waitCounted(7)
	// Reload: the orders key is revoked, a new one added.
	must(t, os.WriteFile(keys+".new", []byte(strings.Replace(keysFileV1, "id: orders", "id: orders-2", 1)), 0o600))
	must(t, os.Rename(keys+".new", keys))
	h.invokeAs("echo", "revoked", map[string]any{"user_id": "bob@orders.example"}, nil, orders)
	h.waitCounted(8)
	h.invokeAs("echo", "rotated", map[string]any{"user_id": "bob@orders.example"}, nil,
		withKey("orders-2", "orders-secret-0123456789abcdef0123456789"))
	if r := h.reply("rotated"); !isResult(r) {
		t.Fatalf("the reloaded key was refused: %s", r)
	}
	h.noReply("claim3", "swap", "unknown", "sharedkey", "revoked")
	// A broken file keeps the last good keys.
	must(t, os.WriteFile(keys, []byte("version: 1\nkeys: [{id: x}]\n"), 0o600))
	h.invokeAs("echo", "kept", map[string]any{"user_id": "bob@orders.example"}, nil,
		withKey("orders-2", "orders-secret-0123456789abcdef0123456789"))
	if r := h.reply("kept"); !isResult(r) {
		t.Fatalf("a broken keys file dropped the last good keys: %s", r)
	}
}

func TestParseKeyRingProblems(t *testing.T) {
	_, err := parseKeyRing([]byte(`version: 2
keys:
  - id: a
    secret: short
    apps: []
    users: ["["]
    tools: ["*"]
  - id: a
    secret: 0123456789abcdef0123456789abcdef
    apps: [x]
    users: [x]
    tools: [x]
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"version 2", `key "a": secret shorter`, `key "a": apps empty`, `users pattern "["`, `key "a": listed twice`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q missing from %v", want, err)
		}
	}
	if _, err := parseKeyRing([]byte("version: 1\nkeys: []\nextra: 1\n")); err == nil || !strings.Contains(err.Error(), "extra") {
		t.Errorf("unknown field: %v", err)
	}
}

// ---- user tokens

type issuer struct {
	kid  string
	alg  jose.SignatureAlgorithm
	priv crypto.Signer
}

func newIssuers(t *testing.T) []issuer {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(t, err)
	_, edk, err := ed25519.GenerateKey(rand.Reader)
	must(t, err)
	return []issuer{{"rsa-1", jose.RS256, rk}, {"ec-1", jose.ES256, ek}, {"ed-1", jose.EdDSA, edk}}
}

func (i issuer) mint(t *testing.T, claims map[string]any) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", i.kid)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: i.alg, Key: i.priv}, opts)
	must(t, err)
	tok, err := jwt.Signed(s).Claims(claims).Serialize()
	must(t, err)
	return tok
}

func jwksOf(t *testing.T, iss []issuer) []byte {
	var set jose.JSONWebKeySet
	for _, i := range iss {
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: i.priv.Public(), KeyID: i.kid, Algorithm: string(i.alg), Use: "sig"})
	}
	b, err := json.Marshal(set)
	must(t, err)
	return b
}

func pemOf(t *testing.T, iss []issuer) []byte {
	var out []byte
	for _, i := range iss {
		der, err := x509.MarshalPKIXPublicKey(i.priv.Public())
		must(t, err)
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}
	return out
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func claimsFor(user string, d time.Duration) map[string]any {
	return map[string]any{"sub": user, "aud": "str-workers", "iss": "https://idp.example",
		"exp": time.Now().Add(d).Unix(), "iat": time.Now().Unix(), "email": user + "@example.com"}
}

// TestUserTokenVerify: issue 16 §1, the reference's enterprise mode.
// Tokens minted with the test's own RSA, ECDSA and Ed25519 keys, from a
// JWK Set and from PEM; expired, wrong audience, wrong issuer key, alg
// none and HS256 keyed with the public key are refused.
func TestUserTokenVerify(t *testing.T) {
	iss := newIssuers(t)
	others := newIssuers(t)
	for _, form := range []struct {
		name string
		data []byte
	}{{"jwks", jwksOf(t, iss)}, {"pem", pemOf(t, iss)}} {
		keys, err := parseTokenKeys(form.data)
		must(t, err)
		verify := func(tok, claim string) (string, error) {
			return keys.verify(tok, time.Now(), tokenPolicy{audience: "str-workers", issuer: "https://idp.example", claim: claim, maxLifetime: 24 * time.Hour})
		}
		for _, i := range iss {
			if got, err := verify(i.mint(t, claimsFor("alice", time.Hour)), "sub"); err != nil || got != "alice" {
				t.Errorf("%s %s: %q %v", form.name, i.alg, got, err)
			}
			if got, err := verify(i.mint(t, claimsFor("alice", time.Hour)), "email"); err != nil || got != "alice@example.com" {
				t.Errorf("%s %s claim email: %q %v", form.name, i.alg, got, err)
			}
		}
		rsaPub, _ := x509.MarshalPKIXPublicKey(iss[0].priv.Public())
		rsaPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: rsaPub})
		body := b64(mustJSON(t, claimsFor("alice", time.Hour)))
		hs := func(key []byte) string {
			head := b64([]byte(`{"alg":"HS256","typ":"JWT","kid":"rsa-1"}`))
			mac := hmac.New(sha256.New, key)
			mac.Write([]byte(head + "." + body))
			return head + "." + body + "." + b64(mac.Sum(nil))
		}
		noExp := claimsFor("alice", time.Hour)
		delete(noExp, "exp")
		wrongIss := claimsFor("alice", time.Hour)
		wrongIss["iss"] = "https://evil.example"
		for _, c := range []struct{ name, tok string }{
			{"expired", iss[0].mint(t, claimsFor("alice", -10*time.Minute))},
			{"wrong audience", iss[1].mint(t, map[string]any{"sub": "alice", "aud": "other", "exp": time.Now().Add(time.Hour).Unix()})},
			{"no exp", iss[2].mint(t, noExp)},
			{"wrong iss", iss[0].mint(t, wrongIss)},
			{"another issuer's key, same kid", others[0].mint(t, claimsFor("alice", time.Hour))},
			{"another issuer's EC key", others[1].mint(t, claimsFor("alice", time.Hour))},
			{"alg none", b64([]byte(`{"alg":"none","typ":"JWT"}`)) + "." + body + "."},
			{"HS256 keyed with the public key (PEM)", hs(rsaPEM)},
			{"HS256 keyed with the public key (DER)", hs(rsaPub)},
			{"not a JWT", "alice"},
			{"signature stripped", strings.Join(strings.Split(iss[0].mint(t, claimsFor("alice", time.Hour)), ".")[:2], ".") + "."},
		} {
			if got, err := verify(c.tok, "sub"); err == nil {
				t.Errorf("%s: %s accepted (%q)", form.name, c.name, got)
			}
		}
		if _, err := verify(iss[0].mint(t, claimsFor("alice", time.Hour)), "groups"); err == nil {
			t.Errorf("%s: a missing claim accepted", form.name)
		}
	}
	// Files that do not belong: a private JWK, a small RSA key, a private PEM.
	ek, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	priv, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: ek, KeyID: "p"}}})
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	smallDER, _ := x509.MarshalPKIXPublicKey(&small.PublicKey)
	privDER, _ := x509.MarshalPKCS8PrivateKey(ek)
	for name, data := range map[string][]byte{
		"private JWK": priv, "1024-bit RSA": pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: smallDER}),
		"private PEM": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}), "empty": nil,
	} {
		if _, err := parseTokenKeys(data); err == nil {
			t.Errorf("%s accepted as issuer keys", name)
		}
	}
}

// TestUserTokenMode: issue 16 §1. Token-only: a request with a valid
// token whose sub is params.user_id runs; no token, a bad token or a
// mismatched claim is refused and, replyTo being unauthenticated, not
// answered. With signing as well, the reference's messages are answered.
// The token file is reloaded on change.
func TestUserTokenMode(t *testing.T) {
	iss := newIssuers(t)
	var keys string
	h := newHarness(t, func(c *Config) {
		keys = filepath.Join(t.TempDir(), "issuer.jwks")
		must(t, os.WriteFile(keys, jwksOf(t, iss[:1]), 0o644))
		c.UserTokenKeys, c.UserTokenAudience, c.UserTokenIssuer, c.UserTokenClaim = keys, "str-workers", "https://idp.example", "sub"
	})
	h.start()
	tok := func(i issuer, user string) map[string]string {
		return map[string]string{PropAuthToken: i.mint(t, claimsFor(user, time.Hour))}
	}
	h.invokeAs("echo", "t-ok", map[string]any{"user_id": "alice"}, tok(iss[0], "alice"), nil)
	if r := h.reply("t-ok"); !isResult(r) {
		t.Fatalf("a valid token was refused: %s", r)
	}
	h.invokeAs("echo", "t-none", map[string]any{"user_id": "alice"}, nil, nil)
	h.invokeAs("echo", "t-mismatch", map[string]any{"user_id": "alice"}, tok(iss[0], "mallory"), nil)
	h.invokeAs("echo", "t-ec", map[string]any{"user_id": "alice"}, tok(iss[1], "alice"), nil) // not yet a key
	h.waitCounted(3)
	// Reload: the EC issuer key added.
	must(t, os.WriteFile(keys+".new", jwksOf(t, iss), 0o644))
	must(t, os.Rename(keys+".new", keys))
	h.invokeAs("echo", "t-ec2", map[string]any{"user_id": "alice"}, tok(iss[1], "alice"), nil)
	if r := h.reply("t-ec2"); !isResult(r) {
		t.Fatalf("a key added to the file was not loaded: %s", r)
	}
	h.noReply("t-none", "t-mismatch", "t-ec")
}

// TestUserTokenWithSigning: signed requests carry the token too; the
// replyTo is the signer's, so the reference's messages are answered.
func TestUserTokenWithSigning(t *testing.T) {
	iss := newIssuers(t)
	h := newHarness(t, func(c *Config) {
		keys := filepath.Join(t.TempDir(), "issuer.pem")
		must(t, os.WriteFile(keys, pemOf(t, iss), 0o644))
		c.SigningSecret, c.UserTokenKeys, c.UserTokenAudience, c.UserTokenClaim = "s3cret", keys, "str-workers", "sub"
	})
	h.start()
	for _, c := range []struct {
		id, token, want string
	}{
		{"none", "", msgNoAuthToken},
		{"expired", iss[0].mint(t, claimsFor("alice", -time.Hour)), msgInvalidAuthToken},
		{"mismatch", iss[2].mint(t, claimsFor("mallory", time.Hour)), `the token's "sub" claim ("mallory") is not params.user_id ("alice")`},
	} {
		h.invokeAs("echo", c.id, map[string]any{"user_id": "alice"}, map[string]string{PropAuthToken: c.token}, withSecret("s3cret"))
		if code, msg := errorCode(t, h.reply(c.id)); code != "AUTHENTICATION_FAILED" || msg != c.want {
			t.Errorf("%s: %s %q, want %q", c.id, code, msg, c.want)
		}
	}
	h.invokeAs("echo", "ok", map[string]any{"user_id": "alice"}, map[string]string{PropAuthToken: iss[1].mint(t, claimsFor("alice", time.Hour))}, withSecret("s3cret"))
	if r := h.reply("ok"); !isResult(r) {
		t.Fatalf("signed with a valid token: %s", r)
	}
}

// TestIdentityConfig: the identity settings. A token key file without an
// audience is a configuration error; the files are paths resolved like
// the others; a keys file that does not load stops the worker at start.
func TestIdentityConfig(t *testing.T) {
	base := map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost"}
	env := func(extra map[string]string) func(string) string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return envOf(m)
	}
	_, err := LoadConfig(nil, env(map[string]string{"STR_USER_TOKEN_KEYS": "/etc/str/issuer.jwks"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "STR_USER_TOKEN_AUDIENCE") {
		t.Errorf("token keys without an audience: %v", err)
	}
	c, err := LoadConfig([]string{"--signing-keys", "keys.yaml", "--user-token-keys", "issuer.pem", "--user-token-audience", "str"}, env(nil), io.Discard)
	must(t, err)
	wd, _ := os.Getwd()
	if c.SigningKeys != filepath.Join(wd, "keys.yaml") || c.UserTokenKeys != filepath.Join(wd, "issuer.pem") || c.UserTokenClaim != "sub" {
		t.Errorf("paths %q %q claim %q", c.SigningKeys, c.UserTokenKeys, c.UserTokenClaim)
	}
	if c.UserTokenMaxLifetime != 24*time.Hour {
		t.Errorf("default token lifetime %v, want 24h", c.UserTokenMaxLifetime)
	}
	c, err = LoadConfig([]string{"--user-token-max-lifetime", "3600"}, env(nil), io.Discard)
	if err != nil || c.UserTokenMaxLifetime != time.Hour {
		t.Errorf("--user-token-max-lifetime 3600: %v %v", c, err)
	}
	for _, v := range []string{"0", "-1", "1d"} {
		if _, err := LoadConfig(nil, env(map[string]string{"STR_USER_TOKEN_MAX_LIFETIME_SECONDS": v}), io.Discard); err == nil ||
			!strings.Contains(err.Error(), "STR_USER_TOKEN_MAX_LIFETIME_SECONDS") {
			t.Errorf("STR_USER_TOKEN_MAX_LIFETIME_SECONDS=%s: %v", v, err)
		}
	}
	bad := filepath.Join(t.TempDir(), "keys.yaml")
	must(t, os.WriteFile(bad, []byte("version: 1\nkeys: []\n"), 0o600))
	cfg, err := LoadConfig(nil, env(nil), io.Discard)
	must(t, err)
	cfg.SigningKeys = bad
	if _, err := New(Options{Config: cfg, Transport: memory.NewBus().Client("w", ""), Sandboxes: launchertest.Sandboxes{}, Store: artifacts.NewMemory("demo/")}); err == nil ||
		!strings.Contains(err.Error(), "STR_SIGNING_KEYS") || !strings.Contains(err.Error(), "no keys") {
		t.Errorf("a keys file without keys: %v", err)
	}
}

// TestAgentKeyShare: issue 29 §7. An agent key allowed users "mallory*"
// sends 12 calls as 12 made-up users, each within its own user caps: the
// key gets its caps over all of them (3 running, 4 waiting: auto, as a
// user's), the other 5 are RESOURCE_EXHAUSTED naming the key (before, the
// 12 users took every slot and queue place), and another key's call
// runs meanwhile.
func TestAgentKeyShare(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		keys := filepath.Join(t.TempDir(), "keys.yaml")
		must(t, os.WriteFile(keys, []byte(`version: 1
keys:
  - id: mallory-key
    secret: mallory-secret-0123456789abcdef01234567
    apps: [app]
    users: ["mallory*"]
    tools: ["*"]
  - id: alice-key
    secret: alice-secret-0123456789abcdef0123456789
    apps: [app]
    users: [alice]
    tools: ["*"]
`), 0o600))
		c.SigningKeys = keys
		c.MaxConcurrent, c.MaxQueued = 4, 16
	})
	h.start()
	mallory := withKey("mallory-key", "mallory-secret-0123456789abcdef01234567")
	var ids []string
	for i := range 12 {
		id := fmt.Sprintf("m%02d", i)
		ids = append(ids, id)
		h.invokeAs("sleeper", id, map[string]any{"user_id": fmt.Sprintf("mallory%02d", i), "args": map[string]any{"seconds": 600}}, nil, mallory)
	}
	for _, id := range ids[7:] {
		code, msg := errorCode(t, h.reply(id))
		if code != "RESOURCE_EXHAUSTED" || !strings.Contains(msg, `agent key "mallory-key"`) || !strings.Contains(msg, "STR_KEY_MAX_QUEUED") {
			t.Fatalf("%s, over the key's caps: %s %q", id, code, msg)
		}
	}
	for _, id := range ids[:3] {
		waitFor(t, id+" running", func() bool { return len(h.status(id)) > 0 })
	}
	h.invokeAs("echo", "alice-1", map[string]any{"user_id": "alice"}, nil, withKey("alice-key", "alice-secret-0123456789abcdef0123456789"))
	if r := h.reply("alice-1"); !isResult(r) {
		t.Fatalf("another key's call beside mallory's: %s", r)
	}
	h.srv.queue.mu.Lock()
	running, waiting := h.srv.queue.shares["agent-key:mallory-key"].running, h.srv.queue.shares["agent-key:mallory-key"].waiting
	h.srv.queue.mu.Unlock()
	if running != 3 || waiting != 4 {
		t.Fatalf("mallory's key: %d running, %d waiting; want 3 and 4", running, waiting)
	}
}

// TestUserTokenLifetimeBoundary: issue 29 §7. A token valid for exactly
// the maximum (exp − iat) is accepted and one second more is refused,
// naming the setting; without iat, what is left of it (exp − now) may be
// the maximum plus the minute's leeway, and not a second more.
func TestUserTokenLifetimeBoundary(t *testing.T) {
	iss := newIssuers(t)[:1]
	keys, err := parseTokenKeys(jwksOf(t, iss))
	must(t, err)
	const max = 6 * time.Hour
	now := time.Now().Truncate(time.Second) // NumericDate has whole seconds
	policy := tokenPolicy{audience: "str-workers", issuer: "https://idp.example", claim: "sub", maxLifetime: max}
	token := func(iat, exp time.Time) string {
		c := map[string]any{"sub": "alice", "aud": "str-workers", "iss": "https://idp.example", "exp": exp.Unix()}
		if !iat.IsZero() {
			c["iat"] = iat.Unix()
		}
		return iss[0].mint(t, c)
	}
	issued := now.Add(-time.Hour)
	for _, c := range []struct {
		name     string
		iat, exp time.Time
		ok       bool
	}{
		{"exp - iat = the maximum", issued, issued.Add(max), true},
		{"exp - iat = the maximum + 1 s", issued, issued.Add(max + time.Second), false},
		{"exp - iat = 10 years", now, now.AddDate(10, 0, 0), false},
		{"no iat, exp - now = the maximum + leeway", time.Time{}, now.Add(max + tokenLeeway), true},
		{"no iat, exp - now = the maximum + leeway + 1 s", time.Time{}, now.Add(max + tokenLeeway + time.Second), false},
		{"no iat, exp - now = 10 years", time.Time{}, now.AddDate(10, 0, 0), false},
	} {
		got, err := keys.verify(token(c.iat, c.exp), now, policy)
		switch {
		case c.ok && (err != nil || got != "alice"):
			t.Errorf("%s: refused: %v", c.name, err)
		case !c.ok && err == nil:
			t.Errorf("%s: accepted", c.name)
		case !c.ok && !strings.Contains(err.Error(), "STR_USER_TOKEN_MAX_LIFETIME_SECONDS"):
			t.Errorf("%s: refused without naming the setting: %v", c.name, err)
		}
	}
}

// TestUserTokenLifetimeThroughServer: with the default maximum (one day),
// a 10-year user token, with iat or without, is refused
// AUTHENTICATION_FAILED (the reference's message, answered: the request
// is signed), and the worker goes on serving: a day's token runs.
func TestUserTokenLifetimeThroughServer(t *testing.T) {
	iss := newIssuers(t)
	h := newHarness(t, func(c *Config) {
		keys := filepath.Join(t.TempDir(), "issuer.jwks")
		must(t, os.WriteFile(keys, jwksOf(t, iss), 0o644))
		c.SigningSecret, c.UserTokenKeys, c.UserTokenAudience, c.UserTokenClaim = "s3cret", keys, "str-workers", "sub"
	})
	if h.cfg.UserTokenMaxLifetime != 24*time.Hour {
		t.Fatalf("default STR_USER_TOKEN_MAX_LIFETIME_SECONDS: %v, want 24h", h.cfg.UserTokenMaxLifetime)
	}
	h.start()
	noIat := claimsFor("alice", 10*365*24*time.Hour)
	delete(noIat, "iat")
	for id, tok := range map[string]string{
		"ten-years":        iss[0].mint(t, claimsFor("alice", 10*365*24*time.Hour)),
		"ten-years-no-iat": iss[1].mint(t, noIat),
	} {
		h.invokeAs("echo", id, map[string]any{"user_id": "alice"}, map[string]string{PropAuthToken: tok}, withSecret("s3cret"))
		if code, msg := errorCode(t, h.reply(id)); code != "AUTHENTICATION_FAILED" || msg != msgInvalidAuthToken {
			t.Errorf("%s: %s %q, want AUTHENTICATION_FAILED %q", id, code, msg, msgInvalidAuthToken)
		}
	}
	h.invokeAs("echo", "a-day", map[string]any{"user_id": "alice"},
		map[string]string{PropAuthToken: iss[2].mint(t, claimsFor("alice", 24*time.Hour))}, withSecret("s3cret"))
	if r := h.reply("a-day"); !isResult(r) {
		t.Fatalf("a token of one day after the refusals: %s", r)
	}
}
