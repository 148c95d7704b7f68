// Package egress is the network policy of a sandbox: the policy as data,
// its validation, and the one decision (Decide) every connection out of a
// sandbox's network namespace goes through, with what the launcher's plan
// needs (Env, ResolvConf, the listener addresses, CapturePorts,
// credentials). It links no HTTP or TLS code (neither net/http nor
// crypto/tls nor crypto/x509), so bin/str does not either.
//
// The proxy that serves the decision is package egress/proxy, and it runs
// out of the launcher's process, in the egress helper (cmd/str-egress,
// driven by package egress/helper) without host privileges. The sandbox's
// init creates the listening sockets inside the namespace (which has only
// lo) and the launcher hands them to the helper; a proxy Session serves
// them there, so every accepted connection comes from inside the sandbox
// and every upstream dial happens in the host's network namespace, after
// one decision. The rest of this comment describes the two together.
//
// One session, per sandbox:
//
//	127.0.0.1:3128   HTTP proxy (CONNECT, absolute-form http://) and SOCKS5
//	                 (no auth, CONNECT; first byte 0x05) on one port
//	127.0.0.1:53     DNS stub, UDP and TCP: A for allowed names answers a
//	                 fake IP from 127.1.0.0/16 (deterministic, never reused
//	                 for another name in the session, TTL 1); nothing is
//	                 forwarded, so no query ever leaves as DNS
//	0.0.0.0:P        transparent capture, for each CapturePorts() P: a plain
//	                 connect() to a fake IP lands here; getsockname() gives
//	                 the fake IP, hence the name
//
// Every adapter turns what it read into an Intent {host or IP, port, via,
// sni}, and decider.Decide is the one place that allows or denies it (deny
// wins, default deny). In order:
//
//  1. isolated denies everything;
//  2. the host is normalized (lowercase, no trailing dot, IDNA to punycode,
//     labels of [a-z0-9_-], IPv6 bracketed, no CR/LF/space/@, numeric-looking
//     names refused) or the request is malformed;
//  3. a DNS query needs an allowlisted name (restricted) or any valid name
//     (allow_egress);
//  4. restricted: the port must be in allowed_ports (default 443);
//  5. a captured connection to an address that is not a fake IP is the
//     sandbox's own loopback: ip_literal;
//  6. an IP literal needs an allowed_cidrs entry (restricted), or a public
//     address (allow_egress);
//  7. restricted: the name must match allowed_hosts ("*.example.com" matches
//     strict subdomains only; "*", "*.com" and public suffixes are refused
//     at Validate);
//  8. a TLS server name, when seen, must equal the name;
//  9. the worker resolves the name (Policy.DNSServers or the host's
//     resolver) and keeps only addresses outside the refused ranges (this
//     network, RFC 1918, CGNAT, loopback, link-local and cloud metadata,
//     192.0.0/24, 198.18/15, the documentation ranges 192.0.2/24,
//     198.51.100/24, 203.0.113/24 and 2001:db8::/32, multicast, reserved,
//     ::, ::1, ULA, IPv6 link-local and multicast, and IPv4 embedded in v4-mapped, NAT64 and
//     6to4 addresses) unless allowed_cidrs names them; none left:
//     resolved_private.
//
// Only the pinned, checked addresses of the decision are dialed, and the
// default dialer's Control hook checks the address once more right before
// connect(), so a name that rebinds between the check and the dial still
// cannot reach a refused address.
//
// Every denial is an Event, aggregated by (kind, reason, host, port, via)
// and capped (MaxEvents distinct, the rest counted as dropped); Summary
// renders the block an agent shows its model. Events never carry query
// strings, headers or bodies; a host that failed validation is recorded
// with every character outside [a-z0-9._:-[]] replaced by '?', so it cannot
// inject text into that block. Denials on the wire: HTTP 403 (400 for a
// malformed request, 502 when the name does not resolve) with X-Proxy-Error
// and X-Str-Reason; SOCKS5 reply 0x02; a captured connection is reset; DNS
// answers NXDOMAIN.
//
// Secretless credentials and HTTP rules (Options.Intercept; intercept.go):
// connections to a host that has a credential or an http_rules entry are
// terminated instead of tunnelled. The sandbox is shown a leaf certificate
// minted for that host by a CA made in memory at the proxy's start (its key
// never leaves the worker's memory; the sandbox trusts its certificate), and
// each request, over HTTP/1.1 or HTTP/2 (net/http on both sides), is checked
// in order: the Host is the tunnel's destination; the host's rules allow
// the method and a clean path under a prefix; no placeholder of a credential
// that belongs to other hosts is in the path, query, headers or body (the
// first MaxBodyScan bytes before anything is sent, the rest as it streams).
// Then the configured header (or query parameter) holding the credential's
// placeholder gets the real value, the request goes upstream over TLS
// verified against the host's trust store (plus explicit extra roots; never
// skipped: a failure is an upstream_certificate violation, never a fallback
// to the tunnel), and values the server echoes are replaced by their
// placeholder. Every other host keeps the byte-for-byte tunnel. A plain
// http:// request is checked the same way but never gets a credential.
//
// What it protects against: a tool reaching the worker's own ports, the
// broker, the host's loopback, private networks or cloud metadata through
// the proxy (by name, by IP literal in any spelling, by v4-mapped, NAT64 or
// 6to4 addresses, or by DNS rebinding); a tool reaching hosts outside its
// allowlist by any ingress path (the adapters share one decision); DNS as an
// exfiltration channel (names are answered locally and never forwarded);
// header and request-line injection (CR, LF, spaces and '@' are refused;
// request heads are parsed strictly and bounded); a cached fake IP landing
// on another host (fake IPs are never reused); resource exhaustion by the
// sandbox (MaxConns concurrent connections, bounded buffers and request
// heads, connect and idle timeouts, a bounded fake-IP table, a bounded
// number of DNS-over-TCP connections); SNI naming one allowed host while
// the tunnel names another (checked on port 443).
//
// What it does not protect against: domain fronting (the HTTP Host inside
// TLS is invisible; a CDN behind an allowed name can route elsewhere); an
// allowlisted host that is itself an open proxy or relay, or any other way
// an allowed host forwards data (allowing github.com allows pushing to any
// repository); exfiltration through the content of allowed connections. A
// connect() to an IP literal that is not a fake IP fails inside the sandbox
// with ENETUNREACH (there is no route but lo) and never reaches the worker,
// so it is not reported; a connect to 127.x on a capture port is reported
// as ip_literal. UDP other than DNS, ICMP and raw sockets get nothing.
//
// What it trusts: the Policy it is given (validated, but its allowlist is
// the operator's choice); the Resolver (a resolver that lies can point an
// allowed name at any public address, never at a refused one); the
// listeners the launcher passes (created by the sandbox's init, whose only
// job is to create them); the kernel's getsockname() on captured
// connections. Nothing inside the sandbox enforces anything: if a listener
// is missing or the session stops, connections fail; they never widen.
//
// Needs: nothing from the kernel beyond TCP and UDP sockets; the network
// namespace and the listeners are the launcher's and the init's work.
package egress
