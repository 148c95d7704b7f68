package worker

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"gopkg.in/yaml.v3"

	"github.com/securetoolruntime/str/worker/transport"
)

// Who a request is from (issue 16). The identity modes, any of which may
// be combined:
//
//   - none configured: nothing is verified; the requester is the claimed
//     params.user_id, unverified (the reference's model: anyone who can
//     publish on the invoke topics can act as any user);
//   - STR_SIGNING_SECRET, one shared secret (str-sign-v2): the signed
//     userId must equal params.user_id and the signed clientId the agent
//     of replyTo, but every holder of the secret may claim any agent and
//     any user (the weaker mode, kept for compatibility);
//   - STR_SIGNING_KEYS, a keys file of per-agent keys (str-sign-v3): the
//     same rules, and the key may claim only its apps, users and tools,
//     so a leaked agent key is that agent's, not every user's;
//   - STR_USER_TOKEN_KEYS, user tokens (the reference's enterprise mode):
//     a JWT in the authToken user property, verified against the issuer
//     keys, its expiry, lifetime (STR_USER_TOKEN_MAX_LIFETIME_SECONDS)
//     and audience checked, and its claim (STR_USER_TOKEN_CLAIM, default
//     sub) equal to params.user_id.
//
// When any is configured, nothing is published to a replyTo the worker
// could not authenticate: a request whose signature fails, or that
// carries no valid token in token-only mode, is logged, counted and
// acked, never answered (its replyTo could be anyone's).

// User property of the reference's enterprise mode: the user's token.
const PropAuthToken = "authToken"

// The reference's messages for a missing and a refused token.
const (
	msgNoAuthToken      = "Authentication required: no auth token provided"
	msgInvalidAuthToken = "Authentication failed: invalid or expired token"
)

// tokenLeeway is the clock skew allowed on a token's exp, nbf and iat.
const tokenLeeway = time.Minute

// tokenAlgorithms are the JWS algorithms a user token may be signed
// with: asymmetric only, so a public key can never be used as an HMAC
// secret (the HS256 confusion) and "none" is never accepted.
var tokenAlgorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// authModes is the configured identity modes; nil fields are off.
type authModes struct {
	keys     *watchedFile[*keyRing]   // STR_SIGNING_KEYS
	tokens   *watchedFile[*tokenKeys] // STR_USER_TOKEN_KEYS
	audience string                   // STR_USER_TOKEN_AUDIENCE
	issuer   string                   // STR_USER_TOKEN_ISSUER ("" = any)
	claim    string                   // STR_USER_TOKEN_CLAIM
	lifetime time.Duration            // STR_USER_TOKEN_MAX_LIFETIME_SECONDS
}

