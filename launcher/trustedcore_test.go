package launcher

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The trusted core: the only code that mounts, chowns or runs a program on
// the host for a sandbox or an installation (issue 18). README.md's
// "The trusted core" table lists these directories with their line counts.
var trustedCore = []string{"launcher", "launcher/install", "launcher/writeback", "launcher/hostbox", "nsinit", "cmd/str-init", "seccomp", "egress"}

// notProduction are directories whose non-test files are not part of a
// production binary's privileged path: test support, the benchmark
// program (it times bubblewrap and str from the outside) and the tests.
var notProduction = []string{"launcher/launchertest", "internal/testfs", "cmd/str-bench", "test"}

// outsideCore are the privileged calls allowed outside the trusted core,
// each a file and a call with its reason (every entry must still be found:
// the list does not outlive its call).
var outsideCore = map[string]string{
	"cmd/str/worker.go: syscall.Exec": "`str worker` replaces its own process by str-worker from str's own directory " +
		"(the worker is a program of its own, issue 19): no sandbox, no privilege change, the same process",
}

// privileged are the calls that mount, chown or start a program on the host.
var privileged = map[string][]string{
	"exec":    {"Command", "CommandContext"},
	"os":      {"StartProcess", "Chown", "Lchown"},
	"syscall": {"ForkExec", "StartProcess", "Exec", "Mount", "Unmount", "Chown", "Fchown", "Lchown", "Fchownat"},
	"unix":    {"Mount", "Unmount", "Chown", "Fchown", "Lchown", "Fchownat", "MountSetattr", "MoveMount", "OpenTree", "Fsmount", "Fsopen", "Exec"},
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: %v", root, err)
	}
	return root
}

func inDirs(rel string, dirs []string) bool {
	for _, d := range dirs {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// exceptions is privilegedCalls' key for the calls outsideCore allows.
const exceptions = "(outsideCore)"

// privilegedCalls lists every call of a privileged function in the
// non-test Go files of the tree below root, by directory, as
// "path:line: pkg.Func"; the calls outsideCore allows are listed under
// exceptions as "path: pkg.Func".
func privilegedCalls(t *testing.T, root string) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "bin" || name == "var") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			for _, fn := range privileged[pkg.Name] {
				if sel.Sel.Name == fn {
					dir := filepath.ToSlash(filepath.Dir(rel))
					if _, ok := outsideCore[fmt.Sprintf("%s: %s.%s", rel, pkg.Name, fn)]; ok {
						found[exceptions] = append(found[exceptions], fmt.Sprintf("%s: %s.%s", rel, pkg.Name, fn))
						continue
					}
					found[dir] = append(found[dir], fmt.Sprintf("%s:%d: %s.%s", rel, fset.Position(sel.Pos()).Line, pkg.Name, fn))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestOnlyTheTrustedCoreActsOnTheHost: outside the trusted core (and the
// non-production directories), no code mounts, chowns or starts a
// program. The worker asks the launcher for all three.
func TestOnlyTheTrustedCoreActsOnTheHost(t *testing.T) {
	root := repoRoot(t)
	found := privilegedCalls(t, root)
	inCore := 0
	for _, c := range found[exceptions] {
		t.Logf("allowed outside the trusted core: %s (%s)", c, outsideCore[c])
	}
	for c := range outsideCore {
		if !slices.Contains(found[exceptions], c) {
			t.Errorf("outsideCore allows %q, which is no longer there: remove it from the list", c)
		}
	}
	for dir, calls := range found {
		switch {
		case dir == exceptions:
		case inDirs(dir, notProduction):
		case inDirs(dir, trustedCore):
			inCore += len(calls)
		default:
			for _, c := range calls {
				t.Errorf("%s: outside the trusted core (%s); ask the launcher instead", c, strings.Join(trustedCore, ", "))
			}
		}
	}
	// The scan itself: the core's own calls are found (a scan that
	// finds nothing proves nothing).
	if inCore < 10 {
		t.Fatalf("only %d privileged calls found in the trusted core: the scan is broken", inCore)
	}
}

// TestReadmeTrustedCoreLines: README.md's trusted-core table names every
// directory of trustedCore with its non-test line count, within 10 %.
func TestReadmeTrustedCoreLines(t *testing.T) {
	root := repoRoot(t)
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([a-z/-]+)/` \\| ([0-9,]+) \\|")
	listed := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(strings.ReplaceAll(m[2], ",", ""))
			listed[m[1]] = n
		}
	}
	for _, dir := range trustedCore {
		want, ok := listed[dir]
		if !ok {
			t.Errorf("README.md's trusted-core table lacks `%s/`", dir)
			continue
		}
		got := goLines(t, filepath.Join(root, dir))
		if diff := got - want; diff*10 > want || -diff*10 > want {
			t.Errorf("README.md says `%s/` has %d lines; it has %d (non-test Go): update the table", dir, want, got)
		}
	}
}

func goLines(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "launchertest" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n += strings.Count(string(b), "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
