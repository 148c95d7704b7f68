package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const benchUsage = `usage: str-bench spawn [-n N] [-w WARMUP] [-l LABEL] [-o RAW] [-e] [--ns LIST] [-j J] [--quiet PID] [--schedstat] -- CMD [ARGS...]

Spawns CMD N times in a row (after WARMUP unmeasured spawns), with no shell
and stdin/stdout/stderr on /dev/null, and prints one line of key=value
figures in microseconds:
  p50_us, p99_us, ...        fork+exec until CMD itself is reaped
  full_p50_us, full_p99_us   until every process CMD left behind is reaped
                             too (str-bench is a child subreaper)
  cpu_p50_us                 user+system CPU of CMD and of everything it left
  per_sec                    measured spawns per second of wall time
--ns pid,mnt,ipc,uts[,net,user,cgroup] clones CMD into new namespaces
straight from this resident process (Go's SysProcAttr; a user namespace
maps 0 to the caller's uid): the kernel's floor that a launcher is compared
with. -j J keeps J spawns in flight (throughput); then what CMD leaves
behind is reaped once at the end, not per spawn (full_us = lat_us).
--quiet PID waits, before each spawn, until PID's process tree (a
resident str serve and its pre-built sandboxes) ran less than 0.3 ms in
10 ms, i.e. its refill after the last call is done (at most 3 s; the line
then counts restless=N): a served call that meets the pool at rest.
--schedstat reads CMD's stdout through a pipe, whose last line must be
CMD's own /proc/self/schedstat ("run_ns wait_ns slices", printed as CMD's
last act): its time on a CPU and waiting on the run queue, whatever
sandbox CMD runs in. The line then adds cmd_run_p50_us, cmd_wait_p50_us
and noschedstat=N (spawns without that line), and RAW lines two fields,
"cmd_run_us cmd_wait_us" (-1 -1 for a spawn without it).
It is the driver of str-bench (the whole comparison, bench_suite.go), with
spawnloop.c's flags, output line and RAW format: one line per measured
spawn, "lat_us cpu_us maxrss_kb wait_status full_us". It asserts nothing
about the numbers.
`

// benchSample is one measured spawn.
type benchSample struct {
	lat, full, cpu time.Duration
	maxRSSKB       int64
	status         syscall.WaitStatus
	leftovers      int
	sched          bool          // --schedstat and CMD's last line was its schedstat
	cmdRun         time.Duration // that line: CMD's time on a CPU
	cmdWait        time.Duration // and waiting on a run queue
}

// benchLeftoverLimit bounds the wait for what a command leaves behind: a
// command that leaves a daemon running is an error, not a measurement.
const benchLeftoverLimit = 10 * time.Second

func benchSpawn(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("bench spawn", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, benchUsage+"\nflags:\n"); fs.PrintDefaults() }
	n := fs.Int("n", 200, "measured spawns")
	warm := fs.Int("w", 5, "unmeasured warm-up spawns")
	label := fs.String("l", "run", "label printed with the figures")
	rawPath := fs.String("o", "", "append one line per measured spawn to `RAW`")
	keepErr := fs.Bool("e", false, "keep CMD's stderr (debugging)")
	nsList := fs.String("ns", "", "clone CMD into these new namespaces (`LIST`: pid,mnt,ipc,uts,net,user,cgroup)")
	jobs := fs.Int("j", 1, "spawns in flight")
	quiet := fs.Int("quiet", 0, "before each spawn, wait until the process tree of `PID` (a resident str serve) is at rest: its refill done (one in flight only)")
	sched := fs.Bool("schedstat", false, "CMD prints its own /proc/self/schedstat last: report its run and run-queue wait times")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	argv := fs.Args()
	if len(argv) == 0 || *n < 1 || *warm < 0 || *jobs < 1 || (*quiet != 0 && *jobs != 1) {
		fs.Usage()
		return exitUsage
	}
	sys, err := benchCloneAttr(*nsList)
	if err != nil {
		fmt.Fprintln(os.Stderr, "str-bench spawn:", err)
		return exitUsage
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "str-bench:", err)
		return 1
	}

	// Orphans of CMD (a launcher's sandbox init still exiting, a daemon)
	// are re-parented to us rather than to init, so they are waited for and
	// charged to the spawn that left them.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "str-bench: PR_SET_CHILD_SUBREAPER:", err)
		return 1
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "str-bench:", err)
		return 1
	}
	defer devnull.Close()
	errFD := devnull.Fd()
	if *keepErr {
		errFD = os.Stderr.Fd()
	}
	attr := &syscall.ProcAttr{Env: os.Environ(), Files: []uintptr{devnull.Fd(), devnull.Fd(), errFD}, Sys: sys}
	sp := benchSpawner{path: path, argv: argv, attr: attr, sched: *sched}

	samples := make([]benchSample, 0, *n)
	restless := 0 // spawns whose wait for --quiet's tree to rest ran out
	rest := func() {
		if *quiet != 0 && !benchAwaitRest(*quiet) {
			restless++
		}
	}
	for i := 0; i < *warm; i++ {
		rest()
		if _, err := sp.one(); err != nil {
			fmt.Fprintf(os.Stderr, "str-bench: spawn %s: %v\n", path, err)
			return 1
		}
	}
	start := time.Now()
	if *jobs == 1 {
		for i := 0; i < *n; i++ {
			rest()
			s, err := sp.one()
			if err != nil {
				fmt.Fprintf(os.Stderr, "str-bench: spawn %s: %v\n", path, err)
				return 1
			}
			samples = append(samples, s)
		}
	} else {
		samples, err = sp.parallel(*n, *jobs)
		if err != nil {
			fmt.Fprintf(os.Stderr, "str-bench: spawn %s: %v\n", path, err)
			return 1
		}
	}
	elapsed := time.Since(start)

	if *rawPath != "" {
		if err := benchWriteRaw(*rawPath, samples, *sched); err != nil {
			fmt.Fprintln(os.Stderr, "str-bench:", err)
			return 1
		}
	}
	line := benchSummary(*label, *jobs, samples, elapsed)
	if *quiet != 0 {
		line += fmt.Sprintf(" restless=%d", restless)
	}
	if *sched {
		line += " " + benchSchedSummary(samples)
	}
	fmt.Fprintln(stdout, line)
	return 0
}

