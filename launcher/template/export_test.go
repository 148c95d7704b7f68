package template

import (
	"testing"

	"github.com/securetoolruntime/str/nsinit"
)

// SetCallNetwork replaces how a template call's egress listeners are made
// (C5) until the test ends: TestTemplateCallNetworkFails makes it fail.
func SetCallNetwork(t *testing.T, f func(nsPath string, ls []nsinit.Listener) ([]int, error)) {
	old := makeCallNetwork
	makeCallNetwork = f
	t.Cleanup(func() { makeCallNetwork = old })
}

// CallNetwork is the real maker of a template call's egress listeners.
var CallNetwork = callNetwork
