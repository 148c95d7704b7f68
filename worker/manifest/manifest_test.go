package manifest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

const specExample = `version: 1
tools:
  echo_tool: {runtime: python, module: example_tools, function: echo_tool, description: "Echo"}
  execute_python: {module: example_tools, function: execute_python, timeout_seconds: 60, sandbox_profile: restrictive}
  data_processor: {package: sam-tool-data-processor, version: ">=1.0,<2.0", module: m, function: f}
`

func TestParseSpecExample(t *testing.T) {
	m, err := Parse([]byte(specExample), "spec")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*Tool{
		"echo_tool": {Name: "echo_tool", Runtime: "python", Module: "example_tools", Function: "echo_tool",
			Description: "Echo", TimeoutSeconds: 300},
		"execute_python": {Name: "execute_python", Runtime: "python", Module: "example_tools", Function: "execute_python",
			TimeoutSeconds: 60, SandboxProfile: "restrictive"},
		"data_processor": {Name: "data_processor", Runtime: "python", Module: "m", Function: "f",
			Package: "sam-tool-data-processor", Version: ">=1.0,<2.0", TimeoutSeconds: 300},
	}
	if m.Version != 1 || !reflect.DeepEqual(m.Tools, want) {
		for k, v := range m.Tools {
			t.Logf("%s: %+v", k, *v)
		}
		t.Fatalf("parsed manifest differs")
	}
	if got := m.Names(); !reflect.DeepEqual(got, []string{"data_processor", "echo_tool", "execute_python"}) {
		t.Errorf("Names = %v", got)
	}
}

func TestParseValidVariants(t *testing.T) {
	cases := map[string]string{
		"no version":      "tools:\n  t: {module: a.b.c, function: f}\n",
		"empty tools":     "version: 1\ntools: {}\n",
		"null tools":      "version: 1\ntools:\n",
		"block style":     "version: 1\ntools:\n  t:\n    module: pkg\n    function: run\n    class_name: Tool\n    sha256: " + strings.Repeat("AB", 32) + "\n    timeout_seconds: 0\n",
		"null optional":   "version: 1\ntools:\n  t: {module: m, function: f, class_name: ~, description: }\n",
		"unicode name ok": "version: 1\ntools:\n  outil_é: {module: m, function: f}\n",
		"class only":      "version: 1\ntools:\n  t: {module: m, class_name: Tool}\n",
	}
	for name, src := range cases {
		m, err := Parse([]byte(src), name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if name == "block style" {
			tool := m.Tools["t"]
			if tool.SHA256 != strings.Repeat("ab", 32) || tool.TimeoutSeconds != DefaultTimeoutSeconds || tool.ClassName != "Tool" {
				t.Errorf("block style: %+v", *tool)
			}
		}
		if name == "class only" {
			if tool := m.Tools["t"]; tool.ClassName != "Tool" || tool.Function != "" {
				t.Errorf("class only: %+v", *tool)
			}
		}
	}
}

func TestParseCollectsEveryProblem(t *testing.T) {
	src := `version: 2
extra: true
tools:
  "bad/name": {module: m, function: f}
  "wild*": {module: m, function: f}
  "has space": {module: m, function: f}
  no_module: {function: f}
  no_function: {module: m}
  empty_function: {module: m, function: ""}
  empty_class: {module: m, class_name: ""}
  bad_runtime: {runtime: node, module: m, function: f}
  bad_module: {module: "a..b", function: f}
  dotted_function: {module: m, function: a.b}
  negative: {module: m, function: f, timeout_seconds: -1}
  huge: {module: m, function: f, timeout_seconds: 999999}
  short_hash: {module: m, function: f, sha256: abc}
  unknown_field: {module: m, function: f, modul: x}
  version_only: {module: m, function: f, version: ">=1"}
  bad_spec: {module: m, function: f, package: p, version: "1.0"}
  number_string: {module: m, function: 12}
  dup: {module: m, function: f, module: n}
  list_value: [1, 2]
  bad_profile: {module: m, function: f, sandbox_profile: "Rest Rictive"}
  bad_package: {module: m, function: f, package: "-e git+x"}
  good: {module: m, function: f}
`
	_, err := Parse([]byte(src), "broken.yaml")
	var me *Error
	if !errors.As(err, &me) {
		t.Fatalf("error %v is not *Error", err)
	}
	wants := []string{
		"line 1: version: 2 is not supported",
		`line 2: the manifest: unknown field "extra"`,
		`tool name "bad/name" contains "/"`,
		`tool name "wild*" contains the topic wildcard '*'`,
		`tool name "has space" contains whitespace`,
		"tools.no_module.module is required",
		"tools.no_function.function is required",
		"tools.empty_function.function is required",
		"tools.empty_class.function is required (or class_name for a class-based tool)",
		`tools.bad_runtime.runtime: "node" is not supported`,
		`tools.bad_module.module: "a..b" is not a dotted Python identifier`,
		`tools.dotted_function.function: "a.b" is not a Python identifier`,
		"tools.negative.timeout_seconds: -1 is negative",
		"tools.huge.timeout_seconds: 999999 is more than 86400",
		"tools.short_hash.sha256: want 64 hex characters",
		`tools.unknown_field: unknown field "modul"`,
		"tools.version_only.version is set without package",
		`tools.bad_spec.version: specifier "1.0" has no operator`,
		"tools.number_string.function must be a string, not int \"12\" (quote it)",
		`tools.dup: duplicate key "module"`,
		"tools.list_value must be a mapping, not a list",
		`tools.bad_profile.sandbox_profile: "Rest Rictive" is not a profile name`,
		`tools.bad_package.package: "-e git+x" is not a valid distribution name`,
	}
	for _, w := range wants {
		found := false
		for _, p := range me.Problems {
			if strings.Contains(p, w) {
				found = true
			}
		}
		if !found {
			t.Errorf("no problem mentions %q", w)
		}
	}
	if len(me.Problems) != len(wants) {
		t.Errorf("%d problems, want %d:\n%s", len(me.Problems), len(wants), strings.Join(me.Problems, "\n"))
	}
	if !strings.Contains(err.Error(), "broken.yaml") {
		t.Errorf("error does not name the source: %v", err)
	}
}

func TestParseRejectsStructure(t *testing.T) {
	cases := map[string]string{
		"":             "empty",
		"- a\n- b\n":   "the manifest must be a mapping",
		"version: 1\n": `"tools" is required`,
		"tools: [a]\n": "tools must be a mapping",
		"tools: {t: {module: m, function: f}}\n---\ntools: {}\n": "more than one YAML document",
		"base: &b {module: m, function: f}\ntools: {t: *b}\n":    "anchors and aliases",
		"version: '1'\ntools: {}\n":                              "version must be an integer",
		"tools: {<<: {t: {module: m, function: f}}}\n":           "merge keys",
		"tools: {t: {module: m, function: f}\n":                  "not valid YAML",
	}
	for src, want := range cases {
		_, err := Parse([]byte(src), "x")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", src, err, want)
		}
	}
}

