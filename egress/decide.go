package egress

import (
	"context"
	"net/netip"
	"slices"
	"strconv"
)

// Ingress adapters (Intent.Via).
const (
	ViaHTTPConnect = "http_connect" // CONNECT host:port
	ViaHTTP        = "http"         // absolute-form GET http://host/...
	ViaSOCKS5      = "socks5"       // SOCKS5 CONNECT to an IPv4/IPv6 address
	ViaSOCKS5h     = "socks5h"      // SOCKS5 CONNECT to a domain name
	ViaTransparent = "transparent"  // plain connect() to a fake IP on a capture port
	ViaDNS         = "dns"          // a query to the DNS stub
)

// Reason codes (stable; they appear in events, X-Str-Reason and metrics).
const (
	// net
	ReasonNotAllowlisted      = "not_allowlisted"
	ReasonPortNotAllowed      = "port_not_allowed"
	ReasonIPLiteral           = "ip_literal"
	ReasonPrivateAddress      = "private_address"
	ReasonResolvedPrivate     = "resolved_private"
	ReasonResolveFailed       = "resolve_failed"
	ReasonMalformedRequest    = "malformed_request"
	ReasonUnsupportedProtocol = "unsupported_protocol"
	ReasonLimitConnections    = "limit_connections"
	ReasonIsolated            = "isolated"
	ReasonSNIMismatch         = "sni_mismatch"
	// dns
	ReasonNameNotAllowlisted = "name_not_allowlisted"
	ReasonQtypeRefused       = "qtype_refused"
	ReasonLimitNames         = "limit_names"
)

// Intent is one connection attempt (or DNS query), normalized by an ingress
// adapter. Host is the destination name when there is one; otherwise IP is
// the destination (an IP literal). When both are set, Host is the name the
// fake IP in IP stands for. Port is 0 for DNS.
type Intent struct {
	Host string
	IP   netip.Addr
	Port int
	Via  string
	SNI  string
}

// Decision is the verdict on one Intent. Addrs are the resolved, checked
// addresses to dial, in order (only for allowed connections); nothing else
// may be dialed.
type Decision struct {
	Allow  bool
	Reason string
	Rule   string
	Addrs  []netip.Addr
}

// Resolver resolves names on the worker (net.Resolver satisfies it).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Decider holds the one decision function for a session.
type Decider struct {
	pol      *Compiled
	resolver Resolver
}

// Deny is the decision that denies with reason (and the rule that did).
func Deny(reason, rule string) Decision { return Decision{Reason: reason, Rule: rule} }

