// Package intercept is the launcher's side of egress TLS termination
// (secretless credentials, http_rules): what a sandbox is given to trust
// the CA its egress helper terminates with. The proxy itself, which
// terminates, injects the credential's value and checks the requests, is
// package egress/proxy, and it runs in the egress helper (cmd/str-egress),
// which alone holds the CA and its key; the launcher asks this package:
//
//   - planning (Check, Add): a sandbox whose request has credentials or
//     whose policy has http_rules (egress.Terminates) gets a generated CA
//     bundle at BundlePath (the host's bundle plus the helper's CA
//     certificate, which the launcher asks the helper for: never its
//     key), SSL_CERT_FILE and the other variables clients read pointing
//     at it, and NAME=placeholder for each credential; the credential's
//     value stays in the request, never in the plan (which `str profile
//     show --plan` prints and the init receives);
//   - the caller's faults (Check): a credential that is invalid or whose
//     hosts lie outside the policy's allowed_hosts, a mount that would
//     hide the bundle.
//
// What it does on the host: nothing but read the host's CA bundle (once
// per launcher), as PEM bytes it never parses: it links no crypto/x509.
//
// What it protects against: a tool reading a credential's value (only a
// placeholder is in its environment and plan); a sandbox that terminates
// nothing getting the CA at all (no credential, no http_rules: no bundle,
// and its proxy no CA); a caller's mount replacing or hiding the bundle
// the tool's clients are pointed at.
//
// What it trusts: the host's CA bundle, the egress helper's certificate,
// and the caller that supplies the credentials' values (SECURITY.md,
// "Secretless credentials" and "The egress helper").
package intercept
