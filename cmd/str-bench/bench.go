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

const benchUsage = `usage: str-bench spawn [-n N] [-w WARMUP] [-l LABEL] [-o RAW] [-e] [--ns LIST] [-j J] [--quiet PID] -- CMD [ARGS...]

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

	samples := make([]benchSample, 0, *n)
	restless := 0 // spawns whose wait for --quiet's tree to rest ran out
	rest := func() {
		if *quiet != 0 && !benchAwaitRest(*quiet) {
			restless++
		}
	}
	for i := 0; i < *warm; i++ {
		rest()
		if _, err := benchOne(path, argv, attr); err != nil {
			fmt.Fprintf(os.Stderr, "str-bench: spawn %s: %v\n", path, err)
			return 1
		}
	}
	start := time.Now()
	if *jobs == 1 {
		for i := 0; i < *n; i++ {
			rest()
			s, err := benchOne(path, argv, attr)
			if err != nil {
				fmt.Fprintf(os.Stderr, "str-bench: spawn %s: %v\n", path, err)
				return 1
			}
			samples = append(samples, s)
		}
	} else {
		samples, err = benchParallel(path, argv, attr, *n, *jobs)
		if err != nil {
			fmt.Fprintf(os.Stderr, "str-bench: spawn %s: %v\n", path, err)
			return 1
		}
	}
	elapsed := time.Since(start)

	if *rawPath != "" {
		if err := benchWriteRaw(*rawPath, samples); err != nil {
			fmt.Fprintln(os.Stderr, "str-bench:", err)
			return 1
		}
	}
	line := benchSummary(*label, *jobs, samples, elapsed)
	if *quiet != 0 {
		line += fmt.Sprintf(" restless=%d", restless)
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

// benchParallel keeps jobs spawns of argv in flight until n have been
// reaped. Each spawn is waited for by its pid (the CPU of its own waited-for
// descendants included); orphans are reaped once at the end, since a
// wait4(-1) per spawn would take another spawn's child.
func benchParallel(path string, argv []string, attr *syscall.ProcAttr, n, jobs int) ([]benchSample, error) {
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
				pid, err := syscall.ForkExec(path, argv, attr)
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

// benchOne spawns argv once, reaps it, then reaps every descendant that
// was re-parented to us.
func benchOne(path string, argv []string, attr *syscall.ProcAttr) (benchSample, error) {
	var s benchSample
	t0 := time.Now()
	pid, err := syscall.ForkExec(path, argv, attr)
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
	return s, nil
}

func benchCPU(ru *syscall.Rusage) time.Duration {
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchWriteRaw(path string, samples []benchSample) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	for _, s := range samples {
		fmt.Fprintf(f, "%.1f %.0f %d %d %.1f\n", benchUs(s.lat), benchUs(s.cpu), s.maxRSSKB, int(s.status), benchUs(s.full))
	}
	return f.Close()
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
