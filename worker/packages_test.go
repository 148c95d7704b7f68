package worker

import (
	"archive/zip"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher/launchertest"

	"github.com/securetoolruntime/str/worker/manifest"
)

// writeTestWheel writes a pure-Python wheel of dist (version v) whose
// module sharedmod says who it is: two such packages ship the same
// top-level module.
func writeTestWheel(t *testing.T, dir, dist, v string) {
	t.Helper()
	under := strings.ReplaceAll(dist, "-", "_")
	f, err := os.Create(filepath.Join(dir, under+"-"+v+"-py3-none-any.whl"))
	must(t, err)
	zw := zip.NewWriter(f)
	for name, content := range map[string]string{
		"sharedmod/__init__.py":                 "WHO = " + `"` + dist + `"` + "\n",
		under + "-" + v + ".dist-info/METADATA": "Metadata-Version: 2.1\nName: " + dist + "\nVersion: " + v + "\n",
		under + "-" + v + ".dist-info/WHEEL":    "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	} {
		w, err := zw.Create(name)
		must(t, err)
		_, err = io.WriteString(w, content)
		must(t, err)
	}
	must(t, zw.Close())
	must(t, f.Close())
}

const packageTools = `def which(ctx):
    import sharedmod
    return {"who": sharedmod.WHO}
`

// TestDeclaredPackages (issue 15 §2, issue 18 §1): each tool's declared
// package is installed at start-up, though its module (pkgtools) is not
// the package's; each tool imports from its own package's site dir only
// (two packages shipping the same module do not shadow each other); a
// package that cannot be installed makes only its tool unavailable, with
// the reason on /readyz; a reload that fixes it installs it.
func TestDeclaredPackages(t *testing.T) {
	h := newHarness(t, nil)
	wheels := filepath.Join(h.dir, "wheels")
	must(t, os.MkdirAll(wheels, 0o755))
	writeTestWheel(t, wheels, "str-pkg-a", "1.0")
	writeTestWheel(t, wheels, "str-pkg-b", "2.0")
	must(t, os.WriteFile(filepath.Join(h.cfg.ToolsDir, "pkgtools.py"), []byte(packageTools), 0o644))
	pm := testManifest + `  tool_a: {module: pkgtools, function: which, package: str-pkg-a, version: ">=1.0"}
  tool_b: {module: pkgtools, function: which, package: str_pkg.B}
  tool_c: {module: pkgtools, function: which, package: str-pkg-c}
`
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(pm), 0o644))
	logs := &logBuffer{}
	var err error
	h.srv, err = New(Options{Config: h.cfg, Transport: h.bus.Client("worker", h.cfg.QueueName()), Sandboxes: launchertest.Sandboxes{},
		Store: h.store, Logger: slog.New(slog.NewJSONHandler(logs, nil)),
		Installer: &manifest.Installer{Python: "/usr/bin/python3", SiteDir: h.cfg.SiteDir, WheelsDir: wheels, Method: manifest.MethodUnpack}})
	must(t, err)
	h.start()

	// installed at start-up, before the first call, and logged
	for _, want := range []string{
		`"msg":"package installed","package":"str-pkg-a","version":"1.0","declared_version":">=1.0","from":"` + wheels + `","method":"unpacked","site_dir":"` + filepath.Join(h.cfg.SiteDir, "str-pkg-a-1.0") + `"`,
		`"msg":"package installed","package":"str_pkg.B","version":"2.0"`,
		`"msg":"package installation failed: the tools that declare it are unavailable (TOOL_NOT_AVAILABLE, see /readyz)","package":"str-pkg-c"`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	for tool, who := range map[string]string{"tool_a": "str-pkg-a", "tool_b": "str-pkg-b"} {
		r, ok := shapeResult(h.reply(h.send(tool, nil)))
		if got, _ := r["tool_result"].(map[string]any); !ok || got["who"] != who {
			t.Errorf("%s imported sharedmod of %v, want %s's", tool, r, who)
		}
	}
	code, msg := errorCode(t, h.reply(h.send("tool_c", nil)))
	if code != "TOOL_NOT_AVAILABLE" {
		t.Errorf("tool_c: %s %q", code, msg)
	}
	readyz := func() map[string]string {
		hs := httptest.NewServer(h.srv.Handler())
		defer hs.Close()
		resp, err := hs.Client().Get(hs.URL + "/readyz")
		must(t, err)
		defer resp.Body.Close()
		var body struct {
			UnavailableTools map[string]string `json:"unavailable_tools"`
		}
		must(t, json.NewDecoder(resp.Body).Decode(&body))
		return body.UnavailableTools
	}
	if u := readyz(); len(u) != 1 || !strings.Contains(u["tool_c"], "package str-pkg-c could not be installed") || !strings.Contains(u["tool_c"], "no pure-Python wheel of str-pkg-c") {
		t.Errorf("readyz: %v", u)
	}

	// the reload that changes tool_c's entry installs its package
	writeTestWheel(t, wheels, "str-pkg-c", "3.1")
	must(t, os.WriteFile(h.cfg.ManifestPath+".tmp", []byte(strings.Replace(pm, "package: str-pkg-c}", `package: str-pkg-c, version: "==3.1"}`, 1)), 0o644))
	must(t, os.Rename(h.cfg.ManifestPath+".tmp", h.cfg.ManifestPath))
	deadline := time.Now().Add(30 * time.Second)
	for len(readyz()) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("tool_c still unavailable 30 s after the reload: %v\n%s", readyz(), logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r, ok := shapeResult(h.reply(h.send("tool_c", nil)))
	if got, _ := r["tool_result"].(map[string]any); !ok || got["who"] != "str-pkg-c" {
		t.Errorf("tool_c after the reload: %v", r)
	}
	if !strings.Contains(logs.String(), `"msg":"package installed","package":"str-pkg-c","version":"3.1"`) {
		t.Errorf("the reload's installation is not logged:\n%s", logs)
	}
}
