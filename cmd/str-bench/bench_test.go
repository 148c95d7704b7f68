package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/worker/manifest"
	"gopkg.in/yaml.v3"
)

// TestBenchHelperProcess is not a test: the tests below re-execute the test
// binary into it so that `str-bench spawn` (which makes its process a
// child subreaper) never changes the test process itself.
func TestBenchHelperProcess(t *testing.T) {
	if os.Getenv("STR_BENCH_HELPER") != "1" {
		return
	}
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv("STR_BENCH_ARGS")), &args); err != nil {
		os.Exit(99)
	}
	os.Exit(benchMain(args))
}

// benchExec runs `str-bench ARGS...` in a child process and returns its
// output line parsed into key=value pairs.
func benchExec(t *testing.T, args ...string) map[string]string {
	t.Helper()
	js, _ := json.Marshal(args)
	cmd := exec.Command(os.Args[0], "-test.run=^TestBenchHelperProcess$")
	cmd.Env = append(os.Environ(), "STR_BENCH_HELPER=1", "STR_BENCH_ARGS="+string(js))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("str-bench %v: %v\n%s", args, err, out)
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
		t.Fatal("str-bench spawn of a missing command succeeded")
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

func TestBenchStatsOf(t *testing.T) {
	var rows []benchRow
	for i := 1; i <= 10; i++ {
		rows = append(rows, benchRow{cell: "c", lat: float64(i * 1000), cpu: float64(i * 100), full: math.NaN()})
	}
	rows[9].status = 256 // exit 1
	rows = append(rows, benchRow{cell: "c", lat: 11000, cpu: math.NaN(), full: math.NaN()})
	st := benchStatsOf(rows)
	if st.n != 11 || st.fails != 1 || st.p50 != 6000 || st.p90 != 10000 || st.p99 != 11000 || st.min != 1000 {
		t.Errorf("stats = %+v", st)
	}
	if st.cpuP50 != 500 { // the sample without CPU is left out: 10 values, nearest rank 5
		t.Errorf("cpu p50 = %v, want 500", st.cpuP50)
	}
	if st := benchStatsOf(nil); st.n != 0 || !math.IsNaN(st.p50) {
		t.Errorf("no samples: %+v", st)
	}
	if got := benchMedian([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median = %v", got)
	}
}

func TestBenchWriteCSV(t *testing.T) {
	rows := []benchRow{
		{cell: "true/plain", round: 1, lat: 812.25, cpu: 700, full: 820, status: 0},
		{cell: "echo/cold, \"quoted\"", round: 2, lat: 40000, cpu: math.NaN(), full: math.NaN(), status: 256},
		{cell: "load/plain", round: 3, lat: 90000, cpu: 61000, full: 90100, sched: true, cmdRun: 58000.04, cmdWait: 30000},
	}
	var buf bytes.Buffer
	if err := benchWriteCSV(&buf, rows); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatalf("not CSV: %v\n%s", err, buf.String())
	}
	want := [][]string{
		{"cell", "round", "lat_us", "cpu_us", "full_us", "status", "cmd_run_us", "cmd_wait_us"},
		{"true/plain", "1", "812.2", "700.0", "820.0", "0", "", ""},
		{"echo/cold, \"quoted\"", "2", "40000.0", "", "", "256", "", ""},
		{"load/plain", "3", "90000.0", "61000.0", "90100.0", "0", "58000.0", "30000.0"},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Errorf("CSV:\n got %q\nwant %q", recs, want)
	}
}

// The chart parses as XML and has one panel per target, whatever the
// samples (none, one, a wide spread, labels that need escaping).
func TestBenchSVGWellFormed(t *testing.T) {
	st := &benchState{cfg: benchSuiteConfig{rounds: 2, n: 3}}
	st.cells = benchSpawnCells(benchSuiteConfig{python: "/usr/bin/python3"}, []*benchStr{{tag: benchTagA, path: "/bin/str", sock: "/tmp/serve.sock"}}, "/usr/bin/bwrap", "/tmp/w")
	st.cells = append(st.cells,
		&benchCell{id: "echo/cold", target: "echo", title: "echo_tool <cold> & \"warm: 0\"", kind: cellEcho},
		&benchCell{id: "echo/warm", target: "echo", title: "echo_tool warm", kind: cellEcho, skip: "no pool"},
		&benchCell{id: "true/warm-dispatch", target: "true", kind: cellWarm})
	for i, c := range st.cells {
		if c.skip != "" || c.id == "true/floor" { // a cell without samples
			continue
		}
		for j := 0; j < 50; j++ {
			st.rows = append(st.rows, benchRow{cell: c.id, round: 1 + j%2, lat: float64((i+1)*(j+1)) * 37, cpu: math.NaN(), full: math.NaN()})
		}
	}
	st.rows = append(st.rows, benchRow{cell: "true/plain", lat: 5e6}) // an outlier far out
	raw := filepath.Join(t.TempDir(), "warm.raw")
	if err := os.WriteFile(raw, []byte("330.1 870.0 5375.3 23105.9 0\n372.5 866.2 4999.7 22181.1 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	warmRows, err := benchReadWarmRaw(raw, "true/warm-dispatch", 1)
	if err != nil || len(warmRows) != 6 || warmRows[0].cell != "true/warm-dispatch-running" || warmRows[5].lat != 4999.7 {
		t.Fatalf("warm RAW: %v %+v", err, warmRows)
	}
	st.rows = append(st.rows, warmRows...)
	var buf bytes.Buffer
	if err := benchWriteSVG(&buf, st.svgHeading(), st.panels()); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(buf.Bytes()))
	panels, cells, depth := 0, 0, 0
	var texts []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("latency.svg is not well-formed XML: %v\n%s", err, buf.String())
		}
		if se, ok := tok.(xml.StartElement); ok {
			if depth == 0 && se.Name.Local != "svg" {
				t.Fatalf("root element %q, want svg", se.Name.Local)
			}
			depth++
			for _, a := range se.Attr {
				if a.Name.Local == "class" && a.Value == "panel" {
					panels++
				}
				if a.Name.Local == "class" && a.Value == "cell" {
					cells++
				}
			}
		}
		if _, ok := tok.(xml.EndElement); ok {
			depth--
		}
		if cd, ok := tok.(xml.CharData); ok {
			texts = append(texts, string(cd))
		}
	}
	for _, title := range []string{"/bin/true", "python3 -c pass", "echo_tool end to end"} {
		if !slices.Contains(texts, title) {
			t.Errorf("no panel titled %q", title)
		}
	}
	if panels != 3 {
		t.Errorf("%d panels, want 3 (/bin/true, python3 -c pass, echo)", panels)
	}
	// 11 /bin/true cells (the floor without samples; str bwrap's two and
	// the served pool-at-rest one included) + 3 warm dispatch phases, 11
	// python cells, echo cold (warm skipped).
	if cells != 27 {
		t.Errorf("%d cells drawn, want 27", cells)
	}
	if !strings.Contains(buf.String(), "latency, ms (log scale)") {
		t.Error("no axis label")
	}
}

