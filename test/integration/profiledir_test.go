package integration

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/profiles/profileyaml"
)

// customProfile is restrictive's file as an operator's profile name,
// with hostname host and, when policy is set, that seccomp policy file.
func customProfile(t *testing.T, name, host, policy string) string {
	t.Helper()
	base, err := os.ReadFile("../../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(base), "name: restrictive", "name: "+name, 1)
	y = strings.Replace(y, "aliases: [untrusted]", "aliases: []", 1)
	y = strings.Replace(y, "hostname: sandbox", "hostname: "+host, 1)
	if policy != "" {
		y = strings.Replace(y, "seccomp: restrictive", "seccomp: "+policy, 1)
	}
	if !strings.Contains(y, "name: "+name) || !strings.Contains(y, "hostname: "+host) {
		t.Fatal("restrictive.yaml changed shape: update customProfile")
	}
	return y
}

// TestProfileDirThroughStrWorker: `str run --profile-dir DIR` runs a
// sandbox of an operator's YAML profile end to end, and of one naming an
// operator's seccomp policy file; str links no YAML, so both are decoded
// by str-worker beside it.
func TestProfileDirThroughStrWorker(t *testing.T) {
	needRoot(t)
	dir, pdir := t.TempDir(), t.TempDir()
	policy := filepath.Join(pdir, "nouname.yaml")
	writeText(t, policy, `version: 1
name: nouname
description: "restrictive, with uname refused"
extends: restrictive
replaces: [uname]
rules:
  - names: [uname]
    action: errno
    errno: EPERM
    reason: "the test tells the policy file applied by this refusal"
`)
	writeText(t, filepath.Join(dir, "custom.yaml"), customProfile(t, "custom", "custom-box", ""))
	writeText(t, filepath.Join(dir, "nouname.yaml"), customProfile(t, "nouname", "nouname-box", policy))

	r := str(t, "--profile-dir", dir, "--profile", "custom", "--", "/bin/sh", "-c", "uname -n")
	if r.Exit != 0 || r.Stdout != "custom-box\n" {
		t.Fatalf("profile custom: exit %d, stdout %q, want custom-box\nstderr: %s", r.Exit, r.Stdout, r.Stderr)
	}
	r = str(t, "--profile-dir", dir, "--profile", "nouname", "--", "/bin/sh", "-c", "uname -n; echo rc=$?")
	if r.Exit != 0 || strings.Contains(r.Stdout, "nouname-box") || !strings.Contains(r.Stdout, "rc=1") {
		t.Fatalf("profile nouname: exit %d, stdout %q, want uname refused\nstderr: %s", r.Exit, r.Stdout, r.Stderr)
	}
}

// TestProfileDirBadYAMLRunsNothing: a bad profile in the directory fails
// `str run` with exit 125 before anything runs, with the decoder's error
// (every file, line and field) word for word after "str run: launcher:
// profiles from DIR: ", as the worker's in-process decoder gives it.
func TestProfileDirBadYAMLRunsNothing(t *testing.T) {
	dir := t.TempDir()
	writeText(t, filepath.Join(dir, "good.yaml"), customProfile(t, "good", "good-box", ""))
	bad := customProfile(t, "bad1", "bad-box", "")
	bad = strings.Replace(bad, "hostname: bad-box", "hostname: bad-box\nbogus: 1", 1)
	bad = strings.Replace(bad, "memory: 512Mi", "memory: 512MB", 1)
	writeText(t, filepath.Join(dir, "bad1.yaml"), bad)
	writeText(t, filepath.Join(dir, "bad2.yaml"), strings.Replace(customProfile(t, "bad2", "x", ""), "uid: 65534", "uid: 0", 1))
	_, want := profileyaml.DecodeDir(dir)
	if want == nil {
		t.Fatal("the in-process decoder accepts the bad directory")
	}
	for _, w := range []string{"bad1.yaml", "line ", "field bogus not found", `unknown suffix "MB"`, "bad2.yaml: profile bad2: uid"} {
		if !strings.Contains(want.Error(), w) {
			t.Fatalf("the decoder's error lacks %q:\n%v", w, want)
		}
	}
	cmd := exec.Command(strBin, "run", "--profile-dir", dir, "--profile", "restrictive", "--", "/bin/echo", "ran")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 {
		t.Fatalf("str run with a bad profile directory: %v, want exit 125\nstderr: %s", err, &stderr)
	}
	if stdout.Len() != 0 {
		t.Errorf("something ran: stdout %q", &stdout)
	}
	if got, w := stderr.String(), "str run: launcher: profiles from "+dir+": "+want.Error()+"\n"; got != w {
		t.Errorf("stderr:\n%s\nwant:\n%s", got, w)
	}
}

func writeText(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}
