package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// Mode is a sandbox's network policy.
type Mode string

// The three policies, from strictest to loosest.
const (
	// Isolated: no network at all. Every proxy request and DNS query is
	// denied with reason "isolated".
	Isolated Mode = "isolated"
	// Restricted: only AllowedHosts on AllowedPorts (default 443), and
	// addresses AllowedCIDRs names.
	Restricted Mode = "restricted"
	// AllowEgress: any host on any port of the public internet; private,
	// loopback, link-local and metadata addresses stay refused unless
	// AllowedCIDRs names them.
	AllowEgress Mode = "allow_egress"
)

// rank orders modes for Tighten; 0 is unknown.
func (m Mode) rank() int {
	switch m {
	case Isolated:
		return 1
	case Restricted:
		return 2
	case AllowEgress:
		return 3
	}
	return 0
}

// On-violation actions.
const (
	OnViolationReport = "report"
	OnViolationKill   = "kill"
)

// ProxyAddr is where the sandbox's HTTP proxy and SOCKS5 listener lives (one
// port; the first byte tells them apart). DNSAddr is the DNS stub (UDP and
// TCP).
const (
	ProxyAddr = "127.0.0.1:3128"
	DNSAddr   = "127.0.0.1:53"
)

const (
	proxyPort = 3128
	dnsPort   = 53
)

// defaultPorts is AllowedPorts when a restricted policy names none.
var defaultPorts = []int{443}

// Policy is one sandbox's network policy, as data (profiles and the tool
// manifest carry it).
//
// A nil AllowedHosts or AllowedCIDRs in a policy passed to Tighten means
// "inherit"; an empty, non-nil list means "none". AllowedPorts and
// DNSServers inherit when empty.
type Policy struct {
	Mode Mode `yaml:"policy" json:"policy"`
	// AllowedHosts: "api.example.com" (exact) or "*.example.com" (strict
	// subdomains only). "*", "*.com" and wildcards over other public
	// suffixes are refused. Restricted only.
	AllowedHosts []string `yaml:"allowed_hosts,omitempty" json:"allowed_hosts,omitempty"`
	// AllowedPorts: restricted: the only ports reachable (default [443]);
	// allow_egress: extra ports captured for proxy-unaware clients (every
	// port is reachable through the proxy).
	AllowedPorts []int `yaml:"allowed_ports,omitempty" json:"allowed_ports,omitempty"`
	// AllowedCIDRs: explicit prefixes, the only way to reach private,
	// loopback or metadata ranges, or (restricted) IP-literal destinations.
	AllowedCIDRs []string `yaml:"allowed_cidrs,omitempty" json:"allowed_cidrs,omitempty"`
	// DNSServers: "IP[:port]" the worker resolves with; empty = the host's
	// resolver.
	DNSServers []string `yaml:"dns_servers,omitempty" json:"dns_servers,omitempty"`
	// OnViolation: "report" (default) or "kill".
	OnViolation string `yaml:"on_violation,omitempty" json:"on_violation,omitempty"`
	// HTTPRules narrow the methods and paths allowed on the hosts they
	// name (the proxy terminates TLS for those hosts). Tighten adds the
	// tightening policy's rules to these: rules are never removed.
	HTTPRules []HTTPRule `yaml:"http_rules,omitempty" json:"http_rules,omitempty"`
}

// Compiled is a validated Policy in the form Decide uses.
type Compiled struct {
	mode     Mode
	hosts    []hostPattern
	ports    []int // restricted: reachable ports; sorted
	cidrs    []netip.Prefix
	dns      []netip.AddrPort
	kill     bool
	rules    []compiledRule
	original Policy
}

// NewDecider returns the decision function for a compiled policy, resolving
// names with r.
func NewDecider(pol *Compiled, r Resolver) *Decider { return &Decider{pol: pol, resolver: r} }

// Mode is the policy's mode.
func (c *Compiled) Mode() Mode { return c.mode }

// DNSServers are the servers names are resolved with (none: the host's
// resolver).
func (c *Compiled) DNSServers() []netip.AddrPort { return c.dns }

// Kill reports whether a violation kills the sandbox (on_violation: kill).
func (c *Compiled) Kill() bool { return c.kill }

// CIDRs are the policy's allowed_cidrs.
func (c *Compiled) CIDRs() []netip.Prefix { return c.cidrs }

// Rules reports whether the policy has http_rules.
func (c *Compiled) Rules() bool { return len(c.rules) > 0 }

// Validate checks the policy and returns every problem at once, each naming
// its field and value.
func (p Policy) Validate() error {
	_, err := p.Compile()
	return err
}

