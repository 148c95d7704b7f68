package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/net/idna"
)

// maxHostLen bounds a host name (RFC 1035: 253 characters without the
// trailing dot).
const maxHostLen = 253

var (
	errEmptyHost     = errors.New("empty host")
	errHostTooLong   = errors.New("host longer than 253 characters")
	errHostChar      = errors.New("host contains a character outside [A-Za-z0-9._-]")
	errHostLabel     = errors.New("host has an empty label or one longer than 63 characters")
	errHostNumeric   = errors.New("host looks numeric but is not an IP address")
	errHostIDNA      = errors.New("host is not a valid internationalized name")
	ErrUnbracketedV6 = errors.New("IPv6 address must be bracketed")
	ErrBadPort       = errors.New("port must be a decimal number from 1 to 65535")
	errHostZone      = errors.New("IPv6 zones are not allowed")
)

// NormalizeHost turns a destination host as a client wrote it into either a
// canonical DNS name (lowercase, no trailing dot, ASCII/punycode) or an IP
// address. Brackets are required around IPv6 literals (bracketed=true when
// the caller already stripped them, as after splitHostPort). v4-mapped IPv6
// addresses are returned as IPv4, so that "[::ffff:10.0.0.1]" is treated as
// 10.0.0.1 everywhere.
func NormalizeHost(s string, bracketed bool) (name string, ip netip.Addr, err error) {
	if s == "" {
		return "", netip.Addr{}, errEmptyHost
	}
	if len(s) > 4*maxHostLen { // before any work on hostile input
		return "", netip.Addr{}, errHostTooLong
	}
	if strings.HasPrefix(s, "[") {
		if !strings.HasSuffix(s, "]") || bracketed {
			return "", netip.Addr{}, ErrUnbracketedV6
		}
		s, bracketed = s[1:len(s)-1], true
	}
	if strings.IndexByte(s, ':') >= 0 {
		if !bracketed {
			return "", netip.Addr{}, ErrUnbracketedV6
		}
		a, perr := netip.ParseAddr(s)
		if perr != nil || !a.Is6() {
			return "", netip.Addr{}, fmt.Errorf("invalid IPv6 address: %w", errHostChar)
		}
		if a.Zone() != "" {
			return "", netip.Addr{}, errHostZone
		}
		return "", a.Unmap(), nil
	}
	if bracketed { // "[example.com]" or "[1.2.3.4]"
		return "", netip.Addr{}, ErrUnbracketedV6
	}
	if a, perr := netip.ParseAddr(s); perr == nil {
		return "", a.Unmap(), nil
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			// IDNA only for names that need it; ASCII names take the strict
			// path below (idna.Lookup would refuse "_" and accept things we
			// don't want to reason about).
			a, ierr := idna.Lookup.ToASCII(s)
			if ierr != nil {
				return "", netip.Addr{}, errHostIDNA
			}
			s = a
			break
		}
	}
	s = strings.ToLower(s)
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", netip.Addr{}, errEmptyHost
	}
	if len(s) > maxHostLen {
		return "", netip.Addr{}, errHostTooLong
	}
	if err := checkLabels(s); err != nil {
		return "", netip.Addr{}, err
	}
	// A name whose last label is numeric ("127.1", "0x7f.1", "1.2.3") is an
	// IP address to some resolvers (inet_aton, WHATWG URL) and a name to
	// others: refuse the ambiguity.
	last := s[strings.LastIndexByte(s, '.')+1:]
	if isNumericLabel(last) {
		return "", netip.Addr{}, errHostNumeric
	}
	return s, netip.Addr{}, nil
}

// checkLabels checks a lowercase name without a trailing dot: labels of 1 to
// 63 characters from [a-z0-9_-].
func checkLabels(s string) error {
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if n == 0 {
				return errHostLabel
			}
			n = 0
			continue
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return errHostChar
		}
		n++
		if n > 63 {
			return errHostLabel
		}
	}
	if n == 0 {
		return errHostLabel
	}
	return nil
}

func isNumericLabel(l string) bool {
	if strings.HasPrefix(l, "0x") {
		for i := 2; i < len(l); i++ {
			c := l[i]
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	for i := 0; i < len(l); i++ {
		if l[i] < '0' || l[i] > '9' {
			return false
		}
	}
	return l != ""
}

// SplitHostPort splits "host:port" and "[v6]:port" strictly: the port is
// required, decimal, 1..65535, without sign or leading zeros beyond "0"
// prefixes that change nothing; an unbracketed IPv6 address is refused.
func SplitHostPort(s string) (host string, bracketed bool, port int, err error) {
	var rest string
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", false, 0, ErrUnbracketedV6
		}
		host, rest, bracketed = s[1:end], s[end+1:], true
		if !strings.HasPrefix(rest, ":") {
			return "", false, 0, ErrBadPort
		}
		rest = rest[1:]
	} else {
		i := strings.IndexByte(s, ':')
		if i < 0 {
			return "", false, 0, ErrBadPort
		}
		host, rest = s[:i], s[i+1:]
		if strings.IndexByte(rest, ':') >= 0 {
			return "", false, 0, ErrUnbracketedV6
		}
	}
	port, err = parsePort(rest)
	if err != nil {
		return "", false, 0, err
	}
	return host, bracketed, port, nil
}