// Rest, for --quiet: a process tree is at rest when all its threads
// together ran less than benchRestCPU in a benchRestWindow (a resident
// launcher between calls: only its runtime's timers). The wait gives up
// after benchRestMax (the spawn then goes ahead and counts as restless).
const (
	benchRestWindow = 10 * time.Millisecond
	benchRestCPU    = 300 * time.Microsecond
	benchRestMax    = 3 * time.Second
)

// benchAwaitRest waits until the tree of pid is at rest; false if it was
// not within benchRestMax.
func benchAwaitRest(pid int) bool {
	deadline := time.Now().Add(benchRestMax)
	last := benchTreeRunNS(pid)
	for time.Now().Before(deadline) {
		time.Sleep(benchRestWindow)
		now := benchTreeRunNS(pid)
		if now-last < int64(benchRestCPU) {
			return true
		}
		last = now
	}
	return false
}

// benchTreeRunNS is the time on CPU, in ns, of every thread of pid and of
// its live descendants (benchTree; each thread's
// /proc/PID/task/TID/schedstat's first field: finer than stat's ticks).
func benchTreeRunNS(pid int) int64 {
	var total int64
	for _, p := range benchTree(benchChildren(), pid) {
		stats, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", p))
		for _, st := range stats {
			if b, err := os.ReadFile(st); err == nil {
				if f := strings.Fields(string(b)); len(f) > 0 {
					v, _ := strconv.ParseInt(f[0], 10, 64)
					total += v
				}
			}
		}
	}
	return total
}

// benchNamespaces are the --ns names and their clone flags.
var benchNamespaces = map[string]uintptr{
	"pid": syscall.CLONE_NEWPID, "mnt": syscall.CLONE_NEWNS, "ipc": syscall.CLONE_NEWIPC,
	"uts": syscall.CLONE_NEWUTS, "net": syscall.CLONE_NEWNET, "user": syscall.CLONE_NEWUSER,
	"cgroup": syscall.CLONE_NEWCGROUP,
}

// benchCloneAttr turns --ns LIST into the SysProcAttr the floor spawns
// with: clone flags only, plus a one-id map (0 -> the caller's uid and gid)
// when a user namespace is asked for, which Go's ForkExec writes from the
// parent as spawnref.c does. "" is a plain fork+exec.
func benchCloneAttr(list string) (*syscall.SysProcAttr, error) {
	if list == "" {
		return nil, nil
	}
	sys := &syscall.SysProcAttr{}
	for _, name := range strings.Split(list, ",") {
		f, ok := benchNamespaces[name]
		if !ok {
			return nil, fmt.Errorf("--ns: unknown namespace %q (want pid,mnt,ipc,uts,net,user,cgroup)", name)
		}
		sys.Cloneflags |= f
	}
	if sys.Cloneflags&syscall.CLONE_NEWUSER != 0 {
		sys.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		sys.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
	}
	return sys, nil
}

// benchSpawner is what every spawn of one str-bench spawn shares.
type benchSpawner struct {
	path  string
	argv  []string
	attr  *syscall.ProcAttr
	sched bool // --schedstat: CMD's stdout is a pipe whose last line is its schedstat
}

// benchStdoutTail is what is kept of CMD's stdout under --schedstat: its
// last bytes, where the schedstat line is (all of it is read, so that CMD
// never blocks on the pipe).
const benchStdoutTail = 4 << 10

