package seccomp

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/godeps"
)

// TestRunTimePathHasNoCgo: the packages a sandbox's setup runs (this one,
// the launcher, the init) import no package with cgo files of its own
// (libseccomp-golang is for the tests: libseccomp_test.go), so they build
// with CGO_ENABLED=0. Standard-library packages with an optional cgo
// variant (net, os/user) do not count: they have a pure-Go one.
func TestRunTimePathHasNoCgo(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("STR_MUST_WORK") == "1" {
			t.Fatalf("go not on PATH: %v", err)
		}
		t.Skipf("go not on PATH (%v): cannot list dependencies", err)
	}
	deps := godeps.List(t, gobin, ".", "../launcher/...", "../cmd/str-init")
	for _, d := range deps {
		if strings.Contains(d.Path, "libseccomp") || (!d.Standard && d.CgoFiles != 0) {
			t.Errorf("%s (standard %v, %d cgo files) is imported by the run-time path", d.Path, d.Standard, d.CgoFiles)
		}
	}
	if len(deps) < 10 {
		t.Fatalf("go list named only %d packages", len(deps))
	}
}
