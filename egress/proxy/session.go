package proxy

import (
	"context"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Listeners are the sockets the sandbox's init created inside the sandbox's
// network namespace. Zero-value fields are skipped.
type Listeners struct {
	Proxy   net.Listener         // 127.0.0.1:3128: HTTP proxy and SOCKS5
	DNSUDP  net.PacketConn       // 127.0.0.1:53/udp
	DNSTCP  net.Listener         // 127.0.0.1:53/tcp
	Capture map[int]net.Listener // 0.0.0.0:P for each CapturePorts() P, keyed by P
}

// Options tune a session. Zero values take the defaults.
type Options struct {
	// Resolver resolves names on the worker. nil: a Go resolver that asks
	// Policy.DNSServers, or the host's resolver when there are none.
	Resolver egress.Resolver
	// Dialer dials the checked, pinned addresses. nil: a net.Dialer whose
	// Control hook re-checks every address against the policy.
	Dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxConns bounds concurrent proxy and capture connections (default 64).
	MaxConns int
	// MaxEvents bounds distinct violation events kept (default 100).
	MaxEvents int
	// ConnectTimeout bounds reading a request, resolving and dialing
	// (default 10 s). IdleTimeout closes a tunnel with no traffic in either
	// direction (default 60 s).
	ConnectTimeout, IdleTimeout time.Duration
	// Intercept turns on TLS termination for hosts with a credential or
	// an HTTP rule (nil: none; a policy with http_rules then fails Start).
	Intercept *Interception
	// OnKill is called once, at the first violation, when the policy says
	// on_violation: kill. It runs on the connection's goroutine and should
	// not block (the caller kills the sandbox).
	OnKill func(egress.Event)
}

const (
	defaultMaxConns       = 64
	defaultMaxEvents      = 100
	defaultConnectTimeout = 10 * time.Second
	defaultIdleTimeout    = 60 * time.Second
	// sniTimeout bounds waiting for a ClientHello on port 443; a client
	// that speaks second is then passed through without an SNI check.
	sniTimeout = 3 * time.Second
	// maxDNSTCPConns bounds concurrent DNS-over-TCP connections.
	maxDNSTCPConns = 16
	// copyBuf is the per-direction tunnel buffer.
	copyBuf = 32 << 10
)

// Session serves one sandbox's listeners under one policy.
type Session struct {
	pol    *egress.Compiled
	dec    *egress.Decider
	opts   Options
	dialer func(ctx context.Context, network, addr string) (net.Conn, error)
	events *egress.EventLog
	fake   *fakeTable
	icpt   *interceptor // nil: nothing is terminated
	term   *termServer  // serves the terminated connections (nil with icpt)
	l      Listeners

	ctx    context.Context
	cancel context.CancelFunc
	stop   func() bool // context.AfterFunc's stop

	slots    chan struct{} // MaxConns
	dnsSlots chan struct{}
	killOnce sync.Once

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Start validates the policy and serves the listeners until Close or until
// ctx is done. In isolated mode it still serves, denying everything, so
// every attempt becomes an event.
func Start(ctx context.Context, p egress.Policy, l Listeners, o Options) (*Session, error) {
	pol, err := p.Compile()
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	if o.MaxConns <= 0 {
		o.MaxConns = defaultMaxConns
	}
	if o.MaxEvents <= 0 {
		o.MaxEvents = defaultMaxEvents
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = defaultConnectTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = defaultIdleTimeout
	}
	if o.Resolver == nil {
		o.Resolver = newResolver(pol.DNSServers(), o.ConnectTimeout)
	}
	icpt, err := newInterceptor(pol, o.Intercept)
	if err != nil {
		return nil, fmt.Errorf("egress: %w", err)
	}
	s := &Session{
		pol:      pol,
		dec:      egress.NewDecider(pol, o.Resolver),
		opts:     o,
		events:   egress.NewEventLog(o.MaxEvents),
		fake:     newFakeTable(),
		icpt:     icpt,
		l:        l,
		slots:    make(chan struct{}, o.MaxConns),
		dnsSlots: make(chan struct{}, maxDNSTCPConns),
		conns:    make(map[net.Conn]struct{}),
	}
	s.dialer = o.Dialer
	if s.dialer == nil {
		d := &net.Dialer{Timeout: o.ConnectTimeout, Control: s.controlCheck}
		s.dialer = d.DialContext
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// Under mu: a ctx already cancelled runs Close at once, which reads
	// stop (str serve's shutdown cancels sandboxes being built).
	s.mu.Lock()
	s.stop = context.AfterFunc(ctx, func() { s.Close() })
	s.mu.Unlock()

	if icpt != nil {
		s.term = s.startTermServer()
	}
	if l.Proxy != nil {
		s.serveListener(l.Proxy, s.handleProxy)
	}
	for port, ln := range l.Capture {
		if ln == nil {
			continue
		}
		port := port
		s.serveListener(ln, func(c net.Conn, h *held) { s.handleCapture(c, port, h) })
	}
	if l.DNSTCP != nil {
		s.serveDNSTCP(l.DNSTCP)
	}
	if l.DNSUDP != nil {
		s.wg.Add(1)
		go s.serveDNSUDP(l.DNSUDP)
	}
	return s, nil
}

// controlCheck is the default dialer's Control hook: the address about to be
// connected must still pass the policy's address filter (rebinding-safe:
// this is the address the kernel will connect to, whatever resolved it).
func (s *Session) controlCheck(network, address string, _ syscall.RawConn) error {
	return s.pol.CheckDialAddr(address)
}

// Close stops serving, closes the listeners and every connection, and waits
// for every goroutine of the session to end. It is safe to call more than
// once.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := s.conns
	s.conns = nil
	stop := s.stop
	s.mu.Unlock()

	stop()
	s.cancel()
	var errs []error
	closeL := func(c io.Closer) {
		if c != nil {
			if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	closeL(s.l.Proxy)
	closeL(s.l.DNSTCP)
	if s.l.DNSUDP != nil {
		closeL(s.l.DNSUDP)
	}
	for _, ln := range s.l.Capture {
		if ln != nil {
			closeL(ln)
		}
	}
	for c := range conns {
		c.Close()
	}
	s.wg.Wait()
	if len(errs) > 0 {
		return fmt.Errorf("egress: close: %w", errors.Join(errs...))
	}
	return nil
}

// Violations returns the aggregated denial events and how many occurrences
// were dropped past MaxEvents distinct events.
func (s *Session) Violations() ([]egress.Event, int) { return s.events.Snapshot() }

// Summary is the short text block an agent can show its model ("" when
// there were no violations).
func (s *Session) Summary() string { return egress.Summary(s.events.Snapshot()) }

// record adds a denial event and, under on_violation: kill, calls OnKill
// once.
func (s *Session) record(ev egress.Event) {
	if ev.Kind == "" {
		ev.Kind = egress.KindNet
	}
	s.events.Add(ev, time.Now())
	if s.pol.Kill() && s.opts.OnKill != nil {
		s.killOnce.Do(func() {
			ev.Action, ev.Count = egress.ActionDenied, 1
			ev.Message = egress.EventMessage(ev)
			s.opts.OnKill(ev)
		})
	}
}

// netEvent builds the event for a denied connection intent.
func netEvent(in egress.Intent, d egress.Decision) egress.Event {
	ev := egress.Event{Kind: egress.KindNet, Reason: d.Reason, Rule: d.Rule, Port: in.Port, Via: in.Via}
	if in.Host != "" {
		if h, ip, err := egress.NormalizeHost(in.Host, false); err == nil && !ip.IsValid() {
			ev.Host = h
		} else if err == nil {
			ev.IP = ip.String()
		} else {
			ev.Host = egress.SanitizeHost(in.Host)
		}
	}
	if ev.Host == "" && ev.IP == "" && in.IP.IsValid() {
		ev.IP = in.IP.Unmap().String()
	}
	return ev
}

// track registers a connection so Close can close it; false after Close.
func (s *Session) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Session) untrack(c net.Conn) {
	s.mu.Lock()
	if s.conns != nil {
		delete(s.conns, c)
	}
	s.mu.Unlock()
	c.Close()
}

// held is one accepted connection's hold on the session: a MaxConns slot,
// its tracking (Close closes it) and its count in the wait group (Close
// waits for it), all given back once by release. The goroutine handling
// the connection releases it when the handler returns, unless the handler
// handed it over: a terminated connection is served on by the session's
// HTTP server (termServer) with no goroutine of the handler's left waiting
// for it, and released when that server reports it closed.
type held struct {
	s    *Session
	c    net.Conn
	over bool // handed over; only the handling goroutine reads or sets it
	once sync.Once
}

func (h *held) release() {
	h.once.Do(func() {
		h.s.untrack(h.c)
		<-h.s.slots
		h.s.wg.Done()
	})
}

// serveListener accepts on ln until it is closed; every connection takes a
// slot of MaxConns or is refused with a limit_connections event.
func (s *Session) serveListener(ln net.Listener, handle func(net.Conn, *held)) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var backoff time.Duration
		for {
			c, err := ln.Accept()
			if err != nil {
				if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				// Temporary (EMFILE, ECONNABORTED): back off, bounded.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				select {
				case <-time.After(backoff):
					continue
				case <-s.ctx.Done():
					return
				}
			}
			backoff = 0
			select {
			case s.slots <- struct{}{}:
			default:
				s.record(egress.Event{Kind: egress.KindNet, Reason: egress.ReasonLimitConnections, Rule: fmt.Sprintf("max_connections: %d", s.opts.MaxConns)})
				reset(c)
				continue
			}
			if !s.track(c) {
				<-s.slots
				c.Close()
				return
			}
			s.wg.Add(1)
			h := &held{s: s, c: c}
			go func() {
				defer func() {
					if !h.over {
						h.release()
					}
				}()
				handle(c, h)
			}()
		}
	}()
}

