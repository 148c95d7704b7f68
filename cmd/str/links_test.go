package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestStrLinksNoHTTPOrX509: str (one-shot and served str run, str serve,
// str bwrap) links no HTTP or TLS code (issue 30): the egress proxy, which
// needs it, runs in the egress helper (cmd/str-egress), and the plan asks
// that helper for the TLS termination CA's certificate.
func TestStrLinksNoHTTPOrX509(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, "github.com/securetoolruntime/str/egress") {
		t.Fatalf("the dependency list lacks package egress: %d packages, the check would prove nothing", len(deps))
	}
	for _, bad := range []string{"net/http", "crypto/tls", "crypto/x509", "golang.org/x/net/http2", "vendor/golang.org/x/net/http2"} {
		if slices.Contains(deps, bad) {
			t.Errorf("str links %s", bad)
		}
	}
}
