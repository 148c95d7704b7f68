package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestBenchHelperProcess is not a test: the tests below re-execute the test
// binary into it so that `str bench spawn` (which makes its process a
// child subreaper) never changes the test process itself.
func TestBenchHelperProcess(t *testing.T) {
	if os.Getenv("STR_BENCH_HELPER") != "1" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv("STR_BENCH_ARGS")), &args); err != nil {
		os.Exit(99)
	}
	os.Exit(cmdBench(args))
}

// benchExec runs `str bench ARGS...` in a child process and returns its
// output line parsed into key=value pairs.
func benchExec(t *testing.T, args ...string) map[string]string {
	t.Helper()
	js, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchHelperProcess$")
	cmd.Env = append(os.Environ(), "STR_BENCH_HELPER=1", "STR_BENCH_ARGS="+string(js))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("str bench %v: %v\n%s", args, err, out)
	}
	kv := map[string]string{}
	for _, f := range strings.Fields(string(out)) {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = v
		}
	}
	return kv
}

// The driver waits for what the command leaves behind (it is a subreaper):
// an orphan that sleeps 0.3 s is reaped by it, so every spawn's full time
// includes that sleep, and the RAW file has one line per measured spawn.
func TestBenchSpawnReapsLeftovers(t *testing.T) {
	raw := filepath.Join(t.TempDir(), "raw")
	kv := benchExec(t, "spawn", "-n", "3", "-w", "1", "-l", "orphan", "-o", raw, "--",
		"/bin/sh", "-c", "sleep 0.3 & exit 0")
	if kv["label"] != "orphan" || kv["n"] != "3" || kv["leftovers"] != "3" || kv["fails"] != "0" {
		t.Fatalf("want label=orphan n=3 leftovers=3 fails=0, got %v", kv)
	}
	data, err := os.ReadFile(raw)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) != 3 {
		t.Fatalf("RAW has %d lines, want 3:\n%s", len(lines), data)
	}
	for _, l := range lines {
		f := strings.Fields(l) // lat_us cpu_us maxrss_kb status full_us
		if len(f) != 5 {
			t.Fatalf("RAW line %q: want 5 fields", l)
		}
		full, _ := strconv.ParseFloat(f[4], 64)
		if full < 300000 { // a lower bound by construction: the orphan sleeps 0.3 s
			t.Errorf("full_us %s < 300000: the orphan was not waited for (line %q)", f[4], l)
		}
	}
}

// A failing command is counted, not fatal; a missing one is an error.
func TestBenchSpawnCountsFailures(t *testing.T) {
	kv := benchExec(t, "spawn", "-n", "4", "-w", "0", "--", "false")
	if kv["n"] != "4" || kv["fails"] != "4" || kv["leftovers"] != "0" {
		t.Fatalf("want n=4 fails=4 leftovers=0, got %v", kv)
	}
	js, _ := json.Marshal([]string{"spawn", "-n", "1", "--", "/nonexistent/cmd"})
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchHelperProcess$")
	cmd.Env = append(os.Environ(), "STR_BENCH_HELPER=1", "STR_BENCH_ARGS="+string(js))
	if err := cmd.Run(); err == nil {
		t.Fatal("str bench spawn of a missing command succeeded")
	}
}

func TestBenchPercentile(t *testing.T) {
	s := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {0, 1}} {
		if got := benchPercentile(s, c.p); got != c.want {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want)
		}
	}
	if got := benchPercentile([]float64{7}, 50); got != 7 {
		t.Errorf("p50 of one sample = %v", got)
	}
}
