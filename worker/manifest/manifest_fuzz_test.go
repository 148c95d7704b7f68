package manifest

import (
	"errors"
	"reflect"
	"testing"
)

// FuzzParse feeds arbitrary manifest files (seeds in
// testdata/fuzz/FuzzParse) to Parse and checks, besides that it never
// panics, that a refusal is an *Error listing at least one problem, and
// that every tool of an accepted manifest has a usable name (one topic
// level), the python runtime, a dotted module and an identifier function
// (or, for a class-based tool, none),
// a timeout within 1..MaxTimeoutSeconds, warm within 0..MaxWarm, and a
// network policy (if any) that validates; no entry is both served and
// unavailable, and every unavailable one says why. Parsing is
// deterministic.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data, "fuzz")
		if err != nil {
			var me *Error
			if m != nil || !errors.As(err, &me) || len(me.Problems) == 0 {
				t.Fatalf("refusal: manifest %v, error %#v", m, err)
			}
			return
		}
		if m.Version != SchemaVersion || m.Tools == nil {
			t.Fatalf("accepted manifest %+v", m)
		}
		for key, tool := range m.Tools {
			checkTool(t, key, tool)
			if _, bad := m.Unavailable[key]; bad {
				t.Fatalf("entry %q both served and unavailable", key)
			}
		}
		for key, reason := range m.Unavailable {
			if reason == "" {
				t.Fatalf("entry %q unavailable without a reason", key)
			}
		}
		again, err := Parse(data, "fuzz")
		if err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("second parse differs: %v", err)
		}
	})
}

func checkTool(t *testing.T, key string, tool *Tool) {
	t.Helper()
	fail := func(format string, a ...any) {
		t.Helper()
		t.Fatalf("accepted tool %q (%+v): "+format, append([]any{key, *tool}, a...)...)
	}
	switch {
	case tool.Name != key:
		fail("name differs from its key")
	case checkToolName(tool.Name) != "":
		fail("name: %s", checkToolName(tool.Name))
	case tool.Runtime != RuntimePython:
		fail("runtime")
	case tool.Module == "" || !validDotted(tool.Module):
		fail("module")
	case tool.Function == "" && tool.ClassName == "", tool.Function != "" && !identRE().MatchString(tool.Function):
		fail("function")
	case tool.ClassName != "" && !identRE().MatchString(tool.ClassName):
		fail("class_name")
	case tool.Package != "" && !packageRE().MatchString(tool.Package):
		fail("package")
	case tool.Version != "" && tool.Package == "":
		fail("version without package")
	case tool.SandboxProfile != "" && !profileRE().MatchString(tool.SandboxProfile):
		fail("sandbox_profile")
	case tool.SHA256 != "" && !lowerHex64(tool.SHA256):
		fail("sha256")
	case tool.TimeoutSeconds < 1 || tool.TimeoutSeconds > MaxTimeoutSeconds:
		fail("timeout %d out of 1..%d", tool.TimeoutSeconds, MaxTimeoutSeconds)
	case tool.Warm < 0 || tool.Warm > MaxWarm || (!tool.WarmSet && tool.Warm != 0):
		fail("warm %d (set %v) out of 0..%d", tool.Warm, tool.WarmSet, MaxWarm)
	}
	if tool.Version != "" {
		if _, err := ParseSpecifiers(tool.Version); err != nil {
			fail("version: %v", err)
		}
	}
	if n := tool.Network; n != nil {
		if n.Mode == "" {
			fail("network without a policy")
		}
		if err := n.Validate(); err != nil {
			fail("network: %v", err)
		}
	}
}

func lowerHex64(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
