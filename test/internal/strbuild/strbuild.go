// Package strbuild builds str's two programs from this tree for the tests
// that run them when STR_BIN names no build: cmd/str with CGO_ENABLED=0 (a
// static program, as make build makes it) and cmd/str-worker (cgo, the
// Solace client library) beside it, where `str worker` finds the worker.
package strbuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Worker is the worker program's name beside str (cmd/str's workerProgram).
const Worker = "str-worker"

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
		{filepath.Join(dir, Worker), "./cmd/str-worker", nil},
	} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
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
