package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Interception turns on TLS termination for the hosts that have a
// credential or an HTTP rule; every other host keeps the untouched tunnel.
type Interception struct {
	// CA mints the certificates the sandbox is shown for terminated hosts
	// (the sandbox must trust CA.CertPEM(); see SandboxBundle).
	CA *CA
	// Credentials are this call's secrets and their placeholders.
	Credentials []egress.Credential
	// UpstreamRoots verify the real servers (nil: the host's trust store,
	// x509.SystemCertPool). Never skipped: a server that does not verify
	// is an upstream_certificate violation and the request fails.
	UpstreamRoots *x509.CertPool
	// MaxBodyScan bounds how much of a request body is read and searched
	// for foreign placeholders before anything is sent upstream (default
	// 64 KiB); the rest is searched as it streams, and a placeholder found
	// there aborts the upstream request. The proxy holds at most
	// MaxConns x maxStreams such prefixes at once.
	MaxBodyScan int
}

const defaultMaxBodyScan = 64 << 10

// maxStreams bounds concurrent HTTP/2 requests on one terminated
// connection (with MaxBodyScan, the proxy's memory per connection).
const maxStreams = 16

// interceptor is a session's compiled Interception.
type interceptor struct {
	ca       *CA
	creds    []egress.Credential
	roots    *x509.CertPool
	bodyScan int
}

// newInterceptor validates an Interception against the policy (step 0 of
// Start): rules and credentials need a CA; credentials must be valid and
// their hosts covered by allowed_hosts.
func newInterceptor(pol *egress.Compiled, ic *Interception) (*interceptor, error) {
	if ic == nil {
		if pol.Rules() {
			return nil, errors.New("network.http_rules need TLS termination: Options.Intercept with a CA")
		}
		return nil, nil
	}
	if ic.CA == nil {
		return nil, errors.New("interception: no CA")
	}
	creds := make([]egress.Credential, len(ic.Credentials))
	copy(creds, ic.Credentials)
	if err := egress.ValidateCredentials(pol, creds); err != nil {
		return nil, err
	}
	it := &interceptor{ca: ic.CA, creds: creds, roots: ic.UpstreamRoots, bodyScan: ic.MaxBodyScan}
	if it.roots == nil {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return nil, fmt.Errorf("interception: the host's trust store: %w", err)
		}
		it.roots = pool
	}
	if it.bodyScan <= 0 {
		it.bodyScan = defaultMaxBodyScan
	}
	return it, nil
}

// intercepts reports whether connections to host are terminated: host has
// a credential or an HTTP rule.
func (s *Session) intercepts(host string) bool {
	if s.icpt == nil || host == "" {
		return false
	}
	if s.pol.HasRule(host) {
		return true
	}
	for i := range s.icpt.creds {
		if s.icpt.creds[i].Covers(host) {
			return true
		}
	}
	return false
}

// passOn is the last step of every allowed tunnel (CONNECT, SOCKS5,
// transparent capture): hosts with a credential or a rule are terminated,
// every other host is spliced byte for byte as before.
func (s *Session) passOn(c net.Conn, r io.Reader, up net.Conn, pre []byte, in egress.Intent, h *held) {
	r = unbuffer(r, c)
	if !s.intercepts(in.Host) {
		s.splice(c, r, up, pre)
		return
	}
	if len(pre) > 0 {
		r = io.MultiReader(bytes.NewReader(pre), r)
	}
	s.terminate(c, r, up, in, h)
}

// unbuffer returns a reader of the bytes r (the request phase's
// bufio.Reader, or c itself) holds buffered and then of c directly: the
// request phase's buffer (proxyReadBuf) is not kept for the life of a
// tunnel or a terminated connection, most of which idle.
func unbuffer(r io.Reader, c net.Conn) io.Reader {
	br, ok := r.(*bufio.Reader)
	if !ok {
		return r
	}
	n := br.Buffered()
	if n == 0 {
		return c
	}
	b, _ := br.Peek(n) // buffered: never reads, never fails
	return io.MultiReader(bytes.NewReader(bytes.Clone(b)), c)
}

// readerConn is a connection whose reads go through r (bytes already
// buffered or peeked come first).
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

var errSNIMismatch = errors.New("egress: TLS server name does not match the destination")