// Decide is the single place where a destination is allowed or denied. Deny
// wins and the default is deny. In order:
//
//  1. isolated: deny everything.
//  2. normalize the host; malformed or unknown via: deny.
//  3. DNS (Via dns): the name must be allowlisted (restricted) or merely
//     valid (allow_egress). Nothing is resolved.
//  4. ports: 1..65535; restricted: AllowedPorts only.
//  5. transparent capture without a known fake IP: deny ip_literal (the
//     address is the sandbox's own loopback, never a destination).
//  6. IP literal: allowed if an AllowedCIDRs entry contains it; otherwise
//     restricted: ip_literal; allow_egress: private_address if refused.
//  7. name: restricted: must match AllowedHosts.
//  8. SNI, when the adapter saw one: must equal the name.
//  9. resolve on the worker; keep only addresses that pass the address
//     filter; none left: resolved_private. The dialer re-checks each
//     address in its Control hook.
func (d *Decider) Decide(ctx context.Context, in Intent) Decision {
	p := d.pol
	// 1.
	if p.mode == Isolated {
		return Deny(ReasonIsolated, "policy: isolated")
	}
	if p.mode != Restricted && p.mode != AllowEgress {
		return Deny(ReasonIsolated, "policy: invalid") // unreachable: compile refuses it
	}
	// 2.
	switch in.Via {
	case ViaHTTPConnect, ViaHTTP, ViaSOCKS5, ViaSOCKS5h, ViaTransparent, ViaDNS:
	default:
		return Deny(ReasonUnsupportedProtocol, "")
	}
	host, ip := "", in.IP.Unmap()
	if in.Host != "" {
		h, hip, err := NormalizeHost(in.Host, false)
		if err != nil {
			if in.Via == ViaDNS {
				return Deny(ReasonNameNotAllowlisted, "")
			}
			return Deny(ReasonMalformedRequest, "")
		}
		if hip.IsValid() {
			host, ip = "", hip
		} else {
			host = h
		}
	}
	// 3.
	if in.Via == ViaDNS {
		if host == "" {
			return Deny(ReasonNameNotAllowlisted, "")
		}
		if p.mode == AllowEgress {
			return Decision{Allow: true, Rule: "policy: allow_egress"}
		}
		if hp, ok := p.matchHost(host); ok {
			return Decision{Allow: true, Rule: "allowed_hosts: " + hp.raw}
		}
		return Deny(ReasonNameNotAllowlisted, "")
	}
	// 4.
	if in.Port < 1 || in.Port > 65535 {
		return Deny(ReasonMalformedRequest, "")
	}
	portRule := "policy: allow_egress"
	if p.mode == Restricted {
		portRule = "allowed_ports: " + strconv.Itoa(in.Port)
	}
	portOK := p.mode == AllowEgress || slices.Contains(p.ports, in.Port)
	// 5.
	if in.Via == ViaTransparent && host == "" {
		return Deny(ReasonIPLiteral, "")
	}
	// 6.
	if host == "" {
		if !ip.IsValid() {
			return Deny(ReasonMalformedRequest, "")
		}
		if pr, ok := inCIDRs(ip, p.cidrs); ok {
			if !portOK {
				return Deny(ReasonPortNotAllowed, "allowed_ports")
			}
			return Decision{Allow: true, Rule: "allowed_cidrs: " + pr.String(), Addrs: []netip.Addr{ip}}
		}
		if p.mode == Restricted {
			return Deny(ReasonIPLiteral, "")
		}
		if refusedAddr(ip) {
			return Deny(ReasonPrivateAddress, "")
		}
		return Decision{Allow: true, Rule: portRule, Addrs: []netip.Addr{ip}}
	}
	// 7.
	rule := "policy: allow_egress"
	if p.mode == Restricted {
		hp, ok := p.matchHost(host)
		if !ok {
			return Deny(ReasonNotAllowlisted, "")
		}
		if !portOK {
			return Deny(ReasonPortNotAllowed, "allowed_ports")
		}
		rule = "allowed_hosts: " + hp.raw
	}
	// 8.
	if in.SNI != "" {
		if sd, ok := d.CheckSNI(host, in.SNI, rule); !ok {
			return sd
		}
	}
	// 9.
	addrs, err := d.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return Deny(ReasonResolveFailed, rule)
	}
	var ok []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if AddrAllowed(a, p.cidrs) && !slices.Contains(ok, a) {
			ok = append(ok, a)
		}
		if len(ok) == maxPinned {
			break
		}
	}
	if len(ok) == 0 {
		return Deny(ReasonResolvedPrivate, rule)
	}
	return Decision{Allow: true, Rule: rule, Addrs: ok}
}

// CheckSNI is step 8 of Decide, also run on its own when the ClientHello
// arrives after the tunnel was granted (CONNECT, SOCKS5): the TLS server name
// must be the destination name itself. It does not stop domain fronting
// (the HTTP Host inside TLS is not visible), but it stops a client from
// naming one allowed host and asking its address for another.
func (d *Decider) CheckSNI(host, sni, rule string) (Decision, bool) {
	n, ip, err := NormalizeHost(sni, false)
	if err != nil || ip.IsValid() || n != host {
		return Deny(ReasonSNIMismatch, rule), false
	}
	return Decision{}, true
}

// maxPinned bounds how many resolved addresses one connection tries.
const maxPinned = 8

func (c *Compiled) matchHost(h string) (hostPattern, bool) {
	for _, hp := range c.hosts {
		if hp.match(h) {
			return hp, true
		}
	}
	return hostPattern{}, false
}
