package proxy

import (
	"bufio"
	"context"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// svcPolicy allows svc.test (and the test's loopback upstream through the
// explicit CIDR) on the upstream's port.
func svcPolicy(port int, extraPorts ...int) egress.Policy {
	return egress.Policy{
		Mode:         egress.Restricted,
		AllowedHosts: []string{"svc.test"},
		AllowedPorts: append([]int{port}, extraPorts...),
		AllowedCIDRs: []string{"127.0.0.1/32"},
	}
}

var svcResolver = stubResolver{"svc.test": {loopback}}

func TestHTTPConnectAllowed(t *testing.T) {
	up := startEcho(t)
	// The default dialer (with its Control re-check) dials the pinned
	// 127.0.0.1, which the policy's CIDR names.
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver, Dialer: nil})
	ts.Session.dialer = (&net.Dialer{Control: ts.Session.controlCheck}).DialContext
	c, br, resp := connect(t, ts.proxy, "svc.test:"+portStr(up))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	echoRoundTrip(t, c, br)
	if evs, _ := ts.Violations(); len(evs) != 0 {
		t.Errorf("violations: %+v", evs)
	}
	if ts.Summary() != "" {
		t.Errorf("summary: %q", ts.Summary())
	}
}

func TestUpstreamNeedsCIDR(t *testing.T) {
	up := startEcho(t)
	p := svcPolicy(up)
	p.AllowedCIDRs = nil
	ts := startSession(t, p, Options{Resolver: svcResolver})
	_, _, resp := connect(t, ts.proxy, "svc.test:"+portStr(up))
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonResolvedPrivate ||
		resp.Header.Get("X-Proxy-Error") != "blocked-private-address" {
		t.Fatalf("got %d %v", resp.StatusCode, resp.Header)
	}
	mustEvent(t, ts.Session, egress.ReasonResolvedPrivate, "svc.test")
}

func TestHTTPConnectDenied(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver})
	for _, tc := range []struct {
		target, reason, proxyErr, host string
		status                         int
	}{
		{"other.test:" + portStr(up), egress.ReasonNotAllowlisted, "blocked-by-allowlist", "other.test", 403},
		{"svc.test:8080", egress.ReasonPortNotAllowed, "blocked-by-allowlist", "svc.test", 403},
		{"1.1.1.1:" + portStr(up), egress.ReasonIPLiteral, "blocked-by-allowlist", "", 403},
		{"[::ffff:1.1.1.1]:443", egress.ReasonIPLiteral, "blocked-by-allowlist", "", 403},
		{"bad_host!:443", egress.ReasonMalformedRequest, "blocked-by-policy", "", 400},
		{"svc.test", egress.ReasonMalformedRequest, "blocked-by-policy", "", 400},
		{"::1:443", egress.ReasonMalformedRequest, "blocked-by-policy", "", 400},
		{"evil.com@svc.test:443", egress.ReasonMalformedRequest, "blocked-by-policy", "", 400},
	} {
		_, _, resp := connect(t, ts.proxy, tc.target)
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.status || resp.Header.Get("X-Str-Reason") != tc.reason || resp.Header.Get("X-Proxy-Error") != tc.proxyErr {
			t.Errorf("CONNECT %s: %d %v", tc.target, resp.StatusCode, resp.Header)
		}
		if !strings.HasPrefix(string(body), "network: ") || strings.Count(string(body), "\n") != 1 {
			t.Errorf("CONNECT %s: body %q", tc.target, body)
		}
		if tc.host != "" {
			ev := mustEvent(t, ts.Session, tc.reason, tc.host)
			if ev.Via != egress.ViaHTTPConnect || ev.Kind != egress.KindNet || ev.Action != "denied" {
				t.Errorf("event %+v", ev)
			}
		}
	}
	ev := mustEvent(t, ts.Session, egress.ReasonIPLiteral, "")
	if ev.IP != "1.1.1.1" || ev.Port == 0 {
		t.Errorf("ip_literal event %+v", ev)
	}
}

