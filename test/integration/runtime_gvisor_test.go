package integration

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// The runtime class gvisor (issue 33, docs/runtimes.md): the example
// profile examples/profiles/gvisor.yaml runs its tool under the real
// runsc of this machine (Debian's package runsc, make test-deps).

// gvisorProfile is the flags that select the example gvisor profile.
var gvisorProfile = []string{"--profile-dir", "../../examples/profiles", "--profile", "gvisor"}

// needRunsc skips without root or runsc (STR_MUST_WORK=1: fails).
func needRunsc(t *testing.T) {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("runsc"); err != nil {
		mustwork.Skip(t, "needs runsc on PATH (Debian: apt-get install runsc; make test-deps)")
	}
}

func gvisor(t *testing.T, args ...string) run {
	t.Helper()
	return str(t, append(append([]string(nil), gvisorProfile...), args...)...)
}

// Python runs, and what it runs on is gVisor's kernel, not this host's.
func TestGVisorRunsPythonOnGVisorsKernel(t *testing.T) {
	needRunsc(t)
	r := gvisor(t, "--", "python3", "-c", "print(1)")
	if r.Exit != 0 || r.Stdout != "1\n" {
		t.Fatalf("python3 -c 'print(1)': exit %d, stdout %q, stderr %s", r.Exit, r.Stdout, r.Stderr)
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	host := unix.ByteSliceToString(uts.Release[:])
	r = gvisor(t, "--", "python3", "-c", "import platform; print(platform.release()); print(open('/proc/version').read())")
	if r.Exit != 0 {
		t.Fatalf("exit %d: %s", r.Exit, r.Stderr)
	}
	release, _, _ := strings.Cut(r.Stdout, "\n")
	if release == host || release == "" {
		t.Errorf("the tool's kernel release is %q, the host's %q: not gVisor's", release, host)
	}
	// The namespaces class, for contrast, shows the host's kernel.
	ns := str(t, "--profile", "restrictive", "--", "uname", "-r")
	if strings.TrimSpace(ns.Stdout) != host {
		t.Errorf("namespaces: uname -r %q, want the host's %q", ns.Stdout, host)
	}
}

// Nothing is writable but the work dir (and the tmpfs): a write under
// /usr fails, one in the work dir reaches the host.
func TestGVisorWritesOnlyTheWorkDir(t *testing.T) {
	needRunsc(t)
	wd := worldDir(t)
	script := `
import os
for p in ["/usr/str-gvisor-probe", "/etc/str-gvisor-probe", "/str-gvisor-probe"]:
    try:
        open(p, "w").write("x")
        print("WROTE", p)
    except OSError as e:
        print("refused", p, e.errno)
open("out.txt", "w").write("from gvisor")
print(os.getcwd())
`
	r := gvisor(t, "--workdir", wd, "--", "python3", "-c", script)
	if r.Exit != 0 || strings.Contains(r.Stdout, "WROTE") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.Exit, r.Stdout, r.Stderr)
	}
	if !strings.Contains(r.Stdout, "\n"+wd+"\n") && !strings.HasSuffix(r.Stdout, wd+"\n") {
		t.Errorf("cwd is not the work dir %s: %s", wd, r.Stdout)
	}
	if got, err := os.ReadFile(filepath.Join(wd, "out.txt")); err != nil || string(got) != "from gvisor" {
		t.Errorf("work dir file on the host: %q, %v", got, err)
	}
	for _, p := range []string{"/usr/str-gvisor-probe", "/etc/str-gvisor-probe"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists on the host", p)
		}
	}
}

