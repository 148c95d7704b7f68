package main

// str-bench without a subcommand: the whole comparison of issue 10 item 6
// and issue 8's benchmark section, interleaved in one run. Every timed cell
// is a child process (str-bench spawn, str-bench echo, str-bench warm, or
// the str binary itself) so that the subreaper and wait4(-1) of the spawn
// driver never meet the workers this process keeps running.

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/launcher/resident"
	"golang.org/x/sys/unix"
)

const benchSuiteUsage = `usage: str-bench [--str PATH] [--str-b PATH] [--quick] [--out DIR] [--rounds R] [-n N] [--python PATH] [-k K] [--examples DIR] [--spinners S]

Measures str next to bubblewrap, plain exec and the kernel's clone floor,
interleaved in one run: R rounds, each running every cell once (N measured
spawns or invocations per cell per round), so that machine noise spreads
evenly over the cells. Compare the ratios, not the absolute numbers.

Cells, for /bin/true and for PYTHON -c pass: plain exec; the clone floor
(str-bench spawn --ns: clone(pid,mnt,ipc,uts) and exec from a resident
process, and the same with net and user namespaces); str run --profile
restrictive and standard; str run --serve through a str serve (restrictive,
a pool of 2) started for the run (root only; its CPU per call, the sandbox
and the refill included, added to the client's in the CPU ratio);
bubblewrap's restrictive and standard lines, and the same two lines run by
str bwrap.
Then: warm dispatch (str-bench warm); echo_tool
end to end through two throw-away workers with the embedded broker, one
with every tool's warm pool off (cold) and one with echo_tool's on (warm:
calls back to back, each meeting a pool still refilling after the one
before; and warm, pool ready: each call sent once the pool is ready again,
its worker CPU without the worker's CPU for the scrapes of /metrics that
pace it)
and through a third (root only) serving echo_tool from a per-tool template
(warm: template, network isolated; its CPU read from the worker's live
tree); invocations per second with 4 in flight next to bubblewrap + PYTHON
-c pass spawned 4 at a time; and the Pss of str's own processes per sandbox
while K tools sleep, next to bubblewrap's. Last, under load (str-bench
load, issue 29): S CPU spinners (default 2 x nproc; 0 skips the phase)
while R rounds of at most 10 runs per cell (--quick: 4) run a fixed python3 loop plain,
under bubblewrap's restrictive line and under str run --one-shot
--profile restrictive, one at a time and 4 in flight: the wall ratio next
to the CPU ratio and the command's run-queue wait.

Prints the table, the ratios, issue 19's and issue 20's target tables
(markdown: each row with this run's figure, its target and met/missed) and
the under-load table (markdown, stating the load) on stdout
and writes DIR/summary.txt (the same), DIR/samples.csv (cell,round,lat_us,cpu_us,full_us,status,cmd_run_us,cmd_wait_us) and
DIR/latency.svg. A progress line with an ETA goes to stderr. Cells that
cannot run here are skipped with the reason; without bubblewrap nothing is
compared (exit 1). Asserts nothing about the numbers.

The str measured is --str PATH (default: the str next to this binary, as
make build and scripts/bench.sh place them: bin/str beside bin/str-bench).
With --str-b PATH (another str, its str-worker beside it, e.g. an older
build) its cells run in the same rounds, interleaved with --str's and
bubblewrap's: str run --profile restrictive, str run --serve (back to back
and pool at rest) through its own str serve, echo_tool cold, warm, warm
pool ready and from a template through its own workers, and the Pss per
sandbox of str run and of the worker; each binary's str serve and workers
run with a state directory of their own (STR_STATE_DIR), and the under-load
phase runs it too (str-bench load --str-b). The report adds the A/B table:
each such row for --str (A) and --str-b (B), their ratios to bubblewrap's
and B/A.
Its building blocks run on their own too: str-bench spawn (the spawn driver
and the clone floor), str-bench echo (one worker end to end), and str-bench
warm (the warm pool's dispatch), str-bench load (the phase under load).
`

// benchSuiteConfig is what the flags decide.
type benchSuiteConfig struct {
	quick     bool
	out       string
	rounds, n int
	warmups   int    // unmeasured spawns per cell per round
	k         int    // concurrent sandboxes of the memory cells
	python    string // absolute interpreter path (a version-manager shim costs ~165 ms a start)
	examples  string // examples/tools (manifest.yaml, python/); "" = find it
	conc      int    // invocations in flight in the throughput cells (the worker's default)
	str       string // the str binary measured; "" = the str next to this binary
	strB      string // a second str binary measured in the same rounds; "" = none
	spinners  int    // the under-load phase's CPU spinners; 0 = no such phase
}

// benchParseSuite parses str-bench's flags. --quick changes the defaults
// (3 rounds of 10); an explicit --rounds or -n wins over it.
func benchParseSuite(args []string, stderr io.Writer) (benchSuiteConfig, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, benchSuiteUsage+"\nflags:\n"); fs.PrintDefaults() }
	cfg := benchSuiteConfig{conc: 4}
	fs.BoolVar(&cfg.quick, "quick", false, "3 rounds of 10: under a minute on 2 cores")
	fs.StringVar(&cfg.out, "out", "var/bench", "write summary.txt, samples.csv and latency.svg to `DIR`")
	fs.IntVar(&cfg.rounds, "rounds", 5, "rounds over all cells")
	fs.IntVar(&cfg.n, "n", 40, "measured spawns or invocations per cell per round")
	fs.IntVar(&cfg.k, "k", 8, "concurrent sandboxes of the memory cells")
	fs.IntVar(&cfg.spinners, "spinners", 2*runtime.NumCPU(), "CPU spinners of the last phase, under load (the default is 2 x nproc; 0: no such phase)")
	fs.StringVar(&cfg.python, "python", "/usr/bin/python3", "the Python of the python3 -c pass cells and of the workers (absolute `PATH`)")
	fs.StringVar(&cfg.str, "str", "", "the str binary measured (`PATH`; default: str next to this binary)")
	fs.StringVar(&cfg.strB, "str-b", "", "a second str binary (`PATH`, its str-worker beside it) whose cells run in the same rounds (the A/B table)")
	fs.StringVar(&cfg.examples, "examples", "", "the example tools `DIR` (default: examples/tools here or next to bin/)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.quick {
		if !set["rounds"] {
			cfg.rounds = 3
		}
		if !set["n"] {
			cfg.n = 10
		}
	}
	cfg.warmups = 3
	if cfg.quick {
		cfg.warmups = 2
	}
	if cfg.rounds < 1 || cfg.n < 1 || cfg.k < 1 {
		return cfg, fmt.Errorf("--rounds, -n and -k must be at least 1")
	}
	if cfg.spinners < 0 {
		return cfg, fmt.Errorf("--spinners %d: want 0 (no phase under load) or more", cfg.spinners)
	}
	if !filepath.IsAbs(cfg.python) {
		return cfg, fmt.Errorf("--python %q: want an absolute path", cfg.python)
	}
	return cfg, nil
}

// Kinds of cells.
const (
	cellSpawn = iota // str-bench spawn: one launcher command per spawn
	cellWarm         // str-bench warm: a pre-created sandbox's dispatch
	cellEcho         // str-bench echo against a worker
	cellTput         // str-bench spawn -j: spawns per second with conc in flight
)

// benchCell is one row of the table.
type benchCell struct {
	id     string // samples.csv's cell column: TARGET/LAUNCHER
	target string // the panel: true, py, echo
	title  string
	kind   int
	argv   []string     // spawn, tput: the command timed
	ns     string       // spawn: str-bench spawn --ns (the clone floor)
	worker *benchWorker // echo
	paced  bool         // echo: each call waits for the warm pool to be ready (str-bench echo --ready-from)
	tree   bool         // echo: the worker's CPU is its live tree's (benchTreeCPU), and every call must be a template call
	skip   string       // why it does not run here ("" = it runs)
	str    *benchStr    // the str binary the cell runs (nil: none), with its state directory
	row    string       // with str: the cell's id for --str (--str-b's cell of the row shares it)
}