// TestCONNECTInjection: a request line with CR/LF, spaces or a missing
// version is answered 400 and nothing is dialed.
func TestCONNECTInjection(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver})
	for _, req := range []string{
		"CONNECT a:443\r\nX:y\r\n\r\n",
		"CONNECT svc.test:" + portStr(up) + "\r\nHost: x\r\n\r\n",
		"CONNECT svc.test:" + portStr(up) + " HTTP/1.1\nHost: x\n\n",
		"CONNECT svc.test\r:" + portStr(up) + " HTTP/1.1\r\n\r\n",
		"CONNECT svc.test :443 HTTP/1.1\r\n\r\n",
		"CONNECT  svc.test:443 HTTP/1.1\r\n\r\n",
		"CONNECT svc.test:443 HTTP/1.1\r\n folded: header\r\n\r\n",
		"CONNECT svc.test:443 HTTP/1.1\r\nBad Header: x\r\n\r\n",
		"CONNECT svc.test:443 HTTP/2.0\r\n\r\n",
		"CONNECT svc.test:443 HTTP/1.1\r\nX: " + strings.Repeat("a", 10000) + "\r\n\r\n",
	} {
		_, _, resp := rawRequest(t, ts.proxy, req)
		if resp.StatusCode != 400 || resp.Header.Get("X-Str-Reason") != egress.ReasonMalformedRequest {
			t.Errorf("%q: %d %v", req, resp.StatusCode, resp.Header)
		}
	}
	mustEventVia(t, ts.Session, egress.ReasonMalformedRequest, egress.ViaHTTPConnect)
	if evs, _ := ts.Violations(); len(evs) != 1 || evs[0].Count != 10 {
		t.Errorf("events %+v", evs)
	}
}

