package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ChildArg0 is argv[0] of the re-exec'd child; it is how main() knows it is
// nsinit and not the str command.
const ChildArg0 = "str-nsinit"

// Fixed descriptors of the child, set up by the launcher through ExtraFiles.
const (
	configFD    = 3 // read end: the JSON Config, then EOF
	reportFD    = 4 // write end: JSON events (timings, warnings, error, exit)
	firstPassFD = 5 // first fd handed on to the tool (as its fd 3)
)

// Exit codes of nsinit itself, distinct from anything it forwards from a
// tool only by the report pipe (the launcher reads the "exit" event).
const (
	ExitSetupFailed = 125 // a setup step failed; the report pipe says which
	ExitCannotExec  = 126 // the tool exists but could not be executed
	ExitNotFound    = 127 // the tool was not found inside the sandbox
)

// staging is where the new root is assembled before pivot_root. It is
// inside our private mount namespace, so the host never sees it; every bind
// source is cloned (open_tree) before the staging tmpfs is mounted, so host
// paths under /tmp stay reachable.
const staging = "/tmp"

// IsChild reports whether this process is the re-exec'd sandbox init.
func IsChild() bool {
	return len(os.Args) > 0 && os.Args[0] == ChildArg0
}

func init() {
	if IsChild() {
		// Keep the main goroutine on the main thread: the setup steps run
		// here, and the per-thread steps run on their own locked thread.
		runtime.LockOSThread()
	}
}

// Main is the entry point of the sandbox init. It never returns: it exits
// with the tool's status, or ExitSetupFailed after reporting the failed
// step on the report pipe (and on stderr).
func Main() {
	rep := newReporter(os.NewFile(reportFD, "report"))
	code, err := run(rep)
	if err != nil {
		var se *StepError
		if !errors.As(err, &se) {
			se = stepErr(0, "setup", "", "", err)
		}
		rep.send(event{Type: "error", Error: se})
		fmt.Fprintln(os.Stderr, se.Error())
		if code == 0 {
			code = ExitSetupFailed
		}
	}
	os.Exit(code)
}

