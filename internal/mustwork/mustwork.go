// Package mustwork is the one place where a test that cannot run on this
// machine decides between skipping and failing. Elsewhere (no root, no
// Python, no user namespaces) such a test skips with its reason; where it
// must run, STR_MUST_WORK=1 (set by .ci/run) turns that skip into a
// failure, so a missing prerequisite in CI is never a silent pass.
//
// It protects against nothing; it is test support.
package mustwork

import (
	"os"
	"testing"
)

// Skip skips t with why, or fails it with why when STR_MUST_WORK=1.
func Skip(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("STR_MUST_WORK") == "1" {
		t.Fatal(why + " (STR_MUST_WORK=1)")
	}
	t.Skip(why)
}
