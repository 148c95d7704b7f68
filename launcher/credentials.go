package launcher

import (
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/nsinit"
)

// CABundlePath is where a sandbox whose egress terminates TLS for some
// hosts finds its CA bundle: the host's bundle plus the proxy CA's
// certificate (a generated file, like /etc/resolv.conf).
const CABundlePath = "/etc/str/ca-certificates.pem"

// caBundleEnv are the variables that point Python (ssl, requests, pip),
// OpenSSL, curl and Node at CABundlePath.
var caBundleEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS"}

// proxyCA is a launcher's egress CA and upstream roots, made on first use
// (once per worker or str run) and kept in memory only.
type proxyCA struct {
	once   sync.Once
	ca     *egress.CA
	roots  *x509.CertPool
	bundle string // the sandbox's CA bundle (host bundle + CA), read once
	err    error
}

// egressCA returns the launcher's CA and the pool upstream servers are
// verified against, creating them on first use: the host's trust store plus
// the PEM file named by STR_EGRESS_EXTRA_ROOTS, read once, as is the host
// bundle the sandboxes' bundle starts with.
func (l *Launcher) egressCA() (*egress.CA, *x509.CertPool, error) {
	p := &l.proxyCA
	p.once.Do(func() {
		if p.ca, p.err = egress.NewCA(); p.err != nil {
			return
		}
		if p.roots, p.err = egress.UpstreamRoots(os.Getenv(egress.ExtraRootsEnv)); p.err != nil {
			p.err = fmt.Errorf("%s: %w", egress.ExtraRootsEnv, p.err)
			return
		}
		b, err := egress.SandboxBundle(p.ca)
		if err != nil {
			p.err = err
			return
		}
		p.bundle = string(b)
	})
	return p.ca, p.roots, p.err
}

// needsInterception reports whether a plan's egress terminates TLS for
// some hosts: the request has credentials or the policy has http_rules.
func needsInterception(pl *Plan, req Request) bool {
	return len(req.Credentials) > 0 || len(pl.Network.HTTPRules) > 0
}

// planInterception adds to a plan what a sandbox needs when its egress
// terminates TLS: the CA bundle (a generated file: the host's bundle and
// the proxy CA's certificate, never the key), the variables that point
// clients at it, and NAME=placeholder for each credential. The values
// stay in the request (never in the plan, which `str profile show --plan`
// prints). Credentials must be valid and their hosts within the policy's
// allowed_hosts: the caller's fault otherwise.
func (l *Launcher) planInterception(pl *Plan, req Request) error {
	if !needsInterception(pl, req) {
		return nil
	}
	if err := egress.CheckCredentials(pl.Network, req.Credentials); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	if _, _, err := l.egressCA(); err != nil {
		return fmt.Errorf("launcher: egress CA: %w", err)
	}
	for _, m := range pl.Child.Mounts {
		if m.Target == CABundlePath || under(CABundlePath, m.Target) && m.Kind != nsinit.MountTmpfs && m.Target != "/" {
			return fmt.Errorf("%w: a mount at %s hides the CA bundle at %s", ErrInvalidRequest, m.Target, CABundlePath)
		}
	}
	pl.Child.Mounts = append(pl.Child.Mounts, nsinit.Mount{Kind: nsinit.MountFile, Target: CABundlePath, Mode: 0o444, Contents: l.proxyCA.bundle})
	add := map[string]string{}
	for _, k := range caBundleEnv {
		add[k] = CABundlePath
	}
	for _, kv := range egress.CredentialEnv(req.Credentials) {
		k, v, _ := strings.Cut(kv, "=")
		add[k] = v
	}
	env := slices.DeleteFunc(slices.Clone(pl.Child.Env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, replaced := add[k]
		return replaced
	})
	for k, v := range add {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	pl.Child.Env = env
	return nil
}

// interception is what the sandbox's egress session terminates with (nil
// when nothing is terminated).
func (s *Sandbox) interception() (*egress.Interception, error) {
	if !needsInterception(s.plan, s.req) {
		return nil, nil
	}
	ca, roots, err := s.l.egressCA()
	if err != nil {
		return nil, err
	}
	return &egress.Interception{CA: ca, Credentials: s.req.Credentials, UpstreamRoots: roots}, nil
}