func TestAbsoluteHTTP(t *testing.T) {
	type seen struct {
		host, uri string
		header    http.Header
	}
	got := make(chan seen, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.Host, r.RequestURI, r.Header.Clone()}
		io.WriteString(w, "upstream says hi")
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ts := startSession(t, svcPolicy(port), Options{Resolver: svcResolver})
	host := "svc.test:" + portStr(port)

	_, _, resp := rawRequest(t, ts.proxy, "GET http://"+host+"/path?secret=1 HTTP/1.1\r\nHost: "+host+
		"\r\nProxy-Authorization: Basic c2VjcmV0\r\nProxy-Connection: keep-alive\r\nConnection: X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(body) != "upstream says hi" {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	s := <-got
	if s.host != host || s.uri != "/path?secret=1" {
		t.Errorf("upstream saw host %q uri %q", s.host, s.uri)
	}
	for _, h := range []string{"Proxy-Authorization", "Proxy-Connection", "X-Drop"} {
		if s.header.Get(h) != "" {
			t.Errorf("upstream saw %s", h)
		}
	}
	if s.header.Get("X-Keep") != "2" {
		t.Errorf("upstream lacks X-Keep: %v", s.header)
	}

	// A Host header that names another host is refused: the decision was
	// made on the URL.
	for _, req := range []string{
		"GET http://" + host + "/ HTTP/1.1\r\nHost: evil.com\r\n\r\n",
		"GET http://" + host + "/ HTTP/1.1\r\nHost: svc.test:1\r\n\r\n",
		"GET http://" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\nHost: evil.com\r\n\r\n",
		"GET http://user@" + host + "/ HTTP/1.1\r\n\r\n",
		"GET /relative HTTP/1.1\r\nHost: " + host + "\r\n\r\n",
	} {
		_, _, resp := rawRequest(t, ts.proxy, req)
		if resp.StatusCode != 400 || resp.Header.Get("X-Str-Reason") != egress.ReasonMalformedRequest {
			t.Errorf("%q: %d %v", req, resp.StatusCode, resp.Header)
		}
	}
	_, _, resp = rawRequest(t, ts.proxy, "GET http://other.test:"+portStr(port)+"/x?token=abc HTTP/1.1\r\nHost: other.test:"+portStr(port)+"\r\n\r\n")
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonNotAllowlisted {
		t.Errorf("other.test: %d %v", resp.StatusCode, resp.Header)
	}
	_, _, resp = rawRequest(t, ts.proxy, "GET https://svc.test/ HTTP/1.1\r\n\r\n")
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonUnsupportedProtocol {
		t.Errorf("https absolute-form: %d %v", resp.StatusCode, resp.Header)
	}
	ev := mustEvent(t, ts.Session, egress.ReasonNotAllowlisted, "other.test")
	if ev.Via != egress.ViaHTTP {
		t.Errorf("event %+v", ev)
	}
	evs, _ := ts.Violations()
	for _, e := range evs {
		if strings.Contains(fmt.Sprintf("%+v", e), "token") || strings.Contains(fmt.Sprintf("%+v", e), "secret") {
			t.Errorf("an event carries a query string: %+v", e)
		}
	}
}

func TestSOCKS5(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver})

	// socks5h: the name travels to the proxy.
	c, rep := socks5(t, ts.proxy, atypDomain, []byte("svc.test"), up, socksConnect)
	if rep != repSucceeded {
		t.Fatalf("socks5h svc.test: reply %#x", rep)
	}
	echoRoundTrip(t, c, bufio.NewReader(c))

	// An IPv4 address is an IP literal, allowed only because the CIDR names it.
	c, rep = socks5(t, ts.proxy, atypIPv4, []byte{127, 0, 0, 1}, up, socksConnect)
	if rep != repSucceeded {
		t.Fatalf("socks5 127.0.0.1 with CIDR: reply %#x", rep)
	}
	echoRoundTrip(t, c, bufio.NewReader(c))

	for _, tc := range []struct {
		name   string
		atyp   byte
		addr   []byte
		port   int
		cmd    byte
		rep    byte
		reason string
	}{
		{"other name", atypDomain, []byte("other.test"), up, socksConnect, repNotAllowed, egress.ReasonNotAllowlisted},
		{"ip literal", atypIPv4, []byte{1, 1, 1, 1}, up, socksConnect, repNotAllowed, egress.ReasonIPLiteral},
		{"v6 mapped literal", atypIPv6, netip.MustParseAddr("::ffff:1.1.1.1").AsSlice(), up, socksConnect, repNotAllowed, egress.ReasonIPLiteral},
		{"port", atypDomain, []byte("svc.test"), 8080, socksConnect, repNotAllowed, egress.ReasonPortNotAllowed},
		{"bind", atypDomain, []byte("svc.test"), up, 0x02, repCmdNotSupported, egress.ReasonUnsupportedProtocol},
		{"udp associate", atypIPv4, []byte{0, 0, 0, 0}, up, 0x03, repCmdNotSupported, egress.ReasonUnsupportedProtocol},
		{"bad name", atypDomain, []byte("svc\r\n.test"), up, socksConnect, repGeneralFailure, egress.ReasonMalformedRequest},
	} {
		_, rep := socks5(t, ts.proxy, tc.atyp, tc.addr, tc.port, tc.cmd)
		if rep != tc.rep {
			t.Errorf("%s: reply %#x, want %#x", tc.name, rep, tc.rep)
		}
		mustEvent(t, ts.Session, tc.reason, "")
	}
	ev := mustEvent(t, ts.Session, egress.ReasonNotAllowlisted, "other.test")
	if ev.Via != egress.ViaSOCKS5h {
		t.Errorf("other.test event via %q", ev.Via)
	}
	ev = mustEvent(t, ts.Session, egress.ReasonIPLiteral, "")
	if ev.Via != egress.ViaSOCKS5 || ev.IP != "1.1.1.1" {
		t.Errorf("ip literal event %+v", ev)
	}
	bad := mustEvent(t, ts.Session, egress.ReasonMalformedRequest, "")
	if strings.ContainsAny(bad.Host, "\r\n") || strings.ContainsAny(bad.Message, "\r") {
		t.Errorf("malformed host not sanitized: %+v", bad)
	}

	// No acceptable auth method.
	c2 := dialT(t, ts.proxy)
	c2.Write([]byte{5, 1, 2})
	var g [2]byte
	if _, err := io.ReadFull(c2, g[:]); err != nil || g != [2]byte{5, 0xff} {
		t.Errorf("auth-only greeting: %v %v", g, err)
	}
}