// terminate serves one terminated connection. In order:
//
//  1. TLS handshake with the sandbox, showing a leaf for in.Host minted by
//     the session's CA; an SNI naming another host is sni_mismatch;
//  2. HTTP/2 (ALPN h2) or HTTP/1.1, both net/http's, on it (the session's
//     termServer, to which the connection is handed over); every request
//     goes through inspect (Host, rules, placeholders), then upstream;
//  3. upstream over TLS verified against UpstreamRoots, HTTP/2 when the
//     server offers it: first on the connection the tunnel already dialed
//     (its handshake runs alongside step 1), later on connections dialed
//     after a fresh Decide.
func (s *Session) terminate(c net.Conn, r io.Reader, up net.Conn, in egress.Intent, h *held) {
	// 3. starts here: the upstream handshake on the pinned connection runs
	// while the sandbox's handshake (1.) does. Only TLS goes upstream
	// before a request has passed inspect.
	first := s.startFirst(up, in)
	// 1.
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			if hello.ServerName != "" {
				if sd, ok := s.dec.CheckSNI(in.Host, hello.ServerName, ""); !ok {
					ev := in
					ev.SNI = hello.ServerName
					s.record(netEvent(ev, sd))
					return nil, errSNIMismatch
				}
			}
			return s.icpt.ca.Leaf(in.Host)
		},
	}
	tc := tls.Server(readerConn{c, r}, cfg)
	c.SetDeadline(time.Now().Add(s.opts.ConnectTimeout))
	if err := tc.HandshakeContext(s.ctx); err != nil {
		first.release()
		return // not TLS, or the sandbox does not trust the CA: no request was sent upstream
	}
	c.SetDeadline(time.Time{})
	// 3. (the transport that takes the handshake started above)
	tr := s.upstreamTransport(in, first)
	end := func() {
		tr.CloseIdleConnections()
		first.release()
	}
	// 2. Handed over: this goroutine returns, and the server ends the
	// connection's upstream side and gives back its hold when it closes.
	// over is set before the server sees the connection, which may close
	// (and release) before serve returns; release runs once either way.
	h.over = true
	t := &termConn{h: &termHandler{s: s, in: in, rt: tr}, end: func() { end(); h.release() }}
	if !s.term.serve(tc, t) {
		h.over = false // the session is closing: released by the caller
		end()
	}
}

// termServer serves a session's terminated connections: one http.Server,
// which hands a connection that negotiated h2 to its HTTP/2 server (the
// standard library's) and any other to HTTP/1.1, fed by terminate through
// a listener of its own. Each connection's handler and end are found by
// the connection (ConnContext, ConnState): no goroutine per connection
// waits for it beyond the server's own.
type termServer struct {
	srv   *http.Server
	queue chan net.Conn // unbuffered: a sent connection was accepted
	ctx   context.Context

	mu    sync.Mutex
	conns map[net.Conn]*termConn
}

// termConn is one terminated connection's handler, and what its end does:
// close the upstream side and release the connection's hold.
type termConn struct {
	h   *termHandler
	end func()
}

type termConnKey struct{}

// startTermServer starts the session's termServer; it stops accepting
// when the session's context is done (Close closes the connections).
func (s *Session) startTermServer() *termServer {
	t := &termServer{queue: make(chan net.Conn), ctx: s.ctx, conns: make(map[net.Conn]*termConn)}
	t.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Context().Value(termConnKey{}).(*termConn).h.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: s.opts.ConnectTimeout,
		IdleTimeout:       s.opts.IdleTimeout,
		MaxHeaderBytes:    maxHeadBytes,
		HTTP2:             &http.HTTP2Config{MaxConcurrentStreams: maxStreams},
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			t.mu.Lock()
			defer t.mu.Unlock()
			return context.WithValue(ctx, termConnKey{}, t.conns[c])
		},
		// Every accepted connection ends in StateClosed (or Hijacked).
		ConnState: func(c net.Conn, st http.ConnState) {
			if st != http.StateClosed && st != http.StateHijacked {
				return
			}
			t.mu.Lock()
			tc := t.conns[c]
			delete(t.conns, c)
			t.mu.Unlock()
			if tc != nil {
				tc.end()
			}
		},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t.srv.Serve(termListener{t})
	}()
	return t
}

