package egress

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/textproto"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Secret is a credential's real value. It prints, logs and marshals as
// "[redacted]", so a value that ends up in a struct that is logged or
// encoded is still not shown.
type Secret struct{ b []byte }

// NewSecret wraps a value.
func NewSecret(v []byte) Secret { return Secret{b: bytes.Clone(v)} }

func (Secret) String() string               { return "[redacted]" }
func (Secret) GoString() string             { return "[redacted]" }
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }
func (Secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }
func (s Secret) empty() bool                { return len(s.b) == 0 }
func (s Secret) Bytes() []byte              { return s.b }
func (s Secret) Render(format string) string {
	return strings.ReplaceAll(format, ValueMark, string(s.b))
}

// valueMark is where a Format puts the value.
const ValueMark = "{value}"

// Credential is one secret a sandbox may use without seeing it: the
// sandbox's environment holds Placeholder under Name; the proxy puts Value
// in place of the placeholder only in requests to Hosts, and only in
// Header (rendered with Format) or the Query parameter.
type Credential struct {
	// Name is the environment variable the placeholder is given in
	// ([A-Z_][A-Z0-9_]*).
	Name string `json:"name"`
	// Hosts are patterns as in allowed_hosts; each must be covered by the
	// policy's allowed_hosts (restricted).
	Hosts []string `json:"hosts"`
	// Header is the request header the value is sent in ("Authorization");
	// Format renders it ("Bearer {value}"; default "{value}").
	Header string `json:"header,omitempty"`
	Format string `json:"format,omitempty"`
	// Query is a query parameter the value may be sent in instead
	// ("api_key"); optional.
	Query string `json:"query,omitempty"`
	// Value is the secret (never printed: see Secret).
	Value Secret `json:"value"`
	// Placeholder is what the sandbox sees (NewPlaceholder, per call).
	Placeholder string `json:"placeholder"`

	hosts []hostPattern
}

// PlaceholderPrefix starts every placeholder, so that a reader of a tool's
// output recognizes one.
const PlaceholderPrefix = "str-placeholder-"

// NewPlaceholder returns a fresh random placeholder (160 bits).
func NewPlaceholder() (string, error) {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("egress: placeholder: %w", err)
	}
	return PlaceholderPrefix + hex.EncodeToString(b[:]), nil
}

