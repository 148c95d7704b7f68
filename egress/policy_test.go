package egress

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestNormalizeHost(t *testing.T) {
	for _, tc := range []struct {
		in, name, ip string
		bad          bool
	}{
		{in: "Example.COM.", name: "example.com"},
		{in: "api.example.com", name: "api.example.com"},
		{in: "_srv._tcp.example.com", name: "_srv._tcp.example.com"},
		{in: "bücher.de", name: "xn--bcher-kva.de"},
		{in: "xn--bcher-kva.de", name: "xn--bcher-kva.de"},
		{in: "1.2.3.4", ip: "1.2.3.4"},
		{in: "[::1]", ip: "::1"},
		{in: "[::ffff:1.1.1.1]", ip: "1.1.1.1"},
		{in: "[2001:db8::1]", ip: "2001:db8::1"},
		{in: "::1", bad: true},            // unbracketed IPv6
		{in: "[fe80::1%eth0]", bad: true}, // zone
		{in: "[example.com]", bad: true},
		{in: "[1.2.3.4]", bad: true},
		{in: "", bad: true},
		{in: ".", bad: true},
		{in: "a..b", bad: true},
		{in: ".a.b", bad: true},
		{in: "a\r\nb.com", bad: true},
		{in: "a b.com", bad: true},
		{in: "user@host.com", bad: true},
		{in: "a/b.com", bad: true},
		{in: "a\\b.com", bad: true},
		{in: "a%2eb.com", bad: true},
		{in: "a\x00.com", bad: true},
		{in: "127.1", bad: true},      // inet_aton would say 127.0.0.1
		{in: "0x7f.0.0.1", bad: true}, // hex
		{in: "0177.0.0.1", bad: true}, // octal: Go refuses it as an IP; and the name is numeric
		{in: "1.2.3", bad: true},
		{in: "example.0x10", bad: true},
		{in: strings.Repeat("a", 64) + ".com", bad: true},
		{in: strings.Repeat("a.", 130) + "com", bad: true},
		{in: "*.example.com", bad: true},
		{in: "é\u200d.com", bad: true}, // IDNA refuses a joiner here
	} {
		name, ip, err := NormalizeHost(tc.in, false)
		if tc.bad {
			if err == nil {
				t.Errorf("normalizeHost(%q) = %q %v, want an error", tc.in, name, ip)
			}
			continue
		}
		if err != nil {
			t.Errorf("normalizeHost(%q): %v", tc.in, err)
			continue
		}
		gotIP := ""
		if ip.IsValid() {
			gotIP = ip.String()
		}
		if name != tc.name || gotIP != tc.ip {
			t.Errorf("normalizeHost(%q) = %q %q, want %q %q", tc.in, name, gotIP, tc.name, tc.ip)
		}
	}
}

func TestSplitHostPort(t *testing.T) {
	for _, tc := range []struct {
		in   string
		host string
		port int
		bad  bool
	}{
		{in: "a.com:443", host: "a.com", port: 443},
		{in: "[::1]:80", host: "::1", port: 80},
		{in: "a.com", bad: true},
		{in: "a.com:", bad: true},
		{in: "a.com:0", bad: true},
		{in: "a.com:65536", bad: true},
		{in: "a.com:+443", bad: true},
		{in: "a.com:443 ", bad: true},
		{in: "::1:80", bad: true},
		{in: "[::1]80", bad: true},
		{in: "[::1:80", bad: true},
	} {
		h, _, p, err := SplitHostPort(tc.in)
		if tc.bad != (err != nil) || !tc.bad && (h != tc.host || p != tc.port) {
			t.Errorf("splitHostPort(%q) = %q %d %v", tc.in, h, p, err)
		}
	}
}

func TestHostPatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		bad     bool
		match   []string
		nomatch []string
	}{
		{pattern: "*", bad: true},
		{pattern: "*.com", bad: true},
		{pattern: "*.co.uk", bad: true},
		{pattern: "*.test", bad: true}, // a single label
		{pattern: "*.*.example.com", bad: true},
		{pattern: "a*.example.com", bad: true},
		{pattern: "1.2.3.4", bad: true},
		{pattern: "[::1]", bad: true},
		{pattern: "exa mple.com", bad: true},
		{pattern: "", bad: true},
		{pattern: "*.example.com", match: []string{"a.example.com", "b.a.example.com"}, nomatch: []string{"example.com", "aexample.com", "example.com.evil.net", "a.example.co"}},
		{pattern: "API.Example.com.", match: []string{"api.example.com"}, nomatch: []string{"x.api.example.com", "example.com"}},
		{pattern: "*.example.co.uk", match: []string{"a.example.co.uk"}, nomatch: []string{"example.co.uk"}},
		{pattern: "svc.test", match: []string{"svc.test"}, nomatch: []string{"other.test"}},
	} {
		hp, err := parsePattern(tc.pattern)
		if tc.bad {
			if err == nil {
				t.Errorf("parsePattern(%q): want an error", tc.pattern)
			}
			continue
		}
		if err != nil {
			t.Errorf("parsePattern(%q): %v", tc.pattern, err)
			continue
		}
		for _, h := range tc.match {
			if !hp.match(h) {
				t.Errorf("%q should match %q", tc.pattern, h)
			}
		}
		for _, h := range tc.nomatch {
			if hp.match(h) {
				t.Errorf("%q should not match %q", tc.pattern, h)
			}
		}
	}
}

