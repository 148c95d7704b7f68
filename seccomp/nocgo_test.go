package seccomp

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// TestRunTimePathHasNoCgo: the packages a sandbox's setup runs (this one,
// the launcher, the init) import no package with cgo files of its own
// (libseccomp-golang is for the tests: libseccomp_test.go), so they build
// with CGO_ENABLED=0. Standard-library packages with an optional cgo
// variant (net, os/user) do not count: they have a pure-Go one.
func TestRunTimePathHasNoCgo(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		mustwork.Skip(t, fmt.Sprintf("go not on PATH (%v): cannot list dependencies", err))
	}
	cmd := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}} {{len .CgoFiles}}",
		".", "../launcher/...", "../nsinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("go list line %q", line)
		}
		n++
		if strings.Contains(f[0], "libseccomp") || (f[1] == "false" && f[2] != "0") {
			t.Errorf("%s (standard %s, %s cgo files) is imported by the run-time path", f[0], f[1], f[2])
		}
	}
	if n < 10 {
		t.Fatalf("go list named only %d packages", n)
	}
}