// benchState is everything one run collects.
type benchState struct {
	cfg      benchSuiteConfig
	str      string      // the str binary measured (resolved)
	strs     []*benchStr // --str, then --str-b when given
	bench    string      // this binary (resolved): the spawn, warm and echo drivers
	bwrap    string
	cells    []*benchCell
	rows     []benchRow
	tput     map[string][]float64           // per-round invocations (or spawns) per second
	echoCPU  map[string][]float64           // per-round worker CPU per invocation, µs
	echoSelf map[string][]float64           // the same, the worker's own process only (no children), µs
	scrapeUs map[*benchWorker]float64       // a worker's own CPU per scrape of its /metrics, µs (scrapeCost)
	scrapes  map[string]int                 // a paced cell's scrapes over its rounds, taken out of its CPU
	pacedN   map[string]int                 // the paced calls of those rounds
	serveCPU map[string][]float64           // per-round str serve CPU per served spawn, with its children (the sandboxes), µs
	serveOwn map[string][]float64           // the same, str serve's own process only, µs
	warmKV   map[string][]map[string]string // per-round str-bench warm output
	errs     map[string][]string            // per-round failures of a cell's command
	echoOut  bytes.Buffer                   // str-bench echo's lines, as they came
	memory   []benchMemory
	memSkips []string
	notes    []string
	load     *benchLoad // the phase under load (nil: --spinners 0)
}

func benchSuite(args []string, stdout, stderr io.Writer) int {
	return benchMainOf(args, stdout, stderr, "str-bench", benchParseSuite, benchRunSuite)
}

// benchMainOf is a str-bench command that parses its flags, then runs
// until done or interrupted (SIGINT, SIGTERM), errors prefixed by name.
func benchMainOf[C any](args []string, stdout, stderr io.Writer, name string,
	parse func([]string, io.Writer) (C, error), run func(context.Context, C, io.Writer, io.Writer) (int, error)) int {
	cfg, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
	}
	return code
}

// benchBinaries finds what a run compares: bubblewrap, this binary and
// the str measured (flagPath: see benchStrBinary).
func benchBinaries(flagPath string) (bwrap, self, str string, err error) {
	if bwrap, err = exec.LookPath("bwrap"); err != nil {
		return "", "", "", errors.New("bubblewrap is missing, and str-bench compares against it: apt-get install bubblewrap")
	}
	self, err = os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return "", "", "", fmt.Errorf("this binary's path: %w", err)
	}
	if str, err = benchStrBinary(flagPath, self); err != nil {
		return "", "", "", err
	}
	return bwrap, self, str, nil
}

func benchRunSuite(ctx context.Context, cfg benchSuiteConfig, stdout, stderr io.Writer) (int, error) {
	// 1. What there is to compare with.
	bwrap, self, str, err := benchBinaries(cfg.str)
	if err != nil {
		return 1, err
	}
	strs := []*benchStr{{tag: benchTagA, path: str}}
	if cfg.strB != "" {
		strB, err := benchStrBinary(cfg.strB, self)
		if err != nil {
			return 1, fmt.Errorf("--str-b: %w", err)
		}
		strs = append(strs, &benchStr{tag: benchTagB, path: strB})
	}
	st := &benchState{cfg: cfg, str: str, strs: strs, bench: self, bwrap: bwrap, tput: map[string][]float64{}, echoCPU: map[string][]float64{}, echoSelf: map[string][]float64{},
		scrapeUs: map[*benchWorker]float64{}, scrapes: map[string]int{}, pacedN: map[string]int{},
		serveCPU: map[string][]float64{}, serveOwn: map[string][]float64{},
		warmKV: map[string][]map[string]string{}, errs: map[string][]string{}}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return 1, err
	}
	tmp, err := os.MkdirTemp("", "str-bench.")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(tmp)
	// The workers' work dirs live below tmp: each sandbox's init runs as a
	// host uid of its own and must be able to traverse it.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 1, err
	}
	work := filepath.Join(tmp, "w") // bwrap's --bind W W --chdir W
	if err := os.Mkdir(work, 0o755); err != nil {
		return 1, err
	}
	// The one-shot rows run str run as users type it: a resident launcher
	// it would find by itself would serve them instead.
	if sock := benchFoundResident(); sock != "" {
		return 1, fmt.Errorf("a resident launcher listens on %s, which str run uses by itself: the one-shot rows would be served by it; stop it for the run (systemctl stop str-serve)", sock)
	}
	// Each binary's state directory: on /run as root, as str's default
	// (/run/str) is; its socket outside it, where its one-shot runs do
	// not look for a resident launcher.
	stateParent := tmp
	if os.Geteuid() == 0 {
		stateParent = "/run"
	}
	for _, v := range strs {
		if v.state, err = os.MkdirTemp(stateParent, "str-bench-"+v.tag+"."); err != nil {
			return 1, err
		}
		defer os.RemoveAll(v.state)
		v.sock = filepath.Join(tmp, "serve-"+v.tag+".sock")
	}
	prog := newBenchProgress(stderr)
	defer prog.end()

	// 2. The cells, each tried once before anything is timed. The served
	// cells call a resident launcher started for this run (root only),
	// one per str binary.
	serveSkip := map[*benchStr]string{}
	for _, v := range strs {
		serveSkip[v] = v.startServe(ctx)
		defer v.stopServe()
	}
	st.cells = benchSpawnCells(cfg, strs, bwrap, work)
	for _, c := range st.cells {
		if c.str != nil && (strings.HasSuffix(c.row, "/str-serve") || strings.HasSuffix(c.row, "/str-serve-rest")) {
			c.skip = serveSkip[c.str]
		}
	}
	pythonOK := benchExecutable(cfg.python)
	for _, c := range st.cells {
		if c.target == "py" && !pythonOK {
			c.skip = fmt.Sprintf("no python at %s (--python)", cfg.python)
		}
	}
	prog.note("checking cells")
	for _, c := range st.cells {
		if c.skip == "" {
			c.skip = benchCheckSpawn(ctx, self, c)
		}
	}
	// Warm dispatch goes next to the clone floor.
	for i, c := range st.cells {
		if c.id == "true/floor-net-user" {
			st.cells = append(st.cells[:i+1], append([]*benchCell{benchWarmCell(ctx, self, cfg.python)}, st.cells[i+1:]...)...)
			break
		}
	}

	// 3. Each str binary's workers, and its echo cells: the cells of a row
	// next to each other in the rounds.
	var workers []*benchWorker
	defer func() {
		for _, w := range workers {
			w.stop()
		}
	}()
	var echo [][]*benchCell
	for _, v := range strs {
		cells, ws := st.echoCells(ctx, prog, v, pythonOK, tmp)
		workers = append(workers, ws...)
		echo = append(echo, cells)
	}
	for i := range echo[0] {
		for _, cells := range echo {
			st.cells = append(st.cells, cells[i])
		}
	}
	tput := &benchCell{id: "tput/bwrap-standard-py", target: "tput", kind: cellTput,
		title: fmt.Sprintf("bwrap standard line + python3 -c pass, %d in flight", cfg.conc),
		argv:  append(benchBwrapLine(bwrap, work, false), cfg.python, "-c", "pass")}
	if !pythonOK {
		tput.skip = fmt.Sprintf("no python at %s (--python)", cfg.python)
	} else if c := st.cell("py/bwrap-standard"); c != nil && c.skip != "" {
		tput.skip = c.skip
	}
	st.cells = append(st.cells, tput)

	// 4. The rounds: every runnable cell once per round, in a fixed order.
	var run []*benchCell
	for _, c := range st.cells {
		if c.skip == "" {
			run = append(run, c)
		}
	}
	extra := 1 + 2*len(strs) // the memory phases: bwrap, and the worker and str run of each str
	if cfg.spinners > 0 {
		extra++
	}
	prog.start(len(run), cfg.rounds, extra)
	for r := 1; r <= cfg.rounds; r++ {
		for i, c := range run {
			if ctx.Err() != nil {
				return 130, errors.New("interrupted")
			}
			prog.cell(i+1, r, c.id)
			t0 := time.Now()
			if err := st.runCell(ctx, c, r, tmp); err != nil {
				st.errs[c.id] = append(st.errs[c.id], fmt.Sprintf("round %d: %v", r, err))
			}
			prog.done(c.id, time.Since(t0))
		}
	}

	for _, c := range st.cells {
		if calls := st.pacedN[c.id]; c.paced && calls > 0 {
			st.notes = append(st.notes, fmt.Sprintf("%s: its worker CPU per call leaves out the pacing's own scrapes of /metrics "+
				"(%.1f per call, %.2f ms of the worker's CPU each, measured on it)", c.id, float64(st.scrapes[c.id])/float64(calls), st.scrapeUs[c.worker]/1000))
		}
	}

	// 5. Memory: K sandboxes at once, one launcher at a time; the workers
	// are stopped after their own.
	st.measureMemory(ctx, prog, func() {
		for _, w := range workers {
			st.notes = append(st.notes, w.poolMetrics()...)
			w.stop()
		}
	}, tmp, work)

	// 6. Under load (issue 29 item 3): last, so that its spinners disturb
	// no other cell; str serve is stopped first, its figures taken.
	if cfg.spinners > 0 {
		for _, v := range strs {
			v.stopServe()
		}
		lc := benchLoadDefaults()
		lc.spinners, lc.rounds, lc.n, lc.conc, lc.python = cfg.spinners, cfg.rounds, min(cfg.n, benchLoadMaxN), cfg.conc, cfg.python
		if cfg.quick {
			lc.n = min(cfg.n, benchLoadQuickN)
		}
		if err := lc.check(); err != nil {
			return exitUsage, err
		}
		strB := ""
		if len(strs) > 1 {
			strB = strs[1].path
		}
		st.load = newBenchLoad(lc, self, str, strB, bwrap, work)
		prog.phase(fmt.Sprintf("under load: %d spinners", lc.spinners))
		if err := st.load.run(ctx, prog, tmp); err != nil {
			if ctx.Err() != nil {
				return 130, err
			}
			st.notes = append(st.notes, "under load: "+err.Error())
		}
		st.rows = append(st.rows, st.load.rows...)
	}
	prog.finish()

	// 6. The report.
	report := st.report()
	fmt.Fprint(stdout, report)
	var errs []error
	write := func(name string, fill func(io.Writer) error) {
		path := filepath.Join(cfg.out, name)
		f, err := os.Create(path)
		if err == nil {
			err = fill(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", path, err))
		}
	}
	write("summary.txt", func(w io.Writer) error { _, err := io.WriteString(w, report); return err })
	write("samples.csv", func(w io.Writer) error { return benchWriteCSV(w, st.rows) })
	write("latency.svg", func(w io.Writer) error { return benchWriteSVG(w, st.svgHeading(), st.panels()) })
	write("echo.txt", func(w io.Writer) error { _, err := w.Write(st.echoOut.Bytes()); return err })
	if err := errors.Join(errs...); err != nil {
		return 1, err
	}
	fmt.Fprintf(stdout, "\nwritten: %s/{summary.txt,samples.csv,latency.svg,echo.txt}\n", cfg.out)
	return 0, nil
}