func TestDiff(t *testing.T) {
	old, _ := Parse([]byte("tools:\n  a: {module: m, function: f}\n  b: {module: m, function: g}\n  c: {module: m, function: h}\n"), "old")
	new, _ := Parse([]byte("tools:\n  b: {module: m, function: g}\n  c: {module: m, function: h, timeout_seconds: 10}\n  d: {module: m, function: i}\n"), "new")
	added, removed, changed := Diff(old, new)
	if !reflect.DeepEqual(added, []string{"d"}) || !reflect.DeepEqual(removed, []string{"a"}) || !reflect.DeepEqual(changed, []string{"c"}) {
		t.Errorf("Diff = %v %v %v", added, removed, changed)
	}
	added, removed, changed = Diff(nil, old)
	if !reflect.DeepEqual(added, []string{"a", "b", "c"}) || removed != nil || changed != nil {
		t.Errorf("Diff(nil, old) = %v %v %v", added, removed, changed)
	}
	added, removed, changed = Diff(old, old)
	if added != nil || removed != nil || changed != nil {
		t.Errorf("Diff(old, old) = %v %v %v", added, removed, changed)
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(p, []byte(specExample), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := Load(p)
	if err != nil || len(m.Tools) != 3 {
		t.Fatalf("Load = %v, %v", m, err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := Load(dir); err == nil {
		t.Error("loading a directory succeeded")
	}
}

func TestSourcePathAndVerify(t *testing.T) {
	root := t.TempDir()
	tools := filepath.Join(root, "tools")
	files := map[string]string{
		"example_tools.py":    "def echo_tool(ctx, message='Hello'):\n    return message\n",
		"pkg/__init__.py":     "",
		"pkg/sub/__init__.py": "def f(ctx):\n    return None\n",
		"pkg/sub.py":          "# shadowed by the package pkg/sub/\n",
		"pkg/mod.py":          "def g(ctx):\n    return None\n",
	}
	for rel, content := range files {
		p := filepath.Join(tools, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(root, "outside.py")
	if err := os.WriteFile(outside, []byte("evil = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(tools, "escape.py")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(tools, "pkg", "mod.py"), filepath.Join(tools, "inside.py")); err != nil {
		t.Fatal(err)
	}
	realTools, _ := filepath.EvalSymlinks(tools)
	cases := map[string]string{
		"example_tools": filepath.Join(realTools, "example_tools.py"),
		"pkg.sub":       filepath.Join(realTools, "pkg", "sub", "__init__.py"),
		"pkg.mod":       filepath.Join(realTools, "pkg", "mod.py"),
		"inside":        filepath.Join(realTools, "pkg", "mod.py"),
	}
	for module, want := range cases {
		got, err := (&Tool{Name: "t", Module: module}).SourcePath(tools)
		if err != nil || got != want {
			t.Errorf("SourcePath(%s) = %q, %v, want %q", module, got, err, want)
		}
	}
	if _, err := (&Tool{Name: "t", Module: "escape"}).SourcePath(tools); err == nil || !strings.Contains(err.Error(), "outside the tools dir") {
		t.Errorf("escape: %v", err)
	}
	if _, err := (&Tool{Name: "t", Module: "nothere"}).SourcePath(tools); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing module: %v", err)
	}
	if _, err := (&Tool{Name: "t", Module: "../x"}).SourcePath(tools); err == nil {
		t.Error("module ../x accepted")
	}

	sum := sha256.Sum256([]byte(files["example_tools.py"]))
	good := hex.EncodeToString(sum[:])
	tool := &Tool{Name: "echo_tool", Module: "example_tools", Function: "echo_tool", SHA256: good}
	if err := tool.Verify(tools); err != nil {
		t.Errorf("Verify with the right hash: %v", err)
	}
	if err := (&Tool{Name: "nohash", Module: "nothere"}).Verify(tools); err != nil {
		t.Errorf("Verify without sha256: %v", err)
	}
	bad := strings.Repeat("0", 64)
	err := (&Tool{Name: "echo_tool", Module: "example_tools", SHA256: bad}).Verify(tools)
	if !errors.Is(err, ErrHashMismatch) || !strings.Contains(err.Error(), "expected sha256 "+bad) || !strings.Contains(err.Error(), "actual "+good) {
		t.Errorf("Verify mismatch: %v", err)
	}
	// a changed file is caught
	if err := os.WriteFile(filepath.Join(tools, "example_tools.py"), []byte("import os\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tool.Verify(tools); !errors.Is(err, ErrHashMismatch) {
		t.Errorf("Verify after edit: %v", err)
	}
}

// recorder collects applied manifests and log lines.
type recorder struct {
	mu      sync.Mutex
	applied []*Manifest
	logs    []string
	fail    error
}

func (r *recorder) apply(m *Manifest) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return r.fail
	}
	r.applied = append(r.applied, m)
	return nil
}

func (r *recorder) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func write(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWatcherPoll(t *testing.T) {
	p := filepath.Join(t.TempDir(), "manifest.yaml")
	write(t, p, "version: 1\ntools:\n  a: {module: m, function: f}\n")
	r := &recorder{}
	w := NewWatcher(p, time.Second, r.apply, r.logf)

	// start: the manifest as found is applied
	if !w.Poll() || len(r.applied) != 1 || r.applied[0].Names()[0] != "a" {
		t.Fatalf("first poll: applied %v", r.applied)
	}
	// unchanged: nothing
	if w.Poll() || len(r.applied) != 1 {
		t.Fatal("unchanged manifest applied again")
	}
	// a tool added (same size edits included: b vs a)
	write(t, p, "version: 1\ntools:\n  a: {module: m, function: f}\n  b: {module: m, function: g}\n")
	if w.Poll() {
		t.Fatal("a change applied at the first poll that read it (it may be half-written)")
	}
	if !w.Poll() {
		t.Fatal("added tool not applied")
	}
	added, removed, _ := Diff(r.applied[0], r.applied[1])
	if !reflect.DeepEqual(added, []string{"b"}) || removed != nil {
		t.Errorf("diff after add: %v %v", added, removed)
	}
	// a same-size edit (a -> c) is seen through the hash
	write(t, p, "version: 1\ntools:\n  c: {module: m, function: f}\n  b: {module: m, function: g}\n")
	if w.Poll() || !w.Poll() {
		t.Fatal("same-size edit not applied")
	}
	_, removed, _ = Diff(r.applied[1], r.applied[2])
	if !reflect.DeepEqual(removed, []string{"a"}) {
		t.Errorf("diff after rename: removed %v", removed)
	}
	// a broken edit keeps the previous manifest and logs once
	write(t, p, "version: 2\ntools:\n  c: {module: m, function: f}\n")
	for i := 0; i < 3; i++ {
		if w.Poll() {
			t.Fatal("broken manifest applied")
		}
	}
	if len(r.applied) != 3 {
		t.Errorf("a broken edit was applied: %d applies", len(r.applied))
	}
	if len(r.logs) != 1 || !strings.Contains(r.logs[0], "version: 2 is not supported") || !strings.Contains(r.logs[0], "keeping the previous") {
		t.Errorf("logs = %q", r.logs)
	}
	// the file vanishing (an editor replacing it) keeps it too
	os.Remove(p)
	if w.Poll() {
		t.Fatal("missing manifest applied")
	}
	// the next valid edit is applied
	write(t, p, "version: 1\ntools:\n  c: {module: m, function: f}\n")
	if w.Poll() || !w.Poll() || len(r.applied) != 4 {
		t.Fatal("valid edit after a broken one not applied")
	}
	// apply failing: retried at the next poll
	write(t, p, "version: 1\ntools:\n  d: {module: m, function: f}\n")
	r.fail = errors.New("broker down")
	first, second := w.Poll(), w.Poll()
	if first || second {
		t.Fatal("failed apply reported as applied")
	}
	r.fail = nil
	if !w.Poll() || r.applied[len(r.applied)-1].Names()[0] != "d" {
		t.Fatal("failed apply not retried")
	}
	// a half-written file (read between truncate and write) that parses
	// is never applied: the complete content follows before it is stable
	n := len(r.applied)
	write(t, p, "version: 1\ntools:\n  e: {module: m, function: f}\n")
	if w.Poll() {
		t.Fatal("the half-written content was applied")
	}
	write(t, p, "version: 1\ntools:\n  e: {module: m, function: f}\n  f: {module: m, function: g}\n")
	if w.Poll() || !w.Poll() || len(r.applied) != n+1 || !reflect.DeepEqual(r.applied[n].Names(), []string{"e", "f"}) {
		t.Fatal("the complete content was not applied")
	}
}

func TestWatchPicksUpChanges(t *testing.T) {
	p := filepath.Join(t.TempDir(), "manifest.yaml")
	write(t, p, "version: 1\ntools:\n  a: {module: m, function: f}\n")
	applied := make(chan *Manifest, 16)
	logs := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		NewWatcher(p, 20*time.Millisecond, func(m *Manifest) error { applied <- m; return nil },
			func(f string, a ...any) { logs <- fmt.Sprintf(f, a...) }).Run(ctx)
	}()
	next := func(what string) *Manifest {
		select {
		case m := <-applied:
			return m
		case <-time.After(10 * time.Second):
			t.Fatalf("no manifest applied: %s", what)
			return nil
		}
	}
	if got := next("initial").Names(); !reflect.DeepEqual(got, []string{"a"}) {
		t.Fatalf("initial = %v", got)
	}
	write(t, p, "version: 1\ntools:\n  a: {module: m, function: f}\n  added: {module: m, function: g}\n")
	if got := next("added").Names(); !reflect.DeepEqual(got, []string{"a", "added"}) {
		t.Fatalf("after add = %v", got)
	}
	write(t, p, "version: 1\ntools:\n  added: {module: m, function: g}\n")
	if got := next("removed").Names(); !reflect.DeepEqual(got, []string{"added"}) {
		t.Fatalf("after remove = %v", got)
	}
	write(t, p, "version: 1\nbogus: 1\ntools:\n  added: {module: m, function: g}\n")
	select {
	case l := <-logs:
		if !strings.Contains(l, `unknown field "bogus"`) {
			t.Errorf("log = %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("broken edit not logged")
	}
	write(t, p, "version: 1\ntools:\n  fixed: {module: m, function: g}\n")
	if got := next("fixed").Names(); !reflect.DeepEqual(got, []string{"fixed"}) {
		t.Fatalf("after fix = %v", got)
	}
	cancel()
	<-done
	select {
	case m := <-applied:
		t.Errorf("unexpected apply of %v (the broken edit must not be applied)", m.Names())
	default:
	}
}

func TestSpecifiers(t *testing.T) {
	cases := []struct {
		version, spec string
		want          bool
	}{
		{"1.5", ">=1.0,<2.0", true},
		{"2.0", ">=1.0,<2.0", false},
		{"1.0", ">=1.0", true},
		{"0.9", ">=1.0", false},
		{"1.2.3", "==1.2.3", true},
		{"1.2", "==1.2.0", true},
		{"1.2.4", "==1.2.*", true},
		{"1.3.0", "==1.2.*", false},
		{"1.2.4", "!=1.2.*", false},
		{"1.0rc1", "<1.0", true},
		{"1.0", ">1.0rc1", true},
		{"1.0.post1", ">1.0", true},
		{"10.0", ">9.9", true},
		{"1.0", "!=1.0", false},
		{"1.0", "<=1.0", true},
		{"1.5", "~=1.4", true},
		{"2.0", "~=1.4", false},
		{"1.3", "~=1.4", false},
		{"1.4.9", "~=1.4.2", true},
		{"1.5.0", "~=1.4.2", false},
		{"1.0+local", "===1.0+local", true},
		{"1.0", "===1.0+local", false},
	}
	for _, c := range cases {
		specs, err := ParseSpecifiers(c.spec)
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		got, err := Satisfies(c.version, specs)
		if err != nil || got != c.want {
			t.Errorf("Satisfies(%s, %s) = %v, %v; want %v", c.version, c.spec, got, err, c.want)
		}
	}
	for _, bad := range []string{"1.0", ">=", ">=1.0,", ">=x", ">=1.*", "~1.0"} {
		if _, err := ParseSpecifiers(bad); err == nil {
			t.Errorf("ParseSpecifiers(%q) accepted", bad)
		}
	}
	specs, _ := ParseSpecifiers("~=1")
	if _, err := Satisfies("1.5", specs); err == nil {
		t.Error("~=1 (one release number) evaluated")
	}
}

func TestParseWarm(t *testing.T) {
	m, err := Parse([]byte(`tools:
  a: {module: m, function: f, warm: 2}
  b: {module: m, function: f, warm: 0}
  c: {module: m, function: f}
  d: {module: m, function: f, warm: template}
`), "test")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]struct {
		n        int
		set, tpl bool
	}{"a": {2, true, false}, "b": {0, true, false}, "c": {0, false, false}, "d": {0, false, true}} {
		if got := m.Tools[name]; got.Warm != want.n || got.WarmSet != want.set || got.Template != want.tpl {
			t.Errorf("%s: warm %d set %v template %v, want %d %v %v", name, got.Warm, got.WarmSet, got.Template, want.n, want.set, want.tpl)
		}
	}
	err = problemsOf(t, `tools:
  a: {module: m, function: f, warm: -1}
  b: {module: m, function: f, warm: 17}
  c: {module: m, function: f, warm: "2"}
  d: {module: m, function: f, warm: templates}
`)
	for _, want := range []string{"tools.a.warm: -1 is not between 0 and 16", "tools.b.warm: 17 is not between 0 and 16", `tools.c.warm: "2" is neither a number of sandboxes (0..16) nor template`, `tools.d.warm: "templates" is neither`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

// A tool may narrow its profile's network policy; the entry is checked
// strictly (unknown keys, bad patterns) when the manifest loads.
func TestParseNetwork(t *testing.T) {
	m, err := Parse([]byte(`version: 1
tools:
  api: {module: m, function: f, network: {policy: restricted, allowed_hosts: [api.example.com, "*.example.org"], allowed_ports: [443, 8443]}}
  none: {module: m, function: f, network: {policy: isolated}}
  plain: {module: m, function: f}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if n := m.Tools["api"].Network; n == nil || n.Mode != egress.Restricted || len(n.AllowedHosts) != 2 || len(n.AllowedPorts) != 2 {
		t.Fatalf("api network: %+v", n)
	}
	if m.Tools["none"].Network.Mode != egress.Isolated || m.Tools["plain"].Network != nil {
		t.Fatalf("none %+v plain %+v", m.Tools["none"].Network, m.Tools["plain"].Network)
	}
	for _, bad := range []string{
		`{policy: restricted, allowed_hosts: ["*"]}`,
		`{policy: restricted, allowed_hosts: ["*.com"]}`,
		`{policy: sideways}`,
		`{allowed_hosts: [a.example.com]}`,
		`{policy: restricted, allowed_hostz: [a.example.com]}`,
		`{policy: isolated, allowed_ports: [80]}`,
	} {
		err := problemsOf(t, "version: 1\ntools:\n  t: {module: m, function: f, network: "+bad+"}\n")
		if err == nil || !strings.Contains(err.Error(), "tools.t.network") {
			t.Errorf("network %s: %v, want a problem naming tools.t.network", bad, err)
		}
	}
}

// Every field of a tool takes part in Equal (and so in Diff): a reload
// that changes only one field, the network policy and the artifacts
// permission included, is a change. A field added to Tool without a
// value here fails the test.
func TestToolEqualEveryField(t *testing.T) {
	base := Tool{Name: "t", Runtime: RuntimePython, Module: "m", Function: "f", TimeoutSeconds: 300}
	other := map[string]any{
		"Name": "u", "Runtime": "other", "Module": "m2", "Function": "g", "ClassName": "C",
		"Package": "p", "Version": ">=1", "Description": "d", "SandboxProfile": "restrictive",
		"SHA256": strings.Repeat("a", 64), "TimeoutSeconds": 10, "Warm": 2, "WarmSet": true, "Template": true,
		"Network":    &egress.Policy{Mode: egress.Isolated},
		"UserScope":  UserScopeWrite,
		"Parameters": `{"type":"object"}`, "ArtifactParams": `{"a":{"is_list":true,"is_optional":false}}`,
		"Instructions": "use it", "ConfigSchema": `[{"name":"k"}]`,
		"Credentials": &Credentials{List: []Credential{{Name: "T", From: "env:T", Hosts: []string{"a.example.com"}, Header: "Authorization"}}},
	}
	typ := reflect.TypeOf(base)
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		v, ok := other[f.Name]
		if !ok {
			t.Errorf("Tool.%s has no changed value in this test: add one (and check Equal compares it)", f.Name)
			continue
		}
		changed := base
		reflect.ValueOf(&changed).Elem().Field(i).Set(reflect.ValueOf(v))
		if base.Equal(&changed) || changed.Equal(&base) {
			t.Errorf("Tool.Equal ignores %s", f.Name)
		}
	}
	// the network policy by content, not by pointer.
	a, b := base, base
	a.Network = &egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"a.example.com"}}
	b.Network = &egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"a.example.com"}}
	if !a.Equal(&b) {
		t.Error("two equal network policies (two pointers) compare unequal")
	}
	b.Network = &egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"b.example.com"}}
	if a.Equal(&b) {
		t.Error("a changed allowed_hosts compares equal")
	}
	var nilTool *Tool
	if !nilTool.Equal(nil) || nilTool.Equal(&base) || base.Equal(nil) {
		t.Error("nil handling")
	}
}

// A reload that changes only a tool's network policy, or only its
// artifacts permission, is applied (Diff reports the tool changed); a
// reload of the same content reports nothing, also for a tool with a
// network policy.
func TestDiffNetworkAndArtifacts(t *testing.T) {
	const src = "version: 1\ntools:\n  api: {module: m, function: f, network: {policy: restricted, allowed_hosts: [a.example.com]}}\n  plain: {module: m, function: f}\n"
	old, err := Parse([]byte(src), "old")
	if err != nil {
		t.Fatal(err)
	}
	same, _ := Parse([]byte(src), "same")
	if a, r, c := Diff(old, same); a != nil || r != nil || c != nil {
		t.Errorf("Diff of two loads of one file = %v %v %v, want nothing", a, r, c)
	}
	net, err := Parse([]byte(strings.Replace(src, "a.example.com", "b.example.com", 1)), "net")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, c := Diff(old, net); !reflect.DeepEqual(c, []string{"api"}) {
		t.Errorf("a network-only change: changed = %v, want [api]", c)
	}
	art, err := Parse([]byte(strings.Replace(src, "plain: {module: m, function: f}", "plain: {module: m, function: f, artifacts: {user_scope: write}}", 1)), "art")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, c := Diff(old, art); !reflect.DeepEqual(c, []string{"plain"}) {
		t.Errorf("an artifacts-only change: changed = %v, want [plain]", c)
	}
}

// OnProblem follows the file: garbage, a valid YAML document breaking the
// schema, a missing file and a failing apply are reported (each once the
// content has been read at two polls in a row), with the previous
// manifest kept; the content applied again (the file repaired) reports
// nil.
func TestWatcherOnProblem(t *testing.T) {
	p := filepath.Join(t.TempDir(), "manifest.yaml")
	const good = "version: 1\ntools:\n  a: {module: m, function: f}\n"
	write(t, p, good)
	r := &recorder{}
	w := NewWatcher(p, time.Second, r.apply, r.logf)
	var last error
	calls := 0
	w.OnProblem = func(err error) { last, calls = err, calls+1 }
	if !w.Poll() || last != nil || calls != 1 {
		t.Fatalf("start: last %v calls %d", last, calls)
	}
	for _, c := range []struct{ name, content, want string }{
		{"garbage", "\x00\xff{{{ not yaml", "invalid manifest"},
		{"schema", "version: 1\nfunktion: f\ntools:\n  a: {module: m, function: f}\n", "funktion"},
	} {
		write(t, p, c.content)
		calls = 0
		w.Poll() // first read of the change: nothing reported yet
		if calls != 0 {
			t.Errorf("%s: reported at the first poll of a change: %v", c.name, last)
		}
		w.Poll()
		if last == nil || !strings.Contains(last.Error(), c.want) || !strings.Contains(last.Error(), "keeping the previous") {
			t.Errorf("%s: problem %v, want one containing %q", c.name, last, c.want)
		}
		write(t, p, good) // repaired: the applied content again
		w.Poll()
		if last != nil {
			t.Errorf("%s: repaired, still reported: %v", c.name, last)
		}
	}
	if len(r.applied) != 1 {
		t.Errorf("applied %d manifests, want only the first", len(r.applied))
	}
	// missing
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	w.Poll()
	if last == nil || !strings.Contains(last.Error(), "missing") {
		t.Errorf("missing: %v", last)
	}
	// a failing apply of a new valid manifest
	write(t, p, good+"  b: {module: m, function: g}\n")
	r.fail = fmt.Errorf("subscribe refused")
	w.Poll()
	w.Poll()
	if last == nil || !strings.Contains(last.Error(), "subscribe refused") {
		t.Errorf("failing apply: %v", last)
	}
	r.fail = nil
	if !w.Poll() || last != nil {
		t.Errorf("apply succeeded, still reported: %v", last)
	}
}

// problemsOf parses src and returns every problem found, of the file (the
// error) and of its entries (Manifest.Unavailable), as one error; nil
// when there is none.
func problemsOf(t *testing.T, src string) error {
	t.Helper()
	m, err := Parse([]byte(src), "test.yaml")
	if err != nil {
		return err
	}
	var out []string
	for _, name := range sortedKeys(m.Unavailable) {
		out = append(out, name+": "+m.Unavailable[name])
	}
	if len(out) == 0 {
		return nil
	}
	return errors.New(strings.Join(out, "\n"))
}

// One bad entry never rejects the manifest: without a whole-file problem,
// every entry with a problem of its own is unavailable with its reasons
// and the good entries load.
func TestParseEntryProblemsAreTheEntrysOwn(t *testing.T) {
	src := `version: 1
tools:
  "bad/name": {module: m, function: f}
  no_module: {function: f}
  bad_runtime: {runtime: node, module: m, function: f}
  unknown_field: {module: m, function: f, modul: x}
  dup: {module: m, function: f, module: n}
  merged: {<<: {module: m}, function: f}
  list_value: [1, 2]
  two_problems: {module: "a..b", function: f, timeout_seconds: -1}
  good: {module: m, function: f}
  also_good: {module: m2, function: g, sandbox_profile: restrictive}
`
	m, err := Parse([]byte(src), "entries.yaml")
	if err != nil {
		t.Fatalf("a manifest whose problems are all its entries' own was rejected: %v", err)
	}
	if got := m.Names(); !reflect.DeepEqual(got, []string{"also_good", "good"}) {
		t.Errorf("served tools %v, want [also_good good]", got)
	}
	wants := map[string][]string{
		"bad/name":      {`line 3: tool name "bad/name" contains "/"`},
		"no_module":     {"line 4: tools.no_module.module is required"},
		"bad_runtime":   {`line 5: tools.bad_runtime.runtime: "node" is not supported`},
		"unknown_field": {`line 6: tools.unknown_field: unknown field "modul"`},
		"dup":           {`line 7: tools.dup: duplicate key "module"`},
		"merged":        {"line 8: tools.merged: YAML merge keys (<<) are not allowed"},
		"list_value":    {"line 9: tools.list_value must be a mapping, not a list"},
		"two_problems":  {`tools.two_problems.module: "a..b" is not a dotted Python identifier`, "tools.two_problems.timeout_seconds: -1 is negative"},
	}
	if len(m.Unavailable) != len(wants) {
		t.Errorf("unavailable entries %v, want %d", sortedKeys(m.Unavailable), len(wants))
	}
	for name, ws := range wants {
		reason, ok := m.Unavailable[name]
		if !ok {
			t.Errorf("%s: not unavailable", name)
			continue
		}
		for _, w := range ws {
			if !strings.Contains(reason, w) {
				t.Errorf("%s: reason %q lacks %q", name, reason, w)
			}
		}
		if _, served := m.Tools[name]; served {
			t.Errorf("%s: both served and unavailable", name)
		}
	}
	if want := append(sortedKeys(wants), "also_good", "good"); !sameSet(m.Entries(), want) {
		t.Errorf("Entries() = %v", m.Entries())
	}
	if ValidToolName("bad/name") || !ValidToolName("good") {
		t.Error("ValidToolName disagrees with the entry check")
	}
}

// Diff sees an entry going from served to unavailable (and back), and an
// unavailable entry's new reasons, as changes; an unavailable entry that
// appears or leaves is added or removed like a tool.
func TestDiffUnavailableEntries(t *testing.T) {
	parse := func(src string) *Manifest {
		t.Helper()
		m, err := Parse([]byte(src), "t")
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	a := parse("tools:\n  x: {module: m, function: f}\n  y: {module: m}\n  z: {module: m, function: f}\n")
	b := parse("tools:\n  x: {module: m, runtime: node, function: f}\n  y: {function: f}\n  w: {module: m}\n")
	added, removed, changed := Diff(a, b)
	if !reflect.DeepEqual(added, []string{"w"}) || !reflect.DeepEqual(removed, []string{"z"}) || !reflect.DeepEqual(changed, []string{"x", "y"}) {
		t.Errorf("Diff = added %v removed %v changed %v", added, removed, changed)
	}
	if added, removed, changed := Diff(b, b); added != nil || removed != nil || changed != nil {
		t.Errorf("Diff(b, b) = %v %v %v", added, removed, changed)
	}
	if added, _, _ := Diff(nil, b); !reflect.DeepEqual(added, []string{"w", "x", "y"}) {
		t.Errorf("Diff(nil, b) added %v", added)
	}
}

// A reload whose only problems are an entry's own is applied: the other
// tools keep serving and the entry is unavailable.
func TestWatcherAppliesEntryProblems(t *testing.T) {
	p := filepath.Join(t.TempDir(), "manifest.yaml")
	write(t, p, "version: 1\ntools:\n  a: {module: m, function: f}\n")
	r := &recorder{}
	w := NewWatcher(p, time.Second, r.apply, r.logf)
	if !w.Poll() {
		t.Fatal("initial manifest not applied")
	}
	write(t, p, "version: 1\ntools:\n  a: {module: m, function: f}\n  b: {module: m, funktion: g}\n")
	if w.Poll() || !w.Poll() {
		t.Fatal("a manifest with one bad entry was not applied")
	}
	got := r.applied[len(r.applied)-1]
	if !reflect.DeepEqual(got.Names(), []string{"a"}) || !strings.Contains(got.Unavailable["b"], `unknown field "funktion"`) {
		t.Errorf("applied tools %v, unavailable %v", got.Names(), got.Unavailable)
	}
}

func sameSet(a, b []string) bool {
	x, y := append([]string(nil), a...), append([]string(nil), b...)
	sort.Strings(x)
	sort.Strings(y)
	return reflect.DeepEqual(x, y)
}

// The newer reference's description fields load (as compact JSON text)
// and are checked; a bad one makes only its entry unavailable.
func TestParseDescriptionFields(t *testing.T) {
	m, err := Parse([]byte(`version: 1
tools:
  t:
    module: m
    function: f
    description: "d"
    parameters: {type: object, properties: {q: {type: string}}, required: [q]}
    artifact_params: {doc: {is_list: false, is_optional: true}}
    instructions: "call it with q"
    config_schema: [{name: api_key, required: true}]
  bad_params: {module: m, function: f, parameters: [1]}
  bad_artifacts: {module: m, function: f, artifact_params: {doc: {is_lst: true}}}
  bad_keys: {module: m, function: f, parameters: {1: x}}
  bad_config: {module: m, function: f, config_schema: {a: 1}}
`), "t")
	if err != nil {
		t.Fatal(err)
	}
	tool := m.Tools["t"]
	if tool == nil || tool.Parameters != `{"properties":{"q":{"type":"string"}},"required":["q"],"type":"object"}` ||
		tool.ArtifactParams != `{"doc":{"is_list":false,"is_optional":true}}` || tool.Instructions != "call it with q" ||
		tool.ConfigSchema != `[{"name":"api_key","required":true}]` {
		t.Fatalf("t = %+v", tool)
	}
	for name, want := range map[string]string{
		"bad_params":    "tools.bad_params.parameters must be a mapping, not a list",
		"bad_artifacts": `unknown field "is_lst"`,
		"bad_keys":      "tools.bad_keys.parameters is not representable as JSON",
		"bad_config":    "tools.bad_config.config_schema must be a list",
	} {
		if !strings.Contains(m.Unavailable[name], want) {
			t.Errorf("%s: %q, want it to contain %q", name, m.Unavailable[name], want)
		}
	}
}