func (p Policy) Compile() (*Compiled, error) {
	var errs []error
	bad := func(field string, v any, format string, a ...any) {
		errs = append(errs, fmt.Errorf("network.%s %s: %s", field, quoteValue(v), fmt.Sprintf(format, a...)))
	}
	c := &Compiled{mode: p.Mode, original: p}
	if p.Mode.rank() == 0 {
		if p.Mode == "" {
			errs = append(errs, errors.New(`network.policy: missing (isolated, restricted or allow_egress)`))
		} else {
			bad("policy", string(p.Mode), "unknown (isolated, restricted or allow_egress)")
		}
	}
	if p.Mode == Isolated {
		// Fields that mean nothing in isolated are mistakes, not no-ops:
		// a reader would believe the hosts are reachable.
		if len(p.AllowedHosts) > 0 {
			bad("allowed_hosts", p.AllowedHosts, "has no effect with policy isolated")
		}
		if len(p.AllowedPorts) > 0 {
			bad("allowed_ports", p.AllowedPorts, "has no effect with policy isolated")
		}
		if len(p.AllowedCIDRs) > 0 {
			bad("allowed_cidrs", p.AllowedCIDRs, "has no effect with policy isolated")
		}
		if len(p.DNSServers) > 0 {
			bad("dns_servers", p.DNSServers, "has no effect with policy isolated")
		}
	}
	if p.Mode == AllowEgress && len(p.AllowedHosts) > 0 {
		bad("allowed_hosts", p.AllowedHosts, "has no effect with policy allow_egress (every public host is allowed); use restricted")
	}
	for i, h := range p.AllowedHosts {
		hp, err := parsePattern(h)
		if err != nil {
			bad(fmt.Sprintf("allowed_hosts[%d]", i), h, "%v", err)
			continue
		}
		c.hosts = append(c.hosts, hp)
	}
	for i, port := range p.AllowedPorts {
		if port < 1 || port > 65535 {
			bad(fmt.Sprintf("allowed_ports[%d]", i), port, "not a port (1-65535)")
			continue
		}
		if !slices.Contains(c.ports, port) {
			c.ports = append(c.ports, port)
		}
	}
	if len(c.ports) == 0 && len(p.AllowedPorts) == 0 && p.Mode == Restricted {
		c.ports = slices.Clone(defaultPorts)
	}
	slices.Sort(c.ports)
	for i, s := range p.AllowedCIDRs {
		pr, err := netip.ParsePrefix(s)
		switch {
		case err != nil:
			bad(fmt.Sprintf("allowed_cidrs[%d]", i), s, "not a CIDR prefix (e.g. 10.20.0.0/16)")
		case pr.Addr().Is4In6():
			bad(fmt.Sprintf("allowed_cidrs[%d]", i), s, "write v4-mapped prefixes in IPv4 form")
		case pr.Masked() != pr:
			bad(fmt.Sprintf("allowed_cidrs[%d]", i), s, "host bits set (did you mean %s?)", pr.Masked())
		default:
			c.cidrs = append(c.cidrs, pr)
		}
	}
	for i, s := range p.DNSServers {
		ap, err := parseDNSServer(s)
		if err != nil {
			bad(fmt.Sprintf("dns_servers[%d]", i), s, "%v", err)
			continue
		}
		c.dns = append(c.dns, ap)
	}
	c.rules = compileRules(p, c.hosts, bad)
	switch p.OnViolation {
	case "", OnViolationReport:
	case OnViolationKill:
		c.kill = true
	default:
		bad("on_violation", p.OnViolation, "unknown (report or kill)")
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func quoteValue(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	default:
		return fmt.Sprintf("%v", v)
	}
}

// parseDNSServer accepts "IP", "IP:port" and "[IPv6]:port"; port 53 by
// default.
func parseDNSServer(s string) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.AddrPort{}, errHostZone
		}
		return netip.AddrPortFrom(a.Unmap(), dnsPort), nil
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 {
		return netip.AddrPort{}, errors.New("not IP or IP:port")
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, errHostZone
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// Tighten returns q applied on top of p: q may only narrow p. Modes are
// ordered isolated ⊂ restricted ⊂ allow_egress; every host q allows must be
// allowed by p (p allow_egress allows every host); ports and CIDRs must be
// subsets; DNS servers must be a subset of p's (a different resolver could
// point an allowed name anywhere); on_violation may go from report to kill
// only. Fields q leaves unset (nil lists, empty strings) are inherited. Every
// looser field is named in the error.
func (p Policy) Tighten(q Policy) (Policy, error) {
	pc, err := p.Compile()
	if err != nil {
		return Policy{}, fmt.Errorf("the policy being tightened: %w", err)
	}
	eff := q
	if eff.Mode == "" {
		eff.Mode = p.Mode
	}
	if eff.OnViolation == "" {
		eff.OnViolation = p.OnViolation
	}
	if eff.Mode == Isolated {
		// Nothing else means anything in isolated; do not inherit it.
		eff.AllowedHosts, eff.AllowedPorts, eff.AllowedCIDRs, eff.DNSServers, eff.HTTPRules = nil, nil, nil, nil, nil
	} else {
		// Rules only narrow (a request must pass every rule matching its
		// host), so the tightening policy's rules are added to these.
		eff.HTTPRules = append(slices.Clone(p.HTTPRules), q.HTTPRules...)
		if eff.AllowedHosts == nil && eff.Mode == p.Mode {
			eff.AllowedHosts = slices.Clone(p.AllowedHosts)
		}
		if len(eff.AllowedPorts) == 0 {
			eff.AllowedPorts = slices.Clone(p.AllowedPorts)
		}
		if eff.AllowedCIDRs == nil {
			eff.AllowedCIDRs = slices.Clone(p.AllowedCIDRs)
		}
		if len(eff.DNSServers) == 0 {
			eff.DNSServers = slices.Clone(p.DNSServers)
		}
	}
	qc, err := eff.Compile()
	if err != nil {
		return Policy{}, fmt.Errorf("the tightening policy: %w", err)
	}
	var errs []error
	looser := func(field string, v any, why string) {
		errs = append(errs, fmt.Errorf("network.%s %s is looser than the policy it tightens: %s", field, quoteValue(v), why))
	}
	if qc.mode.rank() > pc.mode.rank() {
		looser("policy", string(qc.mode), "mode "+string(pc.mode)+" may only be narrowed (isolated < restricted < allow_egress)")
	}
	if qc.mode == Restricted && pc.mode == Restricted {
		for _, qh := range qc.hosts {
			if !slices.ContainsFunc(pc.hosts, func(ph hostPattern) bool { return ph.Covers(qh) }) {
				looser("allowed_hosts", qh.raw, "not covered by "+fmt.Sprint(p.AllowedHosts))
			}
		}
		for _, port := range qc.ports {
			if !slices.Contains(pc.ports, port) {
				looser("allowed_ports", port, "not in "+fmt.Sprint(pc.ports))
			}
		}
	}
	for _, qp := range qc.cidrs {
		if !slices.ContainsFunc(pc.cidrs, func(pp netip.Prefix) bool {
			return pp.Bits() <= qp.Bits() && pp.Contains(qp.Addr())
		}) {
			looser("allowed_cidrs", qp.String(), "not inside "+fmt.Sprint(p.AllowedCIDRs))
		}
	}
	for _, d := range qc.dns {
		if !slices.Contains(pc.dns, d) {
			looser("dns_servers", d.String(), "only a subset of "+fmt.Sprint(p.DNSServers)+" may be chosen")
		}
	}
	if pc.kill && !qc.kill {
		looser("on_violation", eff.OnViolation, "kill may not become report")
	}
	if len(errs) > 0 {
		return Policy{}, errors.Join(errs...)
	}
	return eff, nil
}

// CapturePorts lists the ports the sandbox's init must listen on (0.0.0.0:P)
// for transparent capture of plain connect() calls to fake IPs: restricted:
// the allowed ports; allow_egress: 80, 443 and the allowed ports; isolated:
// none. 53 and 3128 are never listed: the DNS stub and the proxy own them
// on 127.0.0.1 (clients still reach such ports through the proxy).
func (p Policy) CapturePorts() []int {
	c, err := p.Compile()
	if err != nil || c.mode == Isolated {
		return nil
	}
	var ports []int
	switch c.mode {
	case Restricted:
		ports = slices.Clone(c.ports)
	case AllowEgress:
		ports = append([]int{80, 443}, c.ports...)
	}
	slices.Sort(ports)
	ports = slices.Compact(ports)
	return slices.DeleteFunc(ports, func(port int) bool { return port == dnsPort || port == proxyPort })
}

// Env returns the environment variables for the tool: the proxy variables
// (HTTP(S)_PROXY and ALL_PROXY in both cases, pointing at ProxyAddr;
// NO_PROXY only for loopback names, never private ranges: those are
// unreachable anyway and listing them only makes clients bypass the proxy)
// and STR_NETWORK=<mode>. Isolated gets STR_NETWORK only.
func Env(p Policy) []string {
	mode := p.Mode
	if mode.rank() == 0 {
		mode = Isolated
	}
	env := []string{"STR_NETWORK=" + string(mode)}
	if mode == Isolated {
		return env
	}
	const httpProxy = "http://" + ProxyAddr
	const socksProxy = "socks5h://" + ProxyAddr
	const noProxy = "localhost,127.0.0.1,::1"
	return append(env,
		"HTTP_PROXY="+httpProxy, "HTTPS_PROXY="+httpProxy,
		"http_proxy="+httpProxy, "https_proxy="+httpProxy,
		"ALL_PROXY="+socksProxy, "all_proxy="+socksProxy,
		"NO_PROXY="+noProxy, "no_proxy="+noProxy,
	)
}

// ResolvConf is the sandbox's /etc/resolv.conf: the DNS stub only, fail fast.
func ResolvConf() string {
	return "nameserver 127.0.0.1\noptions ndots:0 attempts:1 timeout:1\n"
}