// echoCells are str binary v's echo_tool cells, cold, warm (back to back
// and pool ready) and from a template, with the throw-away workers they
// call: two (cold: every pool off; warm: echo_tool's on) and a third
// serving echo_tool from a per-tool template (issue 20, root only).
func (st *benchState) echoCells(ctx context.Context, prog *benchProgress, v *benchStr, pythonOK bool, tmp string) ([]*benchCell, []*benchWorker) {
	cfg := st.cfg
	cell := func(id, title string) *benchCell {
		return &benchCell{id: v.id(id), row: id, str: v, target: "echo", title: v.title(title), kind: cellEcho}
	}
	cold := cell("echo/cold", "echo_tool end to end, cold (warm: 0)")
	warm := cell("echo/warm", "echo_tool end to end, warm pool, back to back")
	// The same worker, each call sent once its pool is ready again: the
	// latency of a call meeting a pool at rest (back to back, each call
	// meets a pool still refilling after the call before).
	ready := cell("echo/warm-ready", "echo_tool end to end, warm pool ready")
	ready.paced = true
	tpl := cell("echo/template", "echo_tool end to end, per-tool template")
	tpl.tree = true
	var workers []*benchWorker
	switch examples, why := benchFindExamples(cfg.examples, st.bench); {
	case !pythonOK:
		cold.skip = fmt.Sprintf("no python at %s (--python)", cfg.python)
		warm.skip = cold.skip
	case why != "":
		cold.skip, warm.skip = why, why
	default:
		prog.note("starting the workers of " + v.tag)
		workers, cold.skip, warm.skip = benchStartWorkers(ctx, cfg, v, examples, tmp)
		for _, w := range workers {
			switch w.name {
			case v.id("cold"):
				cold.worker = w
			case v.id("warm"):
				warm.worker = w
			}
		}
	}
	ready.worker, ready.skip = warm.worker, warm.skip
	switch examples, why := benchFindExamples(cfg.examples, st.bench); {
	case cold.skip != "":
		tpl.skip = cold.skip
	case why != "":
		tpl.skip = why
	default:
		prog.note("starting the template worker of " + v.tag)
		tpl.worker, tpl.skip = benchStartTemplateWorker(ctx, cfg, v, examples)
		if tpl.worker != nil {
			workers = append(workers, tpl.worker)
		}
	}
	return []*benchCell{cold, warm, ready, tpl}, workers
}

// env is the environment of the cell's command: its str binary's
// (benchStr.env), else this process's (nil).
func (c *benchCell) env() []string {
	if c.str == nil {
		return nil
	}
	return c.str.env()
}

func (st *benchState) cell(id string) *benchCell {
	for _, c := range st.cells {
		if c.id == id {
			return c
		}
	}
	return nil
}