// envName is compiled at its first use, not at every str start.
var envName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Z_][A-Z0-9_]*$`) })

// LoadSecret reads a credential's value from its source: "env:VAR" (the
// caller's environment, through getenv), "file:PATH" (a file; one trailing
// newline is dropped), or "dir:DIR" with the credential's name appended
// (a directory of files the operator mounts, one per secret). An empty
// value is an error: a placeholder that stands for nothing would only fail
// later, at the server.
func LoadSecret(name, source string, getenv func(string) string) (Secret, error) {
	kind, arg, ok := strings.Cut(source, ":")
	if !ok || arg == "" {
		return Secret{}, fmt.Errorf("credential %s: source %q: want env:VAR, file:PATH or dir:DIR", name, source)
	}
	var v []byte
	switch kind {
	case "env":
		if getenv == nil {
			getenv = os.Getenv
		}
		v = []byte(getenv(arg))
		if len(v) == 0 {
			return Secret{}, fmt.Errorf("credential %s: environment variable %s is unset or empty", name, arg)
		}
		return NewSecret(v), nil
	case "file", "dir":
		path := arg
		if kind == "dir" {
			path = strings.TrimSuffix(arg, "/") + "/" + name
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return Secret{}, fmt.Errorf("credential %s: %w", name, err)
		}
		b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
		if len(b) == 0 {
			return Secret{}, fmt.Errorf("credential %s: %s is empty", name, path)
		}
		return NewSecret(b), nil
	}
	return Secret{}, fmt.Errorf("credential %s: source %q: unknown kind %q (env, file or dir)", name, source, kind)
}

// ValidateCredentials checks the credentials against the compiled policy
// and returns every problem at once; it compiles their host patterns.
func ValidateCredentials(pol *Compiled, creds []Credential) error {
	var errs []error
	bad := func(i int, field string, v any, format string, a ...any) {
		errs = append(errs, fmt.Errorf("credentials[%d].%s %s: %s", i, field, quoteValue(v), fmt.Sprintf(format, a...)))
	}
	seen := map[string]bool{}
	placeholders := map[string]bool{}
	for i := range creds {
		c := &creds[i]
		c.hosts = nil
		if !envName().MatchString(c.Name) {
			bad(i, "name", c.Name, "not an environment variable name ([A-Z_][A-Z0-9_]*)")
		} else if seen[c.Name] {
			bad(i, "name", c.Name, "given twice")
		}
		seen[c.Name] = true
		if len(c.Hosts) == 0 {
			bad(i, "hosts", c.Hosts, "missing: a credential names the hosts it may be sent to")
		}
		for j, h := range c.Hosts {
			hp, err := parsePattern(h)
			if err != nil {
				bad(i, fmt.Sprintf("hosts[%d]", j), h, "%v", err)
				continue
			}
			switch pol.mode {
			case Restricted:
				if !slices.ContainsFunc(pol.hosts, func(p hostPattern) bool { return p.Covers(hp) }) {
					bad(i, fmt.Sprintf("hosts[%d]", j), h, "not covered by network.allowed_hosts %v", pol.original.AllowedHosts)
				}
			case AllowEgress:
			default:
				bad(i, fmt.Sprintf("hosts[%d]", j), h, "no host is reachable with policy %s", pol.mode)
			}
			c.hosts = append(c.hosts, hp)
		}
		if c.Header == "" && c.Query == "" {
			bad(i, "header", c.Header, "missing: a header (and format) or a query parameter says how the value is sent")
		}
		if c.Header != "" {
			if !validHeaderName(c.Header) {
				bad(i, "header", c.Header, "not a header name")
			}
			if hopByHop(c.Header) {
				bad(i, "header", c.Header, "a hop-by-hop or proxy header is never forwarded")
			}
		}
		if c.Format != "" && (strings.Count(c.Format, ValueMark) != 1 || strings.ContainsAny(c.Format, "\r\n\x00")) {
			bad(i, "format", c.Format, "must contain %s exactly once and no CR, LF or NUL", ValueMark)
		}
		if c.Query != "" && !validQueryName(c.Query) {
			bad(i, "query", c.Query, "not a plain query parameter name ([A-Za-z0-9_.-])")
		}
		if c.Value.empty() {
			bad(i, "value", "", "empty")
		} else if bytes.ContainsAny(c.Value.Bytes(), "\r\n\x00") {
			bad(i, "value", "[redacted]", "contains CR, LF or NUL")
		}
		if !strings.HasPrefix(c.Placeholder, PlaceholderPrefix) || len(c.Placeholder) < len(PlaceholderPrefix)+32 {
			bad(i, "placeholder", c.Placeholder, "not made by NewPlaceholder")
		} else if placeholders[c.Placeholder] {
			bad(i, "placeholder", c.Placeholder, "shared with another credential")
		}
		placeholders[c.Placeholder] = true
		if !c.Value.empty() && strings.Contains(c.Placeholder, string(c.Value.Bytes())) {
			bad(i, "value", "[redacted]", "is part of its own placeholder")
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// CheckCredentials validates credentials against a policy (what Start
// checks), so a caller can refuse a request before anything runs.
func CheckCredentials(p Policy, creds []Credential) error {
	pol, err := p.Compile()
	if err != nil {
		return err
	}
	return ValidateCredentials(pol, slices.Clone(creds))
}

// Terminates reports whether a sandbox's egress terminates TLS for some
// hosts: it has credentials or its policy has http_rules.
func Terminates(p Policy, creds []Credential) bool {
	return len(creds) > 0 || len(p.HTTPRules) > 0
}

// CredentialEnv is the environment a sandbox gets for its credentials:
// NAME=placeholder for each.
func CredentialEnv(creds []Credential) []string {
	env := make([]string, 0, len(creds))
	for _, c := range creds {
		env = append(env, c.Name+"="+c.Placeholder)
	}
	return env
}

func (c *Credential) Covers(host string) bool {
	return slices.ContainsFunc(c.hosts, func(p hostPattern) bool { return p.match(host) })
}

func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for i := 0; i < len(h); i++ {
		if !IsTokenChar(h[i]) {
			return false
		}
	}
	return true
}

func hopByHop(h string) bool {
	h = textproto.CanonicalMIMEHeaderKey(h)
	return strings.HasPrefix(h, "Proxy-") || slices.Contains([]string{"Connection", "Keep-Alive", "Te", "Trailer", "Upgrade", "Transfer-Encoding", "Host"}, h)
}

func validQueryName(q string) bool {
	for i := 0; i < len(q); i++ {
		c := q[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return q != ""
}

// IsTokenChar reports whether c may appear in an HTTP token (a method or
// a header name, RFC 9110 5.6.2).
func IsTokenChar(c byte) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
