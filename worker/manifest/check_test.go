package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckSource(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// root/manifest.yaml and root/python/ as the reference lays them out.
	py := filepath.Join(root, "python")
	must(os.MkdirAll(filepath.Join(py, "pkg"), 0o755))
	must(os.MkdirAll(filepath.Join(py, "closed"), 0o755))
	must(os.WriteFile(filepath.Join(py, "good.py"), []byte("def f(): pass\n"), 0o644))
	must(os.WriteFile(filepath.Join(py, "secret.py"), []byte("def f(): pass\n"), 0o640))
	must(os.WriteFile(filepath.Join(py, "pkg", "sub.py"), []byte("def f(): pass\n"), 0o644))
	must(os.WriteFile(filepath.Join(py, "closed", "sub.py"), []byte("def f(): pass\n"), 0o644))
	must(os.Chmod(filepath.Join(py, "closed"), 0o750))
	tool := func(module, pkg string) *Tool {
		return &Tool{Name: "t_" + strings.ReplaceAll(module, ".", "_"), Module: module, Function: "f", Package: pkg}
	}
	world := SourceCheck{ToolsDir: py, ManifestDir: root, OwnerUID: -1}
	cases := []struct {
		name  string
		tool  *Tool
		check SourceCheck
		want  string // "" = available
	}{
		{"module file", tool("good", ""), world, ""},
		{"module in a package", tool("pkg.sub", ""), world, ""},
		{"missing module", tool("nope", ""), world, "none of"},
		{"missing module of a package tool is installed later", tool("nope", "somepkg"), world, ""},
		{"file not world-readable", tool("secret", ""), world, "cannot read " + filepath.Join(py, "secret.py") + " (mode -rw-r-----"},
		{"package dir not world-searchable", tool("closed.sub", ""), world, "cannot list directory " + filepath.Join(py, "closed")},
		{"owner bits count for the sandbox's own uid (rootless)", tool("secret", ""),
			SourceCheck{ToolsDir: py, ManifestDir: root, OwnerUID: os.Geteuid()}, ""},
		{"SANDBOX_MODE=none checks existence only", tool("closed.sub", ""),
			SourceCheck{ToolsDir: py, ManifestDir: root, OwnerUID: -1, SkipPermissions: true}, ""},
		{"tools dir is the manifest's directory", tool("good", ""),
			SourceCheck{ToolsDir: root, ManifestDir: root, OwnerUID: -1},
			"TOOLS_PYTHON_DIR " + root + " is the manifest's directory, not its python/ folder: module good is in " + py + "; set TOOLS_PYTHON_DIR=" + py},
		{"tools dir missing, relative to the manifest's dir", tool("good", ""),
			SourceCheck{ToolsDir: filepath.Join(t.TempDir(), "python"), Given: "python", ManifestDir: root, OwnerUID: -1},
			"resolved against the working directory, not the manifest's directory; did you mean " + py},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.tool.CheckSource(c.check)
			if c.want == "" {
				if err != nil {
					t.Fatalf("unavailable: %v", err)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrToolUnavailable) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v\nwant ErrToolUnavailable containing %q", err, c.want)
			}
		})
	}
}
