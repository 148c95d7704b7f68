package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/worker/runner"
)

const benchTemplateUsage = `usage: str-bench template [-n N] [-rounds R] [--profile P] [--tools DIR] [--python PATH]

Per-tool templates (launcher/template) next to bubblewrap, in one
interleaved run: each round runs N calls of every cell, in this order:
  python        python3 -c pass, one at a time (the latency reference)
  bwrap-py/1    bwrap standard line + python3 -c pass, one in flight
  bwrap-py/4    the same, four in flight
  template/1    echo_tool through a template of profile P, one in flight
  template/4    the same, four in flight
Printed per cell (medians over the rounds): calls/s, CPU per call in ms
(python and bwrap: run by the spawn driver (str-bench spawn), the p50 of
the whole reaped tree's user+system; template: the mean of this
process's own (the supervisor's, also printed alone) plus the template's
own and its reaped children's, from /proc; kernel threads' deferred
namespace and cgroup cleanup is in neither), p50 and p99 latency in ms;
then the ratios the issue's targets name. Root only (templates lease
host ids). It asserts nothing.
`

type benchTplCell struct {
	id       string
	jobs     int
	p50, p99 []float64 // ms, per round
	rate     []float64 // calls/s per round
	cpu      []float64 // ms per call per round
	sup      []float64 // template cells: the supervisor's (this process's) share
}

