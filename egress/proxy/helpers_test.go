package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// Every socket in these tests is on 127.0.0.1. Names resolve through
// stubResolver, and guardDialer fails the test if anything but loopback is
// ever dialed.

var loopback = netip.MustParseAddr("127.0.0.1")

// stubResolver answers from a map; unknown names fail.
type stubResolver map[string][]netip.Addr

func (r stubResolver) LookupNetIP(ctx context.Context, _, host string) ([]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// guardDialer dials loopback only; remap sends a port to another one (so a
// test can "reach" port 443 on a server listening elsewhere).
func guardDialer(t testing.TB, remap map[int]int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil || !ap.Addr().IsLoopback() || ap.Addr().Unmap() != loopback {
			t.Errorf("dial of a non-loopback address %q", addr)
			return nil, errors.New("test: refusing to dial " + addr)
		}
		port := int(ap.Port())
		if p, ok := remap[port]; ok {
			port = p
		}
		var d net.Dialer
		return d.DialContext(ctx, network, netip.AddrPortFrom(loopback, uint16(port)).String())
	}
}

// startEcho runs a TCP echo server on 127.0.0.1 and returns its port.
func startEcho(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(30 * time.Second))
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// testSession holds a session and the addresses of its listeners.
type testSession struct {
	*Session
	proxy, dnsTCP string
	dnsUDP        string
	capture       map[int]string
}

// startSession creates the listeners on 127.0.0.1 random ports (capture
// listeners keyed by the ports given) and starts a session.
func startSession(t testing.TB, p egress.Policy, o Options, capturePorts ...int) *testSession {
	t.Helper()
	lnT := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := Listeners{Proxy: lnT(), DNSUDP: pc, DNSTCP: lnT(), Capture: map[int]net.Listener{}}
	ts := &testSession{proxy: l.Proxy.Addr().String(), dnsTCP: l.DNSTCP.Addr().String(), dnsUDP: pc.LocalAddr().String(), capture: map[int]string{}}
	for _, port := range capturePorts {
		l.Capture[port] = lnT()
		ts.capture[port] = l.Capture[port].Addr().String()
	}
	if o.Dialer == nil {
		o.Dialer = guardDialer(t, nil)
	}
	s, err := Start(context.Background(), p, l, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ts.Session = s
	return ts
}

func dialT(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(20 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// rawRequest sends raw bytes to the proxy and reads one response head.
func rawRequest(t *testing.T, proxy, req string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c := dialT(t, proxy)
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: strings.Fields(req + " x")[0]})
	if err != nil {
		t.Fatalf("%q: reading the response: %v", req, err)
	}
	return c, br, resp
}

func connect(t *testing.T, proxy, target string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	return rawRequest(t, proxy, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
}

// echoRoundTrip writes a line through the tunnel and expects it back.
func echoRoundTrip(t *testing.T, w io.Writer, r *bufio.Reader) {
	t.Helper()
	const msg = "hello through the tunnel\n"
	if _, err := io.WriteString(w, msg); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil || got != msg {
		t.Fatalf("echo: got %q, %v", got, err)
	}
}

// socks5 performs a greeting and a CONNECT request; it returns the reply
// code and the connection.
func socks5(t *testing.T, proxy string, atyp byte, addr []byte, port int, cmd byte) (net.Conn, byte) {
	t.Helper()
	c := dialT(t, proxy)
	if _, err := c.Write([]byte{5, 1, 0}); err != nil {
		t.Fatal(err)
	}
	var g [2]byte
	if _, err := io.ReadFull(c, g[:]); err != nil || g != [2]byte{5, 0} {
		t.Fatalf("greeting: %v %v", g, err)
	}
	req := []byte{5, cmd, 0, atyp}
	if atyp == atypDomain {
		req = append(req, byte(len(addr)))
	}
	req = append(req, addr...)
	req = binary.BigEndian.AppendUint16(req, uint16(port))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var rep [10]byte
	if _, err := io.ReadFull(c, rep[:]); err != nil {
		t.Fatalf("reply: %v", err)
	}
	return c, rep[1]
}

// dnsQuery builds a query for name/type.
func buildQuery(t *testing.T, id uint16, name string, typ dnsmessage.Type) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: true})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func queryUDP(t *testing.T, addr string, q []byte) dnsmessage.Message {
	t.Helper()
	c, err := net.Dial("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(q); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatal(err)
	}
	return m
}

func queryTCP(t *testing.T, c net.Conn, q []byte) dnsmessage.Message {
	t.Helper()
	out := binary.BigEndian.AppendUint16(nil, uint16(len(q)))
	if _, err := c.Write(append(out, q...)); err != nil {
		t.Fatal(err)
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	var m dnsmessage.Message
	if err := m.Unpack(buf); err != nil {
		t.Fatal(err)
	}
	return m
}

// clientHello returns the first flight crypto/tls sends for serverName.
func clientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go func() {
		tc := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
		tc.Handshake()
	}()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, binary.BigEndian.Uint16(hdr[3:]))
	if _, err := io.ReadFull(b, body); err != nil {
		t.Fatal(err)
	}
	return append(hdr, body...)
}

// findEvent returns the event with the reason (and host, when not empty).
func findEvent(s *Session, reason, host string) (egress.Event, bool) {
	evs, _ := s.Violations()
	for _, ev := range evs {
		if ev.Reason == reason && (host == "" || ev.Host == host) {
			return ev, true
		}
	}
	return egress.Event{}, false
}

func mustEvent(t *testing.T, s *Session, reason, host string) egress.Event {
	t.Helper()
	ev, ok := findEvent(s, reason, host)
	if !ok {
		evs, _ := s.Violations()
		t.Fatalf("no %s event for %q; events: %+v", reason, host, evs)
	}
	return ev
}

func portStr(p int) string { return strconv.Itoa(p) }

// pin binds name to a chosen address in the session's fake-IP table. The
// test hook for transparent capture: tests on the host cannot bind 127.1.x.y
// (they stay on 127.0.0.1), so they pin the name capture should see to
// 127.0.0.1, the capture listener's local address.
func (t *fakeTable) pin(name string, a netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byName[name], t.byIP[a] = a, name
}