// TestSOCKS5FakeIP: a client that resolved through the stub (socks5:// or a
// CONNECT to the address) reaches the name the fake IP stands for.
func TestSOCKS5FakeIP(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver})
	m := queryUDP(t, ts.dnsUDP, buildQuery(t, 1, "svc.test.", dnsmessage.TypeA))
	if len(m.Answers) != 1 {
		t.Fatalf("answers %+v", m.Answers)
	}
	fake := m.Answers[0].Body.(*dnsmessage.AResource).A
	c, rep := socks5(t, ts.proxy, atypIPv4, fake[:], up, socksConnect)
	if rep != repSucceeded {
		t.Fatalf("reply %#x", rep)
	}
	echoRoundTrip(t, c, bufio.NewReader(c))
	c, br, resp := connect(t, ts.proxy, netip.AddrFrom4(fake).String()+":"+portStr(up))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT to the fake IP: %d", resp.StatusCode)
	}
	echoRoundTrip(t, c, br)
	// An unassigned address in the fake range is just a (refused) literal.
	_, rep = socks5(t, ts.proxy, atypIPv4, []byte{127, 1, 255, 254}, up, socksConnect)
	if rep != repNotAllowed {
		t.Errorf("unassigned fake IP: reply %#x", rep)
	}
}

func TestTransparentCapture(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver}, up)
	// Test hook: on the host the capture listener is on 127.0.0.1, so that
	// address stands in for svc.test's fake IP.
	// Not pinned yet: 127.0.0.1 is the sandbox's own loopback.
	if !refused(t, ts.capture[up], nil) {
		t.Fatal("an unknown local address was not refused")
	}
	ev := mustEvent(t, ts.Session, egress.ReasonIPLiteral, "")
	if ev.Via != egress.ViaTransparent || ev.IP != "127.0.0.1" || ev.Port != up {
		t.Errorf("event %+v", ev)
	}

	ts.fake.pin("svc.test", loopback)
	c := dialT(t, ts.capture[up])
	echoRoundTrip(t, c, bufio.NewReader(c))

	// The same name on a port the policy does not allow.
	ts2 := startSession(t, svcPolicy(up), Options{Resolver: svcResolver}, 8080)
	ts2.fake.pin("svc.test", loopback)
	if !refused(t, ts2.capture[8080], nil) {
		t.Fatal("port 8080 was not refused")
	}
	mustEvent(t, ts2.Session, egress.ReasonPortNotAllowed, "svc.test")
}

func TestRebinding(t *testing.T) {
	up := startEcho(t)
	rebind := stubResolver{"svc.test": {loopback, netip.MustParseAddr("169.254.169.254")}, "meta.test": {netip.MustParseAddr("169.254.169.254")}}
	for _, p := range []egress.Policy{
		{Mode: egress.Restricted, AllowedHosts: []string{"svc.test", "meta.test"}, AllowedPorts: []int{up}},
		{Mode: egress.AllowEgress},
	} {
		ts := startSession(t, p, Options{Resolver: rebind}, up)
		_, _, resp := connect(t, ts.proxy, "svc.test:"+portStr(up))
		if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonResolvedPrivate {
			t.Errorf("%s: CONNECT: %d %v", p.Mode, resp.StatusCode, resp.Header)
		}
		if _, rep := socks5(t, ts.proxy, atypDomain, []byte("meta.test"), up, socksConnect); rep != repNotAllowed {
			t.Errorf("%s: socks5h: %#x", p.Mode, rep)
		}
		ts.fake.pin("svc.test", loopback)
		if !refused(t, ts.capture[up], nil) {
			t.Errorf("%s: transparent connect was not refused", p.Mode)
		}
		ev := mustEvent(t, ts.Session, egress.ReasonResolvedPrivate, "svc.test")
		if ev.Count != 2 && ev.Count != 1 {
			t.Errorf("event %+v", ev)
		}
		mustEvent(t, ts.Session, egress.ReasonResolvedPrivate, "meta.test")
	}
}