// The floor cell: clone with namespace flags from the resident driver.
func TestBenchFloorCellRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "the floor cell needs root (CLONE_NEWPID|NEWNS|NEWIPC|NEWUTS without a user namespace)")
	}
	for _, ns := range []string{"pid,mnt,ipc,uts", "pid,mnt,ipc,uts,net,user"} {
		kv := benchExec(t, "spawn", "--ns", ns, "-n", "3", "-w", "1", "-l", "floor", "--", "/bin/true")
		if kv["n"] != "3" || kv["fails"] != "0" || kv["leftovers"] != "0" {
			t.Errorf("--ns %s: want n=3 fails=0 leftovers=0, got %v", ns, kv)
		}
	}
	// The child really is PID 1 of a new pid namespace.
	kv := benchExec(t, "spawn", "--ns", "pid,mnt,ipc,uts", "-n", "1", "-w", "0", "--", "/bin/sh", "-c", `test "$$" = 1`)
	if kv["fails"] != "0" {
		t.Errorf("the floor's child is not PID 1 of its namespace: %v", kv)
	}
}

func TestBenchCloneAttr(t *testing.T) {
	if sys, err := benchCloneAttr(""); sys != nil || err != nil {
		t.Errorf("no --ns: %v %v", sys, err)
	}
	sys, err := benchCloneAttr("pid,mnt,user")
	if err != nil || sys.Cloneflags != syscall.CLONE_NEWPID|syscall.CLONE_NEWNS|syscall.CLONE_NEWUSER ||
		len(sys.UidMappings) != 1 || sys.UidMappings[0].HostID != os.Getuid() || len(sys.GidMappings) != 1 {
		t.Errorf("pid,mnt,user: %+v %v", sys, err)
	}
	if _, err := benchCloneAttr("pid,time"); err == nil {
		t.Error("an unknown namespace was accepted")
	}
}

