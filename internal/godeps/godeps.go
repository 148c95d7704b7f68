// Package godeps lists what a build links, for the tests that check which
// packages (cgo, a C library) a program may not contain.
package godeps

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Dep is one package of a build.
type Dep struct {
	Path     string // import path
	Standard bool   // in the standard library
	CgoFiles int    // its cgo files (with CGO_ENABLED=1, so that they count)
}

// List is `go list -deps` of pkgs (relative to the test's directory),
// run by gobin with CGO_ENABLED=1; a failure or a line it cannot read
// fails the test.
func List(t *testing.T, gobin string, pkgs ...string) []Dep {
	t.Helper()
	cmd := exec.Command(gobin, append([]string{"list", "-deps", "-f", "{{.ImportPath}} {{.Standard}} {{len .CgoFiles}}"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var deps []Dep
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || (f[1] != "true" && f[1] != "false") {
			t.Fatalf("go list line %q", line)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			t.Fatalf("go list line %q: %v", line, err)
		}
		deps = append(deps, Dep{Path: f[0], Standard: f[1] == "true", CgoFiles: n})
	}
	return deps
}
