// Package ci_test checks the scripts make test and .ci/run are made of:
// scripts/phases.sh runs every phase when one fails, and make test's
// phase list covers every test package.
package ci_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// root is the repository root (this file is test/ci/phases_test.go).
func root(t *testing.T) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("runtime.Caller failed")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// A Makefile of stand-in phases: each leaves a file behind when it runs.
// bad fails; two's first prerequisite fails (make -k must still run the
// second); img fails in the background; needsimg needs it.
const phasesMakefile = `
ok1:
	touch ran-ok1
bad:
	exit 3
two: two-a two-b
two-a:
	exit 1
two-b:
	touch ran-two-b
img:
	touch ran-img; exit 1
needsimg:
	touch ran-needsimg
okimg:
	touch ran-okimg
after:
	touch ran-after
`

// TestPhasesRunAfterFailure: a failed phase does not stop make test. Every
// later phase runs, a phase whose prerequisite phase failed is listed as
// not run, the run's status is a failure and the last line names every
// failed phase.
func TestPhasesRunAfterFailure(t *testing.T) {
	for _, tool := range []string{"bash", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: %v", tool, err)
		}
	}
	dir := t.TempDir()
	script, err := os.ReadFile(filepath.Join(root(t), "scripts", "phases.sh"))
	if err != nil {
		t.Fatal(err)
	}
	// phases.sh works in its own parent directory, where the Makefile is.
	if err := os.Mkdir(filepath.Join(dir, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "scripts", "phases.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Makefile"), []byte(phasesMakefile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "scripts", "phases.sh"), "&img", "ok1", "bad", "two", "needsimg:img", "after")
	cmd.Env = append(os.Environ(), "MAKE=make")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() == 0 {
		t.Fatalf("phases.sh with failing phases: %v, want a non-zero exit status\n%s", err, out)
	}
	for _, f := range []string{"ran-ok1", "ran-two-b", "ran-img", "ran-after"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s: the phase did not run after an earlier one failed (%v)\n%s", f, err, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ran-needsimg")); err == nil {
		t.Errorf("needsimg ran although the phase it needs (img) failed\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := "phases: FAILED: bad, two, img, needsimg (not run)"
	if last := lines[len(lines)-1]; last != want {
		t.Errorf("last line %q, want %q\n%s", last, want, out)
	}
	if !strings.Contains(string(out), "needsimg (NOT RUN: needs img)") {
		t.Errorf("the table does not list needsimg as not run\n%s", out)
	}

	// All green: exit 0, no FAILED line; a phase that needs a background
	// phase waits for it and then runs.
	cmd = exec.Command(filepath.Join(dir, "scripts", "phases.sh"), "&ok1", "okimg:ok1", "after")
	cmd.Env = append(os.Environ(), "MAKE=make")
	if out, err := cmd.CombinedOutput(); err != nil || strings.Contains(string(out), "FAILED") {
		t.Errorf("phases.sh with passing phases: %v\n%s", err, out)
	}
}

// TestMakeTestCoversEveryTestPackage: every package under test/ is run by
// a phase of make test: the engine packages by their own phases (each
// needing the image), the rest by test-integration-host, which lists
// ./test/... less exactly those.
func TestMakeTestCoversEveryTestPackage(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(mk)
	engines := map[string]string{
		"test-docker": "./test/container/", "test-systemd": "./test/systemd/",
		"test-pod": "./test/pod/", "test-fleet": "./test/fleet/",
	}
	// make test's phase list (the recipe line, with its continuation).
	i := strings.Index(text, "./scripts/phases.sh ")
	if i < 0 {
		t.Fatal("Makefile: make test does not run scripts/phases.sh")
	}
	end := i
	for {
		nl := strings.IndexByte(text[end:], '\n')
		if nl < 0 || text[end+nl-1] != '\\' {
			end += max(nl, 0)
			break
		}
		end += nl + 1
	}
	phases := strings.Fields(strings.ReplaceAll(text[i:end], "\\", " "))[1:]
	for _, p := range []string{"test-unit", "test-fuzz", "test-integration", "test-vm", "image"} {
		if !slices.Contains(phases, p) {
			t.Errorf("make test's phases %v lack %s", phases, p)
		}
	}
	for target, pkg := range engines {
		if !slices.Contains(phases, target+":image") {
			t.Errorf("make test's phases %v lack %s:image (%s)", phases, target, pkg)
		}
		if !strings.Contains(text, "\n"+target+": image\n\t$(ENGINE_TEST) "+pkg+"\n") {
			t.Errorf("Makefile: %s does not run %s", target, pkg)
		}
		dir := "/" + strings.Trim(pkg, "./")
		if !strings.Contains(text, "-e "+dir+" ") && !strings.Contains(text, "-e "+dir+")") {
			t.Errorf("test-integration-host does not leave out %s (it has a phase of its own)", dir)
		}
	}
	// Every package directory under test/ is an engine package or is
	// listed by test-integration-host (go list ./test/...).
	if !strings.Contains(text, "$(GO) list ./test/...") {
		t.Error("test-integration-host does not list ./test/...")
	}
}

// TestMakeRunAndDemoSettings: make run passes BROKER_PORT to run.sh (its
// port could not be changed), and make help documents it and make demo's
// BROKER (undocumented before).
func TestMakeRunAndDemoSettings(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skipf("make is not installed: %v", err)
	}
	r := root(t)
	out, err := exec.Command("make", "-C", r, "-n", "run", "BROKER_PORT=4711").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "BROKER_PORT=4711 STR_BIN=") || !strings.Contains(string(out), "./scripts/run.sh") {
		t.Errorf("make -n run BROKER_PORT=4711: %v; want run.sh started with BROKER_PORT=4711\n%s", err, out)
	}
	out, err = exec.Command("make", "-C", r, "-s", "help").CombinedOutput()
	for _, want := range []string{"BROKER_PORT=N", "make demo", "BROKER=HOST:PORT"} {
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("make help: %v; want it to mention %q\n%s", err, want, out)
		}
	}
}
