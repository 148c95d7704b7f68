package main

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCredentialFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k")
	if err := os.WriteFile(file, []byte("from-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	parse := func(args ...string) (*credentialFlags, error) {
		var c credentialFlags
		fs := flag.NewFlagSet("run", flag.ContinueOnError)
		c.register(fs)
		return &c, fs.Parse(args)
	}
	getenv := func(k string) string { return map[string]string{"GH": "from-env"}[k] }
	c, err := parse("--credential", "GITHUB_TOKEN=env:GH", "--credential-host", "GITHUB_TOKEN=api.github.com",
		"--credential-header", "GITHUB_TOKEN=Authorization: Bearer {value}",
		"--credential", "KEY=file:"+file, "--credential-host", "KEY=a.example.com", "--credential-query", "KEY=api_key")
	if err != nil {
		t.Fatal(err)
	}
	creds, errs := c.build(getenv)
	if len(errs) > 0 || len(creds) != 2 {
		t.Fatalf("%v %+v", errs, creds)
	}
	gh, key := creds[0], creds[1]
	if gh.Name != "GITHUB_TOKEN" || gh.Header != "Authorization" || gh.Format != "Bearer {value}" || gh.Hosts[0] != "api.github.com" || !strings.HasPrefix(gh.Placeholder, "str-placeholder-") {
		t.Errorf("GITHUB_TOKEN: %+v", gh)
	}
	if key.Query != "api_key" || key.Header != "" || gh.Placeholder == key.Placeholder {
		t.Errorf("KEY: %+v", key)
	}

	// Every problem at once, each naming its flag.
	c, _ = parse("--credential", "A=env:UNSET", "--credential", "B=vault:x", "--credential", "C=env:GH",
		"--credential-host", "D=x.example.com", "--credential-header", "C=no-colon")
	_, errs = c.build(getenv)
	msg := ""
	for _, e := range errs {
		msg += e.Error() + "\n"
	}
	for _, want := range []string{"A: environment variable UNSET is unset", `"vault:x"`, "--credential-host D: no --credential D=SOURCE",
		"--credential-header C: want", "--credential C: no --credential-host C=HOST"} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "from-env") {
		t.Error("an error carries a value")
	}
}
