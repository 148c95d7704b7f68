package e2e

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDeclaredPackageInstalledAtStartup (issue 15 §2): the reference's
// render_ascii_art example with our own package. The manifest entry's
// module (package_test_tool) is not its package's (str-figlet provides
// strfiglet); the worker installs the declared package from the wheels
// folder next to the manifest at start-up, before it serves, in an
// installation sandbox, and the call, sent with a reference agent's
// defaults, imports it from the package's own site dir.
func TestDeclaredPackageInstalledAtStartup(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	wheels := figletWheel(t, e)
	writeManifest(t, e.manifest, `tools:
  render_ascii_art:
    runtime: python
    module: package_test_tool
    function: render_ascii_art
    package: str-figlet
    description: "Render text as ASCII art (tests package auto-install)"
`)
	w := startWorker(t, e, 0, nil)
	site := filepath.Join(e.root, "site", "str-figlet-1.0")
	log := w.log.String()
	installed := strings.Index(log, `"msg":"package installed","package":"str-figlet","version":"1.0","declared_version":"","from":"`+wheels+`","method":"pip in a sandbox","site_dir":"`+site+`"`)
	serving := strings.Index(log, `"msg":"worker serving"`)
	if installed < 0 || serving < 0 || installed > serving {
		t.Fatalf("want the installation logged before the worker serves (at %d, serving at %d):\n%s", installed, serving, tail(log, 30))
	}

	a := newAgent(t, w.port)
	id := a.invoke("render_ascii_art", map[string]any{"args": map[string]any{"text": "str"}, "sandbox_profile": "standard", "timeout_seconds": 300})
	var r struct {
		Result *struct {
			ToolResult struct {
				Art, From      string
				PackageVersion string `json:"package_version"`
			} `json:"tool_result"`
		} `json:"result"`
	}
	raw := a.reply(id, replyWait)
	must(t, json.Unmarshal(raw, &r))
	if r.Result == nil || r.Result.ToolResult.Art != "+-----+\n| str |\n+-----+" || r.Result.ToolResult.PackageVersion != "1.0" ||
		r.Result.ToolResult.From != filepath.Join(site, "strfiglet", "__init__.py") {
		t.Fatalf("reply %s", raw)
	}
}

// figletWheel puts the reference's render_ascii_art example (our own
// module, package_test_tool) into e's tools dir and the wheel of the
// package it declares, str-figlet 1.0 (module strfiglet), into the wheels
// folder next to the manifest, which it returns.
func figletWheel(t *testing.T, e *env) string {
	t.Helper()
	copyFile(t, "testdata/package_test_tool.py", filepath.Join(e.tools, "package_test_tool.py"))
	wheels := filepath.Join(filepath.Dir(e.manifest), "wheels")
	must(t, os.MkdirAll(wheels, 0o755))
	buildWheel(t, filepath.Join(wheels, "str_figlet-1.0-py3-none-any.whl"), "testdata/package", map[string]string{
		"str_figlet-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: str-figlet\nVersion: 1.0\n",
		"str_figlet-1.0.dist-info/WHEEL":    "Wheel-Version: 1.0\nGenerator: str-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	})
	return wheels
}

// buildWheel zips the files under src and the extra entries into a
// wheel, with a RECORD (in the dist-info dir of the extra entries).
func buildWheel(t *testing.T, path, src string, extra map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	must(t, err)
	zw := zip.NewWriter(f)
	var record strings.Builder
	distInfo := ""
	add := func(name string, b []byte) {
		w, err := zw.Create(name)
		must(t, err)
		_, err = w.Write(b)
		must(t, err)
		sum := sha256.Sum256(b)
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", name, base64.RawURLEncoding.EncodeToString(sum[:]), len(b))
		if d, _, ok := strings.Cut(name, ".dist-info/"); ok {
			distInfo = d + ".dist-info"
		}
	}
	must(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		add(filepath.ToSlash(rel), b)
		return nil
	}))
	for n, c := range extra {
		add(n, []byte(c))
	}
	record.WriteString(distInfo + "/RECORD,,\n")
	w, err := zw.Create(distInfo + "/RECORD")
	must(t, err)
	_, err = w.Write([]byte(record.String()))
	must(t, err)
	must(t, zw.Close())
	must(t, f.Close())
}
