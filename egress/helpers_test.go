package egress

import (
	"os"
	"testing"

	"context"
	"golang.org/x/net/publicsuffix"
	"net"
	"net/netip"
)

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

// The tests run with the public suffix list, as the proxy does (a test may
// link net/http; the package may not).
func TestMain(m *testing.M) {
	PublicSuffix = publicsuffix.PublicSuffix
	os.Exit(m.Run())
}
