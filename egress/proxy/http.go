package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
)

// Bounds on a request head read from the sandbox.
const (
	proxyReadBuf  = 8 << 10  // bufio size; also the longest line
	maxHeadBytes  = 64 << 10 // request line and all header lines
	maxHeadFields = 100
)

var (
	errHeadTooLarge = errors.New("request head too large")
	errBadLine      = errors.New("malformed request line")
	errBadHeader    = errors.New("malformed header line")
)

// handleProxy serves one connection on the proxy port: SOCKS5 when the first
// byte is 0x05, HTTP otherwise.
func (s *Session) handleProxy(c net.Conn, h *held) {
	c.SetDeadline(time.Now().Add(s.opts.ConnectTimeout)) // bounds the whole request phase
	br := bufio.NewReaderSize(c, proxyReadBuf)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	switch first[0] {
	case 0x05:
		s.handleSOCKS(c, br, h)
	case 0x04: // SOCKS4/4a: no domain validation story, no IPv6; refused
		s.record(egress.Event{Kind: egress.KindNet, Reason: egress.ReasonUnsupportedProtocol, Via: egress.ViaSOCKS5})
		c.Write([]byte{0, 0x5b, 0, 0, 0, 0, 0, 0}) // SOCKS4 "request rejected"
	default:
		s.handleHTTP(c, br, h)
	}
}

// requestLine is a parsed HTTP/1.x request line.
type requestLine struct {
	method, target, proto string
}

// parseRequestLine parses "METHOD SP target SP HTTP/1.x" (without CRLF)
// strictly: one space between the parts, a token method, a target of
// visible ASCII, HTTP/1.0 or HTTP/1.1. Anything else (a CR, LF, tab or space
// smuggled into the target, a missing version) is malformed.
func parseRequestLine(line string) (requestLine, error) {
	m, rest, ok := strings.Cut(line, " ")
	if !ok || m == "" {
		return requestLine{}, errBadLine
	}
	t, proto, ok := strings.Cut(rest, " ")
	if !ok || t == "" {
		return requestLine{}, errBadLine
	}
	for i := 0; i < len(m); i++ {
		if !egress.IsTokenChar(m[i]) {
			return requestLine{}, errBadLine
		}
	}
	for i := 0; i < len(t); i++ {
		if t[i] <= ' ' || t[i] >= 0x7f {
			return requestLine{}, errBadLine
		}
	}
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" {
		return requestLine{}, errBadLine
	}
	return requestLine{method: m, target: t, proto: proto}, nil
}

// checkHeaderLine checks "name: value" without its CRLF: a token name, no
// obsolete line folding, no control characters but tab in the value.
func checkHeaderLine(l string) error {
	name, value, ok := strings.Cut(l, ":")
	if !ok || name == "" {
		return errBadHeader
	}
	for i := 0; i < len(name); i++ {
		if !egress.IsTokenChar(name[i]) {
			return errBadHeader
		}
	}
	for i := 0; i < len(value); i++ {
		if c := value[i]; c < ' ' && c != '\t' || c == 0x7f {
			return errBadHeader
		}
	}
	return nil
}

// readHead reads a request head (request line and header lines, each
// CRLF-terminated, then an empty line) within the bounds above and returns
// the parsed request line and the raw head.
func readHead(br *bufio.Reader) (requestLine, []byte, error) {
	var head []byte
	var rl requestLine
	for n := 0; ; n++ {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			return rl, nil, errHeadTooLarge
		}
		if err != nil {
			return rl, nil, err
		}
		if len(head)+len(line) > maxHeadBytes || n > maxHeadFields {
			return rl, nil, errHeadTooLarge
		}
		head = append(head, line...)
		if n == 0 {
			m, _, _ := strings.Cut(string(line), " ")
			rl.method = m // names the adapter in the event if the line is malformed
		}
		if len(line) < 2 || line[len(line)-2] != '\r' {
			return rl, nil, errBadLine // bare LF
		}
		l := string(line[:len(line)-2])
		if strings.IndexByte(l, '\r') >= 0 {
			return rl, nil, errBadLine
		}
		if n == 0 {
			parsed, err := parseRequestLine(l)
			if err != nil {
				return rl, nil, err
			}
			rl = parsed
			continue
		}
		if l == "" {
			return rl, head, nil
		}
		if err := checkHeaderLine(l); err != nil {
			return rl, nil, err
		}
	}
}

// parseConnectTarget parses a CONNECT request target (authority-form
// "host:port" or "[v6]:port") into a normalized name or IP and a port.
func parseConnectTarget(t string) (name string, ip netip.Addr, port int, err error) {
	h, br, port, err := egress.SplitHostPort(t)
	if err != nil {
		return "", netip.Addr{}, 0, err
	}
	name, ip, err = egress.NormalizeHost(h, br)
	return name, ip, port, err
}

