package egress

import (
	"strings"
	"testing"
)

// The seed corpus lives in testdata/fuzz/FuzzNormalizeHost/; the proxy's
// parsers are fuzzed in package egress/proxy.

func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"example.com", "Example.COM.", "*.example.com", "[::1]", "[::ffff:1.1.1.1]", "1.2.3.4",
		"a\r\nb", "user@host", "bücher.de", "127.1", "0x7f.1", "*.com", "*", "_srv.x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, ip, err := NormalizeHost(s, false)
		if err == nil && name != "" {
			if len(name) > maxHostLen || checkLabels(name) != nil {
				t.Fatalf("%q normalized to invalid %q", s, name)
			}
			n2, ip2, err2 := NormalizeHost(name, false)
			if err2 != nil || n2 != name || ip2.IsValid() {
				t.Fatalf("not idempotent: %q -> %q -> %q %v %v", s, name, n2, ip2, err2)
			}
		}
		if err == nil && name == "" && !ip.IsValid() {
			t.Fatalf("%q: neither name nor IP", s)
		}
		if ip.IsValid() && (ip.Is4In6() || ip.Zone() != "") {
			t.Fatalf("%q: IP not canonical: %v", s, ip)
		}
		if hp, err := parsePattern(s); err == nil {
			if hp.name == "" || strings.ContainsAny(hp.name, "* \r\n@") {
				t.Fatalf("pattern %q compiled to %+v", s, hp)
			}
			if hp.wildcard && hp.match(hp.name) {
				t.Fatalf("wildcard %q matches its own suffix", s)
			}
			if name != "" && hp.match(name) && name != hp.name && !strings.HasSuffix(name, "."+hp.name) {
				t.Fatalf("%q matches %q", s, name)
			}
		}
		if h := SanitizeHost(s); strings.ContainsAny(h, "\r\n <>/\\") {
			t.Fatalf("sanitizeHost(%q) = %q", s, h)
		}
	})
}