// newAuthModes loads the keys and token key files (a file that cannot be
// loaded at start-up is a configuration error).
func newAuthModes(cfg *Config, log *slog.Logger) (*authModes, error) {
	a := &authModes{audience: cfg.UserTokenAudience, issuer: cfg.UserTokenIssuer, claim: cfg.UserTokenClaim,
		lifetime: cfg.UserTokenMaxLifetime}
	var err error
	if cfg.SigningKeys != "" {
		if a.keys, err = loadWatched(cfg.SigningKeys, "STR_SIGNING_KEYS", parseKeyRing, log); err != nil {
			return nil, err
		}
		// The file holds secrets: say so when others may read it.
		if fi, err := os.Stat(cfg.SigningKeys); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn("STR_SIGNING_KEYS is readable by its group or others: it holds every agent's secret; chmod 0600",
				"path", cfg.SigningKeys, "mode", fi.Mode().Perm().String())
		}
	}
	if cfg.UserTokenKeys != "" {
		if a.tokens, err = loadWatched(cfg.UserTokenKeys, "STR_USER_TOKEN_KEYS", parseTokenKeys, log); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// signing reports whether requests must be signed.
func (s *Server) signing() bool { return s.cfg.SigningSecret != "" || s.auth.keys != nil }

// authConfigured reports whether any identity mode is on.
func (s *Server) authConfigured() bool { return s.signing() || s.auth.tokens != nil }

// replyTopicAgent checks that topic is a topic of the protocol's kind
// ("response" for replyTo, "status" for statusTo) in this namespace:
// {base}/sam_remote_tool/{kind}/{agent}/{correlation…}, with no empty
// level and no wildcard. It returns the agent, or why the topic is
// refused. Requiring the reply side keeps the worker from ever
// publishing on a request topic of its own namespace (invoke, cancel,
// init_request, str's own): an invoke whose replyTo was a victim's
// cancel topic made the worker cancel the victim itself.
func (s *Server) replyTopicAgent(topic, kind string) (agent, problem string) {
	prefix := s.base + "/sam_remote_tool/" + kind + "/"
	rest, ok := strings.CutPrefix(topic, prefix)
	if !ok {
		return "", fmt.Sprintf("not a %s topic of this namespace (%s{agent}/{id})", kind, prefix)
	}
	levels := strings.Split(rest, "/")
	if len(levels) < 2 {
		return "", fmt.Sprintf("no {agent}/{id} after %s", prefix)
	}
	for _, l := range levels {
		if l == "" || strings.ContainsAny(l, "*>") || strings.ContainsFunc(l, isControl) {
			return "", "an empty level, a wildcard or a control character"
		}
	}
	return levels[0], ""
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// replyBound checks, for a signed request, that its reply topics are
// the signer's: the signed clientId is the agent of replyTo (and of
// statusTo), and a key of the keys file may claim that agent (apps).
// Only then may a refusal be answered there: a valid signature over
// another agent's replyTo would otherwise let any signer inject errors
// into that agent's replies.
func (s *Server) replyBound(d *transport.Delivery, key *signingKey, agent, statusAgent string) *Error {
	c := d.UserProperties[PropClientID]
	if c != agent || (statusAgent != "" && c != statusAgent) {
		return errorf(CodeAuthenticationFailed, "the signed user property %q (%q) is not the agent of replyTo (%q) and statusTo (%q)",
			PropClientID, truncateName(c), truncateName(agent), truncateName(statusAgent))
	}
	if key != nil && !matchAny(key.Apps, c) {
		return errorf(CodeAuthenticationFailed, "key %q may not claim agent (clientId) %q (its apps: %s)",
			key.ID, truncateName(c), strings.Join(key.Apps, ", "))
	}
	return nil
}

// verifyInvoke establishes who an invoke is from, after its signature
// (key: the key that verified it, nil for the shared secret), replyBound
// and its parse. The checks, in order:
//  1. no mode configured: the claimed user, unverified;
//  2. signed: the userId property present and equal to params.user_id;
//  3. a key of the keys file: it may claim params.app_name (apps),
//     params.user_id (users) and the tool (tools);
//  4. user tokens: authToken present, verified, its claim equal to
//     params.user_id.
//
// Every failure is AUTHENTICATION_FAILED naming the property and values.
func (s *Server) verifyInvoke(d *transport.Delivery, key *signingKey, req *Request, now time.Time) (requester, *Error) {
	props := d.UserProperties
	fail := func(format string, a ...any) (requester, *Error) {
		return requester{}, errorf(CodeAuthenticationFailed, format, a...)
	}
	// 1. nothing configured.
	if !s.authConfigured() {
		return requester{UserID: req.UserID}, nil
	}
	var via []string
	keyID := ""
	// 2. the signed identity equals the request's.
	if s.signing() {
		if u := props[PropUserID]; u == "" || u != req.UserID {
			return fail("the signed user property %q (%q) is not params.user_id (%q)", PropUserID, truncateName(u), truncateName(req.UserID))
		}
		via = append(via, "shared-secret")
		// 3. what the key may claim.
		if key != nil {
			if e := key.mayClaim(req.AppName, req.UserID, req.ToolName); e != nil {
				return requester{}, e
			}
			via[0] = "key:" + key.ID
			keyID = key.ID
		}
	}
	// 4. the user's token.
	if s.auth.tokens != nil {
		claim, e := s.verifyToken(props[PropAuthToken], now, req.ID)
		if e != nil {
			return requester{}, e
		}
		if claim != req.UserID {
			return fail("the token's %q claim (%q) is not params.user_id (%q)", s.auth.claim, truncateName(claim), truncateName(req.UserID))
		}
		via = append(via, "token")
	}
	return requester{UserID: req.UserID, Verified: true, Via: strings.Join(via, "+"), Key: keyID}, nil
}

// verifyCancel establishes who a cancel is from, by the same rules as an
// invoke: its signature (the userId property is the user; a key must be
// allowed to claim it and clientId), its token (the claim is the user,
// equal to a signed userId). ok is false when no mode is configured
// (any cancel is honoured, as the reference does).
func (s *Server) verifyCancel(d *transport.Delivery, now time.Time) (who requester, ok bool, e *Error) {
	if !s.authConfigured() {
		return requester{}, false, nil
	}
	props := d.UserProperties
	var via []string
	user, keyID := "", ""
	if s.signing() {
		key, e := s.checkSignature(d, now)
		if e != nil {
			return requester{}, true, e
		}
		if user = props[PropUserID]; user == "" {
			return requester{}, true, errorf(CodeAuthenticationFailed, "the signed cancel has no %q user property", PropUserID)
		}
		via = append(via, "shared-secret")
		if key != nil {
			if !matchAny(key.Users, user) || !matchAny(key.Apps, props[PropClientID]) {
				return requester{}, true, errorf(CodeAuthenticationFailed, "key %q may not claim user %q for agent %q",
					key.ID, truncateName(user), truncateName(props[PropClientID]))
			}
			via[0] = "key:" + key.ID
			keyID = key.ID
		}
	}
	if s.auth.tokens != nil {
		claim, e := s.verifyToken(props[PropAuthToken], now, "cancel")
		if e != nil {
			return requester{}, true, e
		}
		if user != "" && claim != user {
			return requester{}, true, errorf(CodeAuthenticationFailed, "the token's %q claim (%q) is not the signed %q (%q)",
				s.auth.claim, truncateName(claim), PropUserID, truncateName(user))
		}
		user = claim
		via = append(via, "token")
	}
	return requester{UserID: user, Verified: true, Via: strings.Join(via, "+"), Key: keyID}, true, nil
}

// verifyToken checks a user token and returns its identity claim. The
// reply says only what the reference says (no token, or invalid or
// expired); the log says which check failed. In order: present; a
// compact JWS signed with an asymmetric algorithm; verified by an issuer
// key (the header's kid selects among keys that have one); exp present
// and not past, nbf and iat not in the future (tokenLeeway); aud holds
// STR_USER_TOKEN_AUDIENCE; iss equal to STR_USER_TOKEN_ISSUER when set;
// valid for at most STR_USER_TOKEN_MAX_LIFETIME_SECONDS; the claim a
// non-empty string.
func (s *Server) verifyToken(raw string, now time.Time, id string) (string, *Error) {
	// 1. present.
	if raw == "" {
		s.log.Warn("request refused: no authToken", "id", truncateName(id))
		return "", errorf(CodeAuthenticationFailed, msgNoAuthToken)
	}
	claim, err := s.auth.tokens.get().verify(raw, now, tokenPolicy{audience: s.auth.audience, issuer: s.auth.issuer,
		claim: s.auth.claim, maxLifetime: s.auth.lifetime})
	if err != nil {
		s.log.Warn("request refused: invalid or expired token", "id", truncateName(id), "error", err)
		return "", errorf(CodeAuthenticationFailed, msgInvalidAuthToken)
	}
	return claim, nil
}

// --- per-agent keys (STR_SIGNING_KEYS) ---

// The keys file: YAML, unknown fields refused, every key with what it
// may claim (path.Match patterns; "*" is anything):
//
//	version: 1
//	keys:
//	  - id: orders-agent-2026-11
//	    secret: "…at least 32 bytes…"
//	    apps: [orders-agent]        # clientId (the agent of replyTo) and params.app_name
//	    users: ["*@example.com"]    # params.user_id
//	    tools: [echo, "pdf_*"]      # the tool invoked
type keysFile struct {
	Version int           `yaml:"version"`
	Keys    []*signingKey `yaml:"keys"`
}

type signingKey struct {
	ID     string   `yaml:"id"`
	Secret string   `yaml:"secret"`
	Apps   []string `yaml:"apps"`
	Users  []string `yaml:"users"`
	Tools  []string `yaml:"tools"`
}

// minKeySecret is the shortest secret a key of the keys file may have.
const minKeySecret = 32

type keyRing struct{ byID map[string]*signingKey }

// parseKeyRing decodes and checks a keys file, collecting every problem.
func parseKeyRing(data []byte) (*keyRing, error) {
	var f keysFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, err
	}
	var problems []error
	bad := func(format string, a ...any) { problems = append(problems, fmt.Errorf(format, a...)) }
	if f.Version != 1 {
		bad("version %d: must be 1", f.Version)
	}
	if len(f.Keys) == 0 {
		bad("no keys")
	}
	ring := &keyRing{byID: map[string]*signingKey{}}
	for i, k := range f.Keys {
		if k == nil || k.ID == "" || strings.ContainsFunc(k.ID, isControl) {
			bad("key %d: id missing or has a control character", i+1)
			continue
		}
		if ring.byID[k.ID] != nil {
			bad("key %q: listed twice", k.ID)
		}
		if len(k.Secret) < minKeySecret {
			bad("key %q: secret shorter than %d bytes", k.ID, minKeySecret)
		}
		for _, l := range []struct {
			name     string
			patterns []string
		}{{"apps", k.Apps}, {"users", k.Users}, {"tools", k.Tools}} {
			if len(l.patterns) == 0 {
				bad("key %q: %s empty (what may this key claim? \"*\" is anything)", k.ID, l.name)
			}
			for _, p := range l.patterns {
				if _, err := path.Match(p, ""); err != nil || p == "" {
					bad("key %q: %s pattern %q is not a valid pattern", k.ID, l.name, p)
				}
			}
		}
		ring.byID[k.ID] = k
	}
	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return ring, nil
}

// mayClaim checks what a verified request of key k claims (its agent,
// clientId, is checked by replyBound).
func (k *signingKey) mayClaim(app, user, tool string) *Error {
	for _, c := range []struct{ what, list, v string }{
		{"params.app_name", "apps", app},
		{"params.user_id", "users", user}, {"tool", "tools", tool},
	} {
		patterns := map[string][]string{"apps": k.Apps, "users": k.Users, "tools": k.Tools}[c.list]
		if !matchAny(patterns, c.v) {
			return errorf(CodeAuthenticationFailed, "key %q may not claim %s %q (its %s: %s)",
				k.ID, c.what, truncateName(c.v), c.list, strings.Join(patterns, ", "))
		}
	}
	return nil
}

func matchAny(patterns []string, v string) bool {
	for _, p := range patterns {
		if ok, _ := path.Match(p, v); ok {
			return true
		}
	}
	return false
}

// --- user token issuer keys (STR_USER_TOKEN_KEYS) ---

// tokenKeys are the issuer public keys: a JWK Set (JSON) or PEM blocks
// (PUBLIC KEY, CERTIFICATE). RSA (2048 bits or more), ECDSA and Ed25519.
type tokenKeys struct{ keys []tokenKey }

type tokenKey struct {
	kid string // "" for a PEM key: tried for any token
	key any
}

func parseTokenKeys(data []byte) (*tokenKeys, error) {
	var out tokenKeys
	add := func(kid string, k any, where string) error {
		switch pk := k.(type) {
		case *rsa.PublicKey:
			if pk.N.BitLen() < 2048 {
				return fmt.Errorf("%s: RSA key of %d bits (at least 2048)", where, pk.N.BitLen())
			}
		case *ecdsa.PublicKey, ed25519.PublicKey:
		default:
			return fmt.Errorf("%s: a %T is not an RSA, ECDSA or Ed25519 public key", where, k)
		}
		out.keys = append(out.keys, tokenKey{kid: kid, key: k})
		return nil
	}
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] == '{' {
		// 1. a JWK Set.
		var set jose.JSONWebKeySet
		if err := json.Unmarshal(t, &set); err != nil {
			return nil, fmt.Errorf("JWK Set: %w", err)
		}
		for i, k := range set.Keys {
			where := fmt.Sprintf("JWK %d (kid %q)", i+1, k.KeyID)
			if !k.IsPublic() {
				return nil, fmt.Errorf("%s: not a public key (a private or symmetric key does not belong in this file)", where)
			}
			if err := add(k.KeyID, k.Key, where); err != nil {
				return nil, err
			}
		}
	} else {
		// 2. PEM blocks.
		rest := data
		for n := 1; ; n++ {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			where := fmt.Sprintf("PEM block %d (%s)", n, b.Type)
			var k any
			var err error
			switch b.Type {
			case "PUBLIC KEY":
				k, err = x509.ParsePKIXPublicKey(b.Bytes)
			case "CERTIFICATE":
				var c *x509.Certificate
				if c, err = x509.ParseCertificate(b.Bytes); err == nil {
					k = c.PublicKey
				}
			default:
				err = errors.New("only PUBLIC KEY and CERTIFICATE blocks belong in this file")
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w", where, err)
			}
			if err := add("", k, where); err != nil {
				return nil, err
			}
		}
	}
	if len(out.keys) == 0 {
		return nil, errors.New("no keys (a JWK Set, or PEM PUBLIC KEY or CERTIFICATE blocks)")
	}
	return &out, nil
}

