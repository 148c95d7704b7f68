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
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/worker/runner"
)

const benchWarmUsage = `usage: str-bench warm [-n N] [-w WARMUP] [--profile P] [--target runner|sh] [--python PATH] [-o RAW]

The warm pool's dispatch, measured through the launcher directly: N times
(after WARMUP unmeasured rounds), one sandbox of profile P is created and
started ahead of its call and its target gets ready (in "runner" mode:
the worker's tool runner in warm mode with a no-op tool imported; in "sh"
mode: /bin/sh blocked on a read); then the clock starts and the call is
handed over on the sandbox's descriptor 3 (the runner's arguments JSON,
or one line). Printed, one line of key=value figures in microseconds:
  running_p50_us, running_p90_us, running_p99_us
      handed over -> the tool's code runs (it writes a byte on descriptor
      5 as its first action)
  done_p50_us, done_p90_us, done_p99_us
      handed over -> the result is complete (the runner's done byte on
      descriptor 4; the worker replies here)
  reaped_p50_us, reaped_p90_us, reaped_p99_us
      handed over -> the whole sandbox is gone (tool exited, cgroup
      removed)
  ready_p50_us   create -> ready (the pool's refill time, not on a call's path)
plus label=warm-<target> profile= n= fails= per_sec= (calls per second
of the measured loop, one at a time). RAW gets one line per measured call:
"running_us done_us reaped_us ready_us exit_code". Needs what str run
needs (root or user namespaces; see str doctor). It asserts nothing.
`

// benchWarmTool is the no-op tool of runner mode: its first action says
// "running" on descriptor 5.
const benchWarmTool = `import os

def noop(ctx):
    os.write(5, b"x")
    return {}
`

// benchWarmShell is the target of sh mode, with the same signals.
const benchWarmShell = `printf r >&4; read x <&3; printf x >&5; printf d >&4`

// benchWarmSample is one measured call.
type benchWarmSample struct {
	running, done, reaped, ready time.Duration
	exitCode                     int
}

func benchWarm(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("bench warm", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, benchWarmUsage+"\nflags:\n"); fs.PrintDefaults() }
	n := fs.Int("n", 100, "measured calls")
	warmups := fs.Int("w", 3, "unmeasured warm-up calls")
	profile := fs.String("profile", "standard", "sandbox `profile`")
	target := fs.String("target", "runner", "runner | sh")
	python := fs.String("python", "/usr/bin/python3", "interpreter of runner mode")
	rawPath := fs.String("o", "", "append one line per measured call to `RAW`")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *n < 1 || *warmups < 0 || (*target != "runner" && *target != "sh") {
		if err == nil {
			fs.Usage()
		}
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "str-bench warm:", err)
		return 1
	}
	l, err := launcher.New(launcher.Options{CgroupParent: os.Getenv("STR_CGROUP_PARENT")})
	if err != nil {
		return fail(err)
	}
	// 1. a directory the sandboxes can read: the runner, the tool, one
	// work dir per call (each sandbox runs as a host uid of its own).
	base, err := os.MkdirTemp("", "str-bench-warm-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(base)
	b := &benchWarmer{l: l, base: base, profile: *profile, target: *target, python: *python}
	if err := b.prepare(); err != nil {
		return fail(err)
	}
	// 2. the calls, one at a time.
	var samples []benchWarmSample
	fails := 0
	var start time.Time
	for i := 0; i < *warmups+*n; i++ {
		if i == *warmups {
			start = time.Now()
		}
		s, err := b.once(i)
		if err != nil {
			return fail(fmt.Errorf("call %d: %w", i, err))
		}
		if i < *warmups {
			continue
		}
		if s.exitCode != 0 {
			fails++
		}
		samples = append(samples, s)
	}
	elapsed := time.Since(start)
	if *rawPath != "" {
		f, err := os.OpenFile(*rawPath, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fail(err)
		}
		for _, s := range samples {
			fmt.Fprintf(f, "%.1f %.1f %.1f %.1f %d\n", benchUs(s.running), benchUs(s.done), benchUs(s.reaped), benchUs(s.ready), s.exitCode)
		}
		if err := f.Close(); err != nil {
			return fail(err)
		}
	}
	pct := func(get func(benchWarmSample) time.Duration) (p50, p90, p99 float64) {
		var v []float64
		for _, s := range samples {
			v = append(v, benchUs(get(s)))
		}
		sort.Float64s(v)
		return benchPercentile(v, 50), benchPercentile(v, 90), benchPercentile(v, 99)
	}
	r50, r90, r99 := pct(func(s benchWarmSample) time.Duration { return s.running })
	d50, d90, d99 := pct(func(s benchWarmSample) time.Duration { return s.done })
	x50, x90, x99 := pct(func(s benchWarmSample) time.Duration { return s.reaped })
	ready50, _, _ := pct(func(s benchWarmSample) time.Duration { return s.ready })
	fmt.Fprintf(stdout, "label=warm-%s profile=%s n=%d fails=%d running_p50_us=%.1f running_p90_us=%.1f running_p99_us=%.1f "+
		"done_p50_us=%.1f done_p90_us=%.1f done_p99_us=%.1f reaped_p50_us=%.1f reaped_p90_us=%.1f reaped_p99_us=%.1f ready_p50_us=%.1f per_sec=%.1f\n",
		*target, *profile, len(samples), fails, r50, r90, r99, d50, d90, d99, x50, x90, x99, ready50, float64(len(samples))/elapsed.Seconds())
	return 0
}

