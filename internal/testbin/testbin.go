// Package testbin builds, once per test binary, the programs the sandboxes
// a test makes need beside the launcher: the egress helper
// (cmd/str-egress), which a test binary cannot find beside itself. A test
// package whose tests create sandboxes calls Main from its TestMain.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/securetoolruntime/str/egress/helper"
)

// Main builds cmd/str-egress into a temporary directory (go's build cache
// makes a rebuild fast), points STR_EGRESS_BIN at it unless the caller
// set it, runs the tests and exits with their status.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv(helper.BinEnv) == "" {
		bin, err := Egress()
		if err != nil {
			fmt.Fprintln(os.Stderr, "testbin:", err)
			return 1
		}
		defer os.RemoveAll(filepath.Dir(bin))
		os.Setenv(helper.BinEnv, bin)
	}
	return m.Run()
}

// Egress builds cmd/str-egress into a new temporary directory and returns
// the program's path; the directory is the caller's to remove. The
// directory and the program are world-readable: a root launcher runs the
// helper as nobody.
func Egress() (string, error) {
	dir, err := os.MkdirTemp("", "str-testbin-")
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	out := filepath.Join(dir, "str-egress")
	cmd := exec.Command("go", "build", "-o", out, "github.com/securetoolruntime/str/cmd/str-egress")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("go build cmd/str-egress: %w\n%s", err, b)
	}
	return out, nil
}
