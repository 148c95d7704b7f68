package egress

import (
	"context"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/; the f.Add seeds below are
// the same kind of inputs. `go test -fuzz=FuzzX ./egress/` explores more.

func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"example.com", "Example.COM.", "*.example.com", "[::1]", "[::ffff:1.1.1.1]", "1.2.3.4",
		"a\r\nb", "user@host", "bücher.de", "127.1", "0x7f.1", "*.com", "*", "_srv.x.y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		name, ip, err := normalizeHost(s, false)
		if err == nil && name != "" {
			if len(name) > maxHostLen || checkLabels(name) != nil {
				t.Fatalf("%q normalized to invalid %q", s, name)
			}
			n2, ip2, err2 := normalizeHost(name, false)
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
		if h := sanitizeHost(s); strings.ContainsAny(h, "\r\n <>/\\") {
			t.Fatalf("sanitizeHost(%q) = %q", s, h)
		}
	})
}

func FuzzParseConnectLine(f *testing.F) {
	for _, s := range []string{"CONNECT a.com:443 HTTP/1.1", "CONNECT [::1]:443 HTTP/1.1", "CONNECT a:443", "CONNECT a:443\r\nX:y",
		"GET http://a.com/ HTTP/1.1", "CONNECT  a.com:443 HTTP/1.1", "CONNECT a.com:443 HTTP/1.1 ", "CONNECT evil@a.com:443 HTTP/1.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		rl, err := parseRequestLine(line)
		if err != nil {
			return
		}
		if strings.ContainsAny(rl.target, " \t\r\n") || rl.method == "" || !strings.HasPrefix(rl.proto, "HTTP/1.") {
			t.Fatalf("%q parsed to %+v", line, rl)
		}
		name, ip, port, err := parseConnectTarget(rl.target)
		if err != nil {
			return
		}
		if port < 1 || port > 65535 || (name == "") == !ip.IsValid() {
			t.Fatalf("%q: target %q %v %d", line, name, ip, port)
		}
		if strings.ContainsAny(name, "@:/ \r\n") {
			t.Fatalf("%q: name %q", line, name)
		}
	})
}

func FuzzParseSOCKSRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 127, 0, 0, 1, 0x01, 0xbb})
	f.Add([]byte{5, 1, 0, 3, 8, 's', 'v', 'c', '.', 't', 'e', 's', 't', 0x20, 0xfb})
	f.Add([]byte{5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 1, 1, 1, 0, 80})
	f.Add([]byte{5, 2, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{5, 1, 0, 3, 0, 0, 80})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseSOCKSRequest(b)
		if err != nil {
			return
		}
		if r.port < 1 || r.port > 65535 || (r.name == "") == !r.ip.IsValid() || (r.via != ViaSOCKS5 && r.via != ViaSOCKS5h) {
			t.Fatalf("%x parsed to %+v", b, r)
		}
		if r.ip.Is4In6() {
			t.Fatalf("%x: v4-mapped address not unmapped", b)
		}
	})
}

func FuzzParseDNSQuery(f *testing.F) {
	seed := func(name string, typ dnsmessage.Type) []byte {
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 1, RecursionDesired: true})
		b.StartQuestions()
		b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
		m, _ := b.Finish()
		return m
	}
	f.Add(seed("svc.test.", dnsmessage.TypeA))
	f.Add(seed("other.test.", dnsmessage.TypeAAAA))
	f.Add(seed("svc.test.", dnsmessage.TypeTXT))
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0})
	s, err := Start(context.Background(), Policy{Mode: Restricted, AllowedHosts: []string{"svc.test"}}, Listeners{}, Options{Resolver: stubResolver{}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := parseDNSQuery(b)
		if err == nil && q.hdr.Response {
			t.Fatal("a response parsed as a query")
		}
		resp := s.answerDNS(b)
		if resp == nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(resp); err != nil {
			t.Fatalf("unparseable response %x to %x: %v", resp, b, err)
		}
		if !m.Response || len(m.Answers) > 1 {
			t.Fatalf("response %+v", m)
		}
		for _, a := range m.Answers {
			if ar, ok := a.Body.(*dnsmessage.AResource); !ok || ar.A[0] != 127 || ar.A[1] != 1 {
				t.Fatalf("answer %+v", a)
			}
		}
	})
}

func FuzzClientHelloSNI(f *testing.F) {
	f.Add(clientHello(f, "svc.test")[5:])
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		parseClientHelloSNI(b)
	})
}

func TestClientHelloSeedParses(t *testing.T) {
	sni, err := parseClientHelloSNI(clientHello(t, "svc.test")[5:])
	if err != nil || sni != "svc.test" {
		t.Fatalf("%q %v", sni, err)
	}
	if sni, err := parseClientHelloSNI([]byte{1, 0, 0, 0}); err == nil {
		t.Fatalf("empty ClientHello parsed: %q", sni)
	}
}
