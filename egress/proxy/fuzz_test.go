package proxy

import (
	"bufio"
	"bytes"
	"context"
	"github.com/securetoolruntime/str/egress"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Seed corpora live in testdata/fuzz/<FuzzName>/; the f.Add seeds below are
// the same kind of inputs. `go test -fuzz=FuzzX ./egress/` explores more.

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

// FuzzReadHead: an HTTP proxy request head as the sandbox sends it (the
// request line, header lines, the empty line; bytes after it belong to the
// body), read as the proxy reads it, then the target it names: CONNECT's
// authority, or each Host header of a forwarded request.
func FuzzReadHead(f *testing.F) {
	for _, s := range []string{
		"CONNECT svc.test:443 HTTP/1.1\r\nHost: svc.test:443\r\n\r\n",
		"GET http://svc.test/x HTTP/1.1\r\nHost: svc.test\r\nUser-Agent: a\r\n\r\nbody",
		"GET / HTTP/1.0\r\nHost: [::1]:8080\r\n\r\n",
		"CONNECT svc.test:443 HTTP/1.1\nHost: a\n\n",
		"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
		"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
		"CONNECT evil@svc.test:443 HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		rl, head, err := readHead(bufio.NewReaderSize(bytes.NewReader(b), proxyReadBuf))
		if err != nil {
			if head != nil {
				t.Fatalf("%q: error %v with a head %q", b, err, head)
			}
			return
		}
		if !bytes.HasPrefix(b, head) || !bytes.HasSuffix(head, []byte("\r\n\r\n")) || len(head) > maxHeadBytes {
			t.Fatalf("%q: head %q", b, head)
		}
		lines := strings.Split(strings.TrimSuffix(string(head), "\r\n\r\n"), "\r\n")
		if len(lines) > maxHeadFields+1 {
			t.Fatalf("%q: %d lines", b, len(lines))
		}
		if got, err := parseRequestLine(lines[0]); err != nil || got != rl {
			t.Fatalf("%q: request line %+v, reparsed %+v %v", b, rl, got, err)
		}
		for _, l := range lines[1:] {
			if strings.ContainsAny(l, "\r\n") || checkHeaderLine(l) != nil {
				t.Fatalf("%q: header line %q let through", b, l)
			}
		}
		if rl.method == "CONNECT" {
			name, ip, port, err := parseConnectTarget(rl.target)
			if err == nil {
				checkTarget(t, rl.target, name, ip.IsValid(), port)
			}
			return
		}
		for _, a := range headerValues(head, "Host") {
			if name, ip, port, err := parseAuthority(a, 80); err == nil {
				checkTarget(t, a, name, ip.IsValid(), port)
			}
		}
	})
}

// checkTarget: a parsed target is a port and exactly one of a clean name
// and an IP.
func checkTarget(t *testing.T, from, name string, isIP bool, port int) {
	t.Helper()
	if port < 1 || port > 65535 || (name == "") == !isIP || strings.ContainsAny(name, "@:/ \t\r\n") {
		t.Fatalf("%q: target name %q ip %v port %d", from, name, isIP, port)
	}
}

func FuzzParseSOCKSRequest(f *testing.F) {
	f.Add([]byte{5, 1, 0, 1, 127, 0, 0, 1, 0x01, 0xbb})
	f.Add([]byte{5, 1, 0, 3, 8, 's', 'v', 'c', '.', 't', 'e', 's', 't', 0x20, 0xfb})
	f.Add([]byte{5, 1, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 1, 1, 1, 0, 80})
	f.Add([]byte{5, 2, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{5, 1, 0, 3, 0, 0, 80})
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(b []byte) {
			r, err := parseSOCKSRequest(b)
			if err != nil {
				return
			}
			if r.port < 1 || r.port > 65535 || (r.name == "") == !r.ip.IsValid() || (r.via != egress.ViaSOCKS5 && r.via != egress.ViaSOCKS5h) {
				t.Fatalf("%x parsed to %+v", b, r)
			}
			if r.ip.Is4In6() {
				t.Fatalf("%x: v4-mapped address not unmapped", b)
			}
			checkTarget(t, string(b), r.name, r.ip.IsValid(), r.port)
		}
		check(b)
		// As the proxy reads it: one request's bytes off the stream, never
		// more than there are nor than the longest request.
		framed, err := readSOCKSRequest(bytes.NewReader(b))
		if err != nil {
			return
		}
		if !bytes.HasPrefix(b, framed) || len(framed) > 4+1+255+2 {
			t.Fatalf("%x: framed as %x", b, framed)
		}
		check(framed)
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
	s, err := Start(context.Background(), egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"svc.test"}}, Listeners{}, Options{Resolver: stubResolver{}})
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

// FuzzClientHelloSNI: a ClientHello handshake message (with its 4-byte
// header), parsed alone, then as the proxy peeks it off a stream: in one
// record, and as the raw stream the fuzzer made.
func FuzzClientHelloSNI(f *testing.F) {
	f.Add(clientHello(f, "svc.test")[5:])
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		sni, err := parseClientHelloSNI(b)
		if err == nil && sni != "" && !bytes.Contains(b, []byte(sni)) {
			t.Fatalf("%x: SNI %q is not in the message", b, sni)
		}
		// The same message in one handshake record: the peek agrees.
		if len(b) > 0 && len(b) <= maxTLSRecord {
			rec := append([]byte{recordTypeHShake, 3, 1, byte(len(b) >> 8), byte(len(b))}, b...)
			consumed, sni2, err2 := peekClientHello(bytes.NewReader(rec))
			if !bytes.HasPrefix(rec, consumed) {
				t.Fatalf("%x: consumed %x", rec, consumed)
			}
			if err == nil && (err2 != nil || sni2 != sni || !bytes.Equal(consumed, rec)) {
				t.Fatalf("%x: parsed SNI %q, peeked %q %v (consumed %d of %d)", b, sni, sni2, err2, len(consumed), len(rec))
			}
		}
		// The bytes as a stream of records.
		consumed, sni3, err3 := peekClientHello(bytes.NewReader(b))
		if !bytes.HasPrefix(b, consumed) {
			t.Fatalf("%x: consumed %x", b, consumed)
		}
		if err3 == nil && sni3 != "" && !bytes.Contains(consumed, []byte(sni3)) {
			t.Fatalf("%x: SNI %q is not in what was read", b, sni3)
		}
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