func TestSNI(t *testing.T) {
	up := startEcho(t)
	// Port 443 is "reached" on the echo server's port by the test dialer.
	p := svcPolicy(443)
	dialer := guardDialer(t, map[int]int{443: up})

	// CONNECT: the 200 comes first, then the ClientHello is checked.
	ts := startSession(t, p, Options{Resolver: svcResolver, Dialer: dialer}, 443)
	c, br, resp := connect(t, ts.proxy, "svc.test:443")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c.Write(clientHello(t, "evil.com"))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("a mismatched SNI was tunneled")
	}
	ev := mustEvent(t, ts.Session, egress.ReasonSNIMismatch, "svc.test")
	if ev.Via != egress.ViaHTTPConnect || ev.Port != 443 {
		t.Errorf("event %+v", ev)
	}

	// The matching name goes through, ClientHello intact.
	hello := clientHello(t, "svc.test")
	c, br, resp = connect(t, ts.proxy, "svc.test:443")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	c.Write(hello)
	echo := make([]byte, len(hello))
	if _, err := io.ReadFull(br, echo); err != nil || string(echo) != string(hello) {
		t.Fatalf("ClientHello not passed through: %v", err)
	}

	// SOCKS5h, same check.
	c, rep := socks5(t, ts.proxy, atypDomain, []byte("svc.test"), 443, socksConnect)
	if rep != repSucceeded {
		t.Fatalf("reply %#x", rep)
	}
	c.Write(clientHello(t, "other.test"))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("socks5h: a mismatched SNI was tunneled")
	}

	// Transparent: the ClientHello is read before deciding; nothing is
	// dialed for a mismatch.
	ts.fake.pin("svc.test", loopback)
	if !refused(t, ts.capture[443], clientHello(t, "evil.com")) {
		t.Fatal("transparent: a mismatched SNI was tunneled")
	}
	mustEventVia(t, ts.Session, egress.ReasonSNIMismatch, egress.ViaSOCKS5h)
	mustEventVia(t, ts.Session, egress.ReasonSNIMismatch, egress.ViaTransparent)
	c = dialT(t, ts.capture[443])
	c.Write(hello)
	if _, err := io.ReadFull(c, echo); err != nil || string(echo) != string(hello) {
		t.Fatalf("transparent: ClientHello not passed through: %v", err)
	}

	// A truncated handshake is not passed through unchecked.
	c = dialT(t, ts.capture[443])
	c.Write(hello[:20])
	c.(*net.TCPConn).CloseWrite()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a truncated ClientHello was tunneled")
	}
}

// refused reports whether a connection to addr is refused: the dial fails
// (the reset can beat connect's return on loopback) or the first read does.
func refused(t *testing.T, addr string, send []byte) bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return true
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if len(send) > 0 {
		c.Write(send)
	}
	_, err = c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: neither served nor refused", addr)
	}
	return err != nil
}

func mustEventVia(t *testing.T, s *Session, reason, via string) {
	t.Helper()
	evs, _ := s.Violations()
	for _, ev := range evs {
		if ev.Reason == reason && ev.Via == via {
			return
		}
	}
	t.Fatalf("no %s event via %s: %+v", reason, via, evs)
}