// tokenPolicy is what a verified token must hold besides its signature.
type tokenPolicy struct {
	audience    string        // STR_USER_TOKEN_AUDIENCE: in aud
	issuer      string        // STR_USER_TOKEN_ISSUER: iss ("" = any)
	claim       string        // STR_USER_TOKEN_CLAIM: the identity
	maxLifetime time.Duration // STR_USER_TOKEN_MAX_LIFETIME_SECONDS
}

// verify checks one token (see Server.verifyToken) and returns the claim.
func (tk *tokenKeys) verify(raw string, now time.Time, p tokenPolicy) (string, error) {
	// 1. a compact JWS of an allowed algorithm.
	tok, err := jwt.ParseSigned(raw, tokenAlgorithms)
	if err != nil {
		return "", err
	}
	kid := tok.Headers[0].KeyID
	// 2. verified by one of the issuer keys.
	var std jwt.Claims
	var all map[string]any
	verified := false
	for _, k := range tk.keys {
		if k.kid != "" && k.kid != kid {
			continue
		}
		if err = tok.Claims(k.key, &std, &all); err == nil {
			verified = true
			break
		}
	}
	if !verified {
		if err == nil {
			err = fmt.Errorf("no issuer key with kid %q", kid)
		}
		return "", fmt.Errorf("signature not verified by any issuer key: %w", err)
	}
	// 3. expiry required; times, audience and issuer.
	if std.Expiry == nil {
		return "", errors.New("no exp claim (a token without expiry is refused)")
	}
	if err := std.ValidateWithLeeway(jwt.Expected{AnyAudience: jwt.Audience{p.audience}, Issuer: p.issuer, Time: now}, tokenLeeway); err != nil {
		return "", err
	}
	// 4. the lifetime: the worker cannot revoke a token, so a leaked one
	// works until its exp; a token the issuer made valid for longer than
	// the maximum (exp − iat) is refused, and one without iat when what
	// is left of it (exp − now) is longer, with tokenLeeway for the
	// clocks' skew (iat is the issuer's own, exact). After step 3, which
	// refused a token past exp or with iat in the future.
	exp := std.Expiry.Time()
	if std.IssuedAt != nil {
		if life := exp.Sub(std.IssuedAt.Time()); life > p.maxLifetime {
			return "", fmt.Errorf("token lifetime (exp - iat) is %v, longer than the maximum %v (STR_USER_TOKEN_MAX_LIFETIME_SECONDS)", life, p.maxLifetime)
		}
	} else if left := exp.Sub(now); left > p.maxLifetime+tokenLeeway {
		return "", fmt.Errorf("token without iat valid for %v more (exp - now), longer than the maximum %v (STR_USER_TOKEN_MAX_LIFETIME_SECONDS, with %v leeway)",
			left.Truncate(time.Second), p.maxLifetime, tokenLeeway)
	}
	// 5. the identity claim.
	v, _ := all[p.claim].(string)
	if v == "" {
		return "", fmt.Errorf("claim %q missing or not a string", p.claim)
	}
	return v, nil
}

