package launcher

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher/intercept"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
)

// A request with a credential gets the CA bundle, the variables pointing
// at it and NAME=placeholder; the value is nowhere in the plan (what
// `str profile show --plan` prints and what the init receives).
func TestPlanInterception(t *testing.T) {
	l := &Launcher{host: fakeHost(0, CgroupV2)}
	var err error
	if l.profiles, err = profiles.Embedded(); err != nil {
		t.Fatal(err)
	}
	ph, err := egress.NewPlaceholder()
	if err != nil {
		t.Fatal(err)
	}
	const value = "plan-test-secret-value"
	cred := egress.Credential{Name: "API_TOKEN", Hosts: []string{"api.example.com"}, Header: "Authorization", Format: "Bearer {value}",
		Value: egress.NewSecret([]byte(value)), Placeholder: ph}
	net := &egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.example.com"}}
	pl, err := l.Plan(Request{Profile: "standard", Argv: []string{"/bin/true"}, Network: net, Credentials: []egress.Credential{cred}})
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{"API_TOKEN=" + ph, "SSL_CERT_FILE=" + intercept.BundlePath, "REQUESTS_CA_BUNDLE=" + intercept.BundlePath, "CURL_CA_BUNDLE=" + intercept.BundlePath} {
		if !slices.Contains(pl.Child.Env, kv) {
			t.Errorf("env lacks %s: %q", kv, pl.Child.Env)
		}
	}
	i := slices.IndexFunc(pl.Child.Mounts, func(m nsinit.Mount) bool { return m.Target == intercept.BundlePath })
	if i < 0 || pl.Child.Mounts[i].Kind != nsinit.MountFile {
		t.Fatalf("no CA bundle file in the plan")
	}
	ca, err := l.egress.CACert()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(pl.Child.Mounts[i].Contents, string(ca)) || strings.Contains(pl.Child.Mounts[i].Contents, "PRIVATE KEY") {
		t.Errorf("the bundle does not end with the proxy CA's certificate, or holds a key")
	}
	b, _ := json.Marshal(pl)
	if strings.Contains(string(b), value) {
		t.Error("the secret is in the plan")
	}
	// The same CA for every sandbox of this launcher.
	ca2, _ := l.egress.CACert()
	if string(ca2) != string(ca) {
		t.Error("a second CA for the same launcher")
	}

	// A credential for a host the policy does not allow: the caller's fault.
	bad := cred
	bad.Hosts = []string{"evil.example.net"}
	_, err = l.Plan(Request{Profile: "standard", Argv: []string{"/bin/true"}, Network: net, Credentials: []egress.Credential{bad}})
	if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), "evil.example.net") {
		t.Errorf("credential outside allowed_hosts: %v", err)
	}
	// No credentials and no rules: nothing added.
	pl, err = l.Plan(Request{Profile: "standard", Argv: []string{"/bin/true"}, Network: net})
	if err != nil || slices.ContainsFunc(pl.Child.Env, func(kv string) bool { return strings.HasPrefix(kv, "SSL_CERT_FILE=") }) {
		t.Errorf("plain request: %v %q", err, pl.Child.Env)
	}
}