// benchWarmer makes and measures the pre-started sandboxes.
type benchWarmer struct {
	l                              *launcher.Launcher
	base, profile, target, python  string
	runnerPath, toolsDir, workBase string
}

// prepare installs the runner and the no-op tool (runner mode) and the
// work base, all readable by the sandboxes' uids (modes set explicitly).
func (b *benchWarmer) prepare() error {
	for _, d := range []string{b.base, filepath.Join(b.base, "runner"), filepath.Join(b.base, "tools"), filepath.Join(b.base, "work")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(d, 0o755); err != nil {
			return err
		}
	}
	b.toolsDir, b.workBase = filepath.Join(b.base, "tools"), filepath.Join(b.base, "work")
	if b.target != "runner" {
		return nil
	}
	var err error
	if b.runnerPath, err = runner.Install(filepath.Join(b.base, "runner")); err != nil {
		return err
	}
	if _, err := runner.Compile(filepath.Join(b.base, "runner"), b.python); err != nil {
		fmt.Fprintln(os.Stderr, "str-bench warm: runner bytecode cache not written:", err)
	}
	tool := filepath.Join(b.toolsDir, "str_bench_noop.py")
	if err := os.WriteFile(tool, []byte(benchWarmTool), 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tool, 0o644); err != nil {
		return err
	}
	// Compile the tool once, as a deployed tools dir would have it.
	return exec.Command(b.python, "-m", "py_compile", tool).Run()
}

// once runs one call: create, start, wait until ready; hand over (the
// clock starts), wait for "running", "done" and the end.
func (b *benchWarmer) once(i int) (benchWarmSample, error) {
	var s benchWarmSample
	var pipes [3][2]*os.File // args (3), done (4), running (5): [read, write]
	for k := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			return s, err
		}
		pipes[k] = [2]*os.File{r, w}
		defer r.Close()
		defer w.Close()
	}
	// The sandbox and its work dir as the worker gets them (the
	// launcher's Provider: made, capped in root mode, the tool's).
	spec := provider.Spec{Profile: b.profile, Timeout: time.Minute,
		WorkDir:    workdir.Spec{Base: b.workBase, Prefix: "bench-"},
		ExtraFiles: []*os.File{pipes[0][0], pipes[1][1], pipes[2][1]}}
	if b.target == "runner" {
		spec.Argv = []string{b.python, b.runnerPath, "--done-fd", "4", "--warm", "3", "str_bench_noop", "noop", ""}
		spec.Env = []string{"PYTHONPATH=" + b.toolsDir}
		spec.ReadOnly = []string{b.toolsDir, filepath.Dir(b.runnerPath)}
	} else {
		spec.Argv = []string{"/bin/sh", "-c", benchWarmShell}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	sb, err := provider.New(b.l).Create(ctx, spec)
	if err != nil {
		return s, err
	}
	defer sb.Release()
	wd := sb.WorkDir()
	if err := sb.Start(); err != nil {
		return s, err
	}
	pipes[0][0].Close()
	pipes[1][1].Close()
	pipes[2][1].Close()
	waited := make(chan *provider.Exit, 1)
	var waitErr error
	go func() {
		r, err := sb.Wait()
		waitErr = err
		waited <- r
	}()
	kill := func(err error) (benchWarmSample, error) {
		sb.Kill()
		r := <-waited
		if r != nil && r.SetupError != nil {
			err = fmt.Errorf("%w (setup: %v)", err, r.SetupError)
		}
		return s, err
	}
	readByte := func(f *os.File, want byte) error {
		f.SetReadDeadline(time.Now().Add(time.Minute))
		var c [1]byte
		if _, err := io.ReadFull(f, c[:]); err != nil {
			return err
		}
		if c[0] != want {
			return fmt.Errorf("got %q, want %q", c[0], want)
		}
		return nil
	}
	// 1. ready: the pool's part, not the call's.
	if err := readByte(pipes[1][0], 'r'); err != nil {
		return kill(fmt.Errorf("waiting for the target to be ready: %w", err))
	}
	s.ready = time.Since(t0)
	// 2. the call.
	payload := []byte("go\n")
	if b.target == "runner" {
		payload, _ = json.Marshal(map[string]any{"module": "str_bench_noop", "function": "noop", "args": map[string]any{},
			"result_file": wd.Result, "output_dir": wd.Output})
	}
	t1 := time.Now()
	if _, err := pipes[0][1].Write(payload); err != nil {
		return kill(fmt.Errorf("handing over: %w", err))
	}
	pipes[0][1].Close()
	if err := readByte(pipes[2][0], 'x'); err != nil {
		return kill(fmt.Errorf("waiting for the tool to run: %w", err))
	}
	s.running = time.Since(t1)
	if err := readByte(pipes[1][0], 'd'); err != nil {
		return kill(fmt.Errorf("waiting for the result: %w", err))
	}
	s.done = time.Since(t1)
	r := <-waited
	s.reaped = time.Since(t1)
	if waitErr != nil {
		return s, waitErr
	}
	if r.SetupError != nil {
		return s, errors.New(r.SetupError.Error())
	}
	s.exitCode = r.ExitCode
	return s, nil
}