// benchBwrapLine is bubblewrap's standard line, or with restrictive its
// restrictive one (+ --unshare-net --clearenv), exactly as
// shared/spec/baseline.md measured them.
func benchBwrapLine(bwrap, work string, restrictive bool) []string {
	argv := []string{bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts"}
	if restrictive {
		argv = append(argv, "--unshare-net", "--clearenv")
	}
	return append(argv, "--ro-bind", "/", "/", "--tmpfs", "/tmp", "--bind", work, work, "--chdir", work, "--")
}

// benchSpawnCells are the launcher x target cells, in table order. The
// cells of str run --profile restrictive and str run --serve are built
// for each str binary of strs (its own str serve's socket), side by side;
// the others run the first (--str) only.
func benchSpawnCells(cfg benchSuiteConfig, strs []*benchStr, bwrap, work string) []*benchCell {
	targets := []struct {
		id, title string
		argv      []string
	}{
		{"true", "/bin/true", []string{"/bin/true"}},
		{"py", "python3 -c pass", []string{cfg.python, "-c", "pass"}},
	}
	a := strs[0]
	var cells []*benchCell
	for _, t := range targets {
		add := func(id, title, ns string, launcher ...string) *benchCell {
			c := &benchCell{id: t.id + "/" + id, target: t.id, title: t.title + ", " + title,
				kind: cellSpawn, ns: ns, argv: append(append([]string(nil), launcher...), t.argv...)}
			cells = append(cells, c)
			return c
		}
		// A str cell: v's, run with v's state directory.
		addStr := func(v *benchStr, id, title string, launcher func(v *benchStr) []string) {
			c := add(v.id(id), v.title(title), "", launcher(v)...)
			c.str, c.row = v, t.id+"/"+id
		}
		// A str cell of each binary.
		addEach := func(id, title string, launcher func(v *benchStr) []string) {
			for _, v := range strs {
				addStr(v, id, title, launcher)
			}
		}
		add("plain", "plain exec", "")
		add("floor", "clone floor (pid,mnt,ipc,uts)", "pid,mnt,ipc,uts")
		add("floor-net-user", "clone floor (+net,user)", "pid,mnt,ipc,uts,net,user")
		addEach("str-restrictive", "str run --profile restrictive", func(v *benchStr) []string {
			return []string{v.path, "run", "--profile", "restrictive", "--"}
		})
		addStr(a, "str-standard", "str run --profile standard", func(v *benchStr) []string {
			return []string{v.path, "run", "--profile", "standard", "--"}
		})
		served := func(v *benchStr) []string {
			return []string{v.path, "run", "--serve", v.sock, "--profile", "restrictive", "--"}
		}
		addEach("str-serve", "str run --serve (restrictive, through a resident str serve)", served)
		// The same, each call sent once str serve's refill after the last
		// one is done (its tree at rest: spawn --quiet), as the warm
		// pool's "pool ready" cell: the latency of a call that meets the
		// pre-built sandboxes at rest. Back to back, above, each call's
		// refill competes with the next call for the 2 CPUs.
		addEach("str-serve-rest", "str run --serve, pool at rest", served)
		add("bwrap-restrictive", "bwrap restrictive line", "", benchBwrapLine(bwrap, work, true)...)
		add("bwrap-standard", "bwrap standard line", "", benchBwrapLine(bwrap, work, false)...)
		// The same two lines run by str bwrap (issue 22): bubblewrap's
		// command line, str's sandbox (its standard profile underneath).
		addStr(a, "str-bwrap-restrictive", "str bwrap, the restrictive line", func(v *benchStr) []string {
			return append([]string{v.path, "bwrap"}, benchBwrapLine(bwrap, work, true)[1:]...)
		})
		addStr(a, "str-bwrap-standard", "str bwrap, the standard line", func(v *benchStr) []string {
			return append([]string{v.path, "bwrap"}, benchBwrapLine(bwrap, work, false)[1:]...)
		})
	}
	return cells
}

func benchExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// benchSpawnArgs is the str-bench spawn command line of a cell.
func benchSpawnArgs(self string, c *benchCell, n, warmups, jobs int, label, raw string, keepErr bool) []string {
	argv := []string{self, "spawn", "-n", strconv.Itoa(n), "-w", strconv.Itoa(warmups), "-l", label}
	if raw != "" {
		argv = append(argv, "-o", raw)
	}
	if jobs > 1 {
		argv = append(argv, "-j", strconv.Itoa(jobs))
	}
	if c.ns != "" {
		argv = append(argv, "--ns", c.ns)
	}
	if keepErr {
		argv = append(argv, "-e")
	}
	return append(append(argv, "--"), c.argv...)
}

// benchCheckSpawn runs a cell once through the driver and returns why it
// cannot be timed here ("" = it can).
func benchCheckSpawn(ctx context.Context, self string, c *benchCell) string {
	out, errOut, err := benchCommandEnv(ctx, 60*time.Second, c.env(), benchSpawnArgs(self, c, 1, 0, 1, "check", "", true)...)
	if err == nil && benchKV(out)["fails"] == "0" {
		return ""
	}
	return benchCheckWhy(out, errOut, err, "the command failed")
}

// benchCheckWhy is why a cell's check run failed: the driver's first
// line of stderr, else its error, else what (and its stdout); "(not
// root)" added when str-bench does not run as root.
func benchCheckWhy(out, errOut string, err error, what string) string {
	why := benchFirstLine(errOut)
	if why == "" && err != nil {
		why = err.Error()
	}
	if why == "" {
		why = what + " (" + strings.TrimSpace(out) + ")"
	}
	if os.Geteuid() != 0 {
		why += " (not root)"
	}
	return why
}

// benchWarmCell is the warm dispatch cell, tried once (-n 2): where the
// warm pool cannot run here it is skipped with the reason, never made up.
func benchWarmCell(ctx context.Context, self, python string) *benchCell {
	c := &benchCell{id: "true/warm-dispatch", target: "true", title: "warm dispatch (str-bench warm)", kind: cellWarm}
	if _, errOut, err := benchCommand(ctx, 2*time.Minute, self, "warm", "-n", "2", "--python", python); err != nil {
		c.skip = fmt.Sprintf("str-bench warm -n 2 --python %s: %v: %s", python, err, benchFirstLine(errOut))
	}
	return c
}

// benchStrBinary is the str binary measured: flagPath when given, else the
// str beside this binary (bin/str next to bin/str-bench). It must be an
// executable file; without one nothing is measured.
func benchStrBinary(flagPath, self string) (string, error) {
	p := flagPath
	if p == "" {
		p = filepath.Join(filepath.Dir(self), "str")
	}
	abs, err := filepath.Abs(p)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil || !benchExecutable(abs) {
		return "", fmt.Errorf("no str binary at %s (build it with make build, or pass --str PATH)", p)
	}
	return abs, nil
}

// runCell runs one cell for one round and collects its samples.
func (st *benchState) runCell(ctx context.Context, c *benchCell, round int, tmp string) error {
	cfg := st.cfg
	raw := filepath.Join(tmp, "raw")
	os.Remove(raw)
	defer os.Remove(raw)
	switch c.kind {
	case cellSpawn, cellTput:
		n, jobs := cfg.n, 1
		if c.kind == cellTput {
			n, jobs = max(cfg.n, 5*cfg.conc), cfg.conc
		}
		var serve *exec.Cmd // the str serve the cell calls
		if c.str != nil && (strings.HasSuffix(c.row, "/str-serve") || strings.HasSuffix(c.row, "/str-serve-rest")) {
			serve = c.str.serve
		}
		served := serve != nil && strings.HasSuffix(c.row, "/str-serve")
		var own0, all0 int64
		var serr0 error
		if served {
			own0, all0, serr0 = benchProcCPU(serve.Process.Pid)
		}
		args := benchSpawnArgs(st.bench, c, n, cfg.warmups, jobs, c.id, raw, false)
		if serve != nil && strings.HasSuffix(c.row, "/str-serve-rest") {
			args = slices.Insert(args, 2, "--quiet", strconv.Itoa(serve.Process.Pid))
		}
		out, errOut, err := benchCommandEnv(ctx, 20*time.Minute, c.env(), args...)
		if err != nil {
			return fmt.Errorf("%v: %s", err, benchFirstLine(errOut))
		}
		if served && serr0 == nil {
			// The server's CPU over the cell (its warm-ups included, each
			// a served call too), per call: the call, the sandbox it
			// reaped and the refill after it.
			if own1, all1, err := benchProcCPU(serve.Process.Pid); err == nil {
				calls := float64(n + cfg.warmups)
				st.serveCPU[c.id] = append(st.serveCPU[c.id], float64(all1-all0)/calls)
				st.serveOwn[c.id] = append(st.serveOwn[c.id], float64(own1-own0)/calls)
			}
		}
		rows, err := benchReadRaw(raw, c.id, round)
		if err != nil {
			return err
		}
		st.rows = append(st.rows, rows...)
		if c.kind == cellTput {
			if v, err := strconv.ParseFloat(benchKV(out)["per_sec"], 64); err == nil {
				st.tput[c.id] = append(st.tput[c.id], v)
			}
		}
	case cellWarm:
		out, errOut, err := benchCommand(ctx, 20*time.Minute, st.bench, "warm", "-n", strconv.Itoa(cfg.n), "--python", cfg.python, "-o", raw)
		if err != nil {
			return fmt.Errorf("%v: %s", err, benchFirstLine(errOut))
		}
		st.warmKV[c.id] = append(st.warmKV[c.id], benchKV(out))
		// Its samples when the RAW format is the one this code knows;
		// otherwise the report uses the printed percentiles.
		if rows, err := benchReadWarmRaw(raw, c.id, round); err == nil {
			st.rows = append(st.rows, rows...)
		}
	case cellEcho:
		w := c.worker
		argv := []string{st.bench, "echo", "--broker", w.broker, "--namespace", benchWorkerNamespace,
			"-n", strconv.Itoa(cfg.n), "-c", strconv.Itoa(cfg.conc), "--python", cfg.python, "-o", raw}
		calls := 3 + 2*cfg.n // 3 warm-ups, N one at a time, N with conc in flight
		if c.paced {
			argv = append(argv, "--ready-from", w.health)
			calls = 3 + cfg.n // no throughput phase
		}
		var tpl0 float64
		if c.tree {
			var err error
			if tpl0, err = benchTemplateCalls(ctx, w); err != nil {
				return err
			}
		}
		self0, cpu0, err0 := benchProcCPU(w.pid())
		if c.tree {
			cpu0, err0 = benchTreeCPU(w.pid())
		}
		out, errOut, err := benchCommandEnv(ctx, 20*time.Minute, w.env, argv...)
		self1, cpu1, err1 := benchProcCPU(w.pid())
		if c.tree {
			cpu1, err1 = benchTreeCPU(w.pid())
		}
		fmt.Fprintf(&st.echoOut, "%s round=%d %s", c.id, round, out)
		if err != nil {
			return fmt.Errorf("%v: %s", err, benchFirstLine(errOut))
		}
		if c.tree {
			// Every call of the round in a template, or its figures are
			// not the template's.
			tpl1, err := benchTemplateCalls(ctx, w)
			if err != nil {
				return err
			}
			if int(tpl1-tpl0) != calls {
				return fmt.Errorf("%d of %d calls served by a template (str_worker_template_calls_total; worker log %s)", int(tpl1-tpl0), calls, w.log)
			}
		}
		rows, err := benchReadLatencies(raw, c.id, round)
		if err != nil {
			return err
		}
		st.rows = append(st.rows, rows...)
		kv := benchKV(out)
		if v, err := strconv.ParseFloat(kv["invocations_per_s"], 64); err == nil {
			st.tput[c.id] = append(st.tput[c.id], v)
		}
		if err0 == nil && err1 == nil {
			// A paced cell's scrapes of /metrics are the bench's own
			// load on the worker, not the calls': taken out at the
			// worker's measured cost per scrape.
			var scrapeCPU float64
			if n, err := strconv.Atoi(kv["metrics_scrapes"]); err == nil && c.paced {
				scrapeCPU = float64(n) * st.scrapeCost(ctx, w)
				st.scrapes[c.id] += n
				st.pacedN[c.id] += cfg.n
			}
			st.echoCPU[c.id] = append(st.echoCPU[c.id], (float64(cpu1-cpu0)-scrapeCPU)/float64(calls))
			st.echoSelf[c.id] = append(st.echoSelf[c.id], (float64(self1-self0)-scrapeCPU)/float64(calls))
		}
	}
	return nil
}

// benchScrapesForCost scrapes of /metrics, benchScrapeGap apart, measure
// a worker's CPU per scrape: ~0.1 s of its CPU, against a clock tick of
// 10 ms. Apart, as the pacing scrapes (a scrape after a pause costs the
// worker 2-3 times one right after another: 0.70 against 0.27 ms).
const (
	benchScrapesForCost = 150
	benchScrapeGap      = 20 * time.Millisecond
)

// scrapeCost is w's own CPU in µs per scrape of its /metrics, measured
// once, outside any cell's figures (0 when it cannot be).
func (st *benchState) scrapeCost(ctx context.Context, w *benchWorker) float64 {
	if v, ok := st.scrapeUs[w]; ok {
		return v
	}
	st.scrapeUs[w] = 0
	self0, _, err := benchProcCPU(w.pid())
	if err != nil {
		return 0
	}
	for i := 0; i < benchScrapesForCost; i++ {
		if _, err := benchScrapeMetrics(ctx, w.health); err != nil {
			return 0
		}
		time.Sleep(benchScrapeGap)
	}
	self1, _, err := benchProcCPU(w.pid())
	if err != nil {
		return 0
	}
	st.scrapeUs[w] = float64(self1-self0) / benchScrapesForCost
	return st.scrapeUs[w]
}

// benchCommand runs argv with a timeout and returns its stdout and stderr.
func benchCommand(ctx context.Context, limit time.Duration, argv ...string) (string, string, error) {
	return benchCommandEnv(ctx, limit, nil, argv...)
}

// benchCommandEnv is benchCommand with the environment env (nil: this
// process's).
func benchCommandEnv(ctx context.Context, limit time.Duration, env []string, argv ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

// benchKV parses "k=v k=v" output (several lines are merged).
func benchKV(out string) map[string]string {
	kv := map[string]string{}
	for _, f := range strings.Fields(out) {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = v
		}
	}
	return kv
}

func benchFirstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}

