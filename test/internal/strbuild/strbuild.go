// Package strbuild builds str's programs from this tree for the tests
// that run them when STR_BIN names no build: cmd/str and cmd/str-egress
// with CGO_ENABLED=0 (static programs, as make build makes them) and
// cmd/str-worker (cgo, the Solace client library) beside them, where `str
// worker` finds the worker and every launcher its egress helper.
package strbuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Worker is the worker program's name beside str (cmd/str's workerProgram).
const Worker = "str-worker"

// Egress is the egress helper's name beside str (package egress/helper).
const Egress = "str-egress"

// Build builds str and str-worker into dir, from the module at root (a
// path relative to the caller's package directory works), and returns
// str's path. The go command's output goes to stderr.
func Build(dir, root string) (string, error) {
	str := filepath.Join(dir, "str")
	for _, b := range []struct {
		out, pkg string
		env      []string
	}{
		{str, "./cmd/str", []string{"CGO_ENABLED=0"}},
		{filepath.Join(dir, Egress), "./cmd/str-egress", []string{"CGO_ENABLED=0"}},
		{filepath.Join(dir, Worker), "./cmd/str-worker", nil},
	} {
		// disable_grpc_modules: as make build (the Makefile's WORKER_TAGS).
		cmd := exec.Command("go", "build", "-tags", "disable_grpc_modules", "-o", b.out, b.pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), b.env...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("go build -o %s %s (in %s): %w", b.out, b.pkg, root, err)
		}
	}
	return str, nil
}

// WorkerBeside is the str-worker beside the str binary at str (where
// `str worker` execs it from).
func WorkerBeside(str string) string {
	return filepath.Join(filepath.Dir(str), Worker)
}

// EgressBeside is the str-egress beside the str binary at str (where
// every launcher finds its egress helper).
func EgressBeside(str string) string {
	return filepath.Join(filepath.Dir(str), Egress)
}

// Main runs a test binary's tests (call it from TestMain and pass its
// result to os.Exit) with *bin set to the str under test: $STR_BIN when
// set, else str and str-worker built by Build from the module at root
// into a temporary directory, world-readable so a test's unprivileged
// user can run them, and removed once the tests ran. who names the
// suite in the error printed when the build fails. A launcher the tests
// make in their own process finds the egress helper beside that str
// (STR_EGRESS_BIN, unless set).
func Main(m *testing.M, root, who string, bin *string) int {
	if *bin = os.Getenv("STR_BIN"); *bin != "" {
		setEgress(*bin)
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "str-"+who+"-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *bin, err = Build(dir, root); err != nil {
		fmt.Fprintln(os.Stderr, who+": building str:", err)
		return 1
	}
	setEgress(*bin)
	return m.Run()
}

func setEgress(str string) {
	if os.Getenv("STR_EGRESS_BIN") == "" {
		os.Setenv("STR_EGRESS_BIN", EgressBeside(str))
	}
}
