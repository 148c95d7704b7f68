package egress

import (
	"fmt"
	"path"
	"slices"
	"strings"
)

// HTTPRule narrows what may be asked of the hosts it names: only Methods
// (any when empty) and only paths under Paths (any when empty). A request
// to a host several rules match must pass every one of them (deny wins), so
// adding a rule can only narrow a policy. Requests to a ruled host are read
// in the clear: the proxy terminates TLS for it (see Interception).
type HTTPRule struct {
	Host string `yaml:"host" json:"host"`
	// Methods: upper-case request methods ("GET", "HEAD").
	Methods []string `yaml:"methods,omitempty" json:"methods,omitempty"`
	// Paths: path prefixes matched by whole segments: "/repos" allows
	// "/repos" and "/repos/x", not "/repository". A request path that is
	// not clean (".", "..", "//" segments, before or after percent-decoding)
	// is refused under any rule.
	Paths []string `yaml:"paths,omitempty" json:"paths,omitempty"`
}

type compiledRule struct {
	host    hostPattern
	methods []string
	paths   []string
}

// Reason codes of the HTTP layer.
const (
	ReasonMethodNotAllowed = "method_not_allowed"
	ReasonPathNotAllowed   = "path_not_allowed"
	ReasonHostMismatch     = "host_mismatch"
	ReasonUpstreamCert     = "upstream_certificate"
	// ReasonCredentialHost is a credential's placeholder in a request to a
	// host the credential does not belong to (kind credential).
	ReasonCredentialHost = "credential_wrong_host"
	// ReasonUnscrubbable is a response of a credential's host in an
	// encoding the proxy cannot read (not the gzip it asked for): an echo
	// of the value could not be scrubbed (kind credential).
	ReasonUnscrubbable = "response_not_scrubbable"
)

// compileRules validates the http_rules of a policy; bad collects problems.
func compileRules(p Policy, hosts []hostPattern, bad func(field string, v any, format string, a ...any)) []compiledRule {
	var out []compiledRule
	if len(p.HTTPRules) > 0 && p.Mode == Isolated {
		bad("http_rules", len(p.HTTPRules), "has no effect with policy isolated")
		return nil
	}
	for i, r := range p.HTTPRules {
		field := fmt.Sprintf("http_rules[%d]", i)
		hp, err := parsePattern(r.Host)
		if err != nil {
			bad(field+".host", r.Host, "%v", err)
			continue
		}
		if p.Mode == Restricted && !slices.ContainsFunc(hosts, func(a hostPattern) bool { return a.Covers(hp) || hp.Covers(a) }) {
			bad(field+".host", r.Host, "matches no host of allowed_hosts: the rule would have no effect")
		}
		if len(r.Methods) == 0 && len(r.Paths) == 0 {
			bad(field, r.Host, "names neither methods nor paths")
		}
		cr := compiledRule{host: hp}
		for j, m := range r.Methods {
			if !validHeaderName(m) || strings.ToUpper(m) != m {
				bad(fmt.Sprintf("%s.methods[%d]", field, j), m, "not an upper-case method name")
				continue
			}
			cr.methods = append(cr.methods, m)
		}
		for j, pth := range r.Paths {
			if !strings.HasPrefix(pth, "/") || strings.ContainsAny(pth, "?#% \t\r\n") || !cleanPath(pth) {
				bad(fmt.Sprintf("%s.paths[%d]", field, j), pth, "want a clean absolute path without ?, #, %% or spaces (\"/repos/\")")
				continue
			}
			cr.paths = append(cr.paths, pth)
		}
		out = append(out, cr)
	}
	return out
}

// cleanPath reports whether p has no ".", ".." or empty segments (a
// trailing slash is fine).
func cleanPath(p string) bool {
	if p == "/" {
		return true
	}
	q := strings.TrimSuffix(p, "/")
	return path.Clean(q) == q && !strings.Contains(p, "//")
}

// pathUnder reports whether p is prefix or below it, by whole segments.
func pathUnder(p, prefix string) bool {
	if prefix == "/" || p == prefix || p == strings.TrimSuffix(prefix, "/") {
		return true
	}
	return strings.HasPrefix(p, strings.TrimSuffix(prefix, "/")+"/")
}

// CheckRules is the HTTP layer's decision for one request to host: every
// rule that matches the host must allow the method and the path. It
// returns the reason and the rule on denial, "" when allowed. decodedPath
// and escapedPath are the request's path after and before percent-decoding.
func (c *Compiled) CheckRules(host, method, decodedPath, escapedPath string) (reason, rule string) {
	for _, r := range c.rules {
		if !r.host.match(host) {
			continue
		}
		rule = "http_rules: " + r.host.raw
		if len(r.methods) > 0 && !slices.Contains(r.methods, method) {
			return ReasonMethodNotAllowed, rule
		}
		if len(r.paths) > 0 {
			// Both spellings must be clean: "/a/%2e%2e/b" is "/a/../b" to
			// a server that decodes first.
			if !strings.HasPrefix(decodedPath, "/") || !cleanPath(decodedPath) || !cleanPath(escapedPath) {
				return ReasonPathNotAllowed, rule
			}
			if !slices.ContainsFunc(r.paths, func(pfx string) bool { return pathUnder(decodedPath, pfx) }) {
				return ReasonPathNotAllowed, rule
			}
		}
	}
	return "", ""
}

// HasRule reports whether some rule matches host.
func (c *Compiled) HasRule(host string) bool {
	return slices.ContainsFunc(c.rules, func(r compiledRule) bool { return r.host.match(host) })
}
