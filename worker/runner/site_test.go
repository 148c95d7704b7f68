package runner

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// siteProbe is a tool that reports what Python's start left: the -S flag,
// sys.path, the modules loaded, the builtins site defines, and a module
// from the interpreter's own site-packages.
const siteProbe = `import builtins, sys

def probe():
    import str_sys_pkg
    return {"no_site": sys.flags.no_site, "path": sys.path, "modules": sorted(sys.modules),
            "builtins": [n for n in ("exit", "quit", "help", "copyright", "credits", "license") if hasattr(builtins, n)],
            "value": str_sys_pkg.VALUE}
`

// siteReport is what siteProbe returns, and what a plain interpreter prints.
type siteReport struct {
	NoSite   int      `json:"no_site"`
	Path     []string `json:"path"`
	Modules  []string `json:"modules"`
	Builtins []string `json:"builtins"`
	Value    int      `json:"value"`
	User     string   `json:"user"` // the plain interpreter's user site dir
}

// pythonOut runs python with env and args and returns its stdout.
func pythonOut(t *testing.T, python string, env []string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(python, args...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}, env...)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %q: %v\n%s", python, args, err, stderr)
	}
	return out
}

// writeSitePackage puts into dir a module str_sys_pkg (VALUE = 42) and a
// .pth file whose import line loads str_pth_hook: a .pth hook as a host's
// site-packages may carry one.
func writeSitePackage(t *testing.T, dir string) {
	t.Helper()
	for name, content := range map[string]string{
		"str_sys_pkg.py":  "VALUE = 42\n",
		"str_pth_hook.py": "HOOKED = True\n",
		"str_hook.pth":    "import str_pth_hook\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRunnerSitePaths: started as the worker starts it (runner.Command:
// python -S), the runner gives a tool the sys.path that site would have
// given it (the interpreter's own site-packages that exist, after the
// standard library; the user site dir left out) and site's builtins, but
// no .pth file of those dirs runs; cold and warm alike. The interpreter
// is the test's Python under a PYTHONHOME of its own (the standard library
// linked in, site-packages dirs the test writes), so no host directory is
// touched; the plain interpreter with the same home runs the .pth hook,
// so the check can fail.
func TestRunnerSitePaths(t *testing.T) {
	python := pythonBin(t)
	stdlib := strings.TrimSpace(string(pythonOut(t, python, nil, "-S", "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))")))
	home := t.TempDir()
	libDir := filepath.Join(home, "lib", filepath.Base(stdlib))
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(stdlib)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "site-packages" || e.Name() == "dist-packages" {
			continue
		}
		if err := os.Symlink(filepath.Join(stdlib, e.Name()), filepath.Join(libDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PYTHONHOME=" + home}
	sites := strings.Fields(string(pythonOut(t, python, env, "-S", "-c", "import site; print('\\n'.join(site.getsitepackages()))")))
	if len(sites) == 0 || !strings.HasPrefix(sites[0], home+"/") {
		t.Fatalf("site-packages dirs under PYTHONHOME=%s: %q", home, sites)
	}
	// The first exists (with the package and the hook); any other does
	// not, and must not appear on sys.path.
	if err := os.MkdirAll(sites[0], 0o755); err != nil {
		t.Fatal(err)
	}
	writeSitePackage(t, sites[0])

	h := newHarness(t, map[string]string{"sp.py": siteProbe})
	h.env = env

	// The plain interpreter: site adds the dir and runs the hook.
	var ref siteReport
	refOut := pythonOut(t, python, append(env, "PYTHONPATH="+h.tools), "-c",
		"import json, site, sys; print(json.dumps({'path': sys.path, 'modules': sorted(sys.modules), 'user': site.getusersitepackages()}))")
	if err := json.Unmarshal(refOut, &ref); err != nil {
		t.Fatalf("%s: %v", refOut, err)
	}
	if !slices.Contains(ref.Modules, "str_pth_hook") || !slices.Contains(ref.Path, sites[0]) {
		t.Fatalf("the plain interpreter did not process %s (path %q): nothing to compare with", sites[0], ref.Path)
	}
	// Its path without "" (the -c cwd; the runner drops its own dir) and
	// without the user site dir.
	want := slices.DeleteFunc(slices.Clone(ref.Path[1:]), func(p string) bool { return p == ref.User })

	for _, warm := range []bool{false, true} {
		// A fresh arguments and result file for each run.
		for _, f := range []string{h.argPath, h.result} {
			if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
		}
		out, _ := h.runMode(h.args("sp", "probe", `{}`), warm)
		var got siteReport
		if err := json.Unmarshal(out.Result, &got); err != nil || out.Error != "" {
			t.Fatalf("warm=%v: %s %s: %v", warm, out.Result, out.Error, err)
		}
		if got.NoSite != 1 {
			t.Errorf("warm=%v: sys.flags.no_site = %d: the runner did not start with -S", warm, got.NoSite)
		}
		if !reflect.DeepEqual(got.Path, want) {
			t.Errorf("warm=%v: sys.path\n got %q\nwant %q (site's, without the user site %s)", warm, got.Path, want, ref.User)
		}
		if slices.Contains(got.Modules, "str_pth_hook") {
			t.Errorf("warm=%v: the .pth hook of %s ran", warm, sites[0])
		}
		if got.Value != 42 {
			t.Errorf("warm=%v: str_sys_pkg.VALUE = %d from the interpreter's site-packages, want 42", warm, got.Value)
		}
		if w := []string{"exit", "quit", "help", "copyright", "credits", "license"}; !reflect.DeepEqual(got.Builtins, w) {
			t.Errorf("warm=%v: site's builtins %q, want %q", warm, got.Builtins, w)
		}
	}
}

// TestRunnerSitePathsVenv: an interpreter in a virtual environment gets
// site's own processing under -S (its prefix comes from pyvenv.cfg, which
// only site reads): the venv's site-packages is on sys.path, its .pth
// files run.
func TestRunnerSitePathsVenv(t *testing.T) {
	python := pythonBin(t)
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(python, "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		msg := "python -m venv (the venv module) does not work here: " + strings.TrimSpace(string(out))
		mustwork.Skip(t, msg)
	}
	vpy := filepath.Join(venv, "bin", "python3")
	site := strings.TrimSpace(string(pythonOut(t, vpy, nil, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")))
	if !strings.HasPrefix(site, venv+"/") {
		t.Fatalf("the venv's site-packages %s is not under %s", site, venv)
	}
	writeSitePackage(t, site)
	h := newHarness(t, map[string]string{"sp.py": siteProbe})
	h.python = vpy
	out, _ := h.run(h.args("sp", "probe", `{}`))
	var got siteReport
	if err := json.Unmarshal(out.Result, &got); err != nil || out.Error != "" {
		t.Fatalf("%s %s: %v", out.Result, out.Error, err)
	}
	if got.NoSite != 1 || !slices.Contains(got.Path, site) || !slices.Contains(got.Modules, "str_pth_hook") || got.Value != 42 {
		t.Errorf("venv under -S: no_site %d, path %q, hook ran %v, value %d: want 1, %s on the path, the hook run, 42",
			got.NoSite, got.Path, slices.Contains(got.Modules, "str_pth_hook"), got.Value, site)
	}
}
