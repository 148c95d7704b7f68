// Package enginetest is what the tests that run str on the Docker engine
// share (test/container, test/systemd, test/pod, test/fleet): the check
// that the engine, the image and the binary are here (skip with the
// reason, or fail under STR_MUST_WORK=1), docker commands, the repository
// root.
package enginetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// Needs is what a test needs beyond root and a running engine.
type Needs struct {
	Area      string // the test's name in the skip message ("container", "pod", ...)
	WhyRoot   string // why it needs root, for the message
	Image     string // an image that must exist ("" for none)
	ImageHint string // how to get it (default: make image)
	Bin       bool   // STR_BIN (bin/str) must be set
}

// Need skips (or, with STR_MUST_WORK=1, fails) the test when n cannot be
// met here, naming what is missing.
func Need(t *testing.T, n Needs) {
	t.Helper()
	missing := ""
	switch {
	case os.Geteuid() != 0:
		missing = "needs root (" + n.WhyRoot + ")"
	case n.Bin && os.Getenv("STR_BIN") == "":
		missing = "needs STR_BIN (bin/str): run make test-container"
	case n.Image == "" && os.Getenv("STR_IMAGE") == "":
		missing = "needs STR_IMAGE (the worker image): run make test-container"
	default:
		if out, err := exec.Command("docker", "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
			missing = fmt.Sprintf("needs a running docker engine: docker version: %v: %s", err, bytes.TrimSpace(out))
		} else if img := imageOf(n); img != "" {
			if out, err := exec.Command("docker", "image", "inspect", img).CombinedOutput(); err != nil {
				hint := n.ImageHint
				if hint == "" {
					hint = "make image"
				}
				missing = fmt.Sprintf("image %s not built (%s): %s", img, hint, FirstLine(out))
			}
		}
	}
	if missing == "" {
		return
	}
	mustwork.Skip(t, n.Area+": "+missing)
}

func imageOf(n Needs) string {
	if n.Image != "" {
		return n.Image
	}
	return os.Getenv("STR_IMAGE")
}

// FirstLine is b's first line, trimmed.
func FirstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}

// RepoRoot is the repository's root, from a test directory two levels
// below it (test/NAME).
func RepoRoot(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Docker runs docker with args and returns its trimmed output; a failure
// fails the test with the output.
func Docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("docker", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// Invoke runs `str invoke TOOL` against the broker at addr (its token in
// tokenFile, the namespace ns) with extra flags, and returns the reply's
// result and the reply line; no reply, or one without a result, fails the
// test.
func Invoke(t *testing.T, strBin, addr, tokenFile, ns, tool string, extra ...string) (map[string]any, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	a := append([]string{"invoke", tool, "--broker", addr, "--token-file", tokenFile, "--namespace", ns, "--wait", "150s"}, extra...)
	cmd := exec.CommandContext(ctx, strBin, a...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run()
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	var reply map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &reply); err != nil {
		t.Fatalf("str invoke %s: no reply JSON: %v\nstdout:\n%s\nstderr:\n%s", tool, err, stdout.String(), stderr.String())
	}
	res, _ := reply["result"].(map[string]any)
	if res == nil {
		t.Fatalf("str invoke %s: reply without result: %s", tool, lines[len(lines)-1])
	}
	return res, lines[len(lines)-1]
}
