package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Runsc is the program's name, looked up on PATH.
const Runsc = "runsc"

// Status is whether this host can run the gvisor class: runsc's path and
// version, or why not.
type Status struct {
	Path    string
	Version string
	Problem string // "" when runsc runs here
}

// Find looks for runsc on PATH (no version: a run's check, cheap).
func Find() Status {
	p, err := exec.LookPath(Runsc)
	if err != nil {
		return Status{Problem: "runsc not found in PATH (Debian: apt-get install runsc)"}
	}
	return Status{Path: p}
}

// Probe is Find and runsc's version (str runtimes, str doctor).
func Probe() Status {
	st := Find()
	if st.Problem != "" {
		return st
	}
	p := st.Path
	out, err := exec.Command(p, "--version").Output()
	if err != nil {
		return Status{Path: p, Problem: fmt.Sprintf("%s --version: %v", p, err)}
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return Status{Path: p, Version: strings.TrimPrefix(first, "runsc version ")}
}

// Stdio is the tool's standard streams.
type Stdio struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Exit is how a gVisor run ended.
type Exit struct {
	Code      int // the tool's status; 128+signal when a signal ended it
	Signal    int // the signal, when Code says one (or the timeout's SIGKILL)
	TimedOut  bool
	Cancelled bool
	Setup     time.Duration // writing the bundle
	Wall      time.Duration // runsc run, from its start to its end
}

// CancelGrace is how long a cancelled tool has between SIGINT and SIGKILL
// (launcher.CancelGrace's value).
const CancelGrace = 500 * time.Millisecond

// Run writes spec's bundle, runs it under runsc with stdio and removes
// it. A runsc failure before the tool ran is an error with runsc's log;
// the tool's own status, a timeout and a cancel are in Exit. id is
// unique to the run (the container's name and cgroup).
func Run(ctx context.Context, spec Spec, id string, stdio Stdio) (*Exit, error) {
	t0 := time.Now()
	st := Find()
	if st.Problem != "" {
		return nil, errors.New(st.Problem)
	}
	cfg, files, links, err := Bundle(spec, id)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "str-gvisor-")
	if err != nil {
		return nil, fmt.Errorf("gvisor: bundle directory: %w", err)
	}
	defer os.RemoveAll(dir)
	if err := writeBundle(dir, cfg, files, links); err != nil {
		return nil, fmt.Errorf("gvisor: bundle %s: %w", dir, err)
	}
	state, logFile := filepath.Join(dir, "state"), filepath.Join(dir, "runsc.log")
	// --platform=ptrace: this runsc has no systrap, and KVM is not on
	// every host. --network=none: the isolated policy, lo only (Bundle
	// refuses the others). --log: runsc's own messages stay out of the
	// tool's stderr.
	global := []string{"--root", state, "--log", logFile, "--platform=ptrace", "--network=none"}
	if !spec.Limits.Enforce {
		global = append(global, "--ignore-cgroups")
	}
	runsc := func(args ...string) *exec.Cmd {
		return exec.Command(st.Path, append(slices.Clone(global), args...)...)
	}
	defer func() {
		runsc("delete", "--force", id).Run()
		removeCgroups(id)
	}()

	cmd := runsc("run", "--bundle", dir, id)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinViaPipe(stdio.Stdin), viaPipe(stdio.Stdout), viaPipe(stdio.Stderr)
	// runsc dies with its caller; its sandbox is ended by delete.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	ex := &Exit{Setup: time.Since(t0)}
	t1 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("gvisor: start %s run: %w", st.Path, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	var clock <-chan time.Time
	if spec.Timeout > 0 {
		tm := time.NewTimer(spec.Timeout)
		defer tm.Stop()
		clock = tm.C
	}
	var grace <-chan time.Time
	ctxDone := ctx.Done()
	var werr error
wait:
	for {
		select {
		case werr = <-done:
			break wait
		case <-clock:
			ex.TimedOut = true
			runsc("kill", "--all", id, "KILL").Run()
			clock, ctxDone = nil, nil
		case <-ctxDone:
			ex.Cancelled = true
			runsc("kill", id, "INT").Run()
			tm := time.NewTimer(CancelGrace)
			defer tm.Stop()
			grace, ctxDone, clock = tm.C, nil, nil
		case <-grace:
			runsc("kill", "--all", id, "KILL").Run()
			grace = nil
		}
	}
	ex.Wall = time.Since(t1)
	var ee *exec.ExitError
	switch {
	case werr == nil:
	case errors.As(werr, &ee) && ee.ExitCode() >= 0:
		ex.Code = ee.ExitCode()
	default:
		return nil, fmt.Errorf("gvisor: %s run: %w%s", st.Path, werr, logTail(logFile))
	}
	if ex.TimedOut {
		ex.Code, ex.Signal = 128+int(syscall.SIGKILL), int(syscall.SIGKILL)
		return ex, nil
	}
	// runsc's own failure (the container never ran the tool) is its exit
	// status 128 with an error in its log.
	if ex.Code == 128 && !ex.Cancelled {
		if tail := logTail(logFile); strings.Contains(tail, "FATAL") || strings.Contains(tail, "error") {
			return nil, fmt.Errorf("gvisor: %s run failed before the tool ran%s", st.Path, tail)
		}
	}
	if ex.Code > 128 && ex.Code < 128+65 {
		ex.Signal = ex.Code - 128
	}
	return ex, nil
}

// writeBundle makes dir's config.json, files/ and rootfs/ with its
// top-level symlinks. Everything is created anew (O_EXCL) in a
// directory of this run's own.
func writeBundle(dir string, cfg *Config, files []File, links map[string]string) error {
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := writeNew(filepath.Join(dir, "config.json"), data, 0o600); err != nil {
		return err
	}
	for _, d := range []string{"rootfs", "files", "state"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := writeNew(filepath.Join(dir, f.Name), []byte(f.Contents), os.FileMode(f.Mode&0o777)); err != nil {
			return err
		}
	}
	for name, dest := range links {
		if err := os.Symlink(dest, filepath.Join(dir, "rootfs", name)); err != nil {
			return err
		}
	}
	return nil
}

func writeNew(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(path, mode) // the umask's bits back
	}
	return err
}

