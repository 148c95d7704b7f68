package intercept

import (
	"crypto/x509"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/proxy"
	"github.com/securetoolruntime/str/nsinit"
)

// BundlePath is where a sandbox whose egress terminates TLS for some
// hosts finds its CA bundle: the host's bundle plus the proxy CA's
// certificate (a generated file, like /etc/resolv.conf).
const BundlePath = "/etc/str/ca-certificates.pem"

// bundleEnv are the variables that point Python (ssl, requests, pip),
// OpenSSL, curl and Node at BundlePath.
var bundleEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS"}

// CA is a launcher's egress CA and upstream roots, made on first use
// (once per worker or str run) and kept in memory only. The zero value is
// ready for use; a CA must not be copied.
type CA struct {
	once   sync.Once
	ca     *proxy.CA
	roots  *x509.CertPool
	bundle string // the sandbox's CA bundle (host bundle + CA), read once
	err    error
}

// Get returns the CA and the pool upstream servers are verified against,
// creating them on first use: the host's trust store plus the PEM file
// named by STR_EGRESS_EXTRA_ROOTS, read once, as is the host bundle the
// sandboxes' bundle starts with.
func (p *CA) Get() (*proxy.CA, *x509.CertPool, error) {
	p.once.Do(func() {
		if p.ca, p.err = proxy.NewCA(); p.err != nil {
			return
		}
		if p.roots, p.err = proxy.UpstreamRoots(os.Getenv(proxy.ExtraRootsEnv)); p.err != nil {
			p.err = fmt.Errorf("%s: %w", proxy.ExtraRootsEnv, p.err)
			return
		}
		b, err := proxy.SandboxBundle(p.ca)
		if err != nil {
			p.err = err
			return
		}
		p.bundle = string(b)
	})
	return p.ca, p.roots, p.err
}

// Needed reports whether a sandbox's egress terminates TLS for some
// hosts: it has credentials or its policy has http_rules.
func Needed(network egress.Policy, creds []egress.Credential) bool {
	return len(creds) > 0 || len(network.HTTPRules) > 0
}

// Check returns the caller's faults in a sandbox that Needed: a
// credential that is invalid or whose hosts are not within the policy's
// allowed_hosts, or a mount that would hide BundlePath (a mount on it, or
// on a directory above it other than a tmpfs or /).
func Check(network egress.Policy, creds []egress.Credential, mounts []nsinit.Mount) error {
	if err := egress.CheckCredentials(network, creds); err != nil {
		return err
	}
	for _, m := range mounts {
		above := strings.HasPrefix(BundlePath, m.Target+"/")
		if m.Target == BundlePath || above && m.Kind != nsinit.MountTmpfs && m.Target != "/" {
			return fmt.Errorf("a mount at %s hides the CA bundle at %s", m.Target, BundlePath)
		}
	}
	return nil
}

// Add returns mounts and env with what a sandbox that Needed gets when its
// egress terminates TLS: the CA bundle (a generated file: the host's
// bundle and the proxy CA's certificate, never the key), the variables
// that point clients at it, and NAME=placeholder for each credential (env
// sorted, any earlier value of those names replaced). The values stay
// with the caller (never in a plan, which `str profile show --plan`
// prints). Its error is the CA's (Get).
func (p *CA) Add(mounts []nsinit.Mount, env []string, creds []egress.Credential) ([]nsinit.Mount, []string, error) {
	if _, _, err := p.Get(); err != nil {
		return nil, nil, err
	}
	mounts = append(mounts, nsinit.Mount{Kind: nsinit.MountFile, Target: BundlePath, Mode: 0o444, Contents: p.bundle})
	add := map[string]string{}
	for _, k := range bundleEnv {
		add[k] = BundlePath
	}
	for _, kv := range egress.CredentialEnv(creds) {
		k, v, _ := strings.Cut(kv, "=")
		add[k] = v
	}
	out := slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		_, replaced := add[k]
		return replaced
	})
	for k, v := range add {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return mounts, out, nil
}

// Interception is what a sandbox's egress session terminates with (nil
// when nothing is terminated: not Needed).
func (p *CA) Interception(network egress.Policy, creds []egress.Credential) (*proxy.Interception, error) {
	if !Needed(network, creds) {
		return nil, nil
	}
	ca, roots, err := p.Get()
	if err != nil {
		return nil, err
	}
	return &proxy.Interception{CA: ca, Credentials: creds, UpstreamRoots: roots}, nil
}
