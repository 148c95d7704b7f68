package hostile

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSecurityTestedByTable: every test SECURITY.md's "Tested by" table
// names exists (a battery case, or a `func TestName(` in a *_test.go of
// the repository), and every battery case is named there, so the table
// cannot drift from the tests. Needs no root.
func TestSecurityTestedByTable(t *testing.T) {
	b, err := os.ReadFile("../../../SECURITY.md")
	must(t, err)
	doc := string(b)
	start := strings.Index(doc, "\n## Tested by\n")
	if start < 0 {
		t.Fatal("SECURITY.md has no \"## Tested by\" section")
	}
	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	var rows []string
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "| ") && !strings.HasPrefix(line, "| threat") {
			rows = append(rows, line)
		}
	}
	if len(rows) == 0 {
		t.Fatal("the Tested by table has no rows")
	}
	names := map[string]bool{}
	for _, c := range cases() {
		if names[c.name] {
			t.Errorf("battery case %s is defined twice", c.name)
		}
		names[c.name] = true
	}
	funcs := testFuncs(t)
	listed := map[string]bool{}
	ref := regexp.MustCompile("`(Test[A-Za-z0-9_]*(?:/[a-z0-9_*]+)?)`")
	for _, row := range rows {
		cols := strings.Split(row, "|")
		if len(cols) < 4 || len(ref.FindAllString(cols[2], -1)) == 0 {
			t.Errorf("row names no test: %s", row)
			continue
		}
		for _, m := range ref.FindAllStringSubmatch(cols[2], -1) {
			name := m[1]
			if c, ok := strings.CutPrefix(name, "TestHostile/"); ok {
				if c == cgroupModeCase {
					continue // a subtest of TestHostile beside the table's cases
				}
				matched := 0
				for n := range names {
					if n == c || (strings.HasSuffix(c, "_*") && strings.HasPrefix(n, strings.TrimSuffix(c, "*"))) {
						listed[n] = true
						matched++
					}
				}
				if matched == 0 {
					t.Errorf("SECURITY.md names %s: no such battery case", name)
				}
				continue
			}
			if !funcs[name] {
				t.Errorf("SECURITY.md names %s: no func %s( in any *_test.go", name, name)
			}
		}
	}
	for n := range names {
		if !listed[n] {
			t.Errorf("battery case %s is not in SECURITY.md's Tested by table", n)
		}
	}
}

// testFuncs is the set of Test functions declared in the repository.
func testFuncs(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]*)\(`)
	out := map[string]bool{}
	err := filepath.WalkDir("../../..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(p, "_test.go") {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				out[m[1]] = true
			}
		}
		return nil
	})
	must(t, err)
	return out
}