func TestDNSStub(t *testing.T) {
	ts := startSession(t, egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"svc.test", "*.example.com"}}, Options{Resolver: svcResolver})
	tcp := dialT(t, ts.dnsTCP)
	for _, transport := range []string{"udp", "tcp"} {
		q := func(name string, typ dnsmessage.Type) dnsmessage.Message {
			b := buildQuery(t, 0x1234, name, typ)
			if transport == "udp" {
				return queryUDP(t, ts.dnsUDP, b)
			}
			return queryTCP(t, tcp, b)
		}
		m := q("SVC.test.", dnsmessage.TypeA)
		if m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 1 || m.ID != 0x1234 || !m.Response {
			t.Fatalf("%s A svc.test: %+v", transport, m)
		}
		a := netip.AddrFrom4(m.Answers[0].Body.(*dnsmessage.AResource).A)
		if !fakePrefix.Contains(a) || m.Answers[0].Header.TTL != 1 {
			t.Errorf("%s: answer %v ttl %d", transport, a, m.Answers[0].Header.TTL)
		}
		if m.Questions[0].Name.String() != "SVC.test." {
			t.Errorf("question not echoed as asked: %v", m.Questions[0].Name)
		}
		m2 := q("svc.test.", dnsmessage.TypeA)
		if b := m2.Answers[0].Body.(*dnsmessage.AResource).A; netip.AddrFrom4(b) != a {
			t.Errorf("%s: same name, another IP: %v %v", transport, a, b)
		}
		m3 := q("api.example.com.", dnsmessage.TypeA)
		if b := m3.Answers[0].Body.(*dnsmessage.AResource).A; netip.AddrFrom4(b) == a {
			t.Errorf("two names share a fake IP")
		}
		if n, ok := ts.fake.lookup(a); !ok || n != "svc.test" {
			t.Errorf("fake table: %q %v", n, ok)
		}
		if m := q("svc.test.", dnsmessage.TypeAAAA); m.RCode != dnsmessage.RCodeSuccess || len(m.Answers) != 0 {
			t.Errorf("%s AAAA: %+v", transport, m)
		}
		if m := q("svc.test.", dnsmessage.TypeMX); m.RCode != dnsmessage.RCodeRefused {
			t.Errorf("%s MX: %+v", transport, m.Header)
		}
		if m := q("secret-data.attacker.test.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError || len(m.Answers) != 0 {
			t.Errorf("%s other name: %+v", transport, m.Header)
		}
		if m := q("example.com.", dnsmessage.TypeA); m.RCode != dnsmessage.RCodeNameError {
			t.Errorf("%s example.com: %+v", transport, m.Header)
		}
		if m := q("secret-data.attacker.test.", dnsmessage.TypeAAAA); m.RCode != dnsmessage.RCodeNameError {
			t.Errorf("%s other name AAAA: %+v", transport, m.Header)
		}
	}
	ev := mustEvent(t, ts.Session, egress.ReasonNameNotAllowlisted, "secret-data.attacker.test")
	if ev.Kind != egress.KindDNS || ev.Count != 4 || ev.Message != "dns: secret-data.attacker.test blocked — name not in the allowlist" {
		t.Errorf("event %+v", ev)
	}
	if ev := mustEvent(t, ts.Session, egress.ReasonQtypeRefused, "svc.test"); ev.Kind != egress.KindDNS || ev.Count != 2 {
		t.Errorf("event %+v", ev)
	}

	// Malformed queries: FORMERR with the ID, or nothing for a response.
	bad := buildQuery(t, 7, "svc.test.", dnsmessage.TypeA)
	bad[5] = 2 // QDCOUNT 2
	if m := rawUDP(t, ts.dnsUDP, bad); m == nil || m.RCode != dnsmessage.RCodeFormatError || m.ID != 7 {
		t.Errorf("two questions: %+v", m)
	}
	bad = buildQuery(t, 8, "svc.test.", dnsmessage.TypeA)
	bad[2] |= 0x80 // QR: a response
	tcp2 := dialT(t, ts.dnsTCP)
	tcp2.Write(append([]byte{0, byte(len(bad))}, bad...))
	if _, err := tcp2.Read(make([]byte, 1)); err == nil {
		t.Error("a response was answered")
	}
	bad = buildQuery(t, 9, "svc.test.", dnsmessage.TypeA)
	bad[2] |= 0x10 // opcode 2 (STATUS)
	if m := rawUDP(t, ts.dnsUDP, bad); m == nil || m.RCode != dnsmessage.RCodeNotImplemented {
		t.Errorf("opcode: %+v", m)
	}
}

