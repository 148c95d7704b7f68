// Package intercept is the launcher's side of egress TLS termination
// (secretless credentials, http_rules): the CA a launcher's proxy
// terminates with, and what a sandbox is given to trust it. The proxy
// itself, which terminates, injects the credential's value and checks the
// requests, is package egress; the launcher asks this package three
// things:
//
//   - planning (Needed, Check, Add): a sandbox whose request has
//     credentials or whose policy has http_rules gets a generated CA
//     bundle at BundlePath (the host's bundle plus the CA's certificate,
//     never its key), SSL_CERT_FILE and the other variables clients read
//     pointing at it, and NAME=placeholder for each credential; the
//     credential's value stays in the request, never in the plan (which
//     `str profile show --plan` prints and the init receives);
//   - the caller's faults (Check): a credential that is invalid or whose
//     hosts lie outside the policy's allowed_hosts, a mount that would
//     hide the bundle;
//   - at the sandbox's egress start (CA.Interception): the CA, the
//     credentials and the upstream roots the proxy terminates with.
//
// What it does on the host: nothing but read. On first use (once per
// launcher: a worker or a `str run`) it makes a CA key in memory (P-256,
// never written anywhere) and reads the host's trust store, the host's CA
// bundle and the PEM file named by STR_EGRESS_EXTRA_ROOTS.
//
// What it protects against: a tool reading a credential's value (only a
// placeholder is in its environment and plan); a sandbox that terminates
// nothing getting the CA at all (no credential, no http_rules: no bundle,
// and its proxy no CA); a caller's mount replacing or hiding the bundle
// the tool's clients are pointed at.
//
// What it trusts: the host's trust store and STR_EGRESS_EXTRA_ROOTS (the
// roots upstream servers are verified against), and the caller that
// supplies the credentials' values. The CA key lives in the launcher's
// memory for the launcher's life: a compromise of the launcher yields it
// (SECURITY.md, "Secretless credentials").
package intercept
