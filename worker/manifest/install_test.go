package manifest

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

func pythonForTest(t *testing.T) string {
	t.Helper()
	py := os.Getenv("STR_TEST_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if _, err := os.Stat(py); err != nil {
		msg := fmt.Sprintf("python interpreter %s not available (%v); set STR_TEST_PYTHON", py, err)
		mustwork.Skip(t, msg)
	}
	return py
}

type wheelOpts struct {
	extra     map[string]string // more entries, verbatim
	symlink   string            // an entry stored as a symlink
	badRecord bool              // RECORD lists a wrong hash
	noRecord  bool
}

// buildWheel writes a minimal pure-Python wheel of distribution
// "str-tiny-pkg" providing the module strtinypkg.
func buildWheel(t *testing.T, dir, fileName, version string, o wheelOpts) string {
	t.Helper()
	distInfo := "str_tiny_pkg-" + version + ".dist-info"
	files := map[string]string{
		"strtinypkg/__init__.py":                                     fmt.Sprintf("VERSION = %q\n\ndef hello(ctx):\n    return {'v': VERSION}\n", version),
		"str_tiny_pkg-" + version + ".data/purelib/strtiny_extra.py": "EXTRA = True\n",
		"str_tiny_pkg-" + version + ".data/scripts/tool-script":      "#!/bin/sh\n",
		distInfo + "/METADATA":                                       "Metadata-Version: 2.1\nName: str-tiny-pkg\nVersion: " + version + "\n",
		distInfo + "/WHEEL":                                          "Wheel-Version: 1.0\nGenerator: str-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	}
	for k, v := range o.extra {
		files[k] = v
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var record strings.Builder
	for _, n := range names {
		sum := sha256.Sum256([]byte(files[n]))
		h := base64.RawURLEncoding.EncodeToString(sum[:])
		if o.badRecord && strings.HasSuffix(n, "__init__.py") {
			h = base64.RawURLEncoding.EncodeToString(make([]byte, 32))
		}
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, h, len(files[n]))
	}
	record.WriteString(distInfo + "/RECORD,,\n")
	if !o.noRecord {
		files[distInfo+"/RECORD"] = record.String()
		names = append(names, distInfo+"/RECORD")
	}

	p := filepath.Join(dir, fileName)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	for _, n := range names {
		w, err := zw.Create(n)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if o.symlink != "" {
		h := &zip.FileHeader{Name: o.symlink, Method: zip.Store}
		h.SetMode(os.ModeSymlink | 0o777)
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte("/etc/passwd"))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return p
}

func tinyTool(version string) *Tool {
	return &Tool{Name: "tiny", Runtime: "python", Module: "strtinypkg", Function: "hello", Package: "Str_Tiny.Pkg", Version: version}
}

// pyImport imports strtinypkg from site and returns "<VERSION> <dist version> <EXTRA>".
func pyImport(t *testing.T, py, site string) (string, error) {
	t.Helper()
	cmd := exec.Command(py, "-s", "-c", `import strtinypkg, strtiny_extra, importlib.metadata as md
print(strtinypkg.VERSION, md.version("str-tiny-pkg"), strtiny_extra.EXTRA)`)
	cmd.Env = []string{"PYTHONPATH=" + site, "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1"}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func TestInstallerUnpacksPureWheel(t *testing.T) {
	py := pythonForTest(t)
	root := t.TempDir()
	wheels := filepath.Join(root, "wheels")
	site := filepath.Join(root, "site")
	os.MkdirAll(wheels, 0o755)
	buildWheel(t, wheels, "Str_Tiny_Pkg-1.2.0-py3-none-any.whl", "1.2.0", wheelOpts{})
	buildWheel(t, wheels, "str_tiny_pkg-2.1.0-py3-none-any.whl", "2.1.0", wheelOpts{})
	buildWheel(t, wheels, "str_tiny_pkg-3.0.0-cp311-cp311-linux_x86_64.whl", "3.0.0", wheelOpts{})
	inst := &Installer{Python: py, SiteDir: site, WheelsDir: wheels, Method: MethodUnpack}
	ctx := context.Background()

	// ">=1.0,<2.0" picks 1.2.0 (2.1.0 is out of range, 3.0.0 is not pure),
	// into a site dir of its own
	got, err := inst.Ensure(ctx, tinyTool(">=1.0,<2.0"))
	if err != nil {
		t.Fatal(err)
	}
	want := Installed{Package: "Str_Tiny.Pkg", Version: "1.2.0", Dir: filepath.Join(site, "str-tiny-pkg-1.2.0"), Fresh: true, From: wheels, Method: "unpacked"}
	if got != want {
		t.Fatalf("Ensure = %+v, want %+v", got, want)
	}
	if out, err := pyImport(t, py, got.Dir); err != nil || out != "1.2.0 1.2.0 True" {
		t.Fatalf("import after install: %q, %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(got.Dir, "tool-script")); !os.IsNotExist(err) {
		t.Error("a scripts entry was installed into the site dir")
	}
	// already installed in a matching version: found, even without wheels
	noWheels := &Installer{Python: py, SiteDir: site, Method: MethodUnpack}
	again, err := noWheels.Ensure(ctx, tinyTool(">=1.0"))
	if err != nil || again.Fresh || again.Dir != want.Dir || again.Version != "1.2.0" {
		t.Errorf("Ensure of an installed package: %+v, %v", again, err)
	}
	// a constraint the installed version does not meet: the newest pure
	// wheel that meets it, in its own dir beside the first
	up, err := inst.Ensure(ctx, tinyTool(">=2.0"))
	if err != nil {
		t.Fatal(err)
	}
	if up.Dir != filepath.Join(site, "str-tiny-pkg-2.1.0") || !up.Fresh {
		t.Fatalf("upgrade: %+v", up)
	}
	if out, err := pyImport(t, py, up.Dir); err != nil || out != "2.1.0 2.1.0 True" {
		t.Fatalf("import after upgrade: %q, %v", out, err)
	}
	if out, err := pyImport(t, py, want.Dir); err != nil || out != "1.2.0 1.2.0 True" {
		t.Fatalf("the 1.2.0 dir changed: %q, %v", out, err)
	}
	// no constraint: the newest installed
	if any, err := noWheels.Ensure(ctx, tinyTool("")); err != nil || any.Dir != up.Dir {
		t.Errorf("Ensure without a version: %+v, %v", any, err)
	}
	// nothing matches
	_, err = inst.Ensure(ctx, tinyTool(">=3.0"))
	if err == nil || !strings.Contains(err.Error(), "no pure-Python wheel") || !strings.Contains(err.Error(), "not pure Python") {
		t.Errorf("Ensure >=3.0: %v", err)
	}
	// no staging dirs left behind
	left, _ := filepath.Glob(filepath.Join(site, ".staging-*"))
	if len(left) != 0 {
		t.Errorf("staging dirs left: %v", left)
	}
}

// TestInstallerRunsNoPackageCode: a wheel whose sitecustomize.py and .pth
// file would write a marker when Python starts with the site dir on its
// path: installing it and deciding whether it is installed (before and
// after) run no Python with it on the path, so no marker appears. (Before
// issue 18 the check ran "python3 -s" with the site dir on PYTHONPATH and
// imported the sitecustomize.py as the worker, root in production.)
func TestInstallerRunsNoPackageCode(t *testing.T) {
	py := pythonForTest(t)
	root := t.TempDir()
	wheels := filepath.Join(root, "wheels")
	os.MkdirAll(wheels, 0o755)
	marker := filepath.Join(root, "ran-on-host")
	payload := fmt.Sprintf("open(%q, 'a').write('ran\\n')\n", marker)
	buildWheel(t, wheels, "str_tiny_pkg-1.0.0-py3-none-any.whl", "1.0.0", wheelOpts{extra: map[string]string{
		"sitecustomize.py": payload,
		"usercustomize.py": payload,
		"str_evil.pth":     "import os; " + strings.TrimSuffix(payload, "\n") + "\n",
	}})
	inst := &Installer{Python: py, SiteDir: filepath.Join(root, "site"), WheelsDir: wheels, Method: MethodUnpack}
	for n := 0; n < 2; n++ {
		got, err := inst.Ensure(context.Background(), tinyTool(""))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(got.Dir, "sitecustomize.py")); err != nil {
			t.Fatalf("the payload is not installed (the test proves nothing): %v", err)
		}
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Fatalf("package code ran on the host: %s exists (%v)", marker, err)
	}
	// The payload is live: the same interpreter with the dir on its path runs it.
	cmd := exec.Command(py, "-c", "pass")
	cmd.Env = []string{"PYTHONPATH=" + filepath.Join(root, "site", "str-tiny-pkg-1.0.0")}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the payload does not run when imported, so this test proves nothing: %v", err)
	}
}

// TestInstallerSiteDirPerPackage: a package that ships another package's
// top-level module lands in its own dir; the other's dir keeps its own.
func TestInstallerSiteDirPerPackage(t *testing.T) {
	py := pythonForTest(t)
	root := t.TempDir()
	wheels := filepath.Join(root, "wheels")
	os.MkdirAll(wheels, 0o755)
	buildWheel(t, wheels, "str_tiny_pkg-1.0.0-py3-none-any.whl", "1.0.0", wheelOpts{})
	// "str-shadow" ships strtinypkg/__init__.py too.
	writeZip(t, filepath.Join(wheels, "str_shadow-9.0-py3-none-any.whl"), map[string]string{
		"strtinypkg/__init__.py":            "VERSION = 'shadowed'\n",
		"str_shadow-9.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: str-shadow\nVersion: 9.0\n",
		"str_shadow-9.0.dist-info/WHEEL":    "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
	})
	inst := &Installer{Python: py, SiteDir: filepath.Join(root, "site"), WheelsDir: wheels, Method: MethodUnpack}
	tiny, err := inst.Ensure(context.Background(), tinyTool(""))
	if err != nil {
		t.Fatal(err)
	}
	shadow, err := inst.Ensure(context.Background(), &Tool{Name: "shadow", Module: "shadowtool", Function: "f", Package: "str-shadow"})
	if err != nil {
		t.Fatal(err)
	}
	if shadow.Dir == tiny.Dir || shadow.Dir != filepath.Join(root, "site", "str-shadow-9.0") {
		t.Fatalf("dirs: %s and %s", tiny.Dir, shadow.Dir)
	}
	if out, err := pyImport(t, py, tiny.Dir); err != nil || out != "1.0.0 1.0.0 True" {
		t.Fatalf("strtinypkg from its own dir: %q, %v", out, err)
	}
}

// TestInstallerInterpreterSite: a package the interpreter's own
// site-packages has in a satisfying version needs no dir and no install;
// an older one there is not enough.
func TestInstallerInterpreterSite(t *testing.T) {
	root := t.TempDir()
	sys := filepath.Join(root, "sys-site")
	for p, c := range map[string]string{
		"Str_Tiny_Pkg-1.5.dist-info/METADATA": "Metadata-Version: 2.1\nName: str-tiny-pkg\nVersion: 1.5\n\nName: not-this\n",
		"other-1.0.egg-info":                  "Metadata-Version: 1.1\nName: other\nVersion: 1.0\n",
	} {
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(sys, p)), 0o755))
		must(t, os.WriteFile(filepath.Join(sys, p), []byte(c), 0o644))
	}
	inst := &Installer{SiteDir: filepath.Join(root, "site"), sysSite: []string{sys}, sysDone: true}
	got, err := inst.Ensure(context.Background(), tinyTool(">=1.0"))
	if err != nil || got.Dir != "" || got.Version != "1.5" || got.Fresh {
		t.Errorf("in the interpreter's site: %+v, %v", got, err)
	}
	got, err = inst.Ensure(context.Background(), &Tool{Name: "o", Module: "other", Function: "f", Package: "Other", Version: "==1.0"})
	if err != nil || got.Dir != "" || got.Version != "1.0" {
		t.Errorf("an .egg-info file: %+v, %v", got, err)
	}
	_, err = inst.Ensure(context.Background(), tinyTool(">=2"))
	if err == nil || !strings.Contains(err.Error(), "Str_Tiny.Pkg 1.5 in "+sys+` does not satisfy ">=2"`) || !strings.Contains(err.Error(), "no index URL and no wheels folder") {
		t.Errorf("an older version there: %v", err)
	}
}

