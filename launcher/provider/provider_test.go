package provider

import (
	"errors"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/profiles/profileyaml"
)

// The worker's check of a tool's profile (its /readyz list and its
// TOOL_NOT_AVAILABLE answers): the example gvisor profile is available
// exactly where this host runs the class (runsc, root: its calls run
// cold under it, class.go), and refused with the reason where it does
// not (no runsc on PATH), never run on namespaces.
func TestCheckProfileRuntimeClass(t *testing.T) {
	l, err := launcher.New(launcher.Options{ProfileDir: "../../examples/profiles", Decoder: profileyaml.Decoder{}})
	if err != nil {
		t.Fatal(err)
	}
	p := New(l)
	if err := p.CheckProfile("restrictive"); err != nil {
		t.Errorf("restrictive: %v", err)
	}
	var here launcher.RuntimeStatus
	for _, st := range launcher.Runtimes() {
		if st.Class == "gvisor" {
			here = st
		}
	}
	if err := p.CheckProfile("gvisor"); (err == nil) != here.Available {
		t.Errorf("gvisor: %v; str runtimes says available %v (%s)", err, here.Available, here.Problem)
	}
	t.Run("no runsc", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		err := p.CheckProfile("gvisor")
		if !errors.Is(err, launcher.ErrRuntimeUnavailable) || !strings.Contains(err.Error(), "runtime gvisor cannot run this sandbox here") {
			t.Fatalf("gvisor: %v, want launcher.ErrRuntimeUnavailable with the reason", err)
		}
	})
}
