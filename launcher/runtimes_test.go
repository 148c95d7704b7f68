package launcher

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/profiles"
)

// A plan carries its profile's runtime class; the sandbox paths that run
// only namespaces (CreateFromPlan: the worker, str serve, str bwrap)
// refuse any other with ErrRuntimeUnavailable and the reason, and the
// class no host runs yet (microvm) is refused everywhere.
func TestRuntimeClassRefusals(t *testing.T) {
	if pl := mustPlan(t, "standard", Request{}, fakeHost(0, CgroupV1)); pl.Runtime != profiles.RuntimeNamespaces {
		t.Errorf("standard's plan runs %q, want namespaces", pl.Runtime)
	}
	if err := CheckRuntime(profiles.RuntimeNamespaces, false); err != nil {
		t.Errorf("namespaces refused: %v", err)
	}
	err := CheckRuntime(profiles.RuntimeMicroVM, true)
	var re *RuntimeError
	if !errors.Is(err, ErrRuntimeUnavailable) || !errors.As(err, &re) || re.Class != profiles.RuntimeMicroVM {
		t.Fatalf("microvm: %v, want a RuntimeError", err)
	}
	pl := mustPlan(t, "restrictive", Request{}, fakeHost(0, CgroupV1))
	pl.Runtime = profiles.RuntimeGVisor
	_, err = (&Launcher{}).CreateFromPlan(context.Background(), pl, Request{})
	if !errors.Is(err, ErrRuntimeUnavailable) || !strings.Contains(err.Error(), "runtime gvisor cannot run this sandbox here") {
		t.Fatalf("CreateFromPlan of a gvisor plan: %v, want ErrRuntimeUnavailable", err)
	}
}