func parsePort(s string) (int, error) {
	if s == "" || len(s) > 5 {
		return 0, ErrBadPort
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, ErrBadPort
		}
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, ErrBadPort
	}
	return p, nil
}

// hostPattern is one compiled allowed_hosts entry: an exact name, or
// "*.suffix" matching strict subdomains of suffix only.
type hostPattern struct {
	raw      string // as written, for Rule
	name     string // exact name, or the suffix of a wildcard
	wildcard bool
}

// PublicSuffix is the public suffix list parsePattern checks wildcards
// against (golang.org/x/net/publicsuffix, which links net/http). A program
// that links package egress/proxy has it: that package sets it at init,
// and every session's policy is compiled there (the egress helper, the
// worker), so a wildcard over a public suffix never reaches a running
// proxy. A program that does not link the proxy (bin/str) leaves it nil
// and skips only that check here: its launcher has the egress helper check
// a policy with a wildcard (NeedsSuffixList) before it plans the sandbox.
var PublicSuffix func(name string) (suffix string, icann bool)

// NeedsSuffixList reports whether checking p and creds needs the public
// suffix list this program lacks: a wildcard host pattern, and no
// PublicSuffix (the launcher then has the egress helper check them).
func NeedsSuffixList(p Policy, creds []Credential) bool {
	if PublicSuffix != nil {
		return false
	}
	hosts := slices.Clone(p.AllowedHosts)
	for _, r := range p.HTTPRules {
		hosts = append(hosts, r.Host)
	}
	for _, c := range creds {
		hosts = append(hosts, c.Hosts...)
	}
	return slices.ContainsFunc(hosts, func(h string) bool { return strings.HasPrefix(h, "*.") })
}

// parsePattern validates an allowed_hosts entry. "*" alone, "*.tld" and a
// wildcard over any ICANN public suffix ("*.co.uk") are refused: they would
// allow most of the internet under a name that looks narrow. IP literals
// belong in allowed_cidrs.
func parsePattern(s string) (hostPattern, error) {
	raw := s
	wild := false
	if s == "*" {
		return hostPattern{}, errors.New(`"*" would allow every host: use policy allow_egress`)
	}
	if strings.HasPrefix(s, "*.") {
		wild, s = true, s[2:]
	}
	if strings.IndexByte(s, '*') >= 0 {
		return hostPattern{}, errors.New(`"*" is allowed only as the whole first label ("*.example.com")`)
	}
	name, ip, err := NormalizeHost(s, false)
	if err != nil {
		return hostPattern{}, err
	}
	if ip.IsValid() {
		return hostPattern{}, errors.New("an IP address is not a host name: use allowed_cidrs")
	}
	if wild {
		if strings.IndexByte(name, '.') < 0 {
			return hostPattern{}, fmt.Errorf("a wildcard over the single label %q would allow a whole top-level domain", name)
		}
		if PublicSuffix == nil {
			// Checked again where it is enforced (the helper's Start).
		} else if ps, icann := PublicSuffix(name); icann && ps == name {
			return hostPattern{}, fmt.Errorf("a wildcard over the public suffix %q would allow unrelated owners' hosts", name)
		}
	}
	return hostPattern{raw: raw, name: name, wildcard: wild}, nil
}

// match reports whether the normalized name h is covered by the pattern.
func (p hostPattern) match(h string) bool {
	if !p.wildcard {
		return h == p.name
	}
	return len(h) > len(p.name)+1 && strings.HasSuffix(h, p.name) && h[len(h)-len(p.name)-1] == '.'
}

// Covers reports whether every name q matches is also matched by p (for
// Tighten).
func (p hostPattern) Covers(q hostPattern) bool {
	if !q.wildcard {
		return p.match(q.name)
	}
	if !p.wildcard {
		return false
	}
	return q.name == p.name || p.match(q.name)
}

// SanitizeHost makes an untrusted host string safe to put in an event and in
// the text shown to a model: only [a-z0-9._:-[]] survive, the rest becomes
// '?', and it is cut at 253 characters.
func SanitizeHost(s string) string {
	if len(s) > maxHostLen {
		s = s[:maxHostLen]
	}
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '-', c == '_', c == ':', c == '[', c == ']':
		default:
			b[i] = '?'
		}
	}
	return string(b)
}