func benchTemplate(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("template", flag.ContinueOnError)
	n := fs.Int("n", 100, "calls per cell per round")
	rounds := fs.Int("rounds", 3, "rounds")
	profile := fs.String("profile", "standard", "the template's profile")
	tools := fs.String("tools", "examples/tools/python", "directory of example_tools.py")
	python := fs.String("python", "/usr/bin/python3", "python")
	if err := fs.Parse(args); err != nil {
		fmt.Fprint(os.Stderr, benchTemplateUsage)
		return exitUsage
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "str-bench template: root only (templates lease host ids)")
		return 1
	}
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		fmt.Fprintln(os.Stderr, "str-bench template: no bwrap:", err)
		return 1
	}
	tmp, err := os.MkdirTemp("", "str-bench-tpl-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	_ = os.Chmod(tmp, 0o755)
	work := filepath.Join(tmp, "w")
	rdir := filepath.Join(tmp, "runner")
	for _, d := range []string{work, rdir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	rpath, err := runner.Install(rdir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := runner.Compile(rdir, *python); err != nil {
		fmt.Fprintln(os.Stderr, "str-bench template: compile the runner:", err)
	}
	toolsAbs, err := filepath.Abs(*tools)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	l, err := launcher.New(launcher.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	argv := runner.Command(*python, "/opt/str-runner/"+filepath.Base(rpath), "--template", "3", "example_tools", "echo_tool")
	req := template.Request{SourceHash: "bench", Request: launcher.Request{
		Profile: *profile, Argv: argv,
		Env:   []string{"PYTHONPATH=/opt/str-tools"},
		Binds: []launcher.Bind{{Source: rdir, Target: "/opt/str-runner"}, {Source: toolsAbs, Target: "/opt/str-tools"}},
	}}
	holder := &benchTplHolder{l: l, req: req}
	if _, err := holder.get(nil); err != nil {
		fmt.Fprintln(os.Stderr, "str-bench template:", err)
		return 1
	}
	defer holder.close()
	callArgs, err := runner.EncodeArgs(&runner.Args{Module: "example_tools", Function: "echo_tool", Args: json.RawMessage(`{"message":"hi"}`), ResultFile: "/dev/null", OutputDir: "/tmp"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pyArgv := []string{*python, "-c", "pass"}
	bwArgv := append(benchBwrapLine(bwrap, work, false), *python, "-c", "pass")

	cells := []*benchTplCell{{id: "python", jobs: 1}, {id: "bwrap-py/1", jobs: 1}, {id: "bwrap-py/4", jobs: 4},
		{id: "template/1", jobs: 1}, {id: "template/4", jobs: 4}}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for r := 0; r < *rounds; r++ {
		for _, c := range cells {
			if !strings.HasPrefix(c.id, "template") {
				// python and bwrap through the spawn driver, a process of
				// its own: it reaps every descendant (subreaper), so the
				// CPU is the whole tree's, as the suite measures it.
				argv := pyArgv
				if c.id != "python" {
					argv = bwArgv
				}
				sargs := []string{self, "spawn", "-n", strconv.Itoa(*n), "-w", "3", "-l", c.id}
				if c.jobs > 1 {
					sargs = append(sargs, "-j", strconv.Itoa(c.jobs))
				}
				out, errOut, err := benchCommand(context.Background(), 20*time.Minute, append(append(sargs, "--"), argv...)...)
				if err != nil {
					fmt.Fprintf(os.Stderr, "str-bench template: %s round %d: %v: %s\n", c.id, r, err, benchFirstLine(errOut))
					return 1
				}
				kv := benchKV(out)
				if kv["fails"] != "0" {
					fmt.Fprintf(os.Stderr, "str-bench template: %s round %d: %s of %d runs failed (bwrap's bind of / races with other jobs' mounts)\n", c.id, r, kv["fails"], *n)
				}
				f := func(k string) float64 { v, _ := strconv.ParseFloat(kv[k], 64); return v }
				c.p50, c.p99 = append(c.p50, f("p50_us")/1000), append(c.p99, f("p99_us")/1000)
				c.rate, c.cpu = append(c.rate, f("per_sec")), append(c.cpu, f("cpu_p50_us")/1000)
				continue
			}
			lat, elapsed, cpu, sup, err := benchTplCalls(holder, callArgs, *n, c.jobs)
			if err != nil {
				fmt.Fprintf(os.Stderr, "str-bench template: %s round %d: %v\n", c.id, r, err)
				return 1
			}
			c.p50, c.p99 = append(c.p50, benchTplPct(lat, 50)), append(c.p99, benchTplPct(lat, 99))
			c.rate = append(c.rate, float64(len(lat))/elapsed.Seconds())
			c.cpu = append(c.cpu, float64(cpu.Microseconds())/1000/float64(len(lat)))
			c.sup = append(c.sup, float64(sup.Microseconds())/1000/float64(len(lat)))
		}
	}
	by := map[string]*benchTplCell{}
	fmt.Fprintf(stdout, "%-12s %10s %12s %10s %10s %14s\n", "cell", "calls/s", "CPU ms/call", "p50 ms", "p99 ms", "supervisor ms")
	for _, c := range cells {
		by[c.id] = c
		sup := "-"
		if len(c.sup) > 0 {
			sup = fmt.Sprintf("%.2f", benchMedian(c.sup))
		}
		fmt.Fprintf(stdout, "%-12s %10.1f %12.2f %10.2f %10.2f %14s\n", c.id, benchMedian(c.rate), benchMedian(c.cpu), benchMedian(c.p50), benchMedian(c.p99), sup)
	}
	fmt.Fprintf(stdout, "ratio calls/s template/4 vs bwrap-py/4: %.2fx (target >= 3x, stretch 5x)\n", benchMedian(by["template/4"].rate)/benchMedian(by["bwrap-py/4"].rate))
	fmt.Fprintf(stdout, "ratio calls/s template/1 vs bwrap-py/1: %.2fx\n", benchMedian(by["template/1"].rate)/benchMedian(by["bwrap-py/1"].rate))
	fmt.Fprintf(stdout, "ratio p50 template/1 vs python -c pass: %.2fx (target <= 0.4x)\n", benchMedian(by["template/1"].p50)/benchMedian(by["python"].p50))
	// The spawn driver reaps every descendant's CPU one at a time only:
	// bwrap's tree CPU is its one-in-flight cell's.
	fmt.Fprintf(stdout, "CPU per template call (4 in flight): %.2f ms (target <= 7 ms; bwrap + python tree, one in flight: %.2f ms)\n", benchMedian(by["template/4"].cpu), benchMedian(by["bwrap-py/1"].cpu))
	return 0
}

func benchTplPct(lat []time.Duration, p float64) float64 {
	v := make([]float64, len(lat))
	for i, d := range lat {
		v[i] = float64(d.Microseconds()) / 1000
	}
	sort.Float64s(v)
	return benchPercentile(v, p)
}

// benchTplHolder is the current template; one retired by its recycling
// limits (template.MaxCalls, template.MaxAge) is replaced on the clock, as
// a worker would replace it (its start is part of the cost per call).
type benchTplHolder struct {
	l    *launcher.Launcher
	req  template.Request
	mu   sync.Mutex
	cur  *template.Template
	old  []*template.Template
	pids []int // every template's pid, for the CPU count
}

// get returns the current template, replacing it if it is retired (or
// is the one the caller found retired).
func (h *benchTplHolder) get(retired *template.Template) (*template.Template, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur != nil && h.cur != retired && h.cur.Retired() == nil {
		return h.cur, nil
	}
	if h.cur != nil {
		h.old = append(h.old, h.cur)
	}
	t, err := template.Start(context.Background(), h.l, h.req)
	if err != nil {
		return nil, err
	}
	h.cur = t
	h.pids = append(h.pids, t.Pid())
	return t, nil
}

func (h *benchTplHolder) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, t := range append(h.old, h.cur) {
		if t != nil {
			t.Close()
		}
	}
}

func (h *benchTplHolder) cpu() (all, self time.Duration) {
	h.mu.Lock()
	pids := append([]int(nil), h.pids...)
	h.mu.Unlock()
	all, self = benchTplCPU(pids)
	return all, self
}

// benchTplCalls makes n template calls, jobs at a time.
func benchTplCalls(h *benchTplHolder, args []byte, n, jobs int) ([]time.Duration, time.Duration, time.Duration, time.Duration, error) {
	cpu0, self0 := h.cpu()
	t0 := time.Now()
	lat, err := benchTplRun(n, jobs, func() error {
		var tpl *template.Template
		for range 3 {
			var err error
			if tpl, err = h.get(tpl); err != nil {
				return err
			}
			res, err := tpl.Call(context.Background(), args, template.CallOptions{Timeout: time.Minute})
			if errors.Is(err, template.ErrRetired) && tpl.Retired() != nil {
				continue // recycled under us: the next template takes the call
			}
			if err == nil && !strings.Contains(string(res.Document), `"result"`) {
				err = fmt.Errorf("call failed: %s", res.Document)
			}
			return err
		}
		return errors.New("three templates retired under one call")
	})
	cpu1, self1 := h.cpu()
	return lat, time.Since(t0), cpu1 - cpu0, self1 - self0, err
}

// benchTplCPU is this process's CPU plus every template's own and its
// reaped children's (a retired template's last figures stay readable
// until it is reaped at the end), and this process's alone.
func benchTplCPU(pids []int) (time.Duration, time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	self := benchCPU(&ru)
	all := self
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		// utime stime cutime cstime: fields 14-17 of stat, here from 3 on
		var ticks int64
		for _, i := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			ticks += v
		}
		all += time.Duration(ticks) * 10 * time.Millisecond // USER_HZ 100
	}
	return all, self
}

func benchTplRun(n, jobs int, one func() error) ([]time.Duration, error) {
	var mu sync.Mutex
	var lat []time.Duration
	var firstErr error
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	for range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				t := time.Now()
				err := one()
				d := time.Since(t)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				lat = append(lat, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lat, firstErr
}