// serve hands c over to the server; false when the session is closing
// (c was not accepted and tc's end is the caller's).
func (t *termServer) serve(c net.Conn, tc *termConn) bool {
	t.mu.Lock()
	t.conns[c] = tc
	t.mu.Unlock()
	select {
	case t.queue <- c:
		return true
	case <-t.ctx.Done():
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
		return false
	}
}

// termListener is the termServer's listener: the connections terminate
// hands over, until the session's context is done.
type termListener struct{ t *termServer }

func (l termListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.t.queue:
		return c, nil
	case <-l.t.ctx.Done():
		return nil, net.ErrClosed
	}
}

func (termListener) Close() error   { return nil }
func (termListener) Addr() net.Addr { return &net.TCPAddr{} }

// firstConn is the upstream TLS handshake on the connection the tunnel
// already dialed (checked and pinned by its decision), started in parallel
// with the sandbox's handshake, so a new terminated connection waits for
// about one handshake, not two in a row. The transport's first dial takes
// its result; if no request ever came, release closes the connection.
type firstConn struct {
	raw  *trackedConn
	done chan struct{}
	tc   *tls.Conn
	err  error

	mu     sync.Mutex
	handed bool // taken by a dial, or released
}

// startFirst starts the handshake; it ends within ConnectTimeout or when
// the connection is closed (release, Session.Close).
func (s *Session) startFirst(up net.Conn, in egress.Intent) *firstConn {
	f := &firstConn{raw: &trackedConn{Conn: up, s: s}, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(f.done)
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.ConnectTimeout)
		defer cancel()
		f.tc = tls.Client(f.raw, s.upstreamTLS(in.Host))
		f.err = f.tc.HandshakeContext(ctx)
	}()
	return f
}

// take returns the handshake's result to the first dial (ok false for
// every later one).
func (f *firstConn) take(ctx context.Context) (c net.Conn, err error, ok bool) {
	f.mu.Lock()
	if f.handed {
		f.mu.Unlock()
		return nil, nil, false
	}
	f.handed = true
	f.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		f.raw.Close()
		return nil, ctx.Err(), true
	}
	if f.err != nil {
		f.raw.Close()
		return nil, f.err, true
	}
	return f.tc, nil, true
}

func (f *firstConn) release() {
	f.mu.Lock()
	handed := f.handed
	f.handed = true
	f.mu.Unlock()
	if !handed {
		f.raw.Close() // ends the handshake too
	}
}

// upstreamTLS is the client side's TLS for host: the real server verified
// against the interceptor's roots (never skipped), HTTP/2 offered.
func (s *Session) upstreamTLS(host string) *tls.Config {
	return &tls.Config{RootCAs: s.icpt.roots, ServerName: host, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
}

// trackedConn untracks its connection from the session when the upstream
// transport closes it.
type trackedConn struct {
	net.Conn
	s    *Session
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() { t.s.untrack(t.Conn) })
	return nil
}

var errUpstreamDenied = errors.New("egress: upstream denied by the network policy")

// upstreamTransport is the HTTP client side of one terminated connection:
// its first dial takes the handshake on the connection the tunnel already
// dialed; later dials decide again (the policy may not be bypassed by a
// long-lived connection) and dial only the pinned addresses. Servers are
// verified against the interceptor's roots (upstreamTLS).
func (s *Session) upstreamTransport(in egress.Intent, first *firstConn) *http.Transport {
	return &http.Transport{
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if c, err, ok := first.take(ctx); ok {
				return c, err
			}
			d := s.decide(egress.Intent{Host: in.Host, Port: in.Port, Via: in.Via})
			if !d.Allow {
				return nil, errUpstreamDenied
			}
			c, err := s.dial(d, in.Port)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(&trackedConn{Conn: c, s: s}, s.upstreamTLS(in.Host))
			hctx, cancel := context.WithTimeout(ctx, s.opts.ConnectTimeout)
			defer cancel()
			if err := tc.HandshakeContext(hctx); err != nil {
				tc.Close()
				return nil, err
			}
			return tc, nil
		},
		ForceAttemptHTTP2: true,
		// For a credential's host the transport asks for gzip itself and
		// decompresses, so an echo of the value is scrubbed in the clear;
		// for other hosts the client's Accept-Encoding goes through as is.
		DisableCompression:     !s.hasCredential(in.Host),
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        s.opts.IdleTimeout,
		MaxResponseHeaderBytes: 1 << 20,
	}
}

