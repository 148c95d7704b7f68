package launcher

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
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
var trustedCore = []string{"launcher", "nsinit", "seccomp", "egress"}

// notProduction are directories whose non-test files are not part of a
// production binary's privileged path: test support, the benchmark
// program (it times bubblewrap and str from the outside) and the tests
// (internal/testbin builds the egress helper for them; internal/objstoretest
// starts the object stores the artifact stores are tested against).
var notProduction = []string{"launcher/launchertest", "internal/testfs", "internal/testbin", "internal/objstoretest", "cmd/str-bench", "test"}

// outsideCore are the privileged calls allowed outside the trusted core,
// each a file and a call with its reason (every entry must still be found:
// the list does not outlive its call).
var outsideCore = map[string]string{
	"cmd/str/worker.go: syscall.Exec": "`str worker`, `str broker`, `str invoke` and `str tools` replace their own process by " +
		"str-worker from str's own directory (a program of its own, issues 19 and 30): no sandbox, no privilege change, the same process",
	"cmd/str/decode.go: os.StartProcess": "str links no YAML (issue 30): an operator's profile directory or seccomp policy file is decoded by " +
		"`str-worker decode-profiles DIR` or `decode-seccomp FILE` from str's own directory, with str's privileges, only when one is given: no sandbox, no privilege change",
	"bwrap/userns.go: SYS_UNSHARE": usernsProbe,
	"bwrap/userns.go: SYS_CLONE":   usernsProbe,
	"bwrap/userns.go: SYS_CLONE3":  usernsProbe,
}

const usernsProbe = "the numbers are seccomp data a policy is evaluated on (`str bwrap --disable-userns`): no system call is made"

// privileged are the calls that mount, chown or start a program on the
// host, or enter or make namespaces, change root or trace a process.
var privileged = map[string][]string{
	"exec":    {"Command", "CommandContext"},
	"os":      {"StartProcess", "Chown", "Lchown"},
	"syscall": {"ForkExec", "StartProcess", "Exec", "Mount", "Unmount", "Chown", "Fchown", "Lchown", "Fchownat", "PivotRoot", "Unshare", "Chroot", "PtraceAttach"},
	"unix": {"Mount", "Unmount", "Chown", "Fchown", "Lchown", "Fchownat", "MountSetattr", "MoveMount", "OpenTree", "Fsmount", "Fsopen", "Exec",
		"PivotRoot", "Unshare", "Setns", "Chroot", "PtraceAttach", "PtraceSeize"},
}

// privilegedSyscalls are the system call numbers of the same acts (and
// of entering or making namespaces, the mount API, seccomp and ptrace),
// as a raw call names them (unix.SYS_MOUNT, syscall.SYS_CLONE3): any use
// of one of these names is a privileged call, whatever function it is
// passed to.
var privilegedSyscalls = []string{
	"SYS_MOUNT", "SYS_UMOUNT2", "SYS_PIVOT_ROOT", "SYS_CHROOT", "SYS_SETNS", "SYS_UNSHARE",
	"SYS_OPEN_TREE", "SYS_MOVE_MOUNT", "SYS_MOUNT_SETATTR", "SYS_FSOPEN", "SYS_FSCONFIG", "SYS_FSMOUNT", "SYS_FSPICK",
	"SYS_CLONE", "SYS_CLONE3", "SYS_FORK", "SYS_VFORK", "SYS_EXECVE", "SYS_EXECVEAT",
	"SYS_CHOWN", "SYS_FCHOWN", "SYS_LCHOWN", "SYS_FCHOWNAT", "SYS_SECCOMP", "SYS_PTRACE",
}