// benchProcCPU is the CPU in µs of pid itself (utime+stime) and of pid
// with its reaped children (+ cutime+cstime), from /proc/PID/stat.
func benchProcCPU(pid int) (self, all int64, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: no comm", pid)
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 { // f[0] is field 3 (state); utime..cstime are fields 14-17
		return 0, 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	var ticks [4]int64
	for k, s := range f[11:15] {
		if ticks[k], err = strconv.ParseInt(s, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	// A clock tick is 10 ms (USER_HZ 100).
	return (ticks[0] + ticks[1]) * 10000, (ticks[0] + ticks[1] + ticks[2] + ticks[3]) * 10000, nil
}

// benchProgress is the progress line on stderr: one line rewritten in
// place on a terminal, one line per round (and per phase) otherwise.
type benchProgress struct {
	w       io.Writer
	tty     bool
	t0      time.Time
	cells   int
	rounds  int
	extra   int // phases after the rounds (memory)
	done_   int
	took    map[string][]time.Duration
	round   int
	pending bool // a progress line without its newline (terminal)
}

func newBenchProgress(w io.Writer) *benchProgress {
	p := &benchProgress{w: w, t0: time.Now(), took: map[string][]time.Duration{}}
	if f, ok := w.(*os.File); ok {
		_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
		p.tty = err == nil
	}
	return p
}

func (p *benchProgress) line(s string, final bool) {
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K%s", s)
		p.pending = !final
		if final {
			fmt.Fprintln(p.w)
		}
		return
	}
	fmt.Fprintln(p.w, s)
}

func (p *benchProgress) note(s string) { p.line("str-bench: "+s, !p.tty) }

func (p *benchProgress) start(cells, rounds, extra int) {
	p.cells, p.rounds, p.extra = cells, rounds, extra
}

// eta estimates what is left from each cell's mean duration so far (the
// overall mean for cells not yet seen) plus ~6 s per memory phase.
func (p *benchProgress) eta() time.Duration {
	left := p.cells*p.rounds - p.done_
	if p.done_ == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range p.took {
		for _, x := range d {
			sum += x
		}
	}
	mean := sum / time.Duration(p.done_)
	return time.Duration(left)*mean + time.Duration(p.extra)*6*time.Second
}

func (p *benchProgress) cell(i, round int, id string) {
	el := time.Since(p.t0).Round(time.Second)
	eta := "?"
	if p.done_ > 0 {
		eta = p.eta().Round(time.Second).String()
	}
	s := fmt.Sprintf("str-bench: round %d/%d, cell %d/%d %-24s elapsed %v, ETA %s", round, p.rounds, i, p.cells, id, el, eta)
	if p.tty || round != p.round {
		p.line(s, false)
	}
	p.round = round
}

func (p *benchProgress) done(id string, d time.Duration) {
	p.done_++
	p.took[id] = append(p.took[id], d)
}

func (p *benchProgress) phase(s string) {
	if p.extra > 0 {
		p.extra--
	}
	p.line(fmt.Sprintf("str-bench: %s, elapsed %v, ETA %v", s, time.Since(p.t0).Round(time.Second),
		(time.Duration(p.extra+1)*6*time.Second).Round(time.Second)), false)
}

// end ends a pending terminal line, so that what follows starts on its own.
func (p *benchProgress) end() {
	if p.pending {
		fmt.Fprintln(p.w)
		p.pending = false
	}
}

func (p *benchProgress) finish() {
	p.line(fmt.Sprintf("str-bench: done in %v", time.Since(p.t0).Round(time.Second)), true)
}

// report is the table, the ratios, throughput and memory, as text.
func (st *benchState) report() string {
	var b strings.Builder
	cfg := st.cfg
	st.header(&b)
	// The title column: the longest title's (at least 52).
	width := 52
	for _, c := range st.cells {
		if c.skip == "" {
			width = max(width, len(c.title))
		}
	}
	for _, m := range st.memory {
		width = max(width, len(m.title))
	}
	fmt.Fprintf(&b, "\n%-*s %8s %8s %8s %10s %6s %5s\n", width, "cell", "p50 ms", "p90 ms", "p99 ms", "cpu p50 ms", "n", "fails")
	stats := map[string]benchStats{}
	byCell := map[string][]benchRow{}
	for _, r := range st.rows {
		byCell[r.cell] = append(byCell[r.cell], r)
	}
	ms := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		return strconv.FormatFloat(v/1000, 'f', 2, 64)
	}
	var skipped []string
	var warmRows []benchWarmRow
	for _, c := range st.cells {
		if c.skip != "" {
			skipped = append(skipped, fmt.Sprintf("  %s: %s", c.id, c.skip))
			continue
		}
		switch c.kind {
		case cellSpawn, cellEcho:
			s := benchStatsOf(byCell[c.id])
			s.fails += len(st.errs[c.id]) * cfg.n
			if c.kind == cellEcho {
				s.cpuP50 = benchMedian(st.echoCPU[c.id])
			}
			stats[c.id] = s
			fmt.Fprintf(&b, "%-*s %8s %8s %8s %10s %6d %5d\n", width, c.title, ms(s.p50), ms(s.p90), ms(s.p99), ms(s.cpuP50), s.n, s.fails)
		case cellWarm:
			warmRows = benchWarmRowsOf(c.id, byCell, st.warmKV[c.id])
			for _, w := range warmRows {
				fmt.Fprintf(&b, "%-*s %8s %8s %8s %10s %6d %5d\n", width, "warm dispatch, handed over -> "+w.name, ms(w.stats.p50), ms(w.stats.p90), ms(w.stats.p99), "-", w.stats.n, w.stats.fails+len(st.errs[c.id])*cfg.n)
			}
		}
	}
	b.WriteString("(p50/p90/p99: until the launcher is reaped, echo: publish until reply; cpu: user+sys of the whole tree from wait4,\n" +
		" echo: the worker's CPU with its sandboxes per invocation; warm dispatch: str-bench warm, a pre-created sandbox with\n" +
		" the runner and a no-op tool imported, from the call handed over)\n")

	// Throughput.
	fmt.Fprintf(&b, "\n%-*s %10s   per round\n", width, fmt.Sprintf("throughput, %d in flight", cfg.conc), "inv/s p50")
	for _, c := range st.cells {
		if v := st.tput[c.id]; c.skip == "" && len(v) > 0 && (c.kind == cellEcho || c.kind == cellTput) {
			var per []string
			for _, x := range v {
				per = append(per, strconv.FormatFloat(x, 'f', 1, 64))
			}
			fmt.Fprintf(&b, "%-*s %10.1f   %s\n", width, c.title, benchMedian(v), strings.Join(per, " "))
		}
	}

	// Memory.
	if len(st.memory) > 0 || len(st.memSkips) > 0 {
		fmt.Fprintf(&b, "\nmemory: Pss of the launcher's own processes per sandbox while %d tools sleep at once (the tools not counted)\n", cfg.k)
		for _, m := range st.memory {
			fmt.Fprintf(&b, "%-*s %7.2f MiB  (%s)\n", width, m.title, m.perSandboxKB/1024, m.detail)
		}
		for _, s := range st.memSkips {
			fmt.Fprintf(&b, "  skipped: %s\n", s)
		}
		b.WriteString("(str run from a private copy of the binary, so only its K launchers share its pages; the worker's figure moves\n" +
			" by a few 100 KiB with its heap and the tools' sharing of libraries: near 0 means no per-sandbox str process)\n")
	}

	// Ratios.
	b.WriteString("\nratios (p50 unless said; <1 means str is faster or smaller; [target])\n")
	p50 := func(id string) float64 {
		if s, ok := stats[id]; ok && s.n > 0 {
			return s.p50
		}
		return math.NaN()
	}
	cpu := func(id string) float64 {
		if s, ok := stats[id]; ok {
			return s.cpuP50
		}
		return math.NaN()
	}
	ratio := func(label string, a, b2 float64, target string) {
		v := "n/a"
		if !math.IsNaN(a) && !math.IsNaN(b2) && b2 > 0 {
			v = strconv.FormatFloat(a/b2, 'f', 2, 64) + "x"
		}
		fmt.Fprintf(&b, "  %-66s %8s  %s\n", label, v, target)
	}
	// Issue 19's targets: one-shot /bin/true <= 1.4x (CPU <= 1.6x),
	// python <= 1.1x; through a resident launcher <= 1.0x and <= 0.9x.
	for _, t := range []struct{ id, name, oneShot, oneShotCPU, served string }{
		{"true", "/bin/true", "[<= 1.4]", "[<= 1.6]", "[<= 1.0]"},
		{"py", "python3 -c pass", "[<= 1.1]", "", "[<= 0.9]"},
	} {
		ratio("str run restrictive / bwrap restrictive, "+t.name, p50(t.id+"/str-restrictive"), p50(t.id+"/bwrap-restrictive"), t.oneShot)
		ratio("str run standard / bwrap standard, "+t.name, p50(t.id+"/str-standard"), p50(t.id+"/bwrap-standard"), "")
		ratio("CPU str run restrictive / bwrap restrictive, "+t.name, cpu(t.id+"/str-restrictive"), cpu(t.id+"/bwrap-restrictive"), t.oneShotCPU)
		ratio("CPU str run standard / bwrap standard, "+t.name, cpu(t.id+"/str-standard"), cpu(t.id+"/bwrap-standard"), "")
		ratio("str bwrap / bwrap, the restrictive line, "+t.name, p50(t.id+"/str-bwrap-restrictive"), p50(t.id+"/bwrap-restrictive"), "")
		ratio("str bwrap / bwrap, the standard line, "+t.name, p50(t.id+"/str-bwrap-standard"), p50(t.id+"/bwrap-standard"), "")
		ratio("str run --serve / bwrap restrictive, "+t.name, p50(t.id+"/str-serve"), p50(t.id+"/bwrap-restrictive"), t.served)
		ratio("str run --serve, pool at rest / bwrap restrictive, "+t.name, p50(t.id+"/str-serve-rest"), p50(t.id+"/bwrap-restrictive"), "")
		// The client's CPU plus the server's per call (the call, the
		// sandbox it reaps and the refill after it).
		served := math.NaN()
		if v := st.serveCPU[t.id+"/str-serve"]; len(v) > 0 {
			served = cpu(t.id+"/str-serve") + benchMedian(v) // both µs
		}
		ratio("CPU str run --serve (client + str serve) / bwrap restrictive, "+t.name, served, cpu(t.id+"/bwrap-restrictive"), "")
	}
	ratio("str run restrictive / clone floor (+net,user), /bin/true", p50("true/str-restrictive"), p50("true/floor-net-user"), "")
	if c := st.cell("true/warm-dispatch"); c != nil && c.skip == "" {
		for _, w := range warmRows {
			target := ""
			if strings.Contains(w.name, "run") {
				target = "[<= 1.0]"
			}
			ratio("warm dispatch "+w.name+" / clone floor (pid,mnt,ipc,uts)", w.stats.p50, p50("true/floor"), target)
		}
	} else if c != nil {
		fmt.Fprintf(&b, "  %-66s %8s  (%s)\n", "warm dispatch / clone floor", "skipped", c.skip)
	}
	ratio("echo_tool warm, pool ready / python3 -c pass", p50("echo/warm-ready"), p50("py/plain"), "[<= 1.0]")
	ratio("echo_tool warm, back to back (pool refilling) / python3 -c pass", p50("echo/warm"), p50("py/plain"), "")
	ratio("echo_tool cold / python3 -c pass", p50("echo/cold"), p50("py/plain"), "[<= 2.0]")
	tp := func(id string) float64 { return benchMedian(st.tput[id]) }
	ratio(fmt.Sprintf("inv/s echo_tool warm / bwrap + python3 -c pass, %d in flight", cfg.conc), tp("echo/warm"), tp("tput/bwrap-standard-py"), "[>= 1.0]")
	ratio(fmt.Sprintf("inv/s echo_tool cold / bwrap + python3 -c pass, %d in flight", cfg.conc), tp("echo/cold"), tp("tput/bwrap-standard-py"), "")
	ratio("echo_tool per-tool template / python3 -c pass", p50("echo/template"), p50("py/plain"), "[<= 0.4]")
	ratio(fmt.Sprintf("inv/s echo_tool per-tool template / bwrap + python3 -c pass, %d in flight", cfg.conc), tp("echo/template"), tp("tput/bwrap-standard-py"), "[>= 3.0]")
	mem := map[string]float64{}
	for _, m := range st.memory {
		mem[m.id] = m.perSandboxKB
	}
	memOr := func(id string) float64 {
		if v, ok := mem[id]; ok {
			return v
		}
		return math.NaN()
	}
	ratio("Pss per sandbox, str run / bwrap", memOr("str-run"), memOr("bwrap"), "[str <= 1 MiB]")
	ratio("Pss per sandbox, str worker / bwrap", memOr("worker"), memOr("bwrap"), "")
	if len(st.strs) > 1 {
		b.WriteString(benchABTable(st.strs[0].path, st.strs[1].path, st.abRows(p50, cpu, tp, memOr)))
	}

	// Issue 19's table, each row with its target (README.md's Results
	// table is this output and issue 20's).
	ratioOf := func(a, b2 float64) float64 {
		if b2 > 0 {
			return a / b2
		}
		return math.NaN()
	}
	echoMS := func(m map[string][]float64, id string) float64 {
		if len(m[id]) == 0 {
			return math.NaN()
		}
		return benchMedian(m[id]) / 1000
	}
	b.WriteString("\nissue 19 targets (markdown, for README.md; ratios against bubblewrap in this run)\n")
	b.WriteString(benchTargetsTable(benchTargets(benchFigures{
		trueRun: ratioOf(p50("true/str-restrictive"), p50("true/bwrap-restrictive")), trueRunCPU: ratioOf(cpu("true/str-restrictive"), cpu("true/bwrap-restrictive")),
		pyRun: ratioOf(p50("py/str-restrictive"), p50("py/bwrap-restrictive")), pyRunCPU: ratioOf(cpu("py/str-restrictive"), cpu("py/bwrap-restrictive")),
		launcherSelfMS: echoMS(st.echoSelf, "echo/cold"),
		echoColdMS:     echoMS(st.echoCPU, "echo/cold"), echoWarmMS: echoMS(st.echoCPU, "echo/warm"), echoReadyMS: echoMS(st.echoCPU, "echo/warm-ready"),
		tputCold: ratioOf(tp("echo/cold"), tp("tput/bwrap-standard-py")), tputColdIPS: tp("echo/cold"), tputBwrapIPS: tp("tput/bwrap-standard-py"),
		pssRunMiB: memOr("str-run") / 1024,
		trueServe: ratioOf(p50("true/str-serve"), p50("true/bwrap-restrictive")), pyServe: ratioOf(p50("py/str-serve"), p50("py/bwrap-restrictive")),
		trueRest: ratioOf(p50("true/str-serve-rest"), p50("true/bwrap-restrictive")), pyRest: ratioOf(p50("py/str-serve-rest"), p50("py/bwrap-restrictive")),
		serveOwnMS: echoMS(st.serveOwn, "true/str-serve"),
	})))

	// Issue 20's table (per-tool templates), the same way.
	p99 := func(id string) float64 {
		if s, ok := stats[id]; ok && s.n > 0 {
			return s.p99
		}
		return math.NaN()
	}
	perSec := func(id string) float64 { // one in flight: 1 / mean latency
		var sum float64
		var n int
		for _, r := range byCell[id] {
			if r.status == 0 {
				sum += r.lat
				n++
			}
		}
		if n == 0 || (st.cell(id) != nil && st.cell(id).skip != "") {
			return math.NaN()
		}
		return 1e6 / (sum / float64(n)) // lat in µs
	}
	tf := benchTemplateFigures{
		tput: ratioOf(tp("echo/template"), tp("tput/bwrap-standard-py")), tputIPS: tp("echo/template"), tputBwrapIPS: tp("tput/bwrap-standard-py"),
		p50: ratioOf(p50("echo/template"), p50("py/plain")), p50MS: p50("echo/template") / 1000, p99MS: p99("echo/template") / 1000, pyP50MS: p50("py/plain") / 1000,
		cpuMS:       echoMS(st.echoCPU, "echo/template"),
		oneTemplate: perSec("echo/template"), oneCold: perSec("echo/cold"), oneWarmReady: perSec("echo/warm-ready"), oneBwrap: perSec("py/bwrap-standard"),
	}
	b.WriteString("\nissue 20 targets (markdown, for README.md; per-tool templates, in this run)\n")
	b.WriteString(benchTargetsTable(benchTemplateTargets(tf)))
	b.WriteString(benchOneInFlight(tf))
	b.WriteString("(template: echo_tool with warm: template and network isolated, the worker's CPU read from its live tree (the template\n" +
		" reaps its calls, so their CPU is not in the worker's own cutime until the template ends))\n")

	if st.load != nil {
		b.WriteString("\n" + st.load.report())
	}

	if len(skipped) > 0 {
		b.WriteString("\nskipped:\n" + strings.Join(skipped, "\n") + "\n")
	}
	var failures []string
	for _, c := range st.cells {
		for _, e := range st.errs[c.id] {
			failures = append(failures, fmt.Sprintf("  %s %s", c.id, e))
		}
	}
	if len(failures) > 0 {
		b.WriteString("\nfailed runs (counted as n fails):\n" + strings.Join(failures, "\n") + "\n")
	}
	if len(st.notes) > 0 {
		b.WriteString("\nnotes:\n  " + strings.Join(st.notes, "\n  ") + "\n")
	}
	return b.String()
}

func (st *benchState) header(b *strings.Builder) {
	cfg := st.cfg
	kernel := "?"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	cgfs := "?"
	var sfs unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &sfs) == nil {
		cgfs = "tmpfs (v1)"
		if sfs.Type == unix.CGROUP2_SUPER_MAGIC {
			cgfs = "cgroup2"
		}
	}
	bw, _, _ := benchCommand(context.Background(), 10*time.Second, st.bwrap, "--version")
	mode := "full"
	if cfg.quick {
		mode = "quick"
	}
	fmt.Fprintf(b, "str-bench (%s): %s, kernel %s, %d CPUs, cgroup fs %s, uid %d\n", mode, time.Now().UTC().Format(time.RFC3339),
		kernel, runtime.NumCPU(), cgfs, os.Geteuid())
	fmt.Fprintf(b, "str %s; %s; python %s\n", st.str, strings.TrimSpace(bw), cfg.python)
	if len(st.strs) > 1 {
		fmt.Fprintf(b, "str-b %s, its cells in the same rounds (the A/B table)\n", st.strs[1].path)
	}
	fmt.Fprintf(b, "%d rounds x %d per cell, interleaved (every cell once per round); compare ratios, not absolute numbers\n", cfg.rounds, cfg.n)
}