// start forks and execs CMD. Under --schedstat its stdout is the write end
// of a fresh pipe (closed here once CMD has it, so that EOF means every
// holder exited) and out delivers what was read from it; else out is nil.
func (sp *benchSpawner) start() (pid int, out <-chan []byte, err error) {
	if !sp.sched {
		pid, err = syscall.ForkExec(sp.path, sp.argv, sp.attr)
		return pid, nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	attr := *sp.attr // a copy per spawn: spawns in flight have pipes of their own
	attr.Files = append([]uintptr(nil), sp.attr.Files...)
	attr.Files[1] = w.Fd()
	pid, err = syscall.ForkExec(sp.path, sp.argv, &attr)
	w.Close()
	if err != nil {
		r.Close()
		return 0, nil, err
	}
	ch := make(chan []byte, 1)
	go func() {
		defer r.Close()
		var tail []byte
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			tail = append(tail, buf[:n]...)
			if len(tail) > benchStdoutTail {
				tail = append(tail[:0], tail[len(tail)-benchStdoutTail:]...)
			}
			if err != nil {
				break
			}
		}
		ch <- tail
	}()
	return pid, ch, nil
}

// readSched fills s's schedstat fields from what CMD printed (out from
// start; nothing when nil). By the time it is called CMD and every process
// it left behind are reaped, so EOF is near; the wait is bounded anyway.
func (sp *benchSpawner) readSched(s *benchSample, out <-chan []byte) error {
	if out == nil {
		return nil
	}
	select {
	case b := <-out:
		s.cmdRun, s.cmdWait, s.sched = benchParseSchedstat(b)
		return nil
	case <-time.After(benchLeftoverLimit):
		return fmt.Errorf("stdout of %s still open after %v", sp.path, benchLeftoverLimit)
	}
}

// benchParseSchedstat reads the last non-empty line of out as a
// /proc/PID/schedstat line: "run_ns wait_ns slices", three non-negative
// integers; ok is false for anything else.
func benchParseSchedstat(out []byte) (run, wait time.Duration, ok bool) {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 3 {
		return 0, 0, false
	}
	var v [3]int64
	for i, x := range f {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil || n < 0 {
			return 0, 0, false
		}
		v[i] = n
	}
	return time.Duration(v[0]), time.Duration(v[1]), true
}

// parallel keeps jobs spawns of argv in flight until n have been
// reaped. Each spawn is waited for by its pid (the CPU of its own waited-for
// descendants included); orphans are reaped once at the end, since a
// wait4(-1) per spawn would take another spawn's child.
func (sp *benchSpawner) parallel(n, jobs int) ([]benchSample, error) {
	var mu sync.Mutex
	var samples []benchSample
	var firstErr error
	next := 0
	var wg sync.WaitGroup
	for j := 0; j < jobs; j++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= n || firstErr != nil {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				var s benchSample
				t0 := time.Now()
				pid, out, err := sp.start()
				var ru syscall.Rusage
				if err == nil {
					for {
						if _, err = syscall.Wait4(pid, &s.status, 0, &ru); !errors.Is(err, syscall.EINTR) {
							break
						}
					}
				}
				s.lat = time.Since(t0)
				s.full, s.cpu, s.maxRSSKB = s.lat, benchCPU(&ru), ru.Maxrss
				if err == nil {
					// CMD's stdout ends with CMD (a sandbox's init reaps
					// it before the launcher returns): no orphan holds
					// it open unless CMD left one behind.
					err = sp.readSched(&s, out)
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				samples = append(samples, s)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	left, err := benchReapAll()
	if err != nil {
		return nil, err
	}
	if len(samples) > 0 {
		samples[len(samples)-1].leftovers = left
	}
	return samples, nil
}

// benchReapAll reaps every remaining child (orphans re-parented to us),
// bounded by benchLeftoverLimit, and returns how many there were.
func benchReapAll() (int, error) {
	ch := make(chan error, 1)
	count := 0
	go func() {
		for {
			var ws syscall.WaitStatus
			_, err := syscall.Wait4(-1, &ws, 0, nil)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.ECHILD):
				ch <- nil
				return
			case err != nil:
				ch <- err
				return
			}
			count++
		}
	}()
	select {
	case err := <-ch:
		return count, err
	case <-time.After(benchLeftoverLimit):
		return 0, fmt.Errorf("descendants still running after %v", benchLeftoverLimit)
	}
}