// termHandler serves the requests of one terminated connection.
type termHandler struct {
	s  *Session
	in egress.Intent
	rt http.RoundTripper
}

func (h *termHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s, in := h.s, h.in
	// The HTTP Host must be the tunnel's destination: inside a terminated
	// connection, fronting one allowed host with another is visible.
	if name, ip, port, err := parseAuthority(r.Host, in.Port); err != nil || ip.IsValid() || name != in.Host || port != in.Port {
		ev := netEvent(in, egress.Deny(egress.ReasonHostMismatch, ""))
		s.record(ev)
		denyHTTP(w, ev)
		return
	}
	if r.Method == http.MethodConnect {
		ev := netEvent(in, egress.Deny(egress.ReasonUnsupportedProtocol, ""))
		s.record(ev)
		denyHTTP(w, ev)
		return
	}
	body, ev := s.inspect(r, in)
	if ev != nil {
		denyHTTP(w, *ev)
		return
	}
	out := r.Clone(r.Context())
	out.URL.Scheme = "https"
	out.URL.Host = hostPort(in.Host, in.Port)
	out.RequestURI = ""
	out.Body = body
	if r.ContentLength == 0 {
		out.Body = http.NoBody
	}
	stripHopByHop(out.Header)
	// Trailers are not searched for placeholders: none are forwarded.
	out.Trailer = nil
	mine := s.substitute(out, in.Host)
	if len(mine) > 0 {
		// A compressed echo of the value could not be scrubbed: the
		// transport asks for gzip and decompresses it (DisableCompression
		// is off for credential hosts).
		out.Header.Del("Accept-Encoding")
	}

	resp, err := h.rt.RoundTrip(out)
	if err != nil {
		if sc, ok := body.(*scanReader); ok && sc.hit != nil {
			denyHTTP(w, *sc.hit) // recorded by the scanner
			return
		}
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			ev := netEvent(in, egress.Deny(egress.ReasonUpstreamCert, ""))
			s.record(ev)
			denyHTTP(w, ev)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "network: "+egress.DestString(in.Host, "", in.Port)+" could not be reached\n")
		return
	}
	defer resp.Body.Close()
	if ce := resp.Header.Get("Content-Encoding"); len(mine) > 0 && ce != "" && ce != "identity" {
		// Compressed in a way the transport did not undo: the value could
		// be in it, unscrubbed.
		ev := egress.Event{Kind: egress.KindCredential, Reason: egress.ReasonUnscrubbable, Rule: "credentials: " + mine[0].Name, Host: in.Host, Port: in.Port, Via: in.Via}
		s.record(ev)
		denyHTTP(w, ev)
		return
	}
	for k, vv := range resp.Header {
		w.Header()[k] = vv
	}
	stripHopByHop(w.Header())
	var sc *scrubber
	if len(mine) > 0 {
		// The value may be echoed (an error page quoting the header): it is
		// replaced by its placeholder, in headers and body. The length may
		// change, so the body is sent without Content-Length.
		sc = newScrubber(mine)
		for k, vv := range w.Header() {
			for i, v := range vv {
				vv[i] = sc.scrubString(v)
			}
			w.Header()[k] = vv
		}
		w.Header().Del("Content-Length")
	}
	w.WriteHeader(resp.StatusCode)
	copyResponse(w, resp.Body, sc)
}

func hostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// denyHTTP answers a denied request inside a terminated connection the way
// writeDenial does on a plain one.
func denyHTTP(w http.ResponseWriter, ev egress.Event) {
	status := http.StatusForbidden
	if ev.Reason == egress.ReasonUpstreamCert {
		status = http.StatusBadGateway
	}
	h := w.Header()
	h.Set("X-Proxy-Error", proxyError(ev.Reason))
	h.Set("X-Str-Reason", ev.Reason)
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, egress.EventMessage(ev)+"\n")
}

