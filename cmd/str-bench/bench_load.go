package main

// str-bench load, and the suite's last phase: str run next to bubblewrap
// under the same background load (issue 29 item 3). A sandbox that weighs
// less than the process that asked for it shows here as a wall ratio far
// above its CPU ratio: the same CPU, spent later, after a longer wait on
// the run queue.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const benchLoadUsage = `usage: str-bench load [--str PATH] [--str-b PATH] [--spinners S] [--rounds R] [-n N] [-j J] [--loops L] [--python PATH] [--max-load D] [--out DIR]

Runs str next to bubblewrap under the same background load: S CPU
spinners (str-bench spin; default 2 x nproc), ordinary processes in this
process's cgroup, started after every cell was tried once and stopped at
the end (each also ends by itself after --max-load). Meanwhile R rounds,
each running every cell once (N runs per cell per round) in a fixed order,
one run at a time and then J in flight:
  plain exec; bwrap's restrictive line; str run --one-shot --profile
  restrictive; and with --str-b PATH the same with a second str binary
  (an older build next to the new one, in the same rounds).
Every run is the same command, a fixed amount of CPU work that ends by
printing its own /proc/self/schedstat:
  PYTHON -c 'for _ in range(L): pass' + 'print(open("/proc/self/schedstat").read())'