// run performs the sandbox setup as one linear sequence, then runs the tool
// as PID 2 and stays as PID 1 until it exits. The steps, in order:
//
//  0. read the plan from fd 3 (the launcher writes it only once this
//     process is in its cgroup, so nothing below runs outside the limits)
//  1. mark every inherited fd but 0-2 and the pass-list close-on-exec
//  2. make / private, recursively
//  3. clone every bind source (open_tree) while host paths are still visible
//  4. mount a fresh tmpfs as the new root (at the staging dir)
//  5. perform the planned mounts in order: dirs, files, symlinks, read-only
//     bind trees, tmpfs, /dev nodes, devpts, a fresh /proc
//  6. pivot_root into the new root and detach the old one
//  7. remount the root tmpfs read-only
//  8. chdir into the work dir and check getcwd
//  9. set the hostname
//  10. bring up loopback (own network namespace only)
//  11. prepare the rlimits (applied by prlimit(1) in step 19)
//  12. resolve the tool's path inside the sandbox
//
// Then on one locked OS thread that exits after the fork (per-thread state
// never leaks back into this process's other threads):
//
//  13. drop the capability bounding set
//  14. clear the ambient capabilities
//  15. set groups, gid, uid
//  16. clear the effective, permitted and inheritable capabilities
//  17. set no_new_privs
//  18. load seccomp (last: the filter need not allow any setup syscall)
//  19. fork and exec the tool in a new session, through prlimit(1), which
//     sets the rlimits on itself and then execs the tool
//
// and finally, as PID 1:
//
//  20. forward SIGTERM/SIGINT/SIGHUP to the tool's process group, reap every
//     zombie, and exit with the tool's status when it exits (which kills
//     every other process of the pid namespace).
func run(rep *reporter) (int, error) {
	t := newTimer(rep)

	// 0. Read the plan. EOF without a plan means the launcher went away.
	cfg, err := readConfig()
	if err != nil {
		return 0, stepErr(0, "read config", "fd 3", "", err)
	}
	t.mark("config")

	// 1. Close-on-exec for every inherited fd from 3 up: nothing the
	// launcher or the Go runtime holds may leak into the tool; the tool
	// gets exactly 0-2 and the pass-list, re-numbered by the fork (runc's
	// leaked cgroup fd, CVE-2024-21626, is the bug this prevents).
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return 0, stepErr(1, "close_range", "fd 3..", "CLOSE_RANGE_CLOEXEC", err)
	}

	// 2. Make every mount private: nothing we mount may propagate to the
	// host's mount namespace, and host mount events must not reach us.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return 0, stepErr(2, "make private", "/", "MS_REC|MS_PRIVATE", err).hint(hintUserns)
	}

	// 3. Clone the bind sources now: step 4 hides the host's staging dir.
	trees, err := cloneSources(cfg.Mounts)
	if err != nil {
		return 0, err
	}
	t.mark("clone_sources")

	// 4. A fresh tmpfs becomes the new root: nothing of the host is in it
	// but what step 5 binds. nosuid,nodev like every mount we make.
	if err := unix.Mount("tmpfs", staging, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return 0, stepErr(4, "mount tmpfs root", staging, "MS_NOSUID|MS_NODEV", err)
	}
	root, err := unix.Open(staging, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, stepErr(4, "open new root", staging, "O_PATH", err)
	}

	// 5. The planned mounts, in plan order (parents before children).
	for i, m := range cfg.Mounts {
		if err := doMount(rep, cfg, root, m, trees[i]); err != nil {
			return 0, err
		}
	}
	t.mark("mounts")

	// 6. pivot_root into the new root and detach the old one. The
	// pivot_root(".", ".") form stacks the old root on top of the new one;
	// the lazy unmount then removes every host mount from our view.
	if err := unix.Fchdir(root); err != nil {
		return 0, stepErr(6, "chdir", staging, "", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return 0, stepErr(6, "pivot_root", staging, "", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return 0, stepErr(6, "detach old root", "/", "MNT_DETACH", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return 0, stepErr(6, "chdir", "/", "", err)
	}
	unix.Close(root)
	t.mark("pivot_root")

	// 7. The root tmpfs is read-only from now on: the tool writes only to
	// the work dir and the planned tmpfs mounts.
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return 0, stepErr(7, "remount read-only", "/", "MS_REMOUNT|MS_BIND|MS_RDONLY", err)
	}

	// 8. chdir into the work dir and check we are where we meant to be
	// (a path that resolves elsewhere is refused, not followed).
	wd := cfg.Workdir
	if wd == "" {
		wd = "/"
	}
	if err := unix.Chdir(wd); err != nil {
		return 0, stepErr(8, "chdir", wd, "", err)
	}
	if got, err := os.Getwd(); err != nil || got != wd {
		return 0, stepErr(8, "getcwd after chdir", wd, "got "+got, errOr(err, errors.New("working directory is not the planned one")))
	}

	// 9. Hostname (own UTS namespace).
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return 0, stepErr(9, "sethostname", cfg.Hostname, "", err)
		}
	}

	// 10. Loopback up in the sandbox's own network namespace.
	if cfg.LoopbackUp {
		if err := loopbackUp(); err != nil {
			return 0, stepErr(10, "bring up", "lo", "SIOCSIFFLAGS IFF_UP", err)
		}
	}
	t.mark("net")

	// 11. rlimits are applied by util-linux prlimit(1), which the tool is
	// started through (step 20): prlimit sets every limit on itself and
	// then execs the tool, so the tool never runs a single instruction
	// without them, while nsinit (PID 1) carries none. It cannot: a Go
	// process reserves over 1 GiB of address space, more than RLIMIT_AS.
	// prlimit runs after privileges are dropped and seccomp is loaded, so
	// it is trusted with nothing the tool does not already have.
	launch, err := limitedArgv(cfg)
	if err != nil {
		return 0, stepErr(11, "find", prlimitPath, "RLIMIT_* via prlimit(1)", err).hint(
			"the sandbox must contain /usr/bin/prlimit (util-linux): bind /usr read-only in the profile")
	}

	// 12. Resolve the tool inside the sandbox (before seccomp: stat only).
	if len(cfg.Argv) == 0 {
		return 0, stepErr(12, "resolve tool", "", "", errors.New("empty argv"))
	}
	path, err := lookPath(cfg.Argv[0], cfg.Env)
	if err != nil {
		code := ExitNotFound
		if errors.Is(err, unix.EACCES) {
			code = ExitCannotExec
		}
		return code, stepErr(12, "resolve tool", cfg.Argv[0], "", err)
	}
	// prlimit(1) execs what follows "--"; the tool sees its resolved path
	// as argv[0].
	argv := append(append(launch, "--", path), cfg.Argv[1:]...)
	t.mark("setup")

	// PID 1 handles these from now on (step 20); registering before the
	// fork means no signal is lost and no runtime thread is started later.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)

	// 13-19 run on their own locked thread.
	pid, err := startTool(cfg, argv, t)
	if err != nil {
		code := ExitSetupFailed
		if errors.Is(err, unix.ENOENT) {
			code = ExitNotFound
		} else if errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) {
			code = ExitCannotExec
		}
		return code, err
	}
	t.mark("exec")
	t.flush()

	// 20. PID 1: forward signals, reap, exit with the tool's status.
	return reap(rep, pid, sigs), nil
}