// proxyError is the X-Proxy-Error vocabulary (Codex and srt use the same).
func proxyError(reason string) string {
	switch reason {
	case egress.ReasonNotAllowlisted, egress.ReasonPortNotAllowed, egress.ReasonIPLiteral, egress.ReasonSNIMismatch:
		return "blocked-by-allowlist"
	case egress.ReasonPrivateAddress, egress.ReasonResolvedPrivate:
		return "blocked-private-address"
	}
	return "blocked-by-policy"
}

// writeDenial answers a denied or malformed HTTP request: 400 for a
// malformed request, 502 when the name did not resolve, 403 otherwise, with
// X-Proxy-Error and X-Str-Reason and the event's one-line message as body.
func writeDenial(w io.Writer, ev egress.Event) {
	status := http.StatusForbidden
	switch ev.Reason {
	case egress.ReasonMalformedRequest:
		status = http.StatusBadRequest
	case egress.ReasonResolveFailed:
		status = http.StatusBadGateway
	}
	body := egress.EventMessage(ev) + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nX-Proxy-Error: %s\r\nX-Str-Reason: %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), proxyError(ev.Reason), ev.Reason, len(body), body)
}

func writeBadGateway(w io.Writer, host string, port int) {
	body := "network: " + egress.DestString(host, "", port) + " could not be reached\n"
	fmt.Fprintf(w, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
}

// handleHTTP serves one HTTP proxy request: CONNECT (a tunnel) or an
// absolute-form http:// request (forwarded, then the connection closes).
func (s *Session) handleHTTP(c net.Conn, br *bufio.Reader, h *held) {
	rl, head, err := readHead(br)
	if err != nil {
		if errors.Is(err, errBadLine) || errors.Is(err, errBadHeader) || errors.Is(err, errHeadTooLarge) {
			ev := egress.Event{Kind: egress.KindNet, Reason: egress.ReasonMalformedRequest, Via: egress.ViaHTTP}
			if rl.method == http.MethodConnect {
				ev.Via = egress.ViaHTTPConnect
			}
			s.record(ev)
			writeDenial(c, ev)
		}
		return
	}
	if rl.method == http.MethodConnect {
		s.handleConnect(c, br, rl, h)
		return
	}
	s.handleForward(c, br, rl, head)
}

// intentFor builds an Intent from a normalized destination, mapping a fake
// IP back to its name (a client that resolved through the stub and then
// used the proxy with the address).
func (s *Session) intentFor(name string, ip netip.Addr, port int, via string) egress.Intent {
	if name == "" && fakePrefix.Contains(ip) {
		if n, ok := s.fake.lookup(ip); ok {
			return egress.Intent{Host: n, IP: ip, Port: port, Via: via}
		}
	}
	return egress.Intent{Host: name, IP: ip, Port: port, Via: via}
}

func (s *Session) handleConnect(c net.Conn, br *bufio.Reader, rl requestLine, h *held) {
	name, ip, port, err := parseConnectTarget(rl.target)
	if err != nil {
		host, _, _ := strings.Cut(rl.target, ":")
		ev := egress.Event{Kind: egress.KindNet, Reason: egress.ReasonMalformedRequest, Host: egress.SanitizeHost(host), Via: egress.ViaHTTPConnect}
		s.record(ev)
		writeDenial(c, ev)
		return
	}
	in := s.intentFor(name, ip, port, egress.ViaHTTPConnect)
	d := s.decide(in)
	if !d.Allow {
		writeDenial(c, netEvent(in, d))
		return
	}
	up, err := s.dial(d, port)
	if err != nil {
		writeBadGateway(c, in.Host, port)
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		s.untrack(up)
		return
	}
	s.tunnel(c, br, up, in, d, h)
}

// tunnel checks the TLS server name on port 443 (the client has its 200 or
// SOCKS success by now and sends its ClientHello), then splices.
func (s *Session) tunnel(c net.Conn, r io.Reader, up net.Conn, in egress.Intent, d egress.Decision, h *held) {
	var pre []byte
	if in.Port == 443 && in.Host != "" {
		c.SetReadDeadline(time.Now().Add(min(sniTimeout, s.opts.ConnectTimeout)))
		var sni string
		var err error
		pre, sni, err = peekClientHello(r)
		if err == nil && sni != "" {
			in.SNI = sni
			if sd, ok := s.dec.CheckSNI(in.Host, sni, d.Rule); !ok {
				s.record(netEvent(in, sd))
				s.untrack(up)
				reset(c)
				return
			}
		} else if !peekPassable(pre, err) {
			// A handshake that started but could not be read within the
			// bounds is not passed through unchecked.
			ev := netEvent(in, egress.Deny(egress.ReasonMalformedRequest, d.Rule))
			s.record(ev)
			s.untrack(up)
			reset(c)
			return
		}
	}
	s.passOn(c, r, up, pre, in, h)
}

// handleForward forwards one absolute-form request: the Host header must
// name the URL's host and port; Proxy-* and hop-by-hop headers are removed;
// the request goes upstream with Connection: close and the client
// connection closes after the response.
func (s *Session) handleForward(c net.Conn, br *bufio.Reader, rl requestLine, head []byte) {
	malformed := func(host string) {
		ev := egress.Event{Kind: egress.KindNet, Reason: egress.ReasonMalformedRequest, Host: egress.SanitizeHost(host), Via: egress.ViaHTTP}
		s.record(ev)
		writeDenial(c, ev)
	}
	if strings.HasPrefix(rl.target, "/") || rl.target == "*" {
		malformed("") // origin-form: this is a proxy, not a server
		return
	}
	u, err := url.ParseRequestURI(rl.target)
	if err != nil {
		malformed("")
		return
	}
	if scheme := strings.ToLower(u.Scheme); scheme != "http" {
		ev := egress.Event{Kind: egress.KindNet, Reason: egress.ReasonUnsupportedProtocol, Via: egress.ViaHTTP}
		s.record(ev)
		writeDenial(c, ev)
		return
	}
	if u.User != nil || u.Host == "" || u.Opaque != "" {
		malformed("")
		return
	}
	name, ip, port, err := parseAuthority(u.Host, 80)
	if err != nil {
		malformed(u.Host)
		return
	}
	req, err := http.ReadRequest(bufio.NewReaderSize(io.MultiReader(bytes.NewReader(head), br), proxyReadBuf))
	if err != nil {
		malformed(name)
		return
	}
	// Go drops the Host header of an absolute-form request; read it from
	// the head, which readHead already checked line by line.
	if hv := headerValues(head, "Host"); len(hv) > 1 {
		malformed(name)
		return
	} else if len(hv) == 1 {
		hn, hip, hport, herr := parseAuthority(hv[0], 80)
		if herr != nil || hn != name || hip != ip || hport != port {
			malformed(name)
			return
		}
	}
	in := s.intentFor(name, ip, port, egress.ViaHTTP)
	d := s.decide(in)
	if !d.Allow {
		writeDenial(c, netEvent(in, d))
		return
	}
	// The HTTP layer (rules, foreign placeholders) sees plain requests
	// too; a credential is never put into one (it would travel in clear).
	body, ev := s.inspect(req, in)
	if ev != nil {
		writeDenial(c, *ev)
		return
	}
	req.Body = body
	up, err := s.dial(d, port)
	if err != nil {
		writeBadGateway(c, in.Host, port)
		return
	}
	defer s.untrack(up)
	stripHopByHop(req.Header)
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // keep Go from adding its own
	}
	req.Host = u.Host
	req.Close = true
	req.RequestURI = ""
	idle := s.opts.IdleTimeout
	c.SetDeadline(time.Time{})
	upc := idleConn{up, idle}
	if err := req.Write(upc); err != nil {
		writeBadGateway(c, in.Host, port)
		return
	}
	ur := bufio.NewReaderSize(upc, proxyReadBuf)
	cc := idleConn{c, idle}
	for {
		resp, err := http.ReadResponse(ur, req)
		if err != nil {
			writeBadGateway(c, in.Host, port)
			return
		}
		informational := resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols
		stripHopByHop(resp.Header)
		resp.Close = !informational
		err = resp.Write(cc)
		resp.Body.Close()
		if err != nil || !informational {
			return
		}
	}
}

