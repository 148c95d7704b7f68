// Package proxy serves a sandbox's network policy (package egress): the
// HTTP proxy and SOCKS5 port, the DNS stub, the transparent capture ports,
// TLS termination for credentials and http_rules (intercept.go, mitm.go).
// Its design, what it protects against and what it trusts are in package
// egress's doc. It parses everything the sandbox sends, so it runs in the
// egress helper (cmd/str-egress), a process without host privileges, and
// never in the launcher's (bin/str links no HTTP or TLS code).
package proxy

import (
	"github.com/securetoolruntime/str/egress"
	"golang.org/x/net/publicsuffix"
)

// Every policy a session serves is compiled here, with the public suffix
// list (see egress.PublicSuffix).
func init() { egress.PublicSuffix = publicsuffix.PublicSuffix }