// one spawns argv once, reaps it, then reaps every descendant that
// was re-parented to us.
func (sp *benchSpawner) one() (benchSample, error) {
	path := sp.path
	var s benchSample
	t0 := time.Now()
	pid, out, err := sp.start()
	if err != nil {
		return s, err
	}
	var ru syscall.Rusage
	for {
		_, err = syscall.Wait4(pid, &s.status, 0, &ru)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return s, fmt.Errorf("wait4 %d: %w", pid, err)
	}
	s.lat = time.Since(t0)
	s.cpu = benchCPU(&ru)
	s.maxRSSKB = ru.Maxrss

	// Leftovers: wait4(-1) until ECHILD, bounded by benchLeftoverLimit.
	type reaped struct {
		cpu  time.Duration
		rss  int64
		n    int
		err  error
		done time.Time
	}
	ch := make(chan reaped, 1)
	go func() {
		var r reaped
		for {
			var ws syscall.WaitStatus
			var ru syscall.Rusage
			_, err := syscall.Wait4(-1, &ws, 0, &ru)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if errors.Is(err, syscall.ECHILD) {
				break
			}
			if err != nil {
				r.err = err
				break
			}
			r.n++
			r.cpu += benchCPU(&ru)
			r.rss = max(r.rss, ru.Maxrss)
		}
		r.done = time.Now()
		ch <- r
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return s, fmt.Errorf("reap descendants: %w", r.err)
		}
		s.full = r.done.Sub(t0)
		s.cpu += r.cpu
		s.maxRSSKB = max(s.maxRSSKB, r.rss)
		s.leftovers = r.n
	case <-time.After(benchLeftoverLimit):
		return s, fmt.Errorf("descendants of %s still running after %v", path, benchLeftoverLimit)
	}
	return s, sp.readSched(&s, out)
}

func benchCPU(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchWriteRaw appends one line per sample to path: "lat_us cpu_us
// maxrss_kb wait_status full_us", and with sched "cmd_run_us cmd_wait_us"
// after it (-1 -1 for a sample without CMD's schedstat).
func benchWriteRaw(path string, samples []benchSample, sched bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	for _, s := range samples {
		fmt.Fprintf(f, "%.1f %.0f %d %d %.1f", benchUs(s.lat), benchUs(s.cpu), s.maxRSSKB, int(s.status), benchUs(s.full))
		switch {
		case sched && s.sched:
			fmt.Fprintf(f, " %.1f %.1f", benchUs(s.cmdRun), benchUs(s.cmdWait))
		case sched:
			fmt.Fprint(f, " -1 -1")
		}
		fmt.Fprintln(f)
	}
	return f.Close()
}

// benchSchedSummary is --schedstat's part of the output line: the p50s of
// CMD's own run and run-queue wait times over the samples that have them.
func benchSchedSummary(samples []benchSample) string {
	var run, wait []float64
	missing := 0
	for _, s := range samples {
		if !s.sched {
			missing++
			continue
		}
		run = append(run, benchUs(s.cmdRun))
		wait = append(wait, benchUs(s.cmdWait))
	}
	sort.Float64s(run)
	sort.Float64s(wait)
	return fmt.Sprintf("cmd_run_p50_us=%.1f cmd_wait_p50_us=%.1f noschedstat=%d", benchPercentile(run, 50), benchPercentile(wait, 50), missing)
}

func benchUs(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// benchPercentile is the nearest-rank percentile of sorted (as spawnloop
// computes it).
func benchPercentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	k := int(math.Ceil(p / 100 * float64(len(sorted))))
	k = min(max(k, 1), len(sorted))
	return sorted[k-1]
}

// benchSummary is spawnloop's output line for samples.
func benchSummary(label string, jobs int, samples []benchSample, elapsed time.Duration) string {
	var lat, full, cpu []float64
	var sum float64
	var rss int64
	left, fails := 0, 0
	for _, s := range samples {
		lat = append(lat, benchUs(s.lat))
		full = append(full, benchUs(s.full))
		cpu = append(cpu, benchUs(s.cpu))
		sum += benchUs(s.lat)
		rss = max(rss, s.maxRSSKB)
		left += s.leftovers
		if !s.status.Exited() || s.status.ExitStatus() != 0 {
			fails++
		}
	}
	sort.Float64s(lat)
	sort.Float64s(full)
	sort.Float64s(cpu)
	n := len(samples)
	perSec := 0.0
	if elapsed > 0 {
		perSec = float64(n) / elapsed.Seconds()
	}
	return fmt.Sprintf("label=%s jobs=%d n=%d mean_us=%.1f p50_us=%.1f p90_us=%.1f p99_us=%.1f min_us=%.1f max_us=%.1f "+
		"full_p50_us=%.1f full_p99_us=%.1f cpu_p50_us=%.1f per_sec=%.1f maxrss_kb=%d leftovers=%d fails=%d",
		label, jobs, n, sum/float64(n), benchPercentile(lat, 50), benchPercentile(lat, 90), benchPercentile(lat, 99),
		lat[0], lat[n-1], benchPercentile(full, 50), benchPercentile(full, 99), benchPercentile(cpu, 50), perSec,
		rss, left, fails)
}