// benchWarmRow is one phase reported by str-bench warm.
type benchWarmRow struct {
	name  string
	stats benchStats
}

// benchWarmPhases are the columns of str-bench warm's RAW lines that are
// times from the call's hand-over ("running_us done_us reaped_us ready_us
// exit_code"; ready_us is the pool's refill, not on a call's path).
var benchWarmPhases = []string{"running", "done", "reaped"}

// benchReadWarmRaw reads str-bench warm's RAW file as rows of the cells
// CELL-running, CELL-done and CELL-reaped.
func benchReadWarmRaw(path, cell string, round int) ([]benchRow, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []benchRow
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(l)
		if len(f) != 5 {
			return nil, fmt.Errorf("%s: line %q: want 5 fields", path, l)
		}
		var v [5]float64
		for i := range f {
			if v[i], err = strconv.ParseFloat(f[i], 64); err != nil {
				return nil, fmt.Errorf("%s: line %q: %w", path, l, err)
			}
		}
		for i, ph := range benchWarmPhases {
			rows = append(rows, benchRow{cell: cell + "-" + ph, round: round, lat: v[i], cpu: math.NaN(), full: math.NaN(), status: int(v[4])})
		}
	}
	return rows, nil
}

// benchWarmRowsOf is the warm cell's rows of the table: from its samples
// when there are any, else from the percentiles it printed.
func benchWarmRowsOf(cell string, byCell map[string][]benchRow, kv []map[string]string) []benchWarmRow {
	var rows []benchWarmRow
	for _, ph := range benchWarmPhases {
		if r := byCell[cell+"-"+ph]; len(r) > 0 {
			rows = append(rows, benchWarmRow{name: ph, stats: benchStatsOf(r)})
		}
	}
	if len(rows) > 0 {
		return rows
	}
	return benchWarmRows(kv)
}