func rawUDP(t *testing.T, addr string, q []byte) *dnsmessage.Header {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write(q)
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var p dnsmessage.Parser
	h, err := p.Start(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return &h
}

func TestDNSAllowEgressAndIsolated(t *testing.T) {
	ts := startSession(t, egress.Policy{Mode: egress.AllowEgress}, Options{Resolver: svcResolver})
	m := queryUDP(t, ts.dnsUDP, buildQuery(t, 1, "anything.example.net.", dnsmessage.TypeA))
	if len(m.Answers) != 1 {
		t.Errorf("allow_egress: %+v", m)
	}
	if m := queryUDP(t, ts.dnsUDP, buildQuery(t, 2, "bad_-.x.\\000.", dnsmessage.TypeA)); m.RCode != dnsmessage.RCodeNameError {
		t.Errorf("allow_egress invalid name: %+v", m.Header)
	}

	iso := startSession(t, egress.Policy{Mode: egress.Isolated}, Options{Resolver: svcResolver})
	if m := queryUDP(t, iso.dnsUDP, buildQuery(t, 1, "svc.test.", dnsmessage.TypeA)); m.RCode != dnsmessage.RCodeNameError {
		t.Errorf("isolated: %+v", m.Header)
	}
	if ev := mustEvent(t, iso.Session, egress.ReasonIsolated, "svc.test"); ev.Kind != egress.KindDNS {
		t.Errorf("event %+v", ev)
	}
	_, _, resp := connect(t, iso.proxy, "svc.test:443")
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonIsolated {
		t.Errorf("isolated CONNECT: %d %v", resp.StatusCode, resp.Header)
	}
	if _, rep := socks5(t, iso.proxy, atypDomain, []byte("svc.test"), 443, socksConnect); rep != repNotAllowed {
		t.Errorf("isolated socks: %#x", rep)
	}
	if ev := mustEvent(t, iso.Session, egress.ReasonIsolated, "svc.test"); ev.Kind != egress.KindDNS {
		t.Errorf("event %+v", ev)
	}

	// No listeners at all is fine too.
	s, err := Start(context.Background(), egress.Policy{Mode: egress.Isolated}, Listeners{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(context.Background(), egress.Policy{Mode: "open"}, Listeners{}, Options{}); err == nil {
		t.Error("an invalid policy started")
	}
}

func TestFakeIPsNeverReused(t *testing.T) {
	ft := newFakeTable()
	seen := map[netip.Addr]string{}
	for i := 0; i < 5000; i++ {
		name := fmt.Sprintf("host%d.example.com", i)
		a, ok := ft.assign(name)
		if !ok || !fakePrefix.Contains(a) || a == netip.MustParseAddr("127.1.0.0") || a == netip.MustParseAddr("127.1.255.255") {
			t.Fatalf("%s: %v %v", name, a, ok)
		}
		if prev, dup := seen[a]; dup {
			t.Fatalf("%v given to %s and %s", a, prev, name)
		}
		seen[a] = name
		if again, _ := ft.assign(name); again != a {
			t.Fatalf("%s: not deterministic within the session", name)
		}
	}
	// Deterministic across sessions.
	a1, _ := newFakeTable().assign("svc.test")
	a2, _ := newFakeTable().assign("svc.test")
	if a1 != a2 {
		t.Errorf("%v != %v", a1, a2)
	}
}

func TestLimitConnections(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver, MaxConns: 2})
	var held []net.Conn
	for i := 0; i < 2; i++ {
		c, br, resp := connect(t, ts.proxy, "svc.test:"+portStr(up))
		if resp.StatusCode != 200 {
			t.Fatalf("tunnel %d: %d", i, resp.StatusCode)
		}
		echoRoundTrip(t, c, br)
		held = append(held, c)
	}
	if !refused(t, ts.proxy, []byte("CONNECT svc.test:"+portStr(up)+" HTTP/1.1\r\n\r\n")) {
		t.Fatal("a third connection was served")
	}
	ev := mustEvent(t, ts.Session, egress.ReasonLimitConnections, "")
	if ev.Message != "network: connection blocked — too many concurrent connections" {
		t.Errorf("event %+v", ev)
	}
	// Freeing a slot serves the next one.
	held[0].Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", ts.proxy)
		if err == nil {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "CONNECT svc.test:"+portStr(up)+" HTTP/1.1\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
			if err == nil && resp.StatusCode == 200 {
				echoRoundTrip(t, c, br)
				c.Close()
				break
			}
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatal("a freed slot was never reused")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestIdleTimeoutClosesTunnel(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver, IdleTimeout: 100 * time.Millisecond})
	c, br, resp := connect(t, ts.proxy, "svc.test:"+portStr(up))
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	echoRoundTrip(t, c, br)
	// Nothing is sent: the tunnel must end (the test's own deadline bounds
	// the wait).
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("idle tunnel delivered data")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("idle tunnel was never closed")
	}
}