// startTool performs steps 13-20 on a fresh OS thread that is never
// unlocked, so the Go runtime ends the thread when this returns and none of
// the per-thread state (credentials, capabilities, no_new_privs, seccomp)
// is ever seen by another goroutine of nsinit. The fork happens from that
// thread, so the tool inherits exactly that state.
func startTool(cfg *Config, argv []string, t *timer) (int, error) {
	type out struct {
		pid int
		err error
	}
	ch := make(chan out, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		pid, err := dropAndExec(cfg, argv, t)
		ch <- out{pid, err}
	}()
	o := <-ch
	return o.pid, o.err
}

func dropAndExec(cfg *Config, argv []string, t *timer) (int, error) {
	// 13. Empty the bounding set so no later exec (setuid or file-caps
	// binary) can ever regain a capability. Needs CAP_SETPCAP, so it comes
	// before the uid change in step 15.
	lastCap, err := lastCapability()
	if err != nil {
		return 0, stepErr(13, "read", "/proc/sys/kernel/cap_last_cap", "", err)
	}
	for c := 0; c <= lastCap; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return 0, stepErr(13, "drop bounding capability", fmt.Sprintf("cap %d", c), "PR_CAPBSET_DROP", err)
		}
	}

	// 14. Ambient capabilities would survive the exec: clear them.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return 0, stepErr(14, "clear ambient capabilities", "", "PR_CAP_AMBIENT_CLEAR_ALL", err)
	}

	// 15. Identity: groups, then gid, then uid (after the uid change we
	// could no longer change groups or gid). Raw per-thread syscalls: the
	// libc/Go wrappers would change every thread of nsinit.
	if cfg.SetGroups {
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			return 0, stepErr(15, "setgroups", "[]", "", e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(cfg.GID), uintptr(cfg.GID), uintptr(cfg.GID)); e != 0 {
		return 0, stepErr(15, "setresgid", fmt.Sprint(cfg.GID), "", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(cfg.UID), uintptr(cfg.UID), uintptr(cfg.UID)); e != 0 {
		return 0, stepErr(15, "setresuid", fmt.Sprint(cfg.UID), "", e)
	}

	// 16. Empty effective, permitted and inheritable sets. A non-zero uid
	// already lost them in step 15; a profile running as uid 0 inside
	// relies on this step.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return 0, stepErr(16, "capset", "all sets empty", "", err)
	}

	// 17. no_new_privs: exec can never grant privileges again (setuid bits,
	// file capabilities), and it lets an unprivileged thread load seccomp.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return 0, stepErr(17, "prctl", "PR_SET_NO_NEW_PRIVS", "", err)
	}

	// 18. seccomp, last: every setup syscall above is already done, so the
	// filter need not allow mount, pivot_root, capset or setresuid for us.
	// Loaded on this thread only; the fork below inherits it.
	if len(cfg.Seccomp) > 0 {
		if err := installSeccomp(cfg.Seccomp); err != nil {
			return 0, stepErr(18, "load seccomp", cfg.SeccompPolicy, "SECCOMP_SET_MODE_FILTER", err)
		}
	}
	t.mark("privileges")

	// 19. Fork and exec prlimit(1) with the tool's argv; it applies the
	// rlimits to itself and execs the tool (step 11). setsid gives it a
	// new session with no controlling terminal, so TIOCSTI cannot push
	// input into the caller's terminal (CVE-2017-5226). Files lists
	// exactly what the tool gets.
	files := []uintptr{0, 1, 2}
	for i := 0; i < cfg.PassFDs; i++ {
		files = append(files, uintptr(firstPassFD+i))
	}
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{
		Env:   cfg.Env,
		Files: files,
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		return 0, stepErr(19, "exec", argv[len(argv)-len(cfg.Argv)], "via "+prlimitPath, err)
	}
	return pid, nil
}