// parseAuthority parses "host[:port]" (a URL host or a Host header).
func parseAuthority(a string, defPort int) (string, netip.Addr, int, error) {
	hostPart, bracketed, port := a, false, defPort
	if strings.HasPrefix(a, "[") {
		end := strings.IndexByte(a, ']')
		if end < 0 {
			return "", netip.Addr{}, 0, egress.ErrUnbracketedV6
		}
		if rest := a[end+1:]; rest != "" {
			return parseConnectTarget(a)
		}
		hostPart, bracketed = a[1:end], true
	} else if strings.IndexByte(a, ':') >= 0 {
		return parseConnectTarget(a)
	}
	name, ip, err := egress.NormalizeHost(hostPart, bracketed)
	return name, ip, port, err
}

// stripHopByHop removes Proxy-* headers (never forwarded: credentials for
// this proxy), the headers the Connection header lists, and the standard
// hop-by-hop headers. Upgrade is dropped: a forwarded request is one
// request-response exchange.
func stripHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				h.Del(f)
			}
		}
	}
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "proxy-") {
			delete(h, k)
		}
	}
	for _, k := range []string{"Connection", "Keep-Alive", "Te", "Trailer", "Upgrade"} {
		h.Del(k)
	}
}

// idleConn refreshes the deadline before every read and write: a forwarded
// exchange may take any time while bytes keep moving.
type idleConn struct {
	net.Conn
	idle time.Duration
}

func (c idleConn) Read(b []byte) (int, error) {
	c.Conn.SetReadDeadline(time.Now().Add(c.idle))
	return c.Conn.Read(b)
}

func (c idleConn) Write(b []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	return c.Conn.Write(b)
}

// headerValues returns the trimmed values of every header line named name
// in a raw head (request line first, CRLF line ends).
func headerValues(head []byte, name string) []string {
	var out []string
	lines := strings.Split(string(head), "\r\n")
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(k, name) {
			out = append(out, strings.Trim(v, " \t"))
		}
	}
	return out
}
