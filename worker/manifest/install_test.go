package manifest

import (
	"archive/zip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

func pythonForTest(t *testing.T) string {
	t.Helper()
	py := os.Getenv("STR_TEST_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if _, err := os.Stat(py); err != nil {
		msg := fmt.Sprintf("python interpreter %s not available (%v); set STR_TEST_PYTHON", py, err)
		if os.Getenv("STR_MUST_WORK") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
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

	// not importable before
	if _, err := pyImport(t, py, site); err == nil {
		t.Fatal("strtinypkg importable before installation")
	}
	// ">=1.0,<2.0" picks 1.2.0 (2.1.0 is out of range, 3.0.0 is not pure)
	if err := inst.Ensure(ctx, tinyTool(">=1.0,<2.0")); err != nil {
		t.Fatal(err)
	}
	if out, err := pyImport(t, py, site); err != nil || out != "1.2.0 1.2.0 True" {
		t.Fatalf("import after install: %q, %v", out, err)
	}
	if _, err := os.Stat(filepath.Join(site, "tool-script")); !os.IsNotExist(err) {
		t.Error("a scripts entry was installed into the site dir")
	}
	// already importable in a matching version: no-op even without wheels
	noWheels := &Installer{Python: py, SiteDir: site, Method: MethodUnpack}
	if err := noWheels.Ensure(ctx, tinyTool(">=1.0")); err != nil {
		t.Errorf("Ensure of an installed package: %v", err)
	}
	// a constraint the installed version does not meet: upgrade to the
	// newest pure wheel that meets it
	if err := inst.Ensure(ctx, tinyTool(">=2.0")); err != nil {
		t.Fatal(err)
	}
	if out, err := pyImport(t, py, site); err != nil || out != "2.1.0 2.1.0 True" {
		t.Fatalf("import after upgrade: %q, %v", out, err)
	}
	// nothing matches
	err := inst.Ensure(ctx, tinyTool(">=3.0"))
	if err == nil || !strings.Contains(err.Error(), "no pure-Python wheel") || !strings.Contains(err.Error(), "not pure Python") {
		t.Errorf("Ensure >=3.0: %v", err)
	}
	// no staging dirs left behind
	left, _ := filepath.Glob(filepath.Join(site, ".str-unpack-*"))
	if len(left) != 0 {
		t.Errorf("staging dirs left: %v", left)
	}
}

func TestInstallerNoOps(t *testing.T) {
	py := pythonForTest(t)
	root := t.TempDir()
	inst := &Installer{Python: py, SiteDir: filepath.Join(root, "site")}
	if err := inst.Ensure(context.Background(), &Tool{Name: "t", Module: "m", Function: "f"}); err != nil {
		t.Errorf("no package: %v", err)
	}
	// a module already importable from the tools dir needs no install
	tools := filepath.Join(root, "tools")
	os.MkdirAll(tools, 0o755)
	os.WriteFile(filepath.Join(tools, "localmod.py"), []byte("raise SystemExit('must not be imported on the host')\n"), 0o644)
	inst.ToolsDir = tools
	if err := inst.Ensure(context.Background(), &Tool{Name: "t", Module: "localmod.sub", Function: "f", Package: "local-mod"}); err != nil {
		t.Errorf("module in tools dir: %v", err)
	}
	// nothing to install from
	err := inst.Ensure(context.Background(), &Tool{Name: "t", Module: "absent_mod_xyz", Function: "f", Package: "absent-mod"})
	if err == nil || !strings.Contains(err.Error(), "no wheels dir and no index URL") {
		t.Errorf("no source: %v", err)
	}
	// argument injection is refused before anything runs
	err = inst.Ensure(context.Background(), &Tool{Name: "t", Module: "m", Function: "f", Package: "--index-url=http://evil"})
	if err == nil || !strings.Contains(err.Error(), "not a valid distribution name") {
		t.Errorf("injection: %v", err)
	}
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
			err := inst.Ensure(context.Background(), tinyTool(""))
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
	if err := inst.Ensure(context.Background(), tinyTool("")); err != nil {
		t.Errorf("wheel without RECORD: %v", err)
	}
}

func TestInstallerPipOffline(t *testing.T) {
	py := pythonForTest(t)
	if err := exec.Command(py, "-s", "-m", "pip", "--version").Run(); err != nil {
		msg := fmt.Sprintf("pip is not available for %s: %v", py, err)
		if os.Getenv("STR_MUST_WORK") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	root := t.TempDir()
	wheels := filepath.Join(root, "wheels")
	site := filepath.Join(root, "site")
	os.MkdirAll(wheels, 0o755)
	buildWheel(t, wheels, "str_tiny_pkg-1.2.0-py3-none-any.whl", "1.2.0", wheelOpts{})
	buildWheel(t, wheels, "str_tiny_pkg-2.1.0-py3-none-any.whl", "2.1.0", wheelOpts{})
	inst := &Installer{Python: py, SiteDir: site, WheelsDir: wheels} // MethodAuto picks pip
	if err := inst.Ensure(context.Background(), tinyTool(">=1.0,<2.0")); err != nil {
		t.Fatal(err)
	}
	if out, err := pyImport(t, py, site); err != nil || out != "1.2.0 1.2.0 True" {
		t.Fatalf("import after pip install: %q, %v", out, err)
	}
	err := inst.Ensure(context.Background(), tinyTool(">=5"))
	if err == nil || !strings.Contains(err.Error(), "pip install") {
		t.Errorf("pip with no matching wheel: %v", err)
	}
}
