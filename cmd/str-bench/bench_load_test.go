package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBenchParseSchedstat(t *testing.T) {
	for _, c := range []struct {
		out       string
		run, wait time.Duration
		ok        bool
	}{
		{"35420118 52989047 66\n", 35420118, 52989047, true},
		{"hello\nworld\n1 2 3\n\n", 1, 2, true},
		{"0 0 0", 0, 0, true},
		{"1 2 3\nafter\n", 0, 0, false}, // not the last line
		{"1 2\n", 0, 0, false},
		{"1 2 3 4\n", 0, 0, false},
		{"1 -2 3\n", 0, 0, false},
		{"1 x 3\n", 0, 0, false},
		{"", 0, 0, false},
	} {
		run, wait, ok := benchParseSchedstat([]byte(c.out))
		if run != c.run || wait != c.wait || ok != c.ok {
			t.Errorf("%q: got %v %v %v, want %v %v %v", c.out, run, wait, ok, c.run, c.wait, c.ok)
		}
	}
}

// spawn --schedstat reads the command's own schedstat from the end of its
// stdout, however much it printed before; a command that prints none is
// counted in noschedstat and its RAW line says -1 -1.
func TestBenchSpawnSchedstat(t *testing.T) {
	raw := filepath.Join(t.TempDir(), "raw")
	kv := benchExec(t, "spawn", "--schedstat", "-n", "3", "-w", "1", "-o", raw, "--",
		"/bin/sh", "-c", "head -c 200000 /dev/zero | tr '\\0' x; echo; cat /proc/self/schedstat")
	if kv["n"] != "3" || kv["fails"] != "0" || kv["noschedstat"] != "0" || kv["cmd_run_p50_us"] == "" || kv["cmd_wait_p50_us"] == "" {
		t.Fatalf("want n=3 fails=0 noschedstat=0 and the cmd_ figures, got %v", kv)
	}
	rows, err := benchReadRaw(raw, "c", 1)
	if err != nil || len(rows) != 3 {
		t.Fatalf("RAW: %d rows, %v", len(rows), err)
	}
	for _, r := range rows {
		// Read from cat's own line. Its time on a CPU may read 0: the
		// kernel adds a running task's time at its next scheduling event,
		// which a short cat may not have met yet (seen in CI).
		if !r.sched || r.cmdRun < 0 || r.cmdWait < 0 {
			t.Errorf("row without the command's schedstat: %+v", r)
		}
	}

	raw2 := filepath.Join(t.TempDir(), "raw")
	kv = benchExec(t, "spawn", "--schedstat", "-n", "2", "-w", "0", "-o", raw2, "--", "/bin/echo", "no schedstat here")
	if kv["n"] != "2" || kv["fails"] != "0" || kv["noschedstat"] != "2" || kv["cmd_run_p50_us"] != "NaN" {
		t.Fatalf("want n=2 fails=0 noschedstat=2 cmd_run_p50_us=NaN, got %v", kv)
	}
	data, _ := os.ReadFile(raw2)
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(l); len(f) != 7 || f[5] != "-1" || f[6] != "-1" {
			t.Errorf("RAW line %q: want 7 fields ending -1 -1", l)
		}
	}
	rows, err = benchReadRaw(raw2, "c", 1)
	if err != nil || len(rows) != 2 || rows[0].sched {
		t.Errorf("RAW without schedstat: %+v %v", rows, err)
	}

	// Without --schedstat the RAW format is the 5 fields it always was.
	raw3 := filepath.Join(t.TempDir(), "raw")
	benchExec(t, "spawn", "-n", "1", "-w", "0", "-o", raw3, "--", "/bin/true")
	if data, _ := os.ReadFile(raw3); len(strings.Fields(string(data))) != 5 {
		t.Errorf("RAW without --schedstat: %q", data)
	}
}

