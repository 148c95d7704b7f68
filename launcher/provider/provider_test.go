package provider

import (
	"errors"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/profiles/profileyaml"
)

// The worker's check of a tool's profile (its /readyz list and its
// TOOL_NOT_AVAILABLE answers) refuses a runtime class its sandboxes do
// not run, with the reason: the example gvisor profile loads, and is
// unavailable to the worker, never run on namespaces.
func TestCheckProfileRefusesRuntimeClass(t *testing.T) {
	l, err := launcher.New(launcher.Options{ProfileDir: "../../examples/profiles", Decoder: profileyaml.Decoder{}})
	if err != nil {
		t.Fatal(err)
	}
	p := New(l)
	if err := p.CheckProfile("restrictive"); err != nil {
		t.Errorf("restrictive: %v", err)
	}
	err = p.CheckProfile("gvisor")
	if !errors.Is(err, launcher.ErrRuntimeUnavailable) || !strings.Contains(err.Error(), "runtime gvisor cannot run this sandbox here") {
		t.Fatalf("gvisor: %v, want launcher.ErrRuntimeUnavailable with the reason", err)
	}
}
