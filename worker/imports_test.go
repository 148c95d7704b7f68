package worker

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestWorkerImportsNoConcreteTransport: package worker (its build, not
// its tests) depends on the transport interface only, never on a concrete
// transport, the dev broker or a broker's client library: each transport
// classifies its own errors and reports its own limits, and cmd/str-worker wires
// the concrete one (STYLE.md 19).
func TestWorkerImportsNoConcreteTransport(t *testing.T) {
	const module = "github.com/securetoolruntime/str/"
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the worker's dependencies: %v", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{.ImportPath}}", module+"worker").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	// The list is the real one: the interface is in it.
	if !slices.Contains(deps, module+"worker/transport") {
		t.Fatalf("go list -deps of the worker has no %sworker/transport: %q", module, deps)
	}
	forbidden := []string{
		module + "worker/transport/", // devbroker, solace, memory
		module + "broker",            // the embedded dev broker and its protocol
		"solace.dev/",                // the Solace client library
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("package worker depends on %s (forbidden: %s*); only cmd/str-worker may wire a concrete transport", dep, f)
			}
		}
	}
}