Reports per cell the p50 wall time (until the run's whole tree is reaped),
the CPU of that tree (wait4's rusage), the command's own time on a CPU and
waiting on the run queue (its schedstat), and the wall ratio str / bwrap
next to the CPU ratio, as text and as a markdown table. It states the load
(spinners, nproc, their cgroup, the CPU they got). Asserts nothing about
the numbers. The whole comparison (str-bench without a subcommand) ends
with the same phase.
`

// benchLoadConfig is what the flags of str-bench load decide (the suite
// fills it from its own).
type benchLoadConfig struct {
	str, strB string        // the str binaries measured ("" = the str next to this binary; strB "" = none)
	spinners  int           // CPU spinners for the whole phase
	rounds, n int           // rounds over all cells, runs per cell per round
	warmups   int           // unmeasured runs per cell per round
	conc      int           // runs in flight in the second set of cells (1 = no second set)
	loops     int           // the command's Python loop iterations
	python    string        // absolute interpreter path
	maxLoad   time.Duration // a spinner ends by itself after this long
	out       string        // write summary.txt and samples.csv here ("" = stdout only)
}

// benchLoadDefaults are str-bench load's defaults. The suite uses them too,
// with its rounds and at most benchLoadMaxN runs per cell per round.
func benchLoadDefaults() benchLoadConfig {
	return benchLoadConfig{spinners: 2 * runtime.NumCPU(), rounds: 3, n: 10, warmups: 1, conc: 4,
		loops: 2500000, python: "/usr/bin/python3", maxLoad: 10 * time.Minute}
}

// benchLoadMaxN caps the suite's runs per load cell per round (--quick:
// benchLoadQuickN): a run under load takes several times its CPU.
const (
	benchLoadMaxN   = 10
	benchLoadQuickN = 4
)

// benchParseLoad parses str-bench load's flags.
func benchParseLoad(args []string, stderr io.Writer) (benchLoadConfig, error) {
	fs := flag.NewFlagSet("bench load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, benchLoadUsage+"\nflags:\n"); fs.PrintDefaults() }
	cfg := benchLoadDefaults()
	fs.StringVar(&cfg.str, "str", "", "the str binary measured (`PATH`; default: str next to this binary)")
	fs.StringVar(&cfg.strB, "str-b", "", "a second str binary measured in the same rounds (`PATH`)")
	fs.IntVar(&cfg.spinners, "spinners", cfg.spinners, "CPU spinners of the background load (the default is 2 x nproc)")
	fs.IntVar(&cfg.rounds, "rounds", cfg.rounds, "rounds over all cells")
	fs.IntVar(&cfg.n, "n", cfg.n, "measured runs per cell per round")
	fs.IntVar(&cfg.conc, "j", cfg.conc, "runs in flight in the second set of cells (1: one at a time only)")
	fs.IntVar(&cfg.loops, "loops", cfg.loops, "the command's Python loop iterations (~20 ns each)")
	fs.StringVar(&cfg.python, "python", cfg.python, "the Python of the command (absolute `PATH`)")
	fs.DurationVar(&cfg.maxLoad, "max-load", cfg.maxLoad, "a spinner ends by itself after this long (a bound, should str-bench die)")
	fs.StringVar(&cfg.out, "out", "", "also write summary.txt and samples.csv to `DIR`")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return cfg, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return cfg, cfg.check()
}

// check is the configuration's one set of rules (the suite's too).
func (cfg benchLoadConfig) check() error {
	var errs []error
	if cfg.spinners < 1 {
		errs = append(errs, fmt.Errorf("--spinners %d: want at least 1 (the load is the point)", cfg.spinners))
	}
	if cfg.rounds < 1 || cfg.n < 1 || cfg.conc < 1 || cfg.loops < 1 || cfg.warmups < 0 {
		errs = append(errs, fmt.Errorf("--rounds %d, -n %d, -j %d, --loops %d: each must be at least 1", cfg.rounds, cfg.n, cfg.conc, cfg.loops))
	}
	if !filepath.IsAbs(cfg.python) {
		errs = append(errs, fmt.Errorf("--python %q: want an absolute path", cfg.python))
	}
	if cfg.maxLoad <= 0 {
		errs = append(errs, fmt.Errorf("--max-load %v: want a positive duration", cfg.maxLoad))
	}
	return errors.Join(errs...)
}

// benchLoadCommand is the command every load cell runs: a fixed amount of
// CPU work in the interpreter, then the command's own schedstat as its
// last line (str-bench spawn --schedstat). /proc/self is the command in
// every cell: str's sandbox mounts a /proc of its own, bwrap's lines keep
// the host's, where self is the reader either way.
func benchLoadCommand(python string, loops int) []string {
	return []string{python, "-c", fmt.Sprintf("for _ in range(%d): pass\nprint(open('/proc/self/schedstat').read().strip())", loops)}
}

// benchLoadCell is one row of the phase: a launcher running the command,
// one at a time or jobs in flight.
type benchLoadCell struct {
	id, title string
	launcher  string // plain, bwrap, str, str-b
	jobs      int
	argv      []string
	skip      string // why it does not run here ("" = it runs)
}

// benchLoadCells are the phase's cells in table order: plain exec, bwrap's
// restrictive line, str run (and str-b's) one at a time, then the same
// with conc in flight.
func benchLoadCells(cfg benchLoadConfig, str, strB, bwrap, work string) []*benchLoadCell {
	cmd := benchLoadCommand(cfg.python, cfg.loops)
	type launcher struct {
		id, name, title string
		argv            []string
	}
	launchers := []launcher{
		{"plain", "plain", "plain exec", nil},
		{"bwrap-restrictive", "bwrap", "bwrap restrictive line", benchBwrapLine(bwrap, work, true)},
		{"str-restrictive", "str", "str run --one-shot --profile restrictive", []string{str, "run", "--one-shot", "--profile", "restrictive", "--"}},
	}
	if strB != "" {
		launchers = append(launchers, launcher{"str-b-restrictive", "str-b", "str-b run --one-shot --profile restrictive",
			[]string{strB, "run", "--one-shot", "--profile", "restrictive", "--"}})
	}
	jobs := []int{1}
	if cfg.conc > 1 {
		jobs = append(jobs, cfg.conc)
	}
	var cells []*benchLoadCell
	for _, j := range jobs {
		for _, l := range launchers {
			c := &benchLoadCell{id: "load/" + l.id, title: "under load, " + l.title, launcher: l.name, jobs: j,
				argv: append(append([]string(nil), l.argv...), cmd...)}
			if j > 1 {
				c.id = fmt.Sprintf("load-j%d/%s", j, l.id)
				c.title = fmt.Sprintf("under load, %d in flight, %s", j, l.title)
			}
			cells = append(cells, c)
		}
	}
	return cells
}

// spawnArgs is the str-bench spawn command line of a load cell, one run
// at a time: --schedstat, so that each run's command reports its own
// waits. Runs in flight are that many drivers at once (runCell), each the
// subreaper of its own runs: a launcher's orphans (bwrap's pid 1 outlives
// bwrap) and their CPU are charged to the run that left them, which
// spawn -j cannot do.
func (c *benchLoadCell) spawnArgs(self string, n, warmups int, label, raw string, keepErr bool) []string {
	argv := []string{self, "spawn", "--schedstat", "-n", strconv.Itoa(n), "-w", strconv.Itoa(warmups), "-l", label}
	if raw != "" {
		argv = append(argv, "-o", raw)
	}
	if keepErr {
		argv = append(argv, "-e")
	}
	return append(append(argv, "--"), c.argv...)
}

// benchLoad is one run of the phase.
type benchLoad struct {
	cfg         benchLoadConfig
	self        string // this binary: the spawn driver and the spinners
	str, strB   string // resolved
	bwrap       string
	cells       []*benchLoadCell
	rows        []benchRow
	errs        map[string][]string // per-round failures of a cell's driver
	cgroup      string              // where the spinners (and the launchers) run: this process's cpu cgroup
	spinWall    time.Duration       // how long the spinners ran
	spinCPU     time.Duration       // the CPU they got in that time, all together
	spinEndedBy string              // why the load ended before the cells did ("" = it did not)
}

func newBenchLoad(cfg benchLoadConfig, self, str, strB, bwrap, work string) *benchLoad {
	return &benchLoad{cfg: cfg, self: self, str: str, strB: strB, bwrap: bwrap,
		cells: benchLoadCells(cfg, str, strB, bwrap, work), errs: map[string][]string{}, cgroup: benchCPUCgroup()}
}

// run tries every cell once (no load yet), starts the spinners, runs the
// rounds and stops the spinners. A cell that fails its try is skipped
// with the reason; a failed round is recorded in errs.
func (bl *benchLoad) run(ctx context.Context, prog *benchProgress, tmp string) error {
	cfg := bl.cfg
	if !benchExecutable(cfg.python) {
		for _, c := range bl.cells {
			c.skip = fmt.Sprintf("no python at %s (--python)", cfg.python)
		}
		return nil
	}
	for _, c := range bl.cells {
		c.skip = bl.check(ctx, c)
	}
	var run []*benchLoadCell
	for _, c := range bl.cells {
		if c.skip == "" {
			run = append(run, c)
		}
	}
	if len(run) == 0 {
		return nil
	}

	spin, err := benchStartSpinners(bl.self, cfg.spinners, cfg.maxLoad)
	if err != nil {
		return err
	}
	// Stopped on every path out: the load is bounded by this phase.
	defer func() {
		if spin != nil {
			spin.stop()
		}
	}()
	raw := filepath.Join(tmp, "load.raw")
	for r := 1; r <= cfg.rounds; r++ {
		for i, c := range run {
			if ctx.Err() != nil {
				return errors.New("interrupted")
			}
			if why := spin.ended(); why != "" {
				bl.spinEndedBy = why
				bl.errs[c.id] = append(bl.errs[c.id], fmt.Sprintf("round %d: not run: %s", r, why))
				continue
			}
			prog.line(fmt.Sprintf("str-bench: under load (%d spinners), round %d/%d, cell %d/%d %s, elapsed %v",
				cfg.spinners, r, cfg.rounds, i+1, len(run), c.id, time.Since(prog.t0).Round(time.Second)), false)
			if err := bl.runCell(ctx, c, r, raw); err != nil {
				bl.errs[c.id] = append(bl.errs[c.id], fmt.Sprintf("round %d: %v", r, err))
			}
		}
	}
	bl.spinWall, bl.spinCPU = spin.stop()
	spin = nil
	return nil
}

// check runs a cell once, without load: it must exit 0 and print its
// schedstat. It returns why the cell cannot run here ("" = it can).
func (bl *benchLoad) check(ctx context.Context, c *benchLoadCell) string {
	out, errOut, err := benchCommand(ctx, 60*time.Second, c.spawnArgs(bl.self, 1, 0, "check", "", true)...)
	kv := benchKV(out)
	if err == nil && kv["fails"] == "0" && kv["noschedstat"] == "0" {
		return ""
	}
	return benchCheckWhy(out, errOut, err, "the command failed or printed no schedstat")
}

// runCell runs one cell for one round and collects its samples: one
// spawn driver for a cell one at a time, c.jobs drivers started together
// for one in flight, each doing its share of the runs one after another.
func (bl *benchLoad) runCell(ctx context.Context, c *benchLoadCell, round int, raw string) error {
	per := benchLoadRunsPer(bl.cfg.n, c.jobs)
	errs := make(chan error, c.jobs)
	for j := 0; j < c.jobs; j++ {
		out := fmt.Sprintf("%s.%d", raw, j)
		os.Remove(out)
		go func() {
			_, errOut, err := benchCommand(ctx, 20*time.Minute, c.spawnArgs(bl.self, per, bl.cfg.warmups, c.id, out, false)...)
			if err != nil {
				err = fmt.Errorf("%v: %s", err, benchFirstLine(errOut))
			}
			errs <- err
		}()
	}
	var all []error
	for j := 0; j < c.jobs; j++ {
		all = append(all, <-errs)
	}
	for j := 0; j < c.jobs; j++ {
		out := fmt.Sprintf("%s.%d", raw, j)
		if rows, err := benchReadRaw(out, c.id, round); err == nil {
			bl.rows = append(bl.rows, rows...)
		} else if all[j] == nil {
			all = append(all, err)
		}
		os.Remove(out)
	}
	return errors.Join(all...)
}

// benchLoadRunsPer is each driver's share of a cell's runs in a round: n
// runs one at a time; with jobs in flight at least 2 each, so that most of
// every run overlaps the others'.
func benchLoadRunsPer(n, jobs int) int {
	if jobs <= 1 {
		return n
	}
	return max(2, (n+jobs-1)/jobs)
}

// benchLoadStats are one cell's figures (µs; NaN = none).
type benchLoadStats struct {
	benchStats
	runP50, waitP50 float64 // the command's own schedstat, p50
	noSched         int     // runs without it
}

func benchLoadStatsOf(rows []benchRow) benchLoadStats {
	s := benchLoadStats{benchStats: benchStatsOf(rows)}
	var run, wait []float64
	for _, r := range rows {
		if !r.sched {
			s.noSched++
			continue
		}
		run = append(run, r.cmdRun)
		wait = append(wait, r.cmdWait)
	}
	s.runP50, s.waitP50 = benchMedian(run), benchMedian(wait)
	return s
}

// stats is every cell's figures, failed rounds counted as n fails each.
func (bl *benchLoad) stats() map[string]benchLoadStats {
	byCell := map[string][]benchRow{}
	for _, r := range bl.rows {
		byCell[r.cell] = append(byCell[r.cell], r)
	}
	out := map[string]benchLoadStats{}
	for _, c := range bl.cells {
		if c.skip != "" {
			continue
		}
		s := benchLoadStatsOf(byCell[c.id])
		s.fails += len(bl.errs[c.id]) * bl.cfg.n
		out[c.id] = s
	}
	return out
}

// benchLoadGet is a cell's figures, all NaN for a cell not measured.
func benchLoadGet(st map[string]benchLoadStats, id string) benchLoadStats {
	if s, ok := st[id]; ok {
		return s
	}
	return benchLoadStatsOf(nil)
}

// loadLine states the load: how many spinners on how many CPUs, where,
// and the CPU they got.
func (bl *benchLoad) loadLine() string {
	cpus := runtime.NumCPU()
	got := ""
	if bl.spinWall > 0 {
		got = fmt.Sprintf("; they got %.2f of the %d CPUs over the %v they ran", bl.spinCPU.Seconds()/bl.spinWall.Seconds(), cpus, bl.spinWall.Round(time.Second))
	}
	return fmt.Sprintf("%d CPU spinners (str-bench spin; %.3g x nproc %d), ordinary processes in str-bench's cgroup (%s), each in a session of its own "+
		"(sched_autogroup %s), running through every round%s",
		bl.cfg.spinners, float64(bl.cfg.spinners)/float64(cpus), cpus, bl.cgroup, benchAutogroup(), got)
}

// benchAutogroup is the kernel's sched_autogroup setting: on, off or ?.
func benchAutogroup() string {
	b, err := os.ReadFile("/proc/sys/kernel/sched_autogroup_enabled")
	switch {
	case err != nil:
		return "?"
	case strings.TrimSpace(string(b)) == "0":
		return "off"
	}
	return "on"
}

// report is the phase as text: the load, the table, the ratios, and the
// markdown table for docs/performance.md.
func (bl *benchLoad) report() string {
	var b strings.Builder
	cfg := bl.cfg
	st := bl.stats()
	ms := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		return strconv.FormatFloat(v/1000, 'f', 2, 64)
	}
	fmt.Fprintf(&b, "under load: %s\n", bl.loadLine())
	fmt.Fprintf(&b, "command: %s -c 'for _ in range(%d): pass' + its schedstat; %d rounds x %d per cell (%d in flight: %d drivers x %d), interleaved\n",
		cfg.python, cfg.loops, cfg.rounds, cfg.n, cfg.conc, cfg.conc, benchLoadRunsPer(cfg.n, cfg.conc))
	if bl.strB != "" {
		fmt.Fprintf(&b, "str %s; str-b %s\n", bl.str, bl.strB)
	}
	fmt.Fprintf(&b, "\n%-60s %8s %8s %10s %10s %10s %5s %5s\n", "cell", "p50 ms", "p90 ms", "cpu p50 ms", "run p50 ms", "wait p50 ms", "n", "fails")
	var skipped []string
	for _, c := range bl.cells {
		if c.skip != "" {
			skipped = append(skipped, fmt.Sprintf("  %s: %s", c.id, c.skip))
			continue
		}
		s := st[c.id]
		fmt.Fprintf(&b, "%-60s %8s %8s %10s %10s %10s %5d %5d\n", c.title, ms(s.p50), ms(s.p90), ms(s.cpuP50), ms(s.runP50), ms(s.waitP50), s.n, s.fails)
	}
	b.WriteString("(p50/p90: until the run's whole tree is reaped; cpu: user+sys of that tree from wait4; run, wait: the command's\n" +
		" own time on a CPU and on the run queue, from its /proc/self/schedstat)\n")

	b.WriteString("\nratios under load (p50; the wall ratio next to the CPU ratio; <1 means str is faster)\n")
	ratio := func(a, b2 float64) string {
		if math.IsNaN(a) || math.IsNaN(b2) || b2 <= 0 {
			return "n/a"
		}
		return strconv.FormatFloat(a/b2, 'f', 2, 64) + "x"
	}
	for _, row := range bl.ratioRows() {
		a, base := benchLoadGet(st, row.a), benchLoadGet(st, row.b)
		fmt.Fprintf(&b, "  %-62s wall %7s  CPU %7s  run-queue wait %7s\n", row.label, ratio(a.p50, base.p50), ratio(a.cpuP50, base.cpuP50), ratio(a.waitP50, base.waitP50))
	}

	b.WriteString("\nissue 29 under load (markdown, for docs/performance.md; str and bubblewrap under the same load, in this run)\n")
	b.WriteString(bl.markdown(st))
	if len(skipped) > 0 {
		b.WriteString("\nskipped under load:\n" + strings.Join(skipped, "\n") + "\n")
	}
	var failures []string
	for _, c := range bl.cells {
		for _, e := range bl.errs[c.id] {
			failures = append(failures, fmt.Sprintf("  %s %s", c.id, e))
		}
	}
	if len(failures) > 0 {
		b.WriteString("\nfailed runs under load (counted as n fails):\n" + strings.Join(failures, "\n") + "\n")
	}
	if bl.spinEndedBy != "" {
		b.WriteString("\nthe load ended early: " + bl.spinEndedBy + "\n")
	}
	return b.String()
}

// benchLoadRatio is one ratio line: cell a over cell b.
type benchLoadRatio struct{ label, a, b string }

// ratioRows are the ratio lines: each str over bwrap, one at a time and in
// flight, and str over str-b when there is a second binary.
func (bl *benchLoad) ratioRows() []benchLoadRatio {
	var rows []benchLoadRatio
	prefixes := []struct{ id, what string }{{"load/", "one at a time"}}
	if bl.cfg.conc > 1 {
		prefixes = append(prefixes, struct{ id, what string }{fmt.Sprintf("load-j%d/", bl.cfg.conc), fmt.Sprintf("%d in flight", bl.cfg.conc)})
	}
	for _, p := range prefixes {
		rows = append(rows, benchLoadRatio{"str run / bwrap, restrictive, " + p.what, p.id + "str-restrictive", p.id + "bwrap-restrictive"})
		if bl.strB != "" {
			rows = append(rows, benchLoadRatio{"str-b run / bwrap, restrictive, " + p.what, p.id + "str-b-restrictive", p.id + "bwrap-restrictive"},
				benchLoadRatio{"str run / str-b run, restrictive, " + p.what, p.id + "str-restrictive", p.id + "str-b-restrictive"})
		}
		rows = append(rows, benchLoadRatio{"plain exec / bwrap, " + p.what, p.id + "plain", p.id + "bwrap-restrictive"})
	}
	return rows
}

// markdown is the phase's table for docs/performance.md: every cell with its wall,
// CPU and run-queue wait, each next to bwrap's (same in-flight count),
// under a line that states the load and the command.
func (bl *benchLoad) markdown(st map[string]benchLoadStats) string {
	var b strings.Builder
	cfg := bl.cfg
	work := "-"
	if s, ok := st["load/plain"]; ok && !math.IsNaN(s.runP50) {
		work = fmt.Sprintf("%.0f ms", s.runP50/1000)
	}
	fmt.Fprintf(&b, "Load: %s. Each run: `python3 -c` with a loop of %d iterations (%s on a CPU, p50 of plain exec under the load), "+
		"its wall time until its whole tree is reaped, the CPU of that tree, and the command's own run-queue wait from its schedstat; "+
		"%d rounds x %d runs per cell, interleaved.\n\n", bl.loadLine(), cfg.loops, work, cfg.rounds, cfg.n)
	b.WriteString("| in flight | launcher | wall p50 | CPU p50 | run-queue wait p50 | wall / bwrap | CPU / bwrap | wait / bwrap |\n" +
		"|---:|---|---:|---:|---:|---:|---:|---:|\n")
	x := func(a, b2 float64) string {
		if math.IsNaN(a) || math.IsNaN(b2) || b2 <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b2)
	}
	for _, c := range bl.cells {
		s, ok := st[c.id]
		if !ok {
			fmt.Fprintf(&b, "| %d | %s | skipped: %s | | | | | |\n", c.jobs, bl.markdownName(c), strings.ReplaceAll(c.skip, "|", "/"))
			continue
		}
		base := benchLoadGet(st, c.id[:strings.IndexByte(c.id, '/')+1]+"bwrap-restrictive") // the same in-flight count
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %s |\n", c.jobs, bl.markdownName(c),
			benchMS(s.p50/1000), benchMS(s.cpuP50/1000), benchMS(s.waitP50/1000),
			x(s.p50, base.p50), x(s.cpuP50, base.cpuP50), x(s.waitP50, base.waitP50))
	}
	return b.String()
}

// markdownName is a cell's launcher as docs/performance.md names it.
func (bl *benchLoad) markdownName(c *benchLoadCell) string {
	switch c.launcher {
	case "plain":
		return "plain exec (no sandbox)"
	case "bwrap":
		return "bubblewrap, restrictive line"
	case "str":
		if bl.strB != "" {
			return fmt.Sprintf("`str run --one-shot --profile restrictive` (%s)", bl.str)
		}
		return "`str run --one-shot --profile restrictive`"
	case "str-b":
		return fmt.Sprintf("`str run --one-shot --profile restrictive` (%s)", bl.strB)
	}
	return c.launcher
}

// benchCPUCgroup names this process's cgroup of the CPU controller: the
// v1 hierarchy with cpu among its controllers, else the v2 cgroup.
func benchCPUCgroup() string {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "?"
	}
	return benchCPUCgroupOf(string(data))
}

// benchCPUCgroupOf is benchCPUCgroup of a /proc/PID/cgroup text.
func benchCPUCgroupOf(procCgroup string) string {
	v2 := ""
	for _, l := range strings.Split(procCgroup, "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		for _, ctl := range strings.Split(f[1], ",") {
			if ctl == "cpu" {
				return "v1 cpu:" + f[2]
			}
		}
		if f[0] == "0" && f[1] == "" {
			v2 = "v2 " + f[2]
		}
	}
	if v2 != "" {
		return v2
	}
	return "?"
}

// benchSpinners are the background load's processes.
type benchSpinners struct {
	cmds   []*exec.Cmd
	exited []chan struct{} // closed once that spinner was reaped
	t0     time.Time
}

// benchStartSpinners starts n spinners (str-bench spin --for limit), each
// killed with this process's thread should str-bench die (Pdeathsig) and
// ending by itself after limit in any case. Each runs in a session of its
// own: with sched_autogroup (the default of most distributions' kernels) a
// session in the root cpu cgroup is one scheduling entity, so spinners
// sharing str-bench's session would weigh one process all together, not
// the load of n programs on the host.
func benchStartSpinners(self string, n int, limit time.Duration) (*benchSpinners, error) {
	sp := &benchSpinners{t0: time.Now()}
	for i := 0; i < n; i++ {
		cmd := exec.Command(self, "spin", "--for", limit.String())
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			sp.stop()
			return nil, fmt.Errorf("start spinner %d of %d: %w", i+1, n, err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		sp.cmds, sp.exited = append(sp.cmds, cmd), append(sp.exited, done)
	}
	return sp, nil
}

// ended says why the load is no longer what it was ("" = every spinner runs).
func (sp *benchSpinners) ended() string {
	for i, done := range sp.exited {
		select {
		case <-done:
			return fmt.Sprintf("spinner %d of %d exited after %v (%v; --max-load)", i+1, len(sp.cmds), time.Since(sp.t0).Round(time.Second), sp.cmds[i].ProcessState)
		default:
		}
	}
	return ""
}

// stop kills and reaps every spinner and returns how long they ran and
// the CPU they got together (their rusage).
func (sp *benchSpinners) stop() (wall, cpu time.Duration) {
	wall = time.Since(sp.t0)
	for _, c := range sp.cmds {
		_ = c.Process.Kill()
	}
	for i, done := range sp.exited {
		<-done
		if ps := sp.cmds[i].ProcessState; ps != nil {
			cpu += ps.UserTime() + ps.SystemTime()
		}
	}
	return wall, cpu
}

// benchSpin is str-bench spin --for D: one CPU spinner of the load phase,
// an ordinary process busy on one CPU until D has passed.
func benchSpin(args []string) int {
	fs := flag.NewFlagSet("bench spin", flag.ContinueOnError)
	d := fs.Duration("for", 0, "spin this long (`D`), then exit 0")
	if err := fs.Parse(args); err != nil || *d <= 0 || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: str-bench spin --for D")
		return exitUsage
	}
	runtime.GOMAXPROCS(1)
	// Reading the clock (vDSO: no system call) is the work: user time on
	// one CPU, no memory, nothing to optimise away.
	for deadline := time.Now().Add(*d); time.Now().Before(deadline); {
	}
	return 0
}

// benchLoadMain is str-bench load.
func benchLoadMain(args []string, stdout, stderr io.Writer) int {
	return benchMainOf(args, stdout, stderr, "str-bench load", benchParseLoad, benchRunLoad)
}

func benchRunLoad(ctx context.Context, cfg benchLoadConfig, stdout, stderr io.Writer) (int, error) {
	bwrap, self, str, err := benchBinaries(cfg.str)
	if err != nil {
		return 1, err
	}
	strB := ""
	if cfg.strB != "" {
		if strB, err = benchStrBinary(cfg.strB, self); err != nil {
			return 1, fmt.Errorf("--str-b: %w", err)
		}
	}
	tmp, err := os.MkdirTemp("", "str-bench-load.")
	if err != nil {
		return 1, err
	}
	defer os.RemoveAll(tmp)
	// bwrap's --bind W W --chdir W; a sandbox's uid must traverse tmp.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return 1, err
	}
	work := filepath.Join(tmp, "w")
	if err := os.Mkdir(work, 0o755); err != nil {
		return 1, err
	}
	prog := newBenchProgress(stderr)
	defer prog.end()
	bl := newBenchLoad(cfg, self, str, strB, bwrap, work)
	prog.note("checking cells")
	if err := bl.run(ctx, prog, tmp); err != nil {
		return 1, err
	}
	prog.finish()

	var b strings.Builder
	kernel := "?"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		kernel = unix.ByteSliceToString(u.Release[:])
	}
	bw, _, _ := benchCommand(ctx, 10*time.Second, bwrap, "--version")
	fmt.Fprintf(&b, "str-bench load: %s, kernel %s, %d CPUs, uid %d\nstr %s; %s; python %s\n\n", time.Now().UTC().Format(time.RFC3339),
		kernel, runtime.NumCPU(), os.Geteuid(), str, strings.TrimSpace(bw), cfg.python)
	b.WriteString(bl.report())
	report := b.String()
	fmt.Fprint(stdout, report)
	if cfg.out == "" {
		return 0, nil
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return 1, err
	}
	if err := os.WriteFile(filepath.Join(cfg.out, "summary.txt"), []byte(report), 0o644); err != nil {
		return 1, err
	}
	f, err := os.Create(filepath.Join(cfg.out, "samples.csv"))
	if err != nil {
		return 1, err
	}
	err = benchWriteCSV(f, bl.rows)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 1, err
	}
	fmt.Fprintf(stdout, "\nwritten: %s/{summary.txt,samples.csv}\n", cfg.out)
	return 0, nil
}