// rawSyscalls are the functions that take a system call's number
// (syscall's and unix's): one given a literal number instead of a name is
// reported too, as "raw system call N" (a number cannot be audited by
// name).
var rawSyscalls = []string{"Syscall", "Syscall6", "RawSyscall", "RawSyscall6", "RawSyscallNoError", "SyscallNoError"}

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
		dir := filepath.ToSlash(filepath.Dir(rel))
		for _, u := range privilegedUses(fset, f) {
			if _, ok := outsideCore[fmt.Sprintf("%s: %s", rel, u.call)]; ok {
				found[exceptions] = append(found[exceptions], fmt.Sprintf("%s: %s", rel, u.call))
				continue
			}
			found[dir] = append(found[dir], fmt.Sprintf("%s:%d: %s", rel, u.line, u.call))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// privilegedUse is one privileged call found in a file: its line and
// what it is ("unix.Mount", "SYS_MOUNT", "raw system call 165").
type privilegedUse struct {
	line int
	call string
}

// privilegedUses lists f's privileged calls: a privileged function by
// package name, a privileged system call's number by name (in any
// expression: unix.Syscall(unix.SYS_MOUNT, ...), a variable set to it, a
// conversion), and a raw system call given a literal number.
func privilegedUses(fset *token.FileSet, f *ast.File) []privilegedUse {
	var uses []privilegedUse
	at := func(n ast.Node, call string) {
		uses = append(uses, privilegedUse{line: fset.Position(n.Pos()).Line, call: call})
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if pkg, ok := n.X.(*ast.Ident); ok && slices.Contains(privileged[pkg.Name], n.Sel.Name) {
				at(n, pkg.Name+"."+n.Sel.Name)
			}
		case *ast.Ident: // a selector's name too: unix.SYS_MOUNT
			if slices.Contains(privilegedSyscalls, n.Name) {
				at(n, n.Name)
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || !slices.Contains(rawSyscalls, sel.Sel.Name) || len(n.Args) == 0 {
				return true
			}
			nr := n.Args[0]
			for { // through conversions and parentheses: uintptr(165)
				if c, ok := nr.(*ast.CallExpr); ok && len(c.Args) == 1 {
					nr = c.Args[0]
				} else if p, ok := nr.(*ast.ParenExpr); ok {
					nr = p.X
				} else {
					break
				}
			}
			if lit, ok := nr.(*ast.BasicLit); ok && lit.Kind == token.INT {
				at(n, "raw system call "+lit.Value)
			}
		}
		return true
	})
	return uses
}