// pipInto is a PipRunner for the installer's own steps (the real one is
// the launcher's sandbox, tested in test/integration/hostile): it writes
// the metadata a pip run would leave, and records the job.
type pipInto struct {
	version string
	jobs    []PipJob
	fail    error
}

func (p *pipInto) RunPip(_ context.Context, job PipJob) error {
	p.jobs = append(p.jobs, job)
	if p.fail != nil {
		fmt.Fprintln(job.Output, "ERROR: No matching distribution found")
		return p.fail
	}
	d := filepath.Join(job.Target, "str_tiny_pkg-"+p.version+".dist-info")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(d, "METADATA"), []byte("Name: str-tiny-pkg\nVersion: "+p.version+"\n"), 0o644)
}

func TestInstallerPipJob(t *testing.T) {
	root := t.TempDir()
	wheels := filepath.Join(root, "wheels")
	must(t, os.MkdirAll(wheels, 0o755))
	pip := &pipInto{version: "1.3"}
	inst := &Installer{SiteDir: filepath.Join(root, "site"), WheelsDir: wheels, Pip: pip, Method: MethodPip, sysSite: []string{"/nonexistent"}, sysDone: true}
	// pip is not installed for the interpreter (its site has no pip)
	if _, err := inst.Ensure(context.Background(), tinyTool("")); err == nil || !strings.Contains(err.Error(), "pip is not installed for python3") {
		t.Fatalf("no pip: %v", err)
	}
	sys := filepath.Join(root, "sys")
	must(t, os.MkdirAll(filepath.Join(sys, "pip-23.0.dist-info"), 0o755))
	must(t, os.WriteFile(filepath.Join(sys, "pip-23.0.dist-info", "METADATA"), []byte("Name: pip\nVersion: 23.0\n"), 0o644))
	inst.sysSite = []string{sys}
	got, err := inst.Ensure(context.Background(), tinyTool(">=1.0"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Dir != filepath.Join(root, "site", "str-tiny-pkg-1.3") || got.Method != "pip in a sandbox" || got.From != wheels {
		t.Errorf("Ensure = %+v", got)
	}
	j := pip.jobs[len(pip.jobs)-1]
	if j.Requirement != "Str_Tiny.Pkg>=1.0" || j.WheelsDir != wheels || j.IndexURL != "" || j.AllowBuilds || !strings.HasPrefix(j.Target, filepath.Join(root, "site", ".staging-str-tiny-pkg-")) {
		t.Errorf("job %+v", j)
	}
	// the index wins over the wheels folder; a version pip chose that the
	// declared one excludes is refused
	inst.IndexURL, inst.AllowBuilds, pip.version = "http://127.0.0.1:1/simple/", true, "0.5"
	_, err = inst.Ensure(context.Background(), tinyTool(">=1.5"))
	if err == nil || !strings.Contains(err.Error(), `installed Str_Tiny.Pkg 0.5 from http://127.0.0.1:1/simple/, which does not satisfy ">=1.5"`) {
		t.Errorf("wrong version: %v", err)
	}
	if j := pip.jobs[len(pip.jobs)-1]; j.IndexURL != inst.IndexURL || j.WheelsDir != "" || !j.AllowBuilds {
		t.Errorf("index job %+v", j)
	}
	// pip's failure and its output's tail
	pip.fail = errors.New("pip exited with status 1")
	_, err = inst.Ensure(context.Background(), tinyTool(">=1.5"))
	if err == nil || !strings.Contains(err.Error(), "pip exited with status 1") || !strings.Contains(err.Error(), "No matching distribution") {
		t.Errorf("pip failure: %v", err)
	}
	left, _ := filepath.Glob(filepath.Join(root, "site", ".staging-*"))
	if len(left) != 0 {
		t.Errorf("staging dirs left: %v", left)
	}
	// no sandbox for pip: an index cannot be used
	inst.Pip, inst.Method = nil, MethodAuto
	_, err = inst.Ensure(context.Background(), tinyTool(">=1.5"))
	if err == nil || !strings.Contains(err.Error(), "needs pip: no sandbox to run pip in") {
		t.Errorf("no sandbox: %v", err)
	}
}

func TestInstallerNoOps(t *testing.T) {
	root := t.TempDir()
	inst := &Installer{SiteDir: filepath.Join(root, "site"), sysSite: []string{}, sysDone: true}
	if got, err := inst.Ensure(context.Background(), &Tool{Name: "t", Module: "m", Function: "f"}); err != nil || got != (Installed{}) {
		t.Errorf("no package: %+v, %v", got, err)
	}
	// nothing to install from
	_, err := inst.Ensure(context.Background(), &Tool{Name: "t", Module: "absent_mod_xyz", Function: "f", Package: "absent-mod"})
	if err == nil || !strings.Contains(err.Error(), "absent-mod is not installed") || !strings.Contains(err.Error(), "no index URL and no wheels folder") {
		t.Errorf("no source: %v", err)
	}
	// argument injection is refused before anything runs
	_, err = inst.Ensure(context.Background(), &Tool{Name: "t", Module: "m", Function: "f", Package: "--index-url=http://evil"})
	if err == nil || !strings.Contains(err.Error(), "not a valid distribution name") {
		t.Errorf("injection: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func writeZip(t *testing.T, p string, files map[string]string) {
	t.Helper()
	f, err := os.Create(p)
	must(t, err)
	zw := zip.NewWriter(f)
	for n, c := range files {
		w, err := zw.Create(n)
		must(t, err)
		_, err = w.Write([]byte(c))
		must(t, err)
	}
	must(t, zw.Close())
	must(t, f.Close())
}

func TestInstallerRefusesHostileWheels(t *testing.T) {
	py := pythonForTest(t)
	cases := map[string]struct {
		opts wheelOpts
		want string
	}{
		"dotdot":     {wheelOpts{extra: map[string]string{"../escape.py": "x = 1\n"}}, `".." path element`},
		"nested up":  {wheelOpts{extra: map[string]string{"strtinypkg/../../escape.py": "x = 1\n"}}, `".." path element`},
		"absolute":   {wheelOpts{extra: map[string]string{"/tmp/abs.py": "x = 1\n"}}, "is absolute"},
		"backslash":  {wheelOpts{extra: map[string]string{`strtinypkg\..\x.py`: "x = 1\n"}}, "backslash"},
		"symlink":    {wheelOpts{symlink: "strtinypkg/link"}, "is a symlink"},
		"bad record": {wheelOpts{badRecord: true}, "RECORD says"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			wheels := filepath.Join(root, "wheels")
			site := filepath.Join(root, "deep", "site")
			os.MkdirAll(wheels, 0o755)
			buildWheel(t, wheels, "str_tiny_pkg-1.0.0-py3-none-any.whl", "1.0.0", c.opts)
			inst := &Installer{Python: py, SiteDir: site, WheelsDir: wheels, Method: MethodUnpack}
			_, err := inst.Ensure(context.Background(), tinyTool(""))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Ensure = %v, want an error containing %q", err, c.want)
			}
			// nothing installed, nothing written outside the site dir
			entries, _ := os.ReadDir(site)
			if len(entries) != 0 {
				t.Errorf("site dir has %d entries after a refused wheel", len(entries))
			}
			for _, p := range []string{filepath.Join(root, "deep", "escape.py"), filepath.Join(root, "escape.py"), "/tmp/abs.py"} {
				if _, err := os.Stat(p); err == nil {
					t.Errorf("%s was written", p)
				}
			}
		})
	}
	// a wheel without RECORD is accepted
	root := t.TempDir()
	wheels := filepath.Join(root, "wheels")
	os.MkdirAll(wheels, 0o755)
	buildWheel(t, wheels, "str_tiny_pkg-1.0.0-py3-none-any.whl", "1.0.0", wheelOpts{noRecord: true})
	inst := &Installer{Python: py, SiteDir: filepath.Join(root, "site"), WheelsDir: wheels, Method: MethodUnpack}
	if _, err := inst.Ensure(context.Background(), tinyTool("")); err != nil {
		t.Errorf("wheel without RECORD: %v", err)
	}
}

// TestDistInNeverFollowsSymlinks: a dist-info dir or METADATA that is a
// symlink is not read through (it could name any host file).
func TestDistInNeverFollowsSymlinks(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "elsewhere")
	must(t, os.MkdirAll(real, 0o755))
	must(t, os.WriteFile(filepath.Join(real, "METADATA"), []byte("Name: str-tiny-pkg\nVersion: 9.9\n"), 0o644))
	site := filepath.Join(root, "site")
	must(t, os.MkdirAll(filepath.Join(site, "str_tiny_pkg-9.9.dist-info"), 0o755))
	must(t, os.Symlink(filepath.Join(real, "METADATA"), filepath.Join(site, "str_tiny_pkg-9.9.dist-info", "METADATA")))
	if v, ok, err := distIn(site, "str-tiny-pkg"); ok || err == nil || !strings.Contains(err.Error(), "too many levels of symbolic links") {
		t.Errorf("symlinked METADATA: %q %v %v", v, ok, err)
	}
	linked := filepath.Join(root, "linked")
	must(t, os.MkdirAll(linked, 0o755))
	must(t, os.Symlink(real, filepath.Join(linked, "str_tiny_pkg-9.9.dist-info")))
	if v, ok, err := distIn(linked, "str-tiny-pkg"); ok || err != nil {
		t.Errorf("symlinked dist-info dir: %q %v %v", v, ok, err)
	}
}
