// Package integration runs the real str binary and checks each sandbox
// property from inside a sandbox. The tests need root (CI runs as root);
// elsewhere they skip with the reason, and STR_MUST_WORK=1 turns every such
// skip into a failure.
package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher/writeback"
	"github.com/securetoolruntime/str/test/internal/strbuild"
)

// strBin is the str binary under test: $STR_BIN, or built once by TestMain.
var strBin string

func TestMain(m *testing.M) {
	// The build is world-readable: the rootless test's unprivileged user runs it.
	os.Exit(strbuild.Main(m, "../..", "integration", &strBin))
}

// needRoot is the precondition of every sandbox test here.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "needs root (CI runs as root): creates namespaces, mounts and cgroups")
	}
}

// result mirrors the JSON of str run --result.
type result struct {
	ExitCode        int      `json:"exit_code"`
	Signal          int      `json:"signal"`
	TimedOut        bool     `json:"timed_out"`
	OOMKilled       bool     `json:"oom_killed"`
	PidsLimit       bool     `json:"pids_limit_hit"`
	WallTimeMs      float64  `json:"wall_time_ms"`
	CPUTimeMs       float64  `json:"cpu_time_ms"`
	PeakMemoryBytes int64    `json:"peak_memory_bytes"`
	Warnings        []string `json:"warnings"`
	Resident        bool     `json:"resident"`
	SetupError      *struct {
		Step   int    `json:"step"`
		Action string `json:"action"`
		Path   string `json:"path"`
		Error  string `json:"error"`
	} `json:"setup_error"`
	WriteBack *writeback.Report `json:"write_back"`
}

type run struct {
	Stdout, Stderr string
	Exit           int
	Res            result
}

// str runs `str run --result FILE ARGS...` and returns what happened. The
// command is bounded by a generous backstop so a hang fails the test
// instead of the whole suite.
func str(t *testing.T, args ...string) run {
	t.Helper()
	resFile := filepath.Join(t.TempDir(), "result.json")
	full := append([]string{"run", "--result", resFile}, args...)
	cmd := exec.Command(strBin, full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatalf("start str: %v", err)
	}
	waitStarted(t, cmd, fmt.Sprintf("str %v", args), &errb)
	r := run{Stdout: out.String(), Stderr: errb.String(), Exit: cmd.ProcessState.ExitCode()}
	if data, err := os.ReadFile(resFile); err == nil {
		if err := json.Unmarshal(data, &r.Res); err != nil {
			t.Fatalf("result JSON: %v\n%s", err, data)
		}
	}
	return r
}

// sh runs a shell script in a sandbox of the given profile and requires
// exit 0.
func sh(t *testing.T, profile, script string, extra ...string) run {
	t.Helper()
	args := append([]string{"--profile", profile}, extra...)
	args = append(args, "--", "/bin/sh", "-c", script)
	r := str(t, args...)
	if r.Exit != 0 {
		t.Fatalf("profile %s: exit %d\nscript: %s\nstdout: %s\nstderr: %s", profile, r.Exit, script, r.Stdout, r.Stderr)
	}
	return r
}

// worldDir makes a directory the sandbox's uid 65534 can write.
func worldDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "str-wd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	if err := os.Chmod(d, 0o777); err != nil {
		t.Fatal(err)
	}
	return d
}

// findProcs returns the host pids whose command line contains marker.
func findProcs(marker string) []string {
	var pids []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cl, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && strings.Contains(strings.ReplaceAll(string(cl), "\x00", " "), marker) {
			pids = append(pids, e.Name())
		}
	}
	return pids
}

// eventually polls cond for up to limit (a bound on waiting, not a timing
// assertion: the property must hold at the end).
func eventually(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cond()
}

// strBackstop bounds one command a test waits for: a hang fails that test
// rather than the whole binary at its -test.timeout.
const strBackstop = 120 * time.Second

// waitStarted waits for the started cmd to exit; past strBackstop it kills
// it and fails the test, naming what with its stderr so far.
func waitStarted(t *testing.T, cmd *exec.Cmd, what string, stderr *bytes.Buffer) {
	t.Helper()
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(strBackstop):
		_ = cmd.Process.Kill()
		t.Fatalf("%s did not finish within %v; stderr: %s", what, strBackstop, stderr.String())
	}
}