// The isolated policy leaves the tool only gVisor's own lo: a listener
// of this test on the host's loopback and on its other addresses is not
// reached, and the tool has no route out.
func TestGVisorIsolatedNetwork(t *testing.T) {
	needRunsc(t)
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	targets := []string{"127.0.0.1"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
				targets = append(targets, n.IP.String())
			}
		}
	}
	script := `
import socket, sys
port = int(sys.argv[1])
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, port), timeout=5).close()
        print("CONNECTED", host)
    except OSError as e:
        print("refused", host, e)
print([n for _, n in socket.if_nameindex()])
`
	r := gvisor(t, append([]string{"--", "python3", "-c", script, strconv.Itoa(port)}, targets...)...)
	if r.Exit != 0 || strings.Contains(r.Stdout, "CONNECTED") || !strings.Contains(r.Stdout, "['lo']") {
		t.Fatalf("exit %d\nstdout: %s\nstderr: %s", r.Exit, r.Stdout, r.Stderr)
	}
	select {
	case <-accepted:
		t.Fatal("the test's listener accepted a connection from the gvisor sandbox")
	default:
	}
}

// The wall-clock timeout kills the container (runsc kill), as under
// namespaces: the result says timed out, SIGKILL, and str run exits 124.
func TestGVisorTimeoutKills(t *testing.T) {
	needRunsc(t)
	r := gvisor(t, "--timeout", "1s", "--", "sleep", "600")
	if r.Exit != 124 || !r.Res.TimedOut || r.Res.Signal != 9 {
		t.Fatalf("exit %d, result %+v, stderr %s", r.Exit, r.Res, r.Stderr)
	}
}

// A tool's exit status and streams are its own.
func TestGVisorExitAndStreams(t *testing.T) {
	needRunsc(t)
	cmd := exec.Command(strBin, append(append([]string{"run"}, gvisorProfile...), "--", "sh", "-c", "read x; echo out:$x; echo err >&2; exit 7")...)
	cmd.Stdin = strings.NewReader("in\n")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	_ = cmd.Run()
	if cmd.ProcessState.ExitCode() != 7 || out.String() != "out:in\n" || errb.String() != "err\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", cmd.ProcessState.ExitCode(), out.String(), errb.String())
	}
}

// A class the host cannot run is refused with the reason, never run
// under a weaker one: runsc out of PATH, microvm (not in this str), and a
// request asking a weaker class than its profile's.
func TestGVisorRefusedWithReason(t *testing.T) {
	needRoot(t)
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"no runsc", []string{"PATH=/nonexistent"}, append(gvisorProfile[:4:4], "--", "/bin/true"), "runtime gvisor cannot run this sandbox here: runsc not found in PATH"},
		{"microvm", nil, []string{"--runtime", "microvm", "--", "/bin/true"}, "runtime microvm cannot run this sandbox here"},
		{"weaker", nil, append(gvisorProfile[:4:4], "--runtime", "namespaces", "--", "/bin/true"), "runtime namespaces asked, gvisor or stronger allowed"},
		{"proxy policy", nil, []string{"--runtime", "gvisor", "--", "/bin/true"}, "network policy allow_egress"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(strBin, append([]string{"run", "--one-shot"}, c.args...)...)
			cmd.Env = append(os.Environ(), c.env...)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != 125 || !strings.Contains(string(out), c.want) {
				t.Errorf("exit %d, output %s; want 125 and %q", code, out, c.want)
			}
		})
	}
}

// str runtimes lists the three classes with whether each runs here.
func TestStrRuntimesLists(t *testing.T) {
	out, err := exec.Command(strBin, "runtimes").CombinedOutput()
	if err != nil {
		t.Fatalf("str runtimes: %v\n%s", err, out)
	}
	for _, c := range []string{"namespaces  yes", "gvisor ", "microvm     no"} {
		if !strings.Contains(string(out), c) {
			t.Errorf("str runtimes lacks %q:\n%s", c, out)
		}
	}
	cmd := exec.Command(strBin, "runtimes")
	cmd.Env = append(os.Environ(), "PATH=/nonexistent")
	out, _ = cmd.CombinedOutput()
	if !strings.Contains(string(out), "gvisor      no   runsc not found in PATH") {
		t.Errorf("without runsc:\n%s", out)
	}
}