// -j keeps several spawns in flight and still counts every one.
func TestBenchSpawnParallel(t *testing.T) {
	raw := filepath.Join(t.TempDir(), "raw")
	kv := benchExec(t, "spawn", "-j", "3", "-n", "7", "-w", "1", "-o", raw, "--", "/bin/true")
	if kv["n"] != "7" || kv["jobs"] != "3" || kv["fails"] != "0" {
		t.Fatalf("want n=7 jobs=3 fails=0, got %v", kv)
	}
	rows, err := benchReadRaw(raw, "c", 1)
	if err != nil || len(rows) != 7 {
		t.Fatalf("RAW: %d rows, %v", len(rows), err)
	}
}

func TestBenchSuiteFlags(t *testing.T) {
	for _, c := range []struct {
		args              []string
		rounds, n, warmup int
		quick             bool
	}{
		{nil, 5, 40, 3, false},
		{[]string{"--quick"}, 3, 10, 2, true},
		{[]string{"-quick", "-n", "7"}, 3, 7, 2, true},
		{[]string{"--quick", "--rounds", "1", "--out", "/tmp/x"}, 1, 10, 2, true},
		{[]string{"--rounds", "2", "-n", "4"}, 2, 4, 3, false},
	} {
		cfg, err := benchParseSuite(c.args, io.Discard)
		if err != nil {
			t.Errorf("%q: %v", c.args, err)
			continue
		}
		if cfg.rounds != c.rounds || cfg.n != c.n || cfg.warmups != c.warmup || cfg.quick != c.quick || cfg.conc != 4 || cfg.k != 8 || cfg.spinners != 2*runtime.NumCPU() {
			t.Errorf("%q: got rounds=%d n=%d warmups=%d quick=%v conc=%d k=%d spinners=%d", c.args, cfg.rounds, cfg.n, cfg.warmups, cfg.quick, cfg.conc, cfg.k, cfg.spinners)
		}
	}
	if cfg, _ := benchParseSuite([]string{"--spinners", "0"}, io.Discard); cfg.spinners != 0 {
		t.Errorf("--spinners 0: %d", cfg.spinners)
	}
	if cfg, _ := benchParseSuite([]string{"--quick", "--out", "/tmp/x"}, io.Discard); cfg.out != "/tmp/x" {
		t.Errorf("--out: %q", cfg.out)
	}
	for _, bad := range [][]string{{"--rounds", "0"}, {"-n", "-1"}, {"extra"}, {"--python", "python3"}, {"--nosuch"}, {"--spinners", "-1"}} {
		if _, err := benchParseSuite(bad, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Without bubblewrap there is nothing to compare with: exit 1 and say how
// to install it. An unknown subcommand is a usage error that says so.
func TestBenchSuiteRefusesWithoutBwrap(t *testing.T) {
	run := func(env []string, args ...string) (int, string) {
		js, _ := json.Marshal(args)
		cmd := exec.Command(os.Args[0], "-test.run=^TestBenchHelperProcess$")
		cmd.Env = append(append(os.Environ(), env...), "STR_BENCH_HELPER=1", "STR_BENCH_ARGS="+string(js))
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	code, out := run([]string{"PATH=/nonexistent"}, "--quick", "--out", t.TempDir())
	if code != 1 || !strings.Contains(out, "apt-get install bubblewrap") {
		t.Errorf("without bwrap: exit %d, output %q", code, out)
	}
	code, out = run(nil, "nosuch")
	if code != exitUsage || !strings.Contains(out, benchUnknownCommand) {
		t.Errorf("unknown subcommand: exit %d, output %q", code, out)
	}
}

func TestBenchSetWarm(t *testing.T) {
	in := []byte("# comment\nversion: 1\ntools:\n  echo_tool:\n    module: m\n    function: f\n    warm: 3\n  other:\n    module: m\n    function: g\n")
	if n, ok := benchManifestWarm(in, "echo_tool"); !ok || n != 3 {
		t.Errorf("warm of echo_tool = %d %v", n, ok)
	}
	if _, ok := benchManifestWarm(in, "other"); ok {
		t.Error("other has no warm field")
	}
	out, err := benchSetWarm(in, func(string) (int, bool) { return 0, true })
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Version int
		Tools   map[string]map[string]any
	}
	if err := yaml.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	if m.Version != 1 || m.Tools["echo_tool"]["warm"] != 0 || m.Tools["other"]["warm"] != 0 || m.Tools["other"]["function"] != "g" {
		t.Errorf("rewritten manifest:\n%s", out)
	}
	out, err = benchSetWarm(in, func(tool string) (int, bool) { return 2, tool == "other" })
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := benchManifestWarm(out, "other"); n != 2 {
		t.Errorf("other: warm %d, want 2:\n%s", n, out)
	}
	if n, _ := benchManifestWarm(out, "echo_tool"); n != 3 {
		t.Errorf("echo_tool changed:\n%s", out)
	}
}

func TestBenchWarmRows(t *testing.T) {
	rounds := []map[string]string{
		{"n": "10", "fails": "0", "running_p50_us": "900", "running_p90_us": "1000", "running_p99_us": "1200", "reaped_p50_us": "1500"},
		{"n": "10", "fails": "1", "running_p50_us": "800", "running_p90_us": "950", "running_p99_us": "1100", "reaped_p50_us": "1400"},
		{"n": "10", "running_p50_us": "1000", "running_p90_us": "1100", "running_p99_us": "1300", "reaped_p50_us": "1600"},
	}
	rows := benchWarmRows(rounds)
	if len(rows) != 2 || rows[0].name != "running" || rows[1].name != "reaped" {
		t.Fatalf("rows %+v", rows)
	}
	r := rows[0].stats
	if r.p50 != 900 || r.p90 != 1000 || r.p99 != 1200 || r.n != 30 || r.fails != 1 {
		t.Errorf("running: %+v", r)
	}
}

// TestBenchWaitPoolReady: str-bench echo --ready-from waits until the
// pool's ready gauge equals its size (at least 1), and gives up with the
// last values it saw.
func TestBenchWaitPoolReady(t *testing.T) {
	var scrapes atomic.Int32
	pages := []string{
		"", // no pool yet
		`str_worker_warm_pool_size{tool="echo_tool"} 2` + "\n" + `str_worker_warm_pool_ready{tool="echo_tool"} 1` + "\n",
		`str_worker_warm_pool_ready{tool="other"} 2` + "\n" + `str_worker_warm_pool_size{tool="echo_tool"} 2` + "\n" + `str_worker_warm_pool_ready{tool="echo_tool"} 2` + "\n",
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(scrapes.Add(1)) - 1
		io.WriteString(w, "# HELP x\n"+pages[min(n, len(pages)-1)])
	}))
	defer hs.Close()
	n, err := benchWaitPoolReady(t.Context(), hs.URL, "echo_tool")
	if err != nil {
		t.Fatal(err)
	}
	if got := scrapes.Load(); got != 3 || n != 3 {
		t.Errorf("ready after %d scrapes (counted %d), want 3", got, n)
	}

	// A pool of 0 never counts as ready: the third scrape ends the wait
	// (no clock involved), and the error names what the second one said.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var emptyScrapes atomic.Int32
	empty := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if emptyScrapes.Add(1) == 3 {
			cancel()
			<-r.Context().Done() // the client gives up on this one
			return
		}
		io.WriteString(w, `str_worker_warm_pool_size{tool="echo_tool"} 0`+"\n"+`str_worker_warm_pool_ready{tool="echo_tool"} 0`+"\n")
	}))
	defer empty.Close()
	_, err = benchWaitPoolReady(ctx, empty.URL, "echo_tool")
	if err == nil || !strings.Contains(err.Error(), `(last: str_worker_warm_pool_ready{tool="echo_tool"} 0, str_worker_warm_pool_size{tool="echo_tool"} 0)`) {
		t.Errorf("empty pool: %v", err)
	}
}

