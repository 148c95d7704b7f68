package proxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"net/netip"
)

// SOCKS5 (RFC 1928), no authentication, CONNECT only.
const (
	socksVersion   = 0x05
	socksNoAuth    = 0x00
	socksNoMethods = 0xff
	socksConnect   = 0x01
	atypIPv4       = 0x01
	atypDomain     = 0x03
	atypIPv6       = 0x04

	repSucceeded        = 0x00
	repGeneralFailure   = 0x01
	repNotAllowed       = 0x02 // "connection not allowed by ruleset"
	repHostUnreachable  = 0x04
	repConnRefused      = 0x05
	repTTLExpired       = 0x06
	repCmdNotSupported  = 0x07
	repAtypNotSupported = 0x08
)

var (
	errSOCKSVersion = errors.New("socks: not version 5")
	errSOCKSCmd     = errors.New("socks: only CONNECT is supported")
	errSOCKSAtyp    = errors.New("socks: unknown address type")
	errSOCKSShort   = errors.New("socks: truncated request")
	errSOCKSLong    = errors.New("socks: trailing bytes")
	errSOCKSRsv     = errors.New("socks: reserved byte not zero")
)

// socksRequest is a parsed SOCKS5 request: a normalized name (ATYP domain,
// via socks5h) or an IP (ATYP IPv4/IPv6, via socks5; also a domain that is
// an IP literal), and a port.
type socksRequest struct {
	name string
	ip   netip.Addr
	port int
	via  string
	raw  string // the domain as sent, for events when it is invalid
}

// parseSOCKSRequest parses exactly one SOCKS5 request
// (VER CMD RSV ATYP DST.ADDR DST.PORT) from b. A host error (an invalid
// domain) is returned with the request's raw field set.
func parseSOCKSRequest(b []byte) (socksRequest, error) {
	var r socksRequest
	if len(b) < 4 {
		return r, errSOCKSShort
	}
	if b[0] != socksVersion {
		return r, errSOCKSVersion
	}
	if b[2] != 0 {
		return r, errSOCKSRsv
	}
	var addrLen int
	switch b[3] {
	case atypIPv4:
		addrLen = 4
	case atypIPv6:
		addrLen = 16
	case atypDomain:
		if len(b) < 5 {
			return r, errSOCKSShort
		}
		addrLen = 1 + int(b[4])
	default:
		return r, errSOCKSAtyp
	}
	if len(b) < 4+addrLen+2 {
		return r, errSOCKSShort
	}
	if len(b) > 4+addrLen+2 {
		return r, errSOCKSLong
	}
	if b[1] != socksConnect {
		return r, errSOCKSCmd
	}
	addr := b[4 : 4+addrLen]
	r.port = int(binary.BigEndian.Uint16(b[4+addrLen:]))
	switch b[3] {
	case atypIPv4:
		r.ip, r.via = netip.AddrFrom4([4]byte(addr)), egress.ViaSOCKS5
	case atypIPv6:
		r.ip, r.via = netip.AddrFrom16([16]byte(addr)).Unmap(), egress.ViaSOCKS5
	case atypDomain:
		r.via, r.raw = egress.ViaSOCKS5h, string(addr[1:])
		name, ip, err := egress.NormalizeHost(r.raw, false)
		if err != nil {
			return r, err
		}
		r.name, r.ip = name, ip
	}
	if r.port == 0 {
		return r, egress.ErrBadPort
	}
	return r, nil
}

// readSOCKSRequest reads exactly one request's bytes (at most 4+1+255+2).
func readSOCKSRequest(r io.Reader) ([]byte, error) {
	buf := make([]byte, 4, 4+1+255+2)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	var more int
	switch buf[3] {
	case atypIPv4:
		more = 4 + 2
	case atypIPv6:
		more = 16 + 2
	case atypDomain:
		var l [1]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return nil, err
		}
		buf = append(buf, l[0])
		more = int(l[0]) + 2
	default:
		return buf, nil // the parser reports the address type
	}
	buf = buf[:len(buf)+more]
	if _, err := io.ReadFull(r, buf[len(buf)-more:]); err != nil {
		return nil, err
	}
	return buf, nil
}

func socksReply(w io.Writer, rep byte) error {
	// BND.ADDR 0.0.0.0:0: the worker's own addresses are none of the
	// sandbox's business.
	_, err := w.Write([]byte{socksVersion, rep, 0, atypIPv4, 0, 0, 0, 0, 0, 0})
	return err
}

// handleSOCKS serves one SOCKS5 connection.
func (s *Session) handleSOCKS(c net.Conn, br *bufio.Reader, h *held) {
	// Greeting: VER NMETHODS METHODS...
	var g [2]byte
	if _, err := io.ReadFull(br, g[:]); err != nil {
		return
	}
	methods := make([]byte, g[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return
	}
	noAuth := false
	for _, m := range methods {
		noAuth = noAuth || m == socksNoAuth
	}
	if !noAuth {
		s.record(egress.Event{Kind: egress.KindNet, Reason: egress.ReasonUnsupportedProtocol, Via: egress.ViaSOCKS5})
		c.Write([]byte{socksVersion, socksNoMethods})
		return
	}
	if _, err := c.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return
	}
	raw, err := readSOCKSRequest(br)
	if err != nil {
		return
	}
	req, err := parseSOCKSRequest(raw)
	if err != nil {
		ev := egress.Event{Kind: egress.KindNet, Reason: egress.ReasonMalformedRequest, Host: egress.SanitizeHost(req.raw), Port: req.port, Via: egress.ViaSOCKS5}
		rep := byte(repGeneralFailure)
		switch {
		case errors.Is(err, errSOCKSCmd):
			ev.Reason, rep = egress.ReasonUnsupportedProtocol, repCmdNotSupported
		case errors.Is(err, errSOCKSAtyp):
			rep = repAtypNotSupported
		}
		if req.raw != "" || req.via == egress.ViaSOCKS5h {
			ev.Via = egress.ViaSOCKS5h
		}
		s.record(ev)
		socksReply(c, rep)
		return
	}
	in := s.intentFor(req.name, req.ip, req.port, req.via)
	d := s.decide(in)
	if !d.Allow {
		socksReply(c, repNotAllowed)
		return
	}
	up, err := s.dial(d, req.port)
	if err != nil {
		rep := byte(repConnRefused)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			rep = repTTLExpired
		} else if errors.Is(err, egress.ErrRefusedAddr) {
			rep = repHostUnreachable
		}
		socksReply(c, rep)
		return
	}
	if err := socksReply(c, repSucceeded); err != nil {
		s.untrack(up)
		return
	}
	s.tunnel(c, br, up, in, d, h)
}