// reset closes c with an RST rather than a FIN where it can.
func reset(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		l.SetLinger(0)
	}
	c.Close()
}

// dial connects to the decision's pinned addresses, in order, within
// ConnectTimeout. Only these addresses are ever dialed.
func (s *Session) dial(d egress.Decision, port int) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.ConnectTimeout)
	defer cancel()
	var errs []error
	for _, a := range d.Addrs {
		if !egress.AddrAllowed(a, s.pol.CIDRs()) { // Decide's filter, once more
			errs = append(errs, fmt.Errorf("%s: %w", a, egress.ErrRefusedAddr))
			continue
		}
		c, err := s.dialer(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			if !s.track(c) {
				c.Close()
				return nil, net.ErrClosed
			}
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("egress: no address to dial")
	}
	return nil, errors.Join(errs...)
}

// decide runs Decide within ConnectTimeout and records a denial.
func (s *Session) decide(in egress.Intent) egress.Decision {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.ConnectTimeout)
	defer cancel()
	d := s.dec.Decide(ctx, in)
	if !d.Allow {
		s.record(netEvent(in, d))
	}
	return d
}

// splice copies both ways until both sides are done or the tunnel has been
// idle (no byte in either direction) for IdleTimeout. client reads go
// through cr (which may hold bytes already buffered), and pre (bytes read
// from the client while peeking) is sent upstream first.
func (s *Session) splice(client net.Conn, cr io.Reader, upstream net.Conn, pre []byte) {
	defer s.untrack(upstream)
	client.SetDeadline(time.Time{})
	upstream.SetDeadline(time.Time{})
	if len(pre) > 0 {
		upstream.SetWriteDeadline(time.Now().Add(s.opts.IdleTimeout))
		if _, err := upstream.Write(pre); err != nil {
			return
		}
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan struct{})
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		s.copyIdle(client, upstream, upstream, &last)
	}()
	s.copyIdle(upstream, client, cr, &last)
	<-done
}

// copyIdle copies src to dst; a read timeout only ends the copy when the
// other direction was idle too. On EOF the write side of dst is shut down
// (half-close); on any other error both connections are closed so the other
// direction ends as well.
func (s *Session) copyIdle(dst, src net.Conn, r io.Reader, last *atomic.Int64) {
	buf := make([]byte, copyBuf)
	idle := s.opts.IdleTimeout
	for {
		src.SetReadDeadline(time.Now().Add(idle))
		n, err := r.Read(buf)
		if n > 0 {
			last.Store(time.Now().UnixNano())
			dst.SetWriteDeadline(time.Now().Add(idle))
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				dst.Close()
				return
			}
		}
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, last.Load())) < idle {
			continue
		}
		if errors.Is(err, io.EOF) {
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				cw.CloseWrite()
				return
			}
		}
		src.Close()
		dst.Close()
		return
	}
}