func TestValidateCollectsAllProblems(t *testing.T) {
	p := Policy{
		Mode:         Restricted,
		AllowedHosts: []string{"*", "ok.example.com", "*.com"},
		AllowedPorts: []int{0, 443, 70000},
		AllowedCIDRs: []string{"10.0.0.1/8", "nope", "::ffff:10.0.0.0/104"},
		DNSServers:   []string{"1.1.1.1", "dns.example.com"},
		OnViolation:  "explode",
	}
	err := p.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	for _, want := range []string{
		`network.allowed_hosts[0] "*"`, `network.allowed_hosts[2] "*.com"`,
		`network.allowed_ports[0] 0`, `network.allowed_ports[2] 70000`,
		`network.allowed_cidrs[0] "10.0.0.1/8"`, "did you mean 10.0.0.0/8", `network.allowed_cidrs[1] "nope"`, `network.allowed_cidrs[2]`,
		`network.dns_servers[1] "dns.example.com"`, `network.on_violation "explode"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "ok.example.com") {
		t.Errorf("a valid entry is reported: %v", err)
	}
	for _, tc := range []struct {
		p   Policy
		bad string
	}{
		{Policy{}, "network.policy: missing"},
		{Policy{Mode: "open"}, `network.policy "open"`},
		{Policy{Mode: Isolated, AllowedHosts: []string{"a.com"}}, "no effect with policy isolated"},
		{Policy{Mode: AllowEgress, AllowedHosts: []string{"a.com"}}, "no effect with policy allow_egress"},
		{Policy{Mode: Isolated}, ""},
		{Policy{Mode: Restricted, AllowedHosts: []string{"a.com"}, AllowedPorts: []int{443, 8443}, AllowedCIDRs: []string{"10.20.0.0/16"}, DNSServers: []string{"127.0.0.1:5353", "[::1]:53"}, OnViolation: "kill"}, ""},
		{Policy{Mode: AllowEgress, AllowedPorts: []int{8080}}, ""},
	} {
		err := tc.p.Validate()
		if tc.bad == "" && err != nil {
			t.Errorf("%+v: %v", tc.p, err)
		}
		if tc.bad != "" && (err == nil || !strings.Contains(err.Error(), tc.bad)) {
			t.Errorf("%+v: got %v, want %q", tc.p, err, tc.bad)
		}
	}
}

func TestTighten(t *testing.T) {
	base := Policy{Mode: Restricted, AllowedHosts: []string{"*.example.com", "api.other.com"}, AllowedPorts: []int{443, 8443}, AllowedCIDRs: []string{"10.0.0.0/8"}, DNSServers: []string{"127.0.0.1"}}
	egress := Policy{Mode: AllowEgress, AllowedCIDRs: []string{"10.0.0.0/8"}}
	for _, tc := range []struct {
		name  string
		p, q  Policy
		bad   string
		check func(Policy) bool
	}{
		{name: "inherit everything", p: base, q: Policy{}, check: func(e Policy) bool {
			return e.Mode == Restricted && slices.Equal(e.AllowedHosts, base.AllowedHosts) && slices.Equal(e.AllowedPorts, base.AllowedPorts)
		}},
		{name: "narrower hosts and ports", p: base, q: Policy{AllowedHosts: []string{"a.example.com", "*.b.example.com"}, AllowedPorts: []int{443}, AllowedCIDRs: []string{"10.1.0.0/16"}}},
		{name: "no CIDRs", p: base, q: Policy{AllowedCIDRs: []string{}}, check: func(e Policy) bool { return len(e.AllowedCIDRs) == 0 }},
		{name: "to isolated", p: base, q: Policy{Mode: Isolated}, check: func(e Policy) bool { return e.Mode == Isolated && e.AllowedHosts == nil }},
		{name: "egress to restricted", p: egress, q: Policy{Mode: Restricted, AllowedHosts: []string{"anything.net"}, AllowedPorts: []int{22}}},
		{name: "report to kill", p: base, q: Policy{OnViolation: "kill"}},
		{name: "mode looser", p: base, q: Policy{Mode: AllowEgress}, bad: `network.policy "allow_egress" is looser`},
		{name: "isolated to restricted", p: Policy{Mode: Isolated}, q: Policy{Mode: Restricted, AllowedHosts: []string{"a.com"}}, bad: "network.policy"},
		{name: "wildcard parent", p: base, q: Policy{AllowedHosts: []string{"example.com"}}, bad: `network.allowed_hosts "example.com" is looser`},
		{name: "other host", p: base, q: Policy{AllowedHosts: []string{"evil.com"}}, bad: `"evil.com"`},
		{name: "exact cannot widen to wildcard", p: base, q: Policy{AllowedHosts: []string{"*.api.other.com"}}, bad: `"*.api.other.com"`},
		{name: "port", p: base, q: Policy{AllowedPorts: []int{22}}, bad: "network.allowed_ports 22 is looser"},
		{name: "cidr", p: base, q: Policy{AllowedCIDRs: []string{"0.0.0.0/0"}}, bad: `network.allowed_cidrs "0.0.0.0/0"`},
		{name: "cidr in egress", p: egress, q: Policy{AllowedCIDRs: []string{"169.254.0.0/16"}}, bad: "allowed_cidrs"},
		{name: "dns server", p: base, q: Policy{DNSServers: []string{"8.8.8.8"}}, bad: "network.dns_servers"},
		{name: "dns server from host resolver", p: egress, q: Policy{DNSServers: []string{"127.0.0.1"}}, bad: "network.dns_servers"},
		{name: "kill to report", p: Policy{Mode: Isolated, OnViolation: "kill"}, q: Policy{OnViolation: "report"}, bad: "network.on_violation"},
		{name: "invalid q", p: base, q: Policy{AllowedHosts: []string{"*"}}, bad: "tightening policy"},
		{name: "all at once", p: base, q: Policy{AllowedHosts: []string{"evil.com"}, AllowedPorts: []int{22}}, bad: "allowed_ports 22"},
	} {
		e, err := tc.p.Tighten(tc.q)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%s: got %v, want %q", tc.name, err, tc.bad)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if tc.check != nil && !tc.check(e) {
			t.Errorf("%s: got %+v", tc.name, e)
		}
	}
}

func TestCapturePortsEnvResolvConf(t *testing.T) {
	if got := (Policy{Mode: Restricted, AllowedHosts: []string{"a.com"}}).CapturePorts(); !slices.Equal(got, []int{443}) {
		t.Errorf("restricted default: %v", got)
	}
	if got := (Policy{Mode: Restricted, AllowedPorts: []int{8443, 53, 3128, 443}}).CapturePorts(); !slices.Equal(got, []int{443, 8443}) {
		t.Errorf("restricted: %v", got)
	}
	if got := (Policy{Mode: AllowEgress, AllowedPorts: []int{8080, 443}}).CapturePorts(); !slices.Equal(got, []int{80, 443, 8080}) {
		t.Errorf("allow_egress: %v", got)
	}
	if got := (Policy{Mode: Isolated}).CapturePorts(); len(got) != 0 {
		t.Errorf("isolated: %v", got)
	}
	if got := Env(Policy{Mode: Isolated}); !slices.Equal(got, []string{"STR_NETWORK=isolated"}) {
		t.Errorf("isolated env: %v", got)
	}
	env := Env(Policy{Mode: Restricted})
	for _, want := range []string{
		"STR_NETWORK=restricted", "HTTP_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128",
		"ALL_PROXY=socks5h://127.0.0.1:3128", "all_proxy=socks5h://127.0.0.1:3128", "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1",
	} {
		if !slices.Contains(env, want) {
			t.Errorf("env lacks %q: %v", want, env)
		}
	}
	if len(env) != 9 {
		t.Errorf("env: %v", env)
	}
	if ResolvConf() != "nameserver 127.0.0.1\noptions ndots:0 attempts:1 timeout:1\n" {
		t.Errorf("resolv.conf: %q", ResolvConf())
	}
}

func TestRefusedAddresses(t *testing.T) {
	refused := []string{
		"0.0.0.0", "0.1.2.3", "10.0.0.1", "10.255.255.255", "100.64.0.1", "100.127.255.254", "127.0.0.1", "127.1.0.5",
		"169.254.169.254", "172.16.0.1", "172.31.255.255", "192.0.0.192", "192.168.1.1", "198.18.0.1", "198.19.255.255",
		"224.0.0.1", "239.255.255.250", "240.0.0.1", "255.255.255.255",
		"::", "::1", "::127.0.0.1", "fc00::1", "fd12:3456::1", "fe80::1", "fec0::1", "ff02::1", "100::1", "64:ff9b:1::1",
		// v4-mapped, NAT64 and 6to4 spellings of refused IPv4
		"::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "::ffff:0.0.0.0", "::ffff:0:a9fe:a9fe",
		"64:ff9b::a9fe:a9fe", "64:ff9b::7f00:1", "2002:a9fe:a9fe::1", "2002:7f00:1::",
		// documentation ranges (RFC 5737, RFC 3849), also v4-mapped and NAT64
		"192.0.2.1", "192.0.2.255", "198.51.100.7", "203.0.113.10", "2001:db8::1", "2001:db8:ffff::1",
		"::ffff:203.0.113.10", "64:ff9b::c000:201",
	}
	allowed := []string{"1.1.1.1", "8.8.8.8", "192.0.3.1", "198.51.101.1", "203.0.114.1", "2001:db9::1", "100.63.255.255", "100.128.0.0", "172.32.0.1", "192.0.1.1", "198.20.0.1", "223.255.255.255",
		"2606:4700::1111", "::ffff:1.1.1.1", "64:ff9b::101:101", "2002:101:101::1"}
	for _, s := range refused {
		if !refusedAddr(netip.MustParseAddr(s)) {
			t.Errorf("%s should be refused", s)
		}
		if AddrAllowed(netip.MustParseAddr(s), nil) {
			t.Errorf("%s should not pass the filter", s)
		}
	}
	for _, s := range allowed {
		if refusedAddr(netip.MustParseAddr(s)) {
			t.Errorf("%s should not be refused", s)
		}
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("fd00::/8")}
	for _, s := range []string{"127.0.0.1", "::ffff:127.0.0.1", "fd00::5"} {
		if !AddrAllowed(netip.MustParseAddr(s), cidrs) {
			t.Errorf("%s should be allowed by %v", s, cidrs)
		}
	}
	for _, s := range []string{"127.0.0.2", "169.254.169.254", "fe80::1%eth0"} {
		if AddrAllowed(netip.MustParseAddr(s), cidrs) {
			t.Errorf("%s should not be allowed by %v", s, cidrs)
		}
	}
}

// TestControlCheck exercises the default dialer's Control hook without
// dialing: it refuses what Decide refuses, whatever resolved it.
func TestControlCheck(t *testing.T) {
	pol, err := Policy{Mode: AllowEgress, AllowedCIDRs: []string{"127.0.0.1/32"}}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	for addr, ok := range map[string]bool{
		"127.0.0.1:80": true, "1.1.1.1:443": true, "169.254.169.254:80": false, "[::ffff:169.254.169.254]:80": false,
		"10.0.0.1:5432": false, "[::1]:80": false, "127.0.0.2:80": false, "localhost:80": false,
	} {
		if err := pol.CheckDialAddr(addr); (err == nil) != ok {
			t.Errorf("checkDialAddr(%s) = %v, want allowed=%v", addr, err, ok)
		}
	}
	iso, _ := Policy{Mode: Isolated}.Compile()
	if iso.CheckDialAddr("1.1.1.1:443") == nil {
		t.Error("isolated must refuse every dial")
	}
}

func TestDecide(t *testing.T) {
	res := stubResolver{
		"svc.test":       {loopback},
		"rebind.test":    {loopback, netip.MustParseAddr("169.254.169.254")},
		"mixed.test":     {netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("1.1.1.1")},
		"mapped.test":    {netip.MustParseAddr("::ffff:10.0.0.1")},
		"public.test":    {netip.MustParseAddr("1.1.1.1")},
		"a.example.com":  {netip.MustParseAddr("1.1.1.1")},
		"metadata.test":  {netip.MustParseAddr("169.254.169.254")},
		"localhost.test": {loopback},
		"doc.test":       {netip.MustParseAddr("203.0.113.10")},
	}
	restricted := Policy{Mode: Restricted, AllowedHosts: []string{"svc.test", "rebind.test", "mixed.test", "mapped.test", "*.example.com", "nowhere.test"}, AllowedPorts: []int{443, 8443}}
	withCIDR := restricted
	withCIDR.AllowedCIDRs = []string{"127.0.0.1/32"}
	egress := Policy{Mode: AllowEgress}
	docCIDR := Policy{Mode: AllowEgress, AllowedCIDRs: []string{"203.0.113.0/24"}} // a documentation range named
	type row struct {
		p      Policy
		in     Intent
		reason string // "" = allowed
		addrs  string
	}
	rows := []row{
		{restricted, Intent{Host: "svc.test", Port: 443, Via: ViaHTTPConnect}, ReasonResolvedPrivate, ""},
		{withCIDR, Intent{Host: "svc.test", Port: 443, Via: ViaHTTPConnect}, "", "[127.0.0.1]"},
		{withCIDR, Intent{Host: "SVC.test.", Port: 8443, Via: ViaSOCKS5h}, "", "[127.0.0.1]"},
		{withCIDR, Intent{Host: "svc.test", Port: 8080, Via: ViaHTTPConnect}, ReasonPortNotAllowed, ""},
		{withCIDR, Intent{Host: "other.test", Port: 443, Via: ViaHTTPConnect}, ReasonNotAllowlisted, ""},
		{withCIDR, Intent{Host: "other.test", Port: 22, Via: ViaHTTPConnect}, ReasonNotAllowlisted, ""},
		{withCIDR, Intent{Host: "example.com", Port: 443, Via: ViaHTTPConnect}, ReasonNotAllowlisted, ""},
		{withCIDR, Intent{Host: "a.example.com", Port: 443, Via: ViaHTTPConnect}, "", "[1.1.1.1]"},
		{withCIDR, Intent{Host: "rebind.test", Port: 443, Via: ViaTransparent}, "", "[127.0.0.1]"},
		{restricted, Intent{Host: "rebind.test", Port: 443, Via: ViaTransparent}, ReasonResolvedPrivate, ""},
		{restricted, Intent{Host: "mixed.test", Port: 443, Via: ViaHTTP}, "", "[1.1.1.1]"},
		{restricted, Intent{Host: "mapped.test", Port: 443, Via: ViaHTTP}, ReasonResolvedPrivate, ""},
		{restricted, Intent{Host: "nowhere.test", Port: 443, Via: ViaHTTP}, ReasonResolveFailed, ""},
		{restricted, Intent{IP: netip.MustParseAddr("1.1.1.1"), Port: 443, Via: ViaSOCKS5}, ReasonIPLiteral, ""},
		{restricted, Intent{Host: "1.1.1.1", Port: 443, Via: ViaHTTPConnect}, ReasonIPLiteral, ""},
		{withCIDR, Intent{Host: "[::ffff:127.0.0.1]", Port: 443, Via: ViaHTTPConnect}, "", "[127.0.0.1]"},
		{withCIDR, Intent{IP: loopback, Port: 22, Via: ViaSOCKS5}, ReasonPortNotAllowed, ""},
		{withCIDR, Intent{IP: loopback, Port: 443, Via: ViaTransparent}, ReasonIPLiteral, ""}, // the sandbox's own loopback
		{withCIDR, Intent{Host: "svc.test", Port: 443, Via: ViaHTTPConnect, SNI: "evil.com"}, ReasonSNIMismatch, ""},
		{withCIDR, Intent{Host: "svc.test", Port: 443, Via: ViaHTTPConnect, SNI: "SVC.TEST"}, "", "[127.0.0.1]"},
		{withCIDR, Intent{Host: "svc.test", Port: 443, Via: ViaHTTPConnect, SNI: "127.0.0.1"}, ReasonSNIMismatch, ""},
		{withCIDR, Intent{Host: "svc\r\n.test", Port: 443, Via: ViaHTTPConnect}, ReasonMalformedRequest, ""},
		{withCIDR, Intent{Host: "svc.test", Port: 0, Via: ViaHTTPConnect}, ReasonMalformedRequest, ""},
		{withCIDR, Intent{Host: "svc.test", Port: 443, Via: "ftp"}, ReasonUnsupportedProtocol, ""},
		{withCIDR, Intent{Host: "svc.test", Via: ViaDNS}, "", ""},
		{withCIDR, Intent{Host: "other.test", Via: ViaDNS}, ReasonNameNotAllowlisted, ""},
		{withCIDR, Intent{Host: "bad name", Via: ViaDNS}, ReasonNameNotAllowlisted, ""},
		{egress, Intent{Host: "anything.test", Via: ViaDNS}, "", ""},
		{egress, Intent{Host: "public.test", Port: 22, Via: ViaSOCKS5h}, "", "[1.1.1.1]"},
		{egress, Intent{Host: "metadata.test", Port: 80, Via: ViaHTTP}, ReasonResolvedPrivate, ""},
		{egress, Intent{Host: "localhost.test", Port: 80, Via: ViaHTTP}, ReasonResolvedPrivate, ""},
		{egress, Intent{IP: netip.MustParseAddr("169.254.169.254"), Port: 80, Via: ViaSOCKS5}, ReasonPrivateAddress, ""},
		{egress, Intent{Host: "[::ffff:169.254.169.254]", Port: 80, Via: ViaHTTPConnect}, ReasonPrivateAddress, ""},
		{egress, Intent{Host: "[::1]", Port: 80, Via: ViaHTTPConnect}, ReasonPrivateAddress, ""},
		{egress, Intent{IP: netip.MustParseAddr("203.0.113.10"), Port: 80, Via: ViaSOCKS5}, ReasonPrivateAddress, ""},
		{egress, Intent{IP: netip.MustParseAddr("2001:db8::1"), Port: 80, Via: ViaSOCKS5}, ReasonPrivateAddress, ""},
		{egress, Intent{IP: netip.MustParseAddr("8.8.4.4"), Port: 80, Via: ViaSOCKS5}, "", "[8.8.4.4]"},
		{docCIDR, Intent{IP: netip.MustParseAddr("203.0.113.10"), Port: 80, Via: ViaSOCKS5}, "", "[203.0.113.10]"},
		{docCIDR, Intent{Host: "doc.test", Port: 80, Via: ViaHTTP}, "", "[203.0.113.10]"},
		{egress, Intent{Host: "doc.test", Port: 80, Via: ViaHTTP}, ReasonResolvedPrivate, ""},
		{Policy{Mode: Isolated}, Intent{Host: "svc.test", Port: 443, Via: ViaHTTPConnect}, ReasonIsolated, ""},
		{Policy{Mode: Isolated}, Intent{Host: "svc.test", Via: ViaDNS}, ReasonIsolated, ""},
	}
	for _, r := range rows {
		pol, err := r.p.Compile()
		if err != nil {
			t.Fatal(err)
		}
		d := (&Decider{pol: pol, resolver: res}).Decide(context.Background(), r.in)
		if r.reason == "" {
			if !d.Allow {
				t.Errorf("%s %+v: denied %s, want allowed", r.p.Mode, r.in, d.Reason)
			} else if r.addrs != "" && strings.Join(strings.Fields(strings.Trim(fmtAddrs(d.Addrs), "[]")), " ") != strings.Trim(r.addrs, "[]") {
				t.Errorf("%s %+v: addrs %v, want %s", r.p.Mode, r.in, d.Addrs, r.addrs)
			}
			continue
		}
		if d.Allow || d.Reason != r.reason {
			t.Errorf("%s %+v: allow=%v reason=%q, want %q", r.p.Mode, r.in, d.Allow, d.Reason, r.reason)
		}
		if d.Allow == false && len(d.Addrs) != 0 {
			t.Errorf("%+v: a denial carries addresses", r.in)
		}
	}
}

func fmtAddrs(a []netip.Addr) string {
	s := make([]string, len(a))
	for i, x := range a {
		s[i] = x.String()
	}
	return "[" + strings.Join(s, " ") + "]"
}

// The host's own addresses are refused on every interface, not only
// loopback: a public address of the worker's host reaches its listeners.
func TestHostAddressesRefused(t *testing.T) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ifa := range ifas {
		pn, ok := ifa.(*net.IPNet)
		if !ok {
			continue
		}
		a, _ := netip.AddrFromSlice(pn.IP)
		if !refusedAddr(a.Unmap()) {
			t.Errorf("host address %s is not refused", a)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no interface addresses on this host")
	}
}
