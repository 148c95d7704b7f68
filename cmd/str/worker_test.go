package main

import (
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// goCommand is the go command, or the test fails (these tests build str
// the way make build does).
func goCommand(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to build str as make build does: %v", err)
	}
	return gobin
}

// TestStrLinksNoC: str's packages (not its tests) import no package with
// cgo files of its own, nor the Solace client library: with CGO_ENABLED=0
// it is a static program, and `str run` pays for no C start (issue 19).
// Standard-library packages with a pure-Go variant (net, os/user) do not
// count. The worker (cmd/str-worker) is where cgo lives.
func TestStrLinksNoC(t *testing.T) {
	cmd := exec.Command(goCommand(t), "list", "-deps", "-f", "{{.ImportPath}} {{.Standard}} {{len .CgoFiles}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("go list line %q", line)
		}
		n++
		if strings.HasPrefix(f[0], "solace.dev/") || (f[1] == "false" && f[2] != "0") {
			t.Errorf("%s (standard %s, %s cgo files) is linked into str; the worker's C belongs in cmd/str-worker", f[0], f[1], f[2])
		}
	}
	if n < 50 {
		t.Fatalf("go list named only %d packages", n)
	}
}

// TestStrLinksNoBrokerCode: str (run, bwrap, serve, profile, doctor)
// links none of the packages of the commands that talk to a broker: the
// worker, the broker, their transport and the worker's manifests are
// str-worker's (issue 30: `str run` pays for no package init of theirs).
func TestStrLinksNoBrokerCode(t *testing.T) {
	out, err := exec.Command(goCommand(t), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const module = "github.com/securetoolruntime/str/"
	for _, pkg := range strings.Fields(string(out)) {
		for _, not := range []string{"worker", "broker"} {
			if pkg == module+not || strings.HasPrefix(pkg, module+not+"/") {
				t.Errorf("%s is linked into str; it belongs in cmd/str-worker", pkg)
			}
		}
	}
}

// TestStrLinksNoYAML: str links no YAML decoder (issue 30): the embedded
// profiles and seccomp policies come decoded (go generate), and an
// operator's YAML is decoded by str-worker (decode.go).
func TestStrLinksNoYAML(t *testing.T) {
	out, err := exec.Command(goCommand(t), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "yaml") {
			t.Errorf("%s is linked into str; YAML is decoded by str-worker (profiles/profileyaml, seccomp/policyyaml)", pkg)
		}
	}
}

// buildStr builds str as make build does (CGO_ENABLED=0) into a new
// directory and returns its path.
func buildStr(t *testing.T) string {
	t.Helper()
	str := filepath.Join(t.TempDir(), "str")
	cmd := exec.Command(goCommand(t), "build", "-o", str, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	return str
}

// TestStrWorkerExecsStrWorker: the built str is static (no ELF
// interpreter: nothing is loaded before Go starts), and `str CMD ARGS` for
// CMD worker, broker, invoke and tools becomes `str-worker CMD ARGS` from
// str's directory in the same process (a container's PID 1 and systemd's
// main PID stay the worker's), with the environment passed on; without a
// str-worker beside it, each fails with exit 1 and a message naming the
// command, the path it looked at and how to get it; str doctor reports
// either case as information.
func TestStrWorkerExecsStrWorker(t *testing.T) {
	str := buildStr(t)

	// 1. static: no PT_INTERP, no dynamic section.
	f, err := elf.Open(str)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("str has a %v program header: it is not static", p.Type)
		}
	}
	f.Close()

	// 2. no worker beside it.
	worker := filepath.Join(filepath.Dir(str), workerProgram)
	commands := []string{"worker", "broker", "invoke", "tools"}
	var stderr bytes.Buffer
	for _, command := range commands {
		stderr.Reset()
		cmd := exec.Command(str, command, "--help")
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Fatalf("str %s without %s: %v, want exit 1; stderr:\n%s", command, worker, err, &stderr)
		}
		for _, want := range []string{"str " + command + ": ", worker, "no such file", "make build"} {
			if !strings.Contains(stderr.String(), want) {
				t.Errorf("str %s without %s: stderr lacks %q:\n%s", command, workerProgram, want, &stderr)
			}
		}
	}

	// str doctor says so (information: str run works without it).
	doctorLine := func() string {
		out, _ := exec.Command(str, "doctor").Output() // its exit status is about the sandbox, not the worker
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "worker program") {
				return l
			}
		}
		return ""
	}
	if l := doctorLine(); !strings.HasPrefix(l, "[info]") || !strings.Contains(l, "str worker, broker, invoke and tools cannot start") || !strings.Contains(l, worker) {
		t.Errorf("str doctor without %s: %q", workerProgram, l)
	}

	// 3. with one: a script that reports its pid, arguments and one
	// environment variable.
	script := "#!/bin/sh\necho \"pid=$$ argv0=$0 args=$* env=$STR_TEST_WORKER_ENV\"\n"
	if err := os.WriteFile(worker, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, command := range commands {
		cmd := exec.Command(str, command, "--embedded-broker", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "STR_TEST_WORKER_ENV=passed")
		var stdout bytes.Buffer
		stderr.Reset()
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("str %s with a %s beside it: %v\n%s", command, workerProgram, err, &stderr)
		}
		want := "pid=" + strconv.Itoa(cmd.Process.Pid) + " argv0=" + worker + " args=" + command + " --embedded-broker 127.0.0.1:0 env=passed\n"
		if got := stdout.String(); got != want {
			t.Errorf("str %s ran %q, want %q", command, got, want)
		}
	}
	if l := doctorLine(); !strings.HasPrefix(l, "[info]") || !strings.Contains(l, worker+" (str worker, broker, invoke and tools exec it)") {
		t.Errorf("str doctor with %s: %q", workerProgram, l)
	}
}
