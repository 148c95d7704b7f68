package proxy

import (
	"context"
	"errors"
	"github.com/securetoolruntime/str/egress"
	"net"
	"net/netip"
	"sync/atomic"
	"time"
)

// newResolver is the default Resolver: the host's resolver when the policy
// names no DNS servers; otherwise Go's resolver talking only to those
// servers (round-robin per query), from the worker's network namespace.
func newResolver(servers []netip.AddrPort, timeout time.Duration) egress.Resolver {
	if len(servers) == 0 {
		return net.DefaultResolver
	}
	var next atomic.Uint32
	d := &net.Dialer{Timeout: timeout}
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			switch network {
			case "udp", "udp4", "udp6", "tcp", "tcp4", "tcp6":
			default:
				return nil, errors.New("egress: resolver: unexpected network " + network)
			}
			srv := servers[int(next.Add(1)-1)%len(servers)]
			return d.DialContext(ctx, network, srv.String())
		},
	}
}