// TestBenchTemplateManifest: the template worker's manifest, read by the
// worker's own parser, gives the example echo_tool a template with an
// isolated network (what worker/template.go requires) and every other
// tool no pool.
func TestBenchTemplateManifest(t *testing.T) {
	data, err := os.ReadFile("../../examples/tools/manifest.yaml")
	if err != nil {
		t.Fatal(err)
	}
	out, err := benchTemplateManifest(data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Parse(out, "manifest-template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Unavailable) > 0 {
		t.Errorf("entries refused: %v\n%s", m.Unavailable, out)
	}
	echo := m.Tools["echo_tool"]
	if echo == nil || !echo.Template || echo.Network == nil || echo.Network.Mode != egress.Isolated {
		t.Fatalf("echo_tool: %+v, want warm: template and network isolated:\n%s", echo, out)
	}
	for name, tool := range m.Tools {
		if name != "echo_tool" && (tool.Template || tool.Warm != 0) {
			t.Errorf("%s: warm %d template %v, want no pool", name, tool.Warm, tool.Template)
		}
	}
	// A manifest whose echo_tool already has both fields: replaced, not doubled.
	again, err := benchTemplateManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := manifest.Parse(again, "again"); err != nil || strings.Count(string(again), "warm: template") != 1 {
		t.Errorf("rewritten twice (%v):\n%s", err, again)
	}
}
