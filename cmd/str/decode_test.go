package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestProfileDirNeedsStrWorker: without a str-worker beside it, str given
// a profile directory fails (exit 125) with a message that says what
// needs the worker, where it was looked for and how to install it; the
// embedded profiles need no worker.
func TestProfileDirNeedsStrWorker(t *testing.T) {
	str := buildStr(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "extra.yaml"), []byte("version: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(str, "profile", "list", "--profile-dir", dir)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitLauncher {
		t.Fatalf("str profile list --profile-dir without %s: %v, want exit %d; stderr:\n%s", workerProgram, err, exitLauncher, &stderr)
	}
	worker := filepath.Join(filepath.Dir(str), workerProgram)
	for _, want := range []string{"str profile: launcher: profiles from " + dir + ": decoding YAML", worker, "no such file", "make build"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, &stderr)
		}
	}
	out, err := exec.Command(str, "profile", "list").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "restrictive") {
		t.Errorf("str profile list without %s: %v\n%s", workerProgram, err, out)
	}
}