// benchWarmRows turns str-bench warm's per-round key=value lines into
// one row per phase: every key PREFIXp50_us is a phase (PREFIX trimmed of
// "_"), its p50/p90/p99 the medians over the rounds.
func benchWarmRows(rounds []map[string]string) []benchWarmRow {
	phases := map[string]bool{}
	for _, kv := range rounds {
		for k := range kv {
			if p, ok := strings.CutSuffix(k, "p50_us"); ok {
				phases[p] = true
			}
		}
	}
	var names []string
	for p := range phases {
		names = append(names, p)
	}
	sort.Strings(names)
	var rows []benchWarmRow
	for _, p := range names {
		var p50, p90, p99 []float64
		s := benchStats{cpuP50: math.NaN()}
		for _, kv := range rounds {
			get := func(k string) float64 {
				v, err := strconv.ParseFloat(kv[p+k], 64)
				if err != nil {
					return math.NaN()
				}
				return v
			}
			if v := get("p50_us"); !math.IsNaN(v) {
				p50 = append(p50, v)
				p90 = append(p90, get("p90_us"))
				p99 = append(p99, get("p99_us"))
			}
			if n, err := strconv.Atoi(kv["n"]); err == nil {
				s.n += n
			}
			if f, err := strconv.Atoi(kv["fails"]); err == nil {
				s.fails += f
			}
		}
		s.p50, s.p90, s.p99 = benchMedian(p50), benchMedian(p90), benchMedian(p99)
		name := strings.Trim(p, "_")
		if name == "" {
			name = "all"
		}
		rows = append(rows, benchWarmRow{name: name, stats: s})
	}
	// Phases in the order they happen: the earlier one has the smaller p50.
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].stats.p50 < rows[j].stats.p50 })
	return rows
}