// inspect is the HTTP layer's checklist for one request to in.Host, on a
// terminated connection or a plain forwarded one. In order:
//
//  1. the host's HTTP rules (method, clean path under a prefix);
//  2. no placeholder of a credential that does not cover the host in the
//     request line's path or query or in any header;
//  3. the body: the first MaxBodyScan bytes are read and searched before
//     anything is sent; the returned body searches the rest as it streams.
//
// A denial is recorded and returned; the body to send is returned
// otherwise.
func (s *Session) inspect(r *http.Request, in egress.Intent) (io.ReadCloser, *egress.Event) {
	// 1.
	if reason, rule := s.pol.CheckRules(in.Host, r.Method, r.URL.Path, r.URL.EscapedPath()); reason != "" {
		ev := netEvent(in, egress.Deny(reason, rule))
		s.record(ev)
		return nil, &ev
	}
	foreign := s.foreignPlaceholders(in.Host)
	if len(foreign) == 0 {
		return r.Body, nil
	}
	// 2.
	credEvent := func(name string) *egress.Event {
		ev := egress.Event{Kind: egress.KindCredential, Reason: egress.ReasonCredentialHost, Rule: "credentials: " + name, Host: in.Host, Port: in.Port, Via: in.Via}
		s.record(ev)
		return &ev
	}
	for _, f := range foreign {
		if strings.Contains(r.URL.RawQuery, f.placeholder) || strings.Contains(r.URL.EscapedPath(), f.placeholder) || strings.Contains(r.URL.Path, f.placeholder) {
			return nil, credEvent(f.name)
		}
		for k, vv := range r.Header {
			if strings.Contains(k, f.placeholder) {
				return nil, credEvent(f.name)
			}
			for _, v := range vv {
				if strings.Contains(v, f.placeholder) {
					return nil, credEvent(f.name)
				}
			}
		}
	}
	// 3.
	if r.Body == nil || r.Body == http.NoBody {
		return r.Body, nil
	}
	sc := &scanReader{r: r.Body, foreign: foreign, onHit: func(name string) *egress.Event { return credEvent(name) }}
	prefix, err := io.ReadAll(io.LimitReader(sc, int64(s.icpt.bodyScan)))
	if sc.hit != nil {
		return nil, sc.hit
	}
	if err != nil {
		ev := netEvent(in, egress.Deny(egress.ReasonMalformedRequest, ""))
		s.record(ev)
		return nil, &ev
	}
	sc.prefix = bytes.NewReader(prefix)
	return sc, nil
}

type foreignPH struct{ name, placeholder string }

// foreignPlaceholders are the placeholders that must not appear in a
// request to host: those of credentials that do not cover it.
func (s *Session) foreignPlaceholders(host string) []foreignPH {
	if s.icpt == nil {
		return nil
	}
	var out []foreignPH
	for i := range s.icpt.creds {
		c := &s.icpt.creds[i]
		if !c.Covers(host) {
			out = append(out, foreignPH{c.Name, c.Placeholder})
		}
	}
	return out
}

// substitute puts the real value in place of the placeholder in the
// configured header (rendered with Format) or query parameter of a request
// to one of the credential's hosts. It returns the credentials that cover
// the host: their values are scrubbed from every response of the host.
func (s *Session) substitute(r *http.Request, host string) (mine []*egress.Credential) {
	for i := range s.icpt.creds {
		c := &s.icpt.creds[i]
		if !c.Covers(host) {
			continue
		}
		mine = append(mine, c)
		if c.Header != "" {
			for _, v := range r.Header.Values(c.Header) {
				if strings.Contains(v, c.Placeholder) {
					format := c.Format
					if format == "" {
						format = egress.ValueMark
					}
					r.Header.Set(c.Header, c.Value.Render(format))
					break
				}
			}
		}
		if c.Query != "" && strings.Contains(r.URL.RawQuery, c.Placeholder) {
			q := r.URL.Query()
			if vs, ok := q[c.Query]; ok {
				for j, v := range vs {
					if strings.Contains(v, c.Placeholder) {
						vs[j] = string(c.Value.Bytes())
					}
				}
				r.URL.RawQuery = q.Encode()
			}
		}
	}
	return mine
}

// hasCredential reports whether some credential covers host.
func (s *Session) hasCredential(host string) bool {
	for i := range s.icpt.creds {
		if s.icpt.creds[i].Covers(host) {
			return true
		}
	}
	return false
}

// scanReader searches a request body for foreign placeholders as it is
// read (across read boundaries); the first hit is recorded and every later
// read fails, so an upstream request being sent is aborted.
type scanReader struct {
	prefix  *bytes.Reader // the part read ahead by inspect
	r       io.ReadCloser
	foreign []foreignPH
	onHit   func(name string) *egress.Event
	tail    []byte
	hit     *egress.Event
}

