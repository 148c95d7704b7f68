package proxy

import (
	"github.com/securetoolruntime/str/egress"
	"net"
	"net/netip"
	"time"
)

// handleCapture serves one connection accepted on the capture listener for
// port P: a plain connect() from the sandbox to a fake IP. The connection's
// local address (getsockname) is the fake IP the client dialed; it maps
// back to the name the DNS stub gave it out for. Unknown addresses are the
// sandbox's own loopback, never a destination: denied as ip_literal. On
// port 443 the ClientHello is read first (bounded) so Decide also checks the
// SNI. Denied connections are reset.
func (s *Session) handleCapture(c net.Conn, port int, h *held) {
	c.SetDeadline(time.Now().Add(s.opts.ConnectTimeout))
	in := egress.Intent{Port: port, Via: egress.ViaTransparent}
	if ta, ok := c.LocalAddr().(*net.TCPAddr); ok {
		if a, ok := netip.AddrFromSlice(ta.IP); ok {
			in.IP = a.Unmap()
		}
	}
	if name, ok := s.fake.lookup(in.IP); ok {
		in.Host = name
	}
	var pre []byte
	if in.Host != "" && port == 443 && s.pol.Mode() != egress.Isolated {
		c.SetReadDeadline(time.Now().Add(min(sniTimeout, s.opts.ConnectTimeout)))
		var err error
		pre, in.SNI, err = peekClientHello(c)
		if !peekPassable(pre, err) {
			s.record(netEvent(in, egress.Deny(egress.ReasonMalformedRequest, "")))
			reset(c)
			return
		}
	}
	d := s.decide(in)
	if !d.Allow {
		reset(c)
		return
	}
	up, err := s.dial(d, port)
	if err != nil {
		reset(c)
		return
	}
	s.passOn(c, c, up, pre, in, h)
}