// --- files reloaded on change ---

// watchedFile is a configuration file parsed at start-up and again
// whenever it changes (checked at each use by its inode, size and
// modification time: a file rewritten in place or replaced by a rename,
// as Kubernetes updates a mounted Secret). A version that cannot be read
// or parsed is logged and the last good one kept.
type watchedFile[T any] struct {
	path, setting string
	parse         func([]byte) (T, error)
	log           *slog.Logger
	mu            sync.Mutex
	cur           T
	stamp         fileStamp
}

type fileStamp struct {
	dev, ino uint64
	size     int64
	mtime    time.Time
}

func stampOf(p string) (fileStamp, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return fileStamp{}, err
	}
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.dev, st.ino = uint64(sys.Dev), sys.Ino
	}
	return st, nil
}

func loadWatched[T any](p, setting string, parse func([]byte) (T, error), log *slog.Logger) (*watchedFile[T], error) {
	w := &watchedFile[T]{path: p, setting: setting, parse: parse, log: log}
	st, err := stampOf(p)
	if err != nil {
		return nil, fmt.Errorf("worker: %s %s: %w", setting, p, err)
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("worker: %s %s: %w", setting, p, err)
	}
	if w.cur, err = parse(data); err != nil {
		return nil, fmt.Errorf("worker: %s %s: %w", setting, p, err)
	}
	w.stamp = st
	return w, nil
}

// get returns the current version, reloading the file first if it
// changed.
func (w *watchedFile[T]) get() T {
	w.mu.Lock()
	defer w.mu.Unlock()
	st, err := stampOf(w.path)
	if err != nil || st == w.stamp {
		if err != nil && w.stamp != (fileStamp{}) {
			w.log.Error("cannot read "+w.setting+"; keeping the last good version", "path", w.path, "error", err)
			w.stamp = fileStamp{}
		}
		return w.cur
	}
	w.stamp = st
	data, err := os.ReadFile(w.path)
	var v T
	if err == nil {
		v, err = w.parse(data)
	}
	if err != nil {
		w.log.Error("cannot load "+w.setting+"; keeping the last good version", "path", w.path, "error", err)
		return w.cur
	}
	w.cur = v
	w.log.Info(w.setting+" reloaded", "path", w.path)
	return w.cur
}