// logTail is the last lines of runsc's log, for an error message.
func logTail(file string) string {
	data, err := os.ReadFile(file)
	if err != nil || len(data) == 0 {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(data), []byte("\n"))
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return "; runsc's log: " + string(bytes.Join(lines, []byte(" | ")))
}

// removeCgroups removes what runsc leaves of the container's cgroup
// (linux.cgroupsPath) when its sandbox failed to start: an empty
// directory per hierarchy (v1: one per controller). Only directories
// already empty go (rmdir).
func removeCgroups(id string) {
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/str-gvisor/" + id)
	for _, d := range append(dirs, "/sys/fs/cgroup/str-gvisor/"+id) {
		_ = os.Remove(d)
	}
}

// viaPipe hides a regular file behind a pipe (exec copies into it): the
// tool's writes to a host file given as its stdio go, under this runsc,
// at gVisor's own offset (from 0), not the file's shared one, so `{ echo
// a; str run ... echo b; } > f` lost "a". Pipes and terminals are passed
// as they are.
func viaPipe(w io.Writer) io.Writer {
	if regular(w) {
		return struct{ io.Writer }{w}
	}
	return w
}

// stdinViaPipe is viaPipe for stdin: a regular file is read from its
// shared offset (`{ read first; str run ... cat; } < f` gets the rest),
// not from 0.
func stdinViaPipe(r io.Reader) io.Reader {
	if regular(r) {
		return struct{ io.Reader }{r}
	}
	return r
}

func regular(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode().IsRegular()
}