func TestSummaryAndEvents(t *testing.T) {
	var mu sync.Mutex
	var kills []egress.Event
	p := svcPolicy(443)
	p.OnViolation = egress.OnViolationKill
	ts := startSession(t, p, Options{Resolver: svcResolver, MaxEvents: 2, OnKill: func(ev egress.Event) {
		mu.Lock()
		kills = append(kills, ev)
		mu.Unlock()
	}})
	if ts.Summary() != "" {
		t.Fatal("summary before any violation")
	}
	connect(t, ts.proxy, "evil.com:443")
	want := "<sandbox_violations>\nnetwork: evil.com:443 blocked — not in the allowlist\n</sandbox_violations>"
	if got := ts.Summary(); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
	connect(t, ts.proxy, "evil.com:443")
	connect(t, ts.proxy, "svc.test:22")
	connect(t, ts.proxy, "third.com:443") // past MaxEvents distinct
	connect(t, ts.proxy, "fourth.com:443")
	evs, dropped := ts.Violations()
	if len(evs) != 2 || dropped != 2 || evs[0].Count != 2 || evs[1].Reason != egress.ReasonPortNotAllowed {
		t.Fatalf("events %+v dropped %d", evs, dropped)
	}
	if !evs[0].Last.After(evs[0].First) && !evs[0].Last.Equal(evs[0].First) {
		t.Errorf("first/last %v %v", evs[0].First, evs[0].Last)
	}
	want = "<sandbox_violations>\nnetwork: evil.com:443 blocked — not in the allowlist (2 times)\nnetwork: svc.test:22 blocked — port not in allowed_ports\n(2 more violations not listed)\n</sandbox_violations>"
	if got := ts.Summary(); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(kills) != 1 || kills[0].Host != "evil.com" || kills[0].Reason != egress.ReasonNotAllowlisted {
		t.Errorf("OnKill calls: %+v", kills)
	}
}

// stackSession returns the stacks of goroutines running session code.
func sessionGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "proxy.(*Session)") || strings.Contains(g, "egress.(*Decider)") {
			out = append(out, g)
		}
	}
	return out
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	up := startEcho(t)
	ts := startSession(t, svcPolicy(up), Options{Resolver: svcResolver}, up)
	ts.fake.pin("svc.test", loopback)
	// A live tunnel, a captured connection, an idle proxy connection that
	// never sends a request, a SOCKS greeting, a DNS-over-TCP connection.
	c, br, _ := connect(t, ts.proxy, "svc.test:"+portStr(up))
	echoRoundTrip(t, c, br)
	cc := dialT(t, ts.capture[up])
	echoRoundTrip(t, cc, bufio.NewReader(cc))
	dialT(t, ts.proxy)
	sc := dialT(t, ts.proxy)
	sc.Write([]byte{5, 1, 0})
	dt := dialT(t, ts.dnsTCP)
	queryTCP(t, dt, buildQuery(t, 1, "svc.test.", dnsmessage.TypeA))
	queryUDP(t, ts.dnsUDP, buildQuery(t, 1, "svc.test.", dnsmessage.TypeA))
	if len(sessionGoroutines()) == 0 {
		t.Fatal("no session goroutines found: the check would prove nothing")
	}
	if err := ts.Close(); err != nil {
		t.Fatal(err)
	}
	// Close has waited for every session goroutine to call wg.Done; a
	// goroutine may still be between its deferred Done and its exit, so
	// give the scheduler a bounded moment.
	for deadline := time.Now().Add(10 * time.Second); ; {
		g := sessionGoroutines()
		if len(g) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("goroutines left after Close:\n%s", strings.Join(g, "\n\n"))
		}
		time.Sleep(time.Millisecond)
	}
	if err := ts.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	// The tunnel's client side sees the end.
	if _, err := br.ReadByte(); err == nil {
		t.Error("tunnel still open after Close")
	}
	// Listeners are closed.
	if c, err := net.Dial("tcp", ts.proxy); err == nil {
		c.Close()
		t.Error("proxy listener still open after Close")
	}
}

func TestContextCancelCloses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Start(ctx, egress.Policy{Mode: egress.Isolated}, Listeners{Proxy: ln}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("cancelling the context did not close the session")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDialFailureIsNotAViolation(t *testing.T) {
	// A port with nothing listening (a closed listener's port).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	ts := startSession(t, svcPolicy(port), Options{Resolver: svcResolver})
	_, _, resp := connect(t, ts.proxy, "svc.test:"+portStr(port))
	if resp.StatusCode != 502 {
		t.Errorf("status %d", resp.StatusCode)
	}
	if _, rep := socks5(t, ts.proxy, atypDomain, []byte("svc.test"), port, socksConnect); rep != repConnRefused {
		t.Errorf("socks reply %#x", rep)
	}
	if evs, _ := ts.Violations(); len(evs) != 0 {
		t.Errorf("events %+v", evs)
	}
}