// A cancel (SIGTERM to str run) ends the container as under namespaces:
// SIGINT to the tool, SIGKILL after the grace; the result says cancelled.
func TestGVisorCancel(t *testing.T) {
	needRunsc(t)
	resFile := filepath.Join(t.TempDir(), "result.json")
	cmd := exec.Command(strBin, append(append([]string{"run", "--result", resFile}, gvisorProfile...),
		"--", "python3", "-c", "import time; print('started', flush=True); time.sleep(600)")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, len("started\n"))
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "started\n" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the tool's first line: %q, %v; stderr %s", line, err, errb.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	data, err := os.ReadFile(resFile)
	if err != nil {
		t.Fatalf("no result: %v; stderr %s", err, errb.String())
	}
	var res struct {
		Cancelled bool `json:"cancelled"`
		Signal    int  `json:"signal"`
	}
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	if !res.Cancelled || res.Signal == 0 {
		t.Fatalf("result %s; stderr %s", data, errb.String())
	}
}

// The plan's limits hold under gVisor: the rlimits inside (gVisor's
// kernel), and the cgroup limits on the container's cgroup runsc made
// (read on the host while the tool waits): memory as asked, pids the
// profile's plus the Sentry's allowance (launcher/gvisor.SentryTasks).
func TestGVisorLimits(t *testing.T) {
	needRunsc(t)
	cmd := exec.Command(strBin, append(append([]string{"run"}, gvisorProfile...), "--memory", "300Mi",
		"--", "python3", "-c", "import resource, sys; print(resource.getrlimit(resource.RLIMIT_NOFILE), flush=True); sys.stdin.read()")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); cmd.Wait() }()
	line := make([]byte, len("(128, 128)\n"))
	if _, err := io.ReadFull(out, line); err != nil || string(line) != "(128, 128)\n" {
		t.Fatalf("RLIMIT_NOFILE inside: %q, %v (want the profile's 128); stderr %s", line, err, errb.String())
	}
	read := func(patterns ...string) string {
		for _, p := range patterns {
			if m, _ := filepath.Glob(p); len(m) == 1 {
				b, err := os.ReadFile(m[0])
				if err == nil {
					return strings.TrimSpace(string(b))
				}
			}
		}
		t.Errorf("no single cgroup file of %v", patterns)
		return ""
	}
	if m := read("/sys/fs/cgroup/memory/str-gvisor/*/memory.limit_in_bytes", "/sys/fs/cgroup/str-gvisor/*/memory.max"); m != "314572800" {
		t.Errorf("the container's memory limit: %q, want 314572800 (300Mi)", m)
	}
	if p := read("/sys/fs/cgroup/pids/str-gvisor/*/pids.max", "/sys/fs/cgroup/str-gvisor/*/pids.max"); p != "96" {
		t.Errorf("the container's pids.max: %q, want 96 (the profile's 32 + 64 for the Sentry)", p)
	}
}

// Regular files given as stdin and stdout are read and written at their
// shared offsets, as under namespaces (this runsc alone would use its
// own, from 0: the caller's earlier output overwritten, its consumed
// input read again).
func TestGVisorStdioFileOffsets(t *testing.T) {
	needRunsc(t)
	dir := t.TempDir()
	in, err := os.Create(filepath.Join(dir, "in"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := in.WriteString("one\ntwo\nthree\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Seek(int64(len("one\n")), io.SeekStart); err != nil {
		t.Fatal(err)
	}
	outPath := filepath.Join(dir, "out")
	out, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := out.WriteString("first\n"); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(strBin, append(append([]string{"run"}, gvisorProfile...), "--", "cat")...)
	var errb bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("str run: %v; stderr %s", err, errb.String())
	}
	if _, err := out.WriteString("after\n"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(outPath)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "first\ntwo\nthree\nafter\n" {
		t.Fatalf("the output file reads %q, want \"first\\ntwo\\nthree\\nafter\\n\"", got)
	}
}