// A spinner ends by itself once its time is up; bad flags are a usage error.
func TestBenchSpin(t *testing.T) {
	run := func(args ...string) int {
		js, _ := json.Marshal(args)
		cmd := exec.Command(os.Args[0], "-test.run=^TestBenchHelperProcess$")
		cmd.Env = append(os.Environ(), "STR_BENCH_HELPER=1", "STR_BENCH_ARGS="+string(js))
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return 0
	}
	if code := run("spin", "--for", "50ms"); code != 0 {
		t.Errorf("spin --for 50ms: exit %d", code)
	}
	for _, bad := range [][]string{{"spin"}, {"spin", "--for", "0s"}, {"spin", "--for", "1s", "extra"}, {"spin", "--for", "x"}} {
		if code := run(bad...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", bad, code, exitUsage)
		}
	}
}

func TestBenchParseLoad(t *testing.T) {
	cfg, err := benchParseLoad(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.spinners != 2*runtime.NumCPU() || cfg.rounds != 3 || cfg.n != 10 || cfg.conc != 4 || cfg.warmups != 1 ||
		cfg.loops != 2500000 || cfg.python != "/usr/bin/python3" || cfg.maxLoad != 10*time.Minute || cfg.str != "" || cfg.strB != "" || cfg.out != "" {
		t.Errorf("defaults: %+v", cfg)
	}
	cfg, err = benchParseLoad([]string{"--str", "bin/str", "--str-b", "/tmp/oldstr/str", "--spinners", "3", "--rounds", "2", "-n", "5",
		"-j", "1", "--loops", "100", "--python", "/usr/local/bin/python3", "--max-load", "2m", "--out", "/tmp/o"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := benchLoadConfig{str: "bin/str", strB: "/tmp/oldstr/str", spinners: 3, rounds: 2, n: 5, warmups: 1, conc: 1, loops: 100,
		python: "/usr/local/bin/python3", maxLoad: 2 * time.Minute, out: "/tmp/o"}
	if cfg != want {
		t.Errorf("flags:\n got %+v\nwant %+v", cfg, want)
	}
	for _, c := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--spinners", "0"}, "--spinners 0"},
		{[]string{"--rounds", "0"}, "at least 1"},
		{[]string{"-n", "0"}, "at least 1"},
		{[]string{"-j", "0"}, "at least 1"},
		{[]string{"--loops", "-3"}, "--loops -3"},
		{[]string{"--python", "python3"}, `--python "python3"`},
		{[]string{"--max-load", "0s"}, "--max-load 0s"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--nosuch"}, "nosuch"},
	} {
		if _, err := benchParseLoad(c.args, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one saying %q", c.args, err, c.want)
		}
	}
}

func TestBenchLoadCells(t *testing.T) {
	cfg := benchLoadDefaults()
	cfg.conc = 3
	cmd := benchLoadCommand(cfg.python, cfg.loops)
	ids := func(cells []*benchLoadCell) []string {
		var s []string
		for _, c := range cells {
			s = append(s, c.id)
		}
		return s
	}
	cells := benchLoadCells(cfg, "/b/str", "", "/usr/bin/bwrap", "/w")
	if got, want := ids(cells), []string{"load/plain", "load/bwrap-restrictive", "load/str-restrictive",
		"load-j3/plain", "load-j3/bwrap-restrictive", "load-j3/str-restrictive"}; !slices.Equal(got, want) {
		t.Errorf("cells %q, want %q", got, want)
	}
	for _, c := range cells {
		// Every cell runs the same command, at the end of its line.
		if !slices.Equal(c.argv[len(c.argv)-len(cmd):], cmd) {
			t.Errorf("%s: argv %q does not end with the command %q", c.id, c.argv, cmd)
		}
		if want := map[bool]int{false: 1, true: 3}[strings.HasPrefix(c.id, "load-j3/")]; c.jobs != want {
			t.Errorf("%s: jobs %d, want %d", c.id, c.jobs, want)
		}
		launcher := c.argv[:len(c.argv)-len(cmd)]
		switch c.launcher {
		case "plain":
			if len(launcher) != 0 {
				t.Errorf("%s: plain exec runs %q first", c.id, launcher)
			}
		case "str":
			if !slices.Equal(launcher, []string{"/b/str", "run", "--one-shot", "--profile", "restrictive", "--"}) {
				t.Errorf("%s: %q", c.id, launcher)
			}
		case "bwrap":
			if !slices.Equal(launcher, benchBwrapLine("/usr/bin/bwrap", "/w", true)) {
				t.Errorf("%s: %q is not the suite's restrictive line", c.id, launcher)
			}
		default:
			t.Errorf("%s: launcher %q", c.id, c.launcher)
		}
		args := c.spawnArgs("/b/str-bench", 7, 1, c.id, "/r", false)
		if !slices.Equal(args[:4], []string{"/b/str-bench", "spawn", "--schedstat", "-n"}) || slices.Contains(args, "-j") ||
			!slices.Equal(args[len(args)-len(c.argv)-1:], append([]string{"--"}, c.argv...)) {
			t.Errorf("%s: spawn args %q", c.id, args)
		}
	}
	cfg.conc = 1
	cells = benchLoadCells(cfg, "/b/str", "/old/str", "/usr/bin/bwrap", "/w")
	if got, want := ids(cells), []string{"load/plain", "load/bwrap-restrictive", "load/str-restrictive", "load/str-b-restrictive"}; !slices.Equal(got, want) {
		t.Errorf("with --str-b and -j 1: cells %q, want %q", got, want)
	}
	if argv := cells[3].argv; argv[0] != "/old/str" || !slices.Contains(argv, "--one-shot") {
		t.Errorf("str-b cell: %q", argv)
	}
	for _, c := range []struct{ n, jobs, want int }{{10, 1, 10}, {10, 4, 3}, {8, 4, 2}, {1, 4, 2}, {3, 2, 2}} {
		if got := benchLoadRunsPer(c.n, c.jobs); got != c.want {
			t.Errorf("benchLoadRunsPer(%d, %d) = %d, want %d", c.n, c.jobs, got, c.want)
		}
	}
}

func TestBenchCPUCgroupOf(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"9:name=systemd:/\n4:memory:/a/b\n1:cpu:/\n0::/\n", "v1 cpu:/"},
		{"3:cpu,cpuacct:/user.slice/x\n2:cpuset:/\n0::/user.slice/x\n", "v1 cpu:/user.slice/x"},
		{"2:cpuacct:/acct\n0::/system.slice/str.service\n", "v2 /system.slice/str.service"},
		{"0::/\n", "v2 /"},
		{"garbage\n", "?"},
	} {
		if got := benchCPUCgroupOf(c.in); got != c.want {
			t.Errorf("%q: %q, want %q", c.in, got, c.want)
		}
	}
}

// The report states the load and puts each wall ratio next to its CPU
// ratio and run-queue wait ratio, against bwrap at the same in-flight
// count; skipped and failed cells say why.
func TestBenchLoadReport(t *testing.T) {
	cfg := benchLoadDefaults()
	cfg.spinners, cfg.conc, cfg.rounds, cfg.n = 4, 2, 1, 2
	bl := newBenchLoad(cfg, "/b/str-bench", "/b/str", "/old/str", "/usr/bin/bwrap", "/w")
	bl.cgroup = "v1 cpu:/"
	bl.spinWall, bl.spinCPU = 30*time.Second, 45*time.Second
	row := func(id string, lat, cpu, run, wait float64) {
		for i := 0; i < 2; i++ {
			bl.rows = append(bl.rows, benchRow{cell: id, round: 1, lat: lat * 1000, cpu: cpu * 1000, full: lat * 1000, sched: true, cmdRun: run * 1000, cmdWait: wait * 1000})
		}
	}
	row("load/plain", 300, 60, 55, 240)
	row("load/bwrap-restrictive", 200, 62, 56, 120)
	row("load/str-restrictive", 220, 80, 57, 132)
	row("load/str-b-restrictive", 400, 81, 57, 300)
	row("load-j2/bwrap-restrictive", 250, 63, 56, 180)
	row("load-j2/str-restrictive", 250, 70, 56, 180)
	bl.cells[4].skip = "no | python" // load-j2/plain
	bl.errs["load-j2/str-b-restrictive"] = []string{"round 1: exit status 1: boom"}
	out := bl.report()
	for _, want := range []string{
		fmt.Sprintf("4 CPU spinners (str-bench spin; %.3g x nproc %d)", 4/float64(runtime.NumCPU()), runtime.NumCPU()),
		"str-bench's cgroup (v1 cpu:/), each in a session of its own",
		"they got 1.50 of the",
		"str run / bwrap, restrictive, one at a time                    wall   1.10x  CPU   1.29x  run-queue wait   1.10x",
		"str-b run / bwrap, restrictive, one at a time                  wall   2.00x  CPU   1.31x  run-queue wait   2.50x",
		"str run / str-b run, restrictive, one at a time                wall   0.55x",
		"str run / bwrap, restrictive, 2 in flight                      wall   1.00x  CPU   1.11x  run-queue wait   1.00x",
		"str-b run / bwrap, restrictive, 2 in flight                    wall     n/a",
		"| in flight | launcher | wall p50 | CPU p50 | run-queue wait p50 | wall / bwrap | CPU / bwrap | wait / bwrap |",
		"| 1 | plain exec (no sandbox) | 300.0 ms | 60.0 ms | 240.0 ms | 1.50x | 0.97x | 2.00x |",
		"| 1 | bubblewrap, restrictive line | 200.0 ms | 62.0 ms | 120.0 ms | 1.00x | 1.00x | 1.00x |",
		"| 1 | `str run --one-shot --profile restrictive` (/b/str) | 220.0 ms | 80.0 ms | 132.0 ms | 1.10x | 1.29x | 1.10x |",
		"| 1 | `str run --one-shot --profile restrictive` (/old/str) | 400.0 ms | 81.0 ms | 300.0 ms | 2.00x | 1.31x | 2.50x |",
		"| 2 | plain exec (no sandbox) | skipped: no / python | | | | | |",
		"| 2 | `str run --one-shot --profile restrictive` (/b/str) | 250.0 ms | 70.0 ms | 180.0 ms | 1.00x | 1.11x | 1.00x |",
		"| 2 | `str run --one-shot --profile restrictive` (/old/str) | - | - | - | - | - | - |",
		"(55 ms on a CPU, p50 of plain exec under the load)",
		"1 rounds x 2 runs per cell",
		"load-j2/plain: no | python",
		"load-j2/str-b-restrictive round 1: exit status 1: boom",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	if math.IsNaN(benchLoadGet(bl.stats(), "load/plain").p50) {
		t.Error("load/plain has no p50")
	}
}

// latency.svg gains an "under load" panel with the phase's cells that ran,
// labelled by launcher.
func TestBenchSVGUnderLoadPanel(t *testing.T) {
	st := &benchState{cfg: benchSuiteConfig{rounds: 1, n: 2}}
	if n := len(st.panels()); n != 3 {
		t.Fatalf("without the phase: %d panels, want 3", n)
	}
	cfg := benchLoadDefaults()
	cfg.conc = 1
	st.load = newBenchLoad(cfg, "/b/str-bench", "/b/str", "", "/usr/bin/bwrap", "/w")
	st.load.cells[0].skip = "no python"
	for _, c := range st.load.cells[1:] {
		st.rows = append(st.rows, benchRow{cell: c.id, round: 1, lat: 2e5, cpu: 6e4, full: 2e5})
	}
	panels := st.panels()
	if len(panels) != 4 || panels[3].title != "under load" {
		t.Fatalf("with the phase: %d panels, the last %q", len(panels), panels[len(panels)-1].title)
	}
	var labels []string
	for _, c := range panels[3].cells {
		labels = append(labels, c.label)
		if len(c.ms) != 1 || c.ms[0] != 200 {
			t.Errorf("%s: samples %v, want [200] ms", c.label, c.ms)
		}
	}
	if want := []string{"bwrap restrictive line", "str run --one-shot --profile restrictive"}; !slices.Equal(labels, want) {
		t.Errorf("labels %q, want %q", labels, want)
	}
	var buf strings.Builder
	if err := benchWriteSVG(&buf, st.svgHeading(), panels); err != nil || !strings.Contains(buf.String(), ">under load<") {
		t.Errorf("latency.svg: %v, under load panel drawn: %v", err, strings.Contains(buf.String(), ">under load<"))
	}
}