// reap is PID 1's loop: it forwards termination signals to the tool's
// process group and reaps every child until the tool itself has exited.
func reap(rep *reporter, tool int, sigs chan os.Signal) int {
	go func() {
		for s := range sigs {
			// The tool leads its own session and process group (setsid).
			_ = unix.Kill(-tool, s.(syscall.Signal))
		}
	}()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// ECHILD: nothing left, cannot happen before the tool exits.
			rep.send(event{Type: "exit", Code: ExitSetupFailed})
			return ExitSetupFailed
		}
		if pid != tool {
			continue // an orphan re-parented to us: reaped, nothing else
		}
		ev := event{Type: "exit"}
		switch {
		case ws.Exited():
			ev.Code = ws.ExitStatus()
		case ws.Signaled():
			ev.Signal = int(ws.Signal())
			ev.Code = 128 + ev.Signal
		}
		rep.send(ev)
		// Exiting as PID 1 makes the kernel kill every other process of the
		// pid namespace, double-forked daemons included.
		return ev.Code
	}
}

func readConfig() (*Config, error) {
	f := os.NewFile(configFD, "config")
	data, err := io.ReadAll(io.LimitReader(f, 16<<20))
	f.Close()
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, errors.New("no plan received (launcher gone?)")
	}
	var cfg Config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, err
	}
	if cfg.Version != ConfigVersion {
		return nil, fmt.Errorf("config version %d, want %d", cfg.Version, ConfigVersion)
	}
	return &cfg, nil
}

func lastCapability() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		// /proc may be absent (best-effort without /proc): CAP_LAST_CAP of
		// the headers; extra PR_CAPBSET_DROP calls return EINVAL, ignored.
		return int(unix.CAP_LAST_CAP), nil
	}
	var n int
	_, err = fmt.Sscan(strings.TrimSpace(string(b)), &n)
	return n, err
}

// lookPath finds argv0 in the PATH of the tool's environment, inside the
// sandbox (we are past pivot_root).
func lookPath(argv0 string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, checkExec(argv0)
	}
	pathEnv := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	firstErr := error(unix.ENOENT)
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, argv0)
		err := checkExec(p)
		if err == nil {
			return p, nil
		}
		if !errors.Is(err, unix.ENOENT) && errors.Is(firstErr, unix.ENOENT) {
			firstErr = err
		}
	}
	return "", firstErr
}

func checkExec(p string) error {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.EACCES
	}
	return unix.Access(p, unix.X_OK)
}

func errOr(err, fallback error) error {
	if err != nil {
		return err
	}
	return fallback
}

// timer records per-phase durations and reports them once.
type timer struct {
	rep    *reporter
	last   time.Time
	phases []Phase
}

func newTimer(rep *reporter) *timer { return &timer{rep: rep, last: time.Now()} }

func (t *timer) mark(name string) {
	now := time.Now()
	t.phases = append(t.phases, Phase{Name: "nsinit_" + name, Ms: float64(now.Sub(t.last).Microseconds()) / 1000})
	t.last = now
}

func (t *timer) flush() { t.rep.send(event{Type: "timings", Phases: t.phases}) }

// prlimitPath is util-linux prlimit(1), inside the sandbox (under /usr).
const prlimitPath = "/usr/bin/prlimit"

// limitedArgv returns the prlimit(1) command line that applies cfg's
// rlimits (soft = hard) and then runs what follows "--".
func limitedArgv(cfg *Config) ([]string, error) {
	if err := checkExec(prlimitPath); err != nil {
		return nil, err
	}
	flags := map[int]string{
		unix.RLIMIT_AS: "--as", unix.RLIMIT_CPU: "--cpu", unix.RLIMIT_FSIZE: "--fsize",
		unix.RLIMIT_NOFILE: "--nofile", unix.RLIMIT_NPROC: "--nproc", unix.RLIMIT_STACK: "--stack",
		unix.RLIMIT_CORE: "--core",
	}
	argv := []string{prlimitPath}
	for _, rl := range cfg.Rlimits {
		f, ok := flags[rl.Resource]
		if !ok {
			return nil, fmt.Errorf("rlimit %s has no prlimit(1) option", rl.Name)
		}
		argv = append(argv, fmt.Sprintf("%s=%d:%d", f, rl.Value, rl.Value))
	}
	return argv, nil
}
