package proxy

import (
	"encoding/binary"
	"errors"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// DNS stub bounds.
const (
	maxDNSQuery   = 4096 // a query is a header and one question, plus EDNS
	dnsTCPIdle    = 10 * time.Second
	fakeTTL       = 1
	dnsHeaderSize = 12
)

var (
	errDNSShort     = errors.New("dns: shorter than a header")
	errDNSResponse  = errors.New("dns: not a query")
	errDNSQuestions = errors.New("dns: not exactly one question")
	errDNSSections  = errors.New("dns: answer or authority records in a query")
	errDNSOpcode    = errors.New("dns: opcode not QUERY")
)

// dnsQuery is a parsed query: the header and its single question.
type dnsQuery struct {
	hdr dnsmessage.Header
	q   dnsmessage.Question
}

// parseDNSQuery parses a query strictly: QR clear, opcode QUERY, exactly one
// question, no answer or authority records (at most one additional record,
// an EDNS OPT, which is ignored). errDNSOpcode comes with a valid header so
// the caller can answer NOTIMP.
func parseDNSQuery(b []byte) (dnsQuery, error) {
	var q dnsQuery
	if len(b) < dnsHeaderSize {
		return q, errDNSShort
	}
	var p dnsmessage.Parser
	h, err := p.Start(b)
	if err != nil {
		return q, err
	}
	q.hdr = h
	if h.Response {
		return q, errDNSResponse
	}
	if h.OpCode != 0 {
		return q, errDNSOpcode
	}
	qd := binary.BigEndian.Uint16(b[4:])
	an := binary.BigEndian.Uint16(b[6:])
	ns := binary.BigEndian.Uint16(b[8:])
	ar := binary.BigEndian.Uint16(b[10:])
	if qd != 1 {
		return q, errDNSQuestions
	}
	if an != 0 || ns != 0 || ar > 1 {
		return q, errDNSSections
	}
	q.q, err = p.Question()
	if err != nil {
		return q, err
	}
	return q, nil
}

// answerDNS turns one query into its response (nil: drop it). The rules:
// A for an allowed name: its fake IP, TTL 1. AAAA, HTTPS and SVCB for an
// allowed name: NOERROR with no data (clients fall back to A without
// reporting anything). Other types for an allowed name: REFUSED and a
// qtype_refused event. A name not allowed (or not a valid name, or any name
// in isolated): NXDOMAIN and an event. Nothing is ever forwarded: the worker
// resolves only when a connection to the fake IP happens.
func (s *Session) answerDNS(b []byte) []byte {
	q, err := parseDNSQuery(b)
	if err != nil {
		if len(b) < dnsHeaderSize || q.hdr.Response {
			return nil // never answer a response: no reflection loops
		}
		rc := dnsmessage.RCodeFormatError
		if errors.Is(err, errDNSOpcode) {
			rc = dnsmessage.RCodeNotImplemented
		}
		id := binary.BigEndian.Uint16(b)
		return buildDNS(dnsmessage.Header{ID: id, OpCode: q.hdr.OpCode, RCode: rc}, nil, nil)
	}
	hdr := dnsmessage.Header{
		ID:                 q.hdr.ID,
		OpCode:             q.hdr.OpCode,
		Authoritative:      true,
		RecursionDesired:   q.hdr.RecursionDesired,
		RecursionAvailable: true,
	}
	raw := q.q.Name.String()
	in := egress.Intent{Host: raw, Via: egress.ViaDNS}
	ev := egress.Event{Kind: egress.KindDNS, Via: egress.ViaDNS}
	if name, ip, err := egress.NormalizeHost(raw, false); err == nil && !ip.IsValid() {
		ev.Host = name
	} else {
		ev.Host = egress.SanitizeHost(raw)
	}
	if q.q.Class != dnsmessage.ClassINET {
		hdr.RCode = dnsmessage.RCodeRefused
		ev.Reason = egress.ReasonQtypeRefused
		s.record(ev)
		return buildDNS(hdr, &q.q, nil)
	}
	d := s.dec.Decide(s.ctx, in)
	if !d.Allow {
		hdr.RCode = dnsmessage.RCodeNameError
		ev.Reason, ev.Rule = d.Reason, d.Rule
		s.record(ev)
		return buildDNS(hdr, &q.q, nil)
	}
	switch q.q.Type {
	case dnsmessage.TypeA:
		a, ok := s.fake.assign(ev.Host)
		if !ok {
			hdr.RCode = dnsmessage.RCodeServerFailure
			ev.Reason = egress.ReasonLimitNames
			s.record(ev)
			return buildDNS(hdr, &q.q, nil)
		}
		return buildDNS(hdr, &q.q, &dnsmessage.AResource{A: a.As4()})
	case dnsmessage.TypeAAAA, dnsmessage.TypeHTTPS, dnsmessage.TypeSVCB:
		return buildDNS(hdr, &q.q, nil)
	default:
		hdr.RCode = dnsmessage.RCodeRefused
		ev.Reason, ev.Rule = egress.ReasonQtypeRefused, d.Rule
		s.record(ev)
		return buildDNS(hdr, &q.q, nil)
	}
}

// buildDNS builds a response with the question echoed as asked and at most
// one A record.
func buildDNS(h dnsmessage.Header, q *dnsmessage.Question, a *dnsmessage.AResource) []byte {
	h.Response = true
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if q != nil {
		if err := b.StartQuestions(); err != nil {
			return nil
		}
		if err := b.Question(*q); err != nil {
			return nil
		}
		if a != nil {
			if err := b.StartAnswers(); err != nil {
				return nil
			}
			rh := dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: fakeTTL}
			if err := b.AResource(rh, *a); err != nil {
				return nil
			}
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// serveDNSUDP answers queries one at a time (answers are computed in memory,
// nothing is forwarded).
func (s *Session) serveDNSUDP(pc net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, maxDNSQuery)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if resp := s.answerDNS(buf[:n]); resp != nil {
			pc.WriteTo(resp, from)
		}
	}
}

// serveDNSTCP accepts DNS-over-TCP connections, at most maxDNSTCPConns at a
// time, each closed after dnsTCPIdle without a query.
func (s *Session) serveDNSTCP(ln net.Listener) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
					return
				}
				select {
				case <-time.After(10 * time.Millisecond):
					continue
				case <-s.ctx.Done():
					return
				}
			}
			select {
			case s.dnsSlots <- struct{}{}:
			default:
				c.Close()
				continue
			}
			if !s.track(c) {
				<-s.dnsSlots
				c.Close()
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() { <-s.dnsSlots }()
				defer s.untrack(c)
				s.handleDNSTCP(c)
			}()
		}
	}()
}

func (s *Session) handleDNSTCP(c net.Conn) {
	buf := make([]byte, 2+maxDNSQuery)
	for {
		c.SetDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := io.ReadFull(c, buf[:2]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(buf))
		if n > maxDNSQuery {
			return
		}
		if _, err := io.ReadFull(c, buf[2:2+n]); err != nil {
			return
		}
		resp := s.answerDNS(buf[2 : 2+n])
		if resp == nil {
			return
		}
		out := make([]byte, 2+len(resp))
		binary.BigEndian.PutUint16(out, uint16(len(resp)))
		copy(out[2:], resp)
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}
