package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// refusedPrefixes are destinations no policy reaches unless an allowed_cidrs
// entry names them: "this network", private, CGNAT, loopback, link-local
// (cloud metadata 169.254.169.254), IETF protocol assignments, benchmarking
// (also the fake-IP range of other tools), documentation (TEST-NET-1..3,
// 2001:db8::/32: never on the internet, so a destination there is a
// network of the operator's own or a test's), multicast, reserved and
// broadcast, and their IPv6 counterparts. The list follows microsandbox's
// and E2B's.
var refusedPrefixes = mustPrefixes(
	"0.0.0.0/8",       // "this network"; 0.0.0.0 reaches the host's own listeners
	"10.0.0.0/8",      // RFC 1918
	"100.64.0.0/10",   // CGNAT (RFC 6598), also some clouds' internal ranges
	"127.0.0.0/8",     // loopback: the worker's own ports, the dev broker
	"169.254.0.0/16",  // link-local: cloud metadata (169.254.169.254)
	"172.16.0.0/12",   // RFC 1918
	"192.0.0.0/24",    // IETF protocol assignments (incl. 192.0.0.192 Oracle metadata)
	"192.0.2.0/24",    // documentation, TEST-NET-1 (RFC 5737)
	"192.168.0.0/16",  // RFC 1918
	"198.51.100.0/24", // documentation, TEST-NET-2 (RFC 5737)
	"203.0.113.0/24",  // documentation, TEST-NET-3 (RFC 5737)
	"198.18.0.0/15",   // benchmarking; fake-IP range of other proxies
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, and 255.255.255.255
	"::/96",           // unspecified, loopback ::1, deprecated IPv4-compatible
	"fc00::/7",        // unique local
	"fe80::/10",       // link-local
	"fec0::/10",       // deprecated site-local
	"ff00::/8",        // multicast
	"64:ff9b:1::/48",  // local-use NAT64 (RFC 8215)
	"100::/64",        // discard-only (RFC 6666)
	"::ffff:0:0:0/96", // SIIT "IPv4-translated" (RFC 2765)
	"2001:db8::/32",   // documentation (RFC 3849)
)

// IPv6 prefixes that embed an IPv4 address: the embedded address is checked
// like any IPv4 destination, so 64:ff9b::a9fe:a9fe (NAT64 of
// 169.254.169.254) is refused while NAT64 of a public address is not.
var (
	nat64Prefix = netip.MustParsePrefix("64:ff9b::/96") // RFC 6052 well-known prefix: bytes 12..15
	sixToFour   = netip.MustParsePrefix("2002::/16")    // RFC 3056: bytes 2..5
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// refusedAddr reports whether a is in a refused range; v4-mapped addresses
// are unmapped first, and IPv4 embedded in NAT64 and 6to4 addresses is
// checked too. An invalid address or one with a zone is refused.
func refusedAddr(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return true
	}
	a = a.Unmap()
	for _, p := range refusedPrefixes {
		if p.Contains(a) {
			return true
		}
	}
	if hostAddr(a) {
		return true
	}
	if a.Is6() {
		b := a.As16()
		switch {
		case nat64Prefix.Contains(a):
			return refusedAddr(netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}))
		case sixToFour.Contains(a):
			return refusedAddr(netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}))
		}
	}
	return false
}

// inCIDRs returns the first prefix containing a (unmapped), if any.
func inCIDRs(a netip.Addr, cidrs []netip.Prefix) (netip.Prefix, bool) {
	a = a.Unmap()
	for _, p := range cidrs {
		if p.Contains(a) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// AddrAllowed is the address filter every dial passes twice (Decide, then
// the dialer's Control hook): an address an allowed_cidrs entry contains is
// allowed; otherwise any refused address is not.
func AddrAllowed(a netip.Addr, cidrs []netip.Prefix) bool {
	if a.Zone() != "" {
		return false
	}
	if _, ok := inCIDRs(a, cidrs); ok {
		return true
	}
	return !refusedAddr(a)
}

// The worker host's own addresses, on every interface, are refused like
// loopback: a public address of the host reaches the same listeners (the
// dev broker, the health port) as 127.0.0.1 does. The list is read from
// the kernel and refreshed at most every hostAddrTTL, so an address added
// at run time is refused from then on.
const hostAddrTTL = 2 * time.Second

var hostAddrs struct {
	mu    sync.Mutex
	at    time.Time
	addrs []netip.Addr
}

func hostAddr(a netip.Addr) bool {
	hostAddrs.mu.Lock()
	defer hostAddrs.mu.Unlock()
	if time.Since(hostAddrs.at) > hostAddrTTL {
		hostAddrs.addrs = hostAddrs.addrs[:0]
		if ifas, err := net.InterfaceAddrs(); err == nil {
			for _, ifa := range ifas {
				if pn, ok := ifa.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(pn.IP); ok {
						hostAddrs.addrs = append(hostAddrs.addrs, ip.Unmap())
					}
				}
			}
		}
		hostAddrs.at = time.Now()
	}
	for _, h := range hostAddrs.addrs {
		if h == a {
			return true
		}
	}
	return false
}

// CheckDialAddr is the last check before a connect(): the address about to
// be connected must still pass the policy's address filter (rebinding-safe:
// this is the address the kernel will connect to, whatever resolved it).
func (c *Compiled) CheckDialAddr(address string) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("egress: dial %q: not an IP address", address)
	}
	if c.mode == Isolated || !AddrAllowed(ap.Addr(), c.cidrs) {
		return fmt.Errorf("egress: dial %s: %w", address, ErrRefusedAddr)
	}
	return nil
}

// ErrRefusedAddr: an address the policy's address filter refuses.
var ErrRefusedAddr = errors.New("address refused by the network policy")
