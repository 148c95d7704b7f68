package profiles

import (
	"errors"
	"strings"
	"testing"
)

// A request may ask a stronger runtime class than its profile's, never a
// weaker one; an unknown class is invalid in a profile and in a request.
func TestRuntimeTightenOnly(t *testing.T) {
	set, err := Embedded()
	if err != nil {
		t.Fatal(err)
	}
	std, err := set.Lookup("standard")
	if err != nil {
		t.Fatal(err)
	}
	if std.RuntimeClass() != RuntimeNamespaces {
		t.Fatalf("standard's runtime is %q, want namespaces", std.RuntimeClass())
	}
	g, err := std.Tighten(Overrides{Runtime: RuntimeGVisor})
	if err != nil || g.RuntimeClass() != RuntimeGVisor {
		t.Fatalf("standard tightened to gvisor: %v, %v", g, err)
	}
	if _, err := g.Tighten(Overrides{Runtime: RuntimeNamespaces}); !errors.Is(err, ErrLoosening) {
		t.Fatalf("gvisor loosened to namespaces: %v, want ErrLoosening", err)
	}
	if m, err := g.Tighten(Overrides{Runtime: RuntimeMicroVM}); err != nil || m.Runtime != RuntimeMicroVM {
		t.Fatalf("gvisor tightened to microvm: %v", err)
	}
	if _, err := std.Tighten(Overrides{Runtime: "docker"}); err == nil || !strings.Contains(err.Error(), `"docker" is not one of`) {
		t.Fatalf("unknown class: %v", err)
	}
	bad := *std
	bad.Runtime = "kata"
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "runtime: \"kata\" is not one of namespaces, gvisor, microvm") {
		t.Fatalf("profile with runtime kata: %v", err)
	}
}
