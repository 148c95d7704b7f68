package intercept

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/nsinit"
)

// BundlePath is where a sandbox whose egress terminates TLS for some
// hosts finds its CA bundle: the host's bundle plus the proxy CA's
// certificate (a generated file, like /etc/resolv.conf).
const BundlePath = "/etc/str/ca-certificates.pem"

// bundleEnv are the variables that point Python (ssl, requests, pip),
// OpenSSL, curl and Node at BundlePath.
var bundleEnv = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "NODE_EXTRA_CA_CERTS"}

// hostBundles are where Debian, Fedora/RHEL, Alpine and SUSE keep the
// host's CA bundle, in order.
var hostBundles = []string{
	"/etc/ssl/certs/ca-certificates.crt",
	"/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/ssl/cert.pem",
	"/etc/ssl/ca-bundle.pem",
}

// hostBundle is the host's bundle (the first of the usual places that
// exists), read once per launcher, as PEM bytes: never parsed here.
var hostBundle = sync.OnceValues(func() ([]byte, error) {
	for _, p := range hostBundles {
		b, err := os.ReadFile(p)
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("host CA bundle %s: %w", p, err)
		}
	}
	return nil, nil
})

// Bundle is the CA bundle a sandbox trusts: the host's bundle followed by
// caPEM, the egress helper's CA certificate, so that terminated hosts and
// untouched tunnels both verify.
func Bundle(caPEM []byte) ([]byte, error) {
	host, err := hostBundle()
	if err != nil {
		return nil, err
	}
	out := slices.Clone(host)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, caPEM...), nil
}

// Check returns the caller's faults in a sandbox whose egress terminates TLS (egress.Terminates): a
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

// Add returns mounts and env with what a sandbox whose egress terminates
// TLS gets: the CA bundle (a generated file: the host's
// bundle and the proxy CA's certificate, never the key), the variables
// that point clients at it, and NAME=placeholder for each credential (env
// sorted, any earlier value of those names replaced). The values stay
// with the caller (never in a plan, which `str profile show --plan`
// prints). caPEM is the egress helper's CA certificate (Bundle).
func Add(mounts []nsinit.Mount, env []string, creds []egress.Credential, caPEM []byte) ([]nsinit.Mount, []string, error) {
	bundle, err := Bundle(caPEM)
	if err != nil {
		return nil, nil, err
	}
	mounts = append(mounts, nsinit.Mount{Kind: nsinit.MountFile, Target: BundlePath, Mode: 0o444, Contents: string(bundle)})
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
