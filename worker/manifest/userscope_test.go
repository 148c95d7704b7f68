package manifest

import (
	"strings"
	"testing"
)

// artifacts.user_scope is read by default, may be write or none, and is
// parsed as strictly as every other field.
func TestParseUserScope(t *testing.T) {
	m, err := Parse([]byte(`version: 1
tools:
  dflt: {module: m, function: f}
  rd: {module: m, function: f, artifacts: {user_scope: read}}
  wr: {module: m, function: f, artifacts: {user_scope: write}}
  no: {module: m, function: f, artifacts: {user_scope: none}}
  empty: {module: m, function: f, artifacts: {}}
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct{ read, write bool }{
		"dflt": {true, false}, "rd": {true, false}, "wr": {true, true}, "no": {false, false}, "empty": {true, false},
	} {
		u := m.Tools[name].UserScope
		if u.CanRead() != want.read || u.CanWrite() != want.write {
			t.Errorf("%s: user_scope %q: read %v write %v, want %+v", name, u, u.CanRead(), u.CanWrite(), want)
		}
	}
	if s := m.Tools["dflt"].UserScope.String(); s != "read" {
		t.Errorf("default user_scope reads as %q", s)
	}
	// A changed permission is a changed tool (the pool's key, reloads).
	m2, err := Parse([]byte(`version: 1
tools:
  dflt: {module: m, function: f, artifacts: {user_scope: none}}
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, changed := Diff(&Manifest{Tools: map[string]*Tool{"dflt": m.Tools["dflt"]}}, m2); len(changed) != 1 {
		t.Errorf("user_scope change not seen as a change: %v", changed)
	}

	err = problemsOf(t, `version: 1
tools:
  a: {module: m, function: f, artifacts: {user_scope: admin}}
  b: {module: m, function: f, artifacts: {user_scope: write, share: true}}
  c: {module: m, function: f, artifacts: {user_scope: 1}}
  d: {module: m, function: f, artifacts: write}
`)
	if err == nil {
		t.Fatal("bad artifacts sections accepted")
	}
	for _, want := range []string{
		`tools.a.artifacts.user_scope: "admin" is not one of read, write, none`,
		`tools.b.artifacts: unknown field "share"`,
		`tools.c.artifacts.user_scope must be a string`,
		`tools.d.artifacts must be a mapping`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
}