func (st *benchState) svgHeading() string {
	return fmt.Sprintf("str-bench, %s, %d rounds x %d: latency per cell", time.Now().UTC().Format("2006-01-02 15:04Z"), st.cfg.rounds, st.cfg.n)
}

// panels groups the samples by target for latency.svg: /bin/true,
// python3 -c pass, and echo_tool next to python3 -c pass.
func (st *benchState) panels() []benchPanel {
	byCell := map[string][]float64{}
	for _, r := range st.rows {
		byCell[r.cell] = append(byCell[r.cell], r.lat/1000)
	}
	titles := map[string]string{}
	for _, c := range st.cells {
		titles[c.id] = c.title
	}
	panel := func(title string, ids ...string) benchPanel {
		p := benchPanel{title: title}
		for _, id := range ids {
			c := st.cell(id)
			if (c != nil && c.skip == "" && c.kind != cellWarm) || (c == nil && len(byCell[id]) > 0) {
				p.cells = append(p.cells, benchPanelCell{label: strings.TrimPrefix(titles[id], title+", "), ms: byCell[id]})
			}
		}
		return p
	}
	var trueIDs, pyIDs []string
	for _, c := range st.cells {
		if c.kind == cellSpawn && c.target == "true" {
			trueIDs = append(trueIDs, c.id)
		}
		if c.kind == cellWarm && c.skip == "" {
			for _, ph := range benchWarmPhases {
				if id := c.id + "-" + ph; len(byCell[id]) > 0 {
					titles[id] = "/bin/true, warm dispatch -> " + ph
					trueIDs = append(trueIDs, id)
				}
			}
		}
		if c.kind == cellSpawn && c.target == "py" {
			pyIDs = append(pyIDs, c.id)
		}
	}
	echoIDs := []string{"py/plain"}
	for _, c := range st.cells {
		if c.kind == cellEcho {
			echoIDs = append(echoIDs, c.id)
		}
	}
	panels := []benchPanel{
		panel("/bin/true", trueIDs...),
		panel("python3 -c pass", pyIDs...),
		panel("echo_tool end to end", echoIDs...),
	}
	if st.load != nil {
		var ids []string
		for _, c := range st.load.cells {
			if c.skip == "" {
				titles[c.id] = c.title
				ids = append(ids, c.id)
			}
		}
		panels = append(panels, panel("under load", ids...))
	}
	return panels
}

// benchFoundResident is the socket str run would use without --serve
// (resident.ImplicitSocket) when something listens there, else "".
func benchFoundResident() string {
	sock := resident.ImplicitSocket()
	if sock == "" {
		return ""
	}
	if _, _, err := resident.Listener(sock); err != nil {
		return ""
	}
	return sock
}
