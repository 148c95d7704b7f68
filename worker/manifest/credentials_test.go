package manifest

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/egress"
)

const credManifest = `version: 1
tools:
  gh:
    module: m
    function: f
    network:
      policy: restricted
      allowed_hosts: [api.github.com, "*.example.com"]
      http_rules:
        - {host: api.github.com, methods: [GET], paths: [/repos/]}
    credentials:
      - name: GITHUB_TOKEN
        from: file:SECRET_FILE
        hosts: [api.github.com]
        header: Authorization
        format: "Bearer {value}"
      - {name: OTHER_KEY, from: "env:STR_TEST_OTHER_KEY", hosts: [a.example.com], query: key}
`

// A tool's credentials are parsed with their hosts checked against the
// tool's own policy; each call reads the values anew (a changed file is
// the next call's value) with fresh placeholders.
func TestCredentials(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "gh")
	if err := os.WriteFile(secret, []byte("v1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := Parse([]byte(strings.Replace(credManifest, "SECRET_FILE", secret, 1)), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tool := m.Tools["gh"]
	if tool == nil || tool.Credentials == nil || len(tool.Credentials.List) != 2 || len(tool.Network.HTTPRules) != 1 {
		t.Fatalf("parsed %+v", tool)
	}
	getenv := func(k string) string { return map[string]string{"STR_TEST_OTHER_KEY": "k1"}[k] }
	a, err := tool.Credentials.Secrets(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(secret, []byte("v2"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := tool.Credentials.Secrets(getenv)
	if err != nil {
		t.Fatal(err)
	}
	if a[0].Placeholder == b[0].Placeholder || a[0].Placeholder == a[1].Placeholder {
		t.Error("a placeholder was reused")
	}
	// The value is not printable (its use is checked in package egress);
	// reflection reads it here: the file was read anew.
	val := func(c egress.Credential) string { return string(reflect.ValueOf(c.Value).Field(0).Bytes()) }
	if val(a[0]) != "v1" || val(b[0]) != "v2" || val(a[1]) != "k1" {
		t.Errorf("values %q %q %q, want v1 (trailing newline dropped), v2 (the file read anew), k1", val(a[0]), val(b[0]), val(a[1]))
	}
	if _, err := tool.Credentials.Secrets(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "OTHER_KEY") || !strings.Contains(err.Error(), "STR_TEST_OTHER_KEY") {
		t.Errorf("a missing source: %v", err)
	}

	for _, bad := range []struct{ yaml, want string }{
		{"    credentials: [{name: T, from: env:X, hosts: [evil.test], header: Authorization}]\n", "not covered by network.allowed_hosts"},
		{"    credentials: [{name: T, from: vault:x, hosts: [api.github.com], header: Authorization}]\n", "want env:VAR, file:PATH or dir:DIR"},
		{"    credentials: [{name: t, from: env:X, hosts: [api.github.com], header: Authorization}]\n", "not an environment variable name"},
		{"    credentials: [{name: T, from: env:X, hosts: [api.github.com], header: Authorization, value: x}]\n", `unknown field "value"`},
		{"    credentials: {name: T}\n", "must be a list"},
	} {
		y := "version: 1\ntools:\n  t:\n    module: m\n    function: f\n    network: {policy: restricted, allowed_hosts: [api.github.com]}\n" + bad.yaml
		if err := problemsOf(t, y); err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), "tools.t") {
			t.Errorf("%s: %v, want %q", bad.yaml, err, bad.want)
		}
	}
	// Credentials need the tool's own policy.
	if err := problemsOf(t, "version: 1\ntools:\n  t: {module: m, function: f, credentials: [{name: T, from: env:X, hosts: [a.test], header: H}]}\n"); err == nil || !strings.Contains(err.Error(), "needs its own network policy") {
		t.Errorf("credentials without a network policy: %v", err)
	}
}
