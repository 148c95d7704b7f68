// Package testdns is the tests' DNS server: A records from a table, on
// the host's loopback, for policies whose names the tests decide.
package testdns

import (
	"net"
	"strings"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Serve answers A queries for the names in answers (lower case, fully
// qualified: "svc.test.") with their address, NXDOMAIN for any other
// name, until the test ends; it returns the server's "127.0.0.1:PORT".
func Serve(t *testing.T, answers map[string][4]byte) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			a, known := answers[strings.ToLower(q.Name.String())]
			hdr := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true}
			if !known {
				hdr.RCode = dnsmessage.RCodeNameError
			}
			b := dnsmessage.NewBuilder(nil, hdr)
			_ = b.StartQuestions()
			_ = b.Question(q)
			if known && q.Type == dnsmessage.TypeA {
				_ = b.StartAnswers()
				_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a})
			}
			if msg, err := b.Finish(); err == nil {
				_, _ = pc.WriteTo(msg, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}