func (s *scanReader) Read(b []byte) (int, error) {
	if s.hit != nil {
		return 0, errors.New("egress: request body carries another host's credential placeholder")
	}
	if s.prefix != nil {
		if s.prefix.Len() > 0 {
			return s.prefix.Read(b)
		}
		s.prefix = nil
	}
	n, err := s.r.Read(b)
	if n > 0 {
		win := append(s.tail, b[:n]...)
		for _, f := range s.foreign {
			if bytes.Contains(win, []byte(f.placeholder)) {
				s.hit = s.onHit(f.name)
				return 0, errors.New("egress: request body carries another host's credential placeholder")
			}
		}
		keep := min(len(win), len(egress.PlaceholderPrefix)+40)
		s.tail = append(s.tail[:0], win[len(win)-keep:]...)
	}
	return n, err
}

func (s *scanReader) Close() error { return s.r.Close() }

// scrubber replaces credential values with their placeholders in a
// response stream (values split across reads included).
type scrubber struct {
	olds, news [][]byte
	keep       int
	tail, win  []byte
}

func newScrubber(creds []*egress.Credential) *scrubber {
	sc := &scrubber{}
	for _, c := range creds {
		sc.olds = append(sc.olds, c.Value.Bytes())
		sc.news = append(sc.news, []byte(c.Placeholder))
		sc.keep = max(sc.keep, len(c.Value.Bytes())-1)
	}
	return sc
}

func (sc *scrubber) scrubString(v string) string {
	for i, o := range sc.olds {
		v = strings.ReplaceAll(v, string(o), string(sc.news[i]))
	}
	return v
}

// push adds a chunk and returns what may be sent: everything but the last
// keep bytes, which could start a value that the next chunk completes. The
// returned slice is valid until the next push.
func (sc *scrubber) push(b []byte) []byte {
	sc.win = append(append(sc.win[:0], sc.tail...), b...)
	for i, o := range sc.olds {
		if bytes.Contains(sc.win, o) {
			sc.win = bytes.ReplaceAll(sc.win, o, sc.news[i])
		}
	}
	k := min(len(sc.win), sc.keep)
	sc.tail = append(sc.tail[:0], sc.win[len(sc.win)-k:]...)
	return sc.win[:len(sc.win)-k]
}

func (sc *scrubber) flush() []byte {
	t := sc.tail
	sc.tail = nil
	return t
}

// respBuf is copyResponse's read size. Each read of an HTTP/2 upstream's
// body sends the server a WINDOW_UPDATE and each read is flushed to the
// sandbox, so on a CPU-bound path fewer, larger reads cost the proxy less
// per byte (BenchmarkTerminatedLink, veth-unshaped, 16 MiB, medians of 6
// alternated runs: 2.14 ns/B with 32 KiB reads, 1.69 with 256 KiB). When
// the link is the bottleneck a read returns what has arrived, so streams
// are not delayed.
// A response starts with copyBuf and takes a pooled respBuf once a read
// fills that: small responses allocate as before, and only a large
// response being copied holds one (the HTTP/2 transport itself may buffer
// up to its 4 MiB stream window per response).
const respBuf = 256 << 10

var respBufs = sync.Pool{New: func() any { b := make([]byte, respBuf); return &b }}

// copyResponse streams a response body to the sandbox, flushing after each
// read (server-sent events and long polls see their bytes as they come).
func copyResponse(w http.ResponseWriter, body io.Reader, sc *scrubber) {
	rc := http.NewResponseController(w)
	buf := make([]byte, copyBuf)
	var big *[]byte
	defer func() {
		if big != nil {
			respBufs.Put(big)
		}
	}()
	for {
		n, err := body.Read(buf)
		if n > 0 {
			out := buf[:n]
			if sc != nil {
				out = sc.push(out)
			}
			if _, werr := w.Write(out); werr != nil {
				return
			}
			rc.Flush()
			if n == len(buf) && big == nil {
				// A large body: the chunk above is sent (the scrubber
				// keeps its own copy of its tail), so buf may change.
				big = respBufs.Get().(*[]byte)
				buf = *big
			}
		}
		if err != nil {
			if sc != nil {
				w.Write(sc.flush())
			}
			return
		}
	}
}