// TestPrivilegedScanCatches: the scan finds each kind of privileged call
// in a planted file (and nothing in harmless ones), and a file outside
// the trusted core is reported under its own directory.
func TestPrivilegedScanCatches(t *testing.T) {
	cases := []struct {
		src  string
		want []string
	}{
		{`unix.Mount("a", "b", "", 0, "")`, []string{"unix.Mount"}},
		{`syscall.Syscall6(syscall.SYS_MOUNT, 0, 0, 0, 0, 0, 0)`, []string{"SYS_MOUNT"}},
		{`unix.RawSyscall(unix.SYS_UMOUNT2, 0, 0, 0)`, []string{"SYS_UMOUNT2"}},
		{`unix.Syscall(uintptr(unix.SYS_PIVOT_ROOT), 0, 0, 0)`, []string{"SYS_PIVOT_ROOT"}},
		{`nr := unix.SYS_SETNS; unix.Syscall(uintptr(nr), 0, 0, 0)`, []string{"SYS_SETNS"}},
		{`unix.RawSyscall6(unix.SYS_CLONE3, 0, 0, 0, 0, 0, 0)`, []string{"SYS_CLONE3"}},
		{`sys.RawSyscall(unix.SYS_UNSHARE, unix.CLONE_NEWNS, 0, 0)`, []string{"SYS_UNSHARE"}},
		{`unix.Syscall(unix.SYS_OPEN_TREE, 0, 0, 0)`, []string{"SYS_OPEN_TREE"}},
		{`unix.Syscall6(unix.SYS_MOVE_MOUNT, 0, 0, 0, 0, 0, 0)`, []string{"SYS_MOVE_MOUNT"}},
		{`unix.Syscall6(unix.SYS_MOUNT_SETATTR, 0, 0, 0, 0, 0, 0)`, []string{"SYS_MOUNT_SETATTR"}},
		{`unix.Syscall(unix.SYS_FSOPEN, 0, 0, 0); unix.Syscall(unix.SYS_FSMOUNT, 0, 0, 0)`, []string{"SYS_FSOPEN", "SYS_FSMOUNT"}},
		{`unix.Syscall(unix.SYS_SECCOMP, 0, 0, 0)`, []string{"SYS_SECCOMP"}},
		{`unix.Syscall6(unix.SYS_PTRACE, 0, 0, 0, 0, 0, 0)`, []string{"SYS_PTRACE"}},
		{`syscall.RawSyscall((165), 0, 0, 0)`, []string{"raw system call 165"}},
		{`unix.Setns(3, unix.CLONE_NEWNS)`, []string{"unix.Setns"}},
		{`unix.Syscall(unix.SYS_GETPID, 0, 0, 0); unix.Getpid(); os.Open("x")`, nil},
	}
	for _, c := range cases {
		src := "package p\nfunc f() {\n" + c.src + "\n}\n"
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		var got []string
		for _, u := range privilegedUses(fset, f) {
			got = append(got, u.call)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: found %q, want %q", c.src, got, c.want)
		}
	}

	// A planted file outside the core is reported under its directory.
	root := t.TempDir()
	planted := filepath.Join(root, "worker", "planted.go")
	if err := os.MkdirAll(filepath.Dir(planted), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(planted, []byte("package worker\n\nfunc f() { unix.Syscall(unix.SYS_MOUNT, 0, 0, 0) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := privilegedCalls(t, root)["worker"]; !slices.Equal(got, []string{"worker/planted.go:3: SYS_MOUNT"}) {
		t.Errorf("the planted call: found %q under worker", got)
	}
}

// TestOnlyTheTrustedCoreActsOnTheHost: outside the trusted core (and the
// non-production directories), no code mounts, chowns or starts a
// program, through a function or a raw system call (privilegedUses). The
// worker asks the launcher for all three.
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

// TestReadmeTrustedCoreLines: README.md's trusted-core table has one row
// for every package of trustedCore (a directory with non-test Go or
// assembly files, notProduction and testdata aside) with its non-test Go
// lines, within 10 %, and its assembly lines, exactly; and no row for
// one that is gone. On a difference it prints the table as it should be
// (the descriptions kept from README.md), to paste.
func TestReadmeTrustedCoreLines(t *testing.T) {
	root := repoRoot(t)
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A row without its assembly column is read for its description.
	row := regexp.MustCompile("^\\| `([a-z0-9/-]+)/` \\| ([0-9,]+) \\|(?: ([0-9,]+) \\|)? (.*) \\|$")
	type readmeRow struct {
		goLines, asmLines int
		noAsm             bool // the row lacks the assembly column
		what              string
	}
	listed := map[string]readmeRow{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.Atoi(strings.ReplaceAll(m[2], ",", ""))
			a, _ := strconv.Atoi(strings.ReplaceAll(m[3], ",", ""))
			listed[m[1]] = readmeRow{n, a, m[3] == "", m[4]}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	pkgs := corePackages(t, root)
	table := "| package | lines (non-test Go) | lines (assembly) | what it does on the host |\n|---|---:|---:|---|\n"
	for _, p := range pkgs {
		r, ok := listed[p.dir]
		switch {
		case !ok:
			t.Errorf("README.md's trusted-core table lacks `%s/` (%d lines of Go, %d of assembly)", p.dir, p.goLines, p.asmLines)
			r.what = "(what it does on the host)"
		case r.noAsm:
			t.Errorf("README.md's row for `%s/` lacks its assembly lines", p.dir)
		case (p.goLines-r.goLines)*10 > r.goLines || (r.goLines-p.goLines)*10 > r.goLines:
			t.Errorf("README.md says `%s/` has %d lines of Go; it has %d (non-test)", p.dir, r.goLines, p.goLines)
		case p.asmLines != r.asmLines:
			t.Errorf("README.md says `%s/` has %d lines of assembly; it has %d", p.dir, r.asmLines, p.asmLines)
		}
		delete(listed, p.dir)
		table += fmt.Sprintf("| `%s/` | %s | %s | %s |\n", p.dir, thousands(p.goLines), thousands(p.asmLines), r.what)
	}
	for dir := range listed {
		t.Errorf("README.md's trusted-core table lists `%s/`, which is not a package of the trusted core", dir)
	}
	if t.Failed() {
		t.Errorf("the table should read:\n%s", table)
	} else {
		t.Logf("the table:\n%s", table)
	}
}

// corePackage is one package of the trusted core: its directory and its
// line counts.
type corePackage struct {
	dir               string
	goLines, asmLines int
}

// corePackages are trustedCore's packages, in its order, each
// directory's sub-packages after it.
func corePackages(t *testing.T, root string) []corePackage {
	t.Helper()
	var pkgs []corePackage
	for _, top := range trustedCore {
		counts := map[string]*corePackage{}
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			rel = filepath.ToSlash(rel)
			if d.IsDir() {
				if d.Name() == "testdata" || inDirs(rel, notProduction) {
					return filepath.SkipDir
				}
				return nil
			}
			isGo := strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go")
			isAsm := strings.HasSuffix(path, ".s")
			if !isGo && !isAsm {
				return nil
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			dir := filepath.ToSlash(filepath.Dir(rel))
			p := counts[dir]
			if p == nil {
				p = &corePackage{dir: dir}
				counts[dir] = p
			}
			if isGo {
				p.goLines += strings.Count(string(b), "\n")
			} else {
				p.asmLines += strings.Count(string(b), "\n")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, dir := range slices.Sorted(maps.Keys(counts)) {
			pkgs = append(pkgs, *counts[dir])
		}
	}
	return pkgs
}

// thousands is n with a comma every three digits, as the table writes it.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// coreBudgets are the most non-test Go lines a core package may have
// (issue 30: a privileged core a reviewer can read in a day): nsinit, and
// the top-level launcher (the code every sandbox runs; its optional
// boundaries are packages of their own). A change that needs more moves
// an optional boundary out or makes the code smaller; it does not raise
// the number. nsinit's 2,550 (2,500 before) holds init sub-step 0a
// (str bwrap's --userns, --pidns: join, unshare, fork and its parent's
// wait, 63 lines), which cannot run anywhere but in the clone child; the
// step list compileDirect's doc copied went (steps.go and SECURITY.md).
var coreBudgets = map[string]int{"nsinit": 2550, "launcher": 5000}

// maxAssemblyLines is the most hand-written assembly the whole
// repository may hold (today: nsinit's raw clone).
const maxAssemblyLines = 60

// TestCoreLineBudgets: the budgets above hold, and the repository's
// assembly (every .s file outside testdata) stays within maxAssemblyLines.
func TestCoreLineBudgets(t *testing.T) {
	root := repoRoot(t)
	seen := 0
	for _, p := range corePackages(t, root) {
		if budget, ok := coreBudgets[p.dir]; ok {
			seen++
			if p.goLines > budget {
				t.Errorf("%s/ has %d non-test lines of Go, its budget is %d", p.dir, p.goLines, budget)
			}
		}
	}
	if seen != len(coreBudgets) {
		t.Errorf("found %d of the %d budgeted packages: the count is broken", seen, len(coreBudgets))
	}
	asm := 0
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == ".git") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".s") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		asm += strings.Count(string(b), "\n")
		rel, _ := filepath.Rel(root, path)
		files = append(files, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if asm > maxAssemblyLines {
		t.Errorf("%d lines of assembly in %s: at most %d", asm, strings.Join(files, ", "), maxAssemblyLines)
	}
	if asm == 0 {
		t.Errorf("no assembly found (nsinit's raw clone is some): the walk is broken")
	}
}
