package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The init's descriptors (see MaxInitFDs): the tool's pass-list at
// 3..3+n-1, the config pipe (read end: the JSON Config, then EOF) at 3+n,
// the report socket (JSON events) at 4+n, then the launcher's mount trees
// from FirstTreeFD(n) on, then its own executable. n is argv[1].
type fdLayout struct{ pass, config, report, trees int }

func layoutFromArgs(args []string) (fdLayout, error) {
	n := 0
	if len(args) > 1 {
		v, err := strconv.Atoi(args[1])
		if err != nil || v < 0 || v > MaxPassFDs {
			return fdLayout{}, fmt.Errorf("argv[1] %q is not a pass-fd count 0..%d", args[1], MaxPassFDs)
		}
		n = v
	}
	return fdLayout{pass: n, config: 3 + n, report: 4 + n, trees: FirstTreeFD(n)}, nil
}

// str's own exit codes, the same for `str run` and the init: a tool's own
// status is passed through unchanged, so these are the only values str
// adds (with 124, timed out, which only the launcher knows).
const (
	ExitSetupFailed = 125 // a setup step failed; the report pipe says which
	ExitCannotExec  = 126 // the tool exists but could not be executed
	ExitNotFound    = 127 // the tool was not found inside the sandbox
)

// staging is where the new root is assembled before pivot_root. It is
// inside our private mount namespace, so the host never sees it; every bind
// source is taken (step 3) before the staging tmpfs is mounted, so host
// paths under /tmp stay reachable.
const staging = "/tmp"

// Main is the entry point of the sandbox init (cmd/str-init, a small
// static program the launcher executes read-only, see initbin). It returns
// only by exiting: on success the process has become the tool (execve),
// on failure it reports the failed step on the report pipe and exits with
// ExitSetupFailed, ExitCannotExec or ExitNotFound. It prints nothing: the
// launcher prints the error once.
func Main() {
	fds, err := layoutFromArgs(os.Args)
	if err != nil {
		// No report pipe to speak on: stderr, once.
		fmt.Fprintln(os.Stderr, "str-init:", err)
		os.Exit(ExitSetupFailed)
	}
	rep := newReporter(os.NewFile(uintptr(fds.report), "report"))
	code, err := run(fds, rep)
	var se *StepError
	if !errors.As(err, &se) {
		se = stepErr(StepReadPlan, "setup", "", "", err)
	}
	rep.send(event{Type: "error", Error: se})
	os.Exit(code)
}

// run performs the sandbox setup as one linear sequence and ends by
// executing the tool in its own place, so the tool is the sandbox's PID 1
// and no str process stays inside (nothing privileged, no memory of ours).
// It returns only on failure. The steps, in order (nsinit.DocList; the
// same list is in SECURITY.md):
//
//  0. read the plan from the config pipe (a direct sandbox: none to read, the plan is the program its clone child runs)
//  1. mark every inherited fd past the pass-list close-on-exec (a direct sandbox first moves the launcher's descriptors above the tool's and dup3s 0-2 and the pass-list into place)
//  2. make / private, recursively
//  3. take each bind source's detached tree (the launcher's descriptor, or open_tree here when rootless) and open the cgroup v1 tasks files
//  4. mount a fresh tmpfs as the new root
//  5. perform the planned mounts in order
//  6. pivot_root into the new root and detach the old one
//  7. remount the new root read-only (a bubblewrap line's: give its own entries to the command, writable, instead)
//  8. chdir into the work dir and check getcwd
//  9. set the hostname
//  10. bring up loopback and hand the egress listeners to the launcher
//     10a. pre-built sandbox (str serve): wait for the call on the report socket (argv, environment, stdio as SCM_RIGHTS) and dup3 the stdio onto 0-2
//  11. resolve the tool's path and build argv and envp
//
// Then on one locked OS thread, which is the one that calls execve (the
// per-thread state below is what the tool inherits; no other thread of
// ours ever has it):
//
//  12. cgroup v1: move this thread into the sandbox's cgroup (write 0 to each tasks file)
//  13. drop the capability bounding set
//  14. clear the ambient capabilities
//  15. set groups, gid, uid
//  16. clear the effective, permitted and inheritable capabilities
//  17. re-arm the parent-death signal and check the launcher is alive
//  18. set no_new_privs
//  19. load seccomp
//     19a. per-tool template: hand the seccomp filter's listener to the launcher (SCM_RIGHTS on the report socket) and close it
//  20. set the rlimits (raw prlimit64, RLIMIT_AS last)
//  21. execve the tool (raw syscall): the tool becomes PID 1
//
// The init runs in the sandbox's own user namespace as root of that
// namespace only: on the host it is an unprivileged uid of its own (see
// launcher: one id block per sandbox), so even before step 13 it holds no
// capability over anything of the host. On cgroup v2 it is born in the
// sandbox's cgroup (CLONE_INTO_CGROUP); on v1 its setup runs in the
// launcher's cgroup and the exec thread moves itself in at step 12, so the
// tool never runs a single instruction outside the limits while no
// process migration (an RCU grace period, 8-20 ms) sits on the critical
// path.
func run(fds fdLayout, rep *reporter) (int, error) {
	t := newTimer(rep)

	// 0. Read the plan. EOF without a plan means the launcher went away.
	cfg, err := readConfig(fds.config)
	if err != nil {
		return ExitSetupFailed, stepErr(StepReadPlan, "read config", fmt.Sprintf("fd %d", fds.config), "", err)
	}
	if cfg.PassFDs != fds.pass {
		return ExitSetupFailed, stepErr(StepReadPlan, "check config", "pass_fds", fmt.Sprintf("plan %d, argv %d", cfg.PassFDs, fds.pass), errors.New("the plan and the launcher disagree"))
	}
	t.mark("config")

	// 1. Close-on-exec for every inherited fd past the pass-list: nothing
	// the launcher or the Go runtime holds may leak into the tool; the
	// tool gets exactly 0-2 and the pass-list (runc's leaked cgroup fd,
	// CVE-2024-21626, is the bug this prevents).
	if err := unix.CloseRange(uint(fds.config), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return ExitSetupFailed, stepErr(StepCloseFDs, "close_range", fmt.Sprintf("fd %d..", fds.config), "CLOSE_RANGE_CLOEXEC", err)
	}

	// 2. Make every mount private: nothing we mount may propagate to the
	// host's mount namespace, and host mount events must not reach us.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return ExitSetupFailed, stepErr(StepMakePrivate, "make private", "/", "MS_REC|MS_PRIVATE", err).hint(hintUserns)
	}

	// 3. Take every bind source's detached tree now: step 4 hides the
	// host's staging dir. Root mode, the launcher cloned them on the host
	// and they are our descriptors (a bind then needs no permission of
	// ours on the source's parents); rootless, we clone them here, as the
	// caller's own host uid. The cgroup v1 tasks files (the launcher made
	// them writable by this process's host uid) are opened now too, for
	// step 12.
	trees, err := takeSources(cfg.Mounts, fds)
	if err != nil {
		return ExitSetupFailed, err
	}
	tasks := make([]int, len(cfg.CgroupTasks))
	for i, p := range cfg.CgroupTasks {
		if tasks[i], err = unix.Open(p, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0); err != nil {
			return ExitSetupFailed, stepErr(StepCloneSources, "open cgroup tasks file", p, "O_WRONLY", err)
		}
	}
	t.mark("clone_sources")

	// 4. A fresh tmpfs becomes the new root: nothing of the host is in it
	// but what step 5 binds. nosuid,nodev like every mount we make. The
	// umask is fixed first: the directories and files the init creates
	// (mount points, /etc/passwd) must be 0755/0644 for the tool's uid
	// whatever umask the worker runs with (systemd's UMask=0027 would make
	// them unreadable); the tool inherits the same 022.
	unix.Umask(0o022)
	if err := unix.Mount("tmpfs", staging, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return ExitSetupFailed, stepErr(StepRootTmpfs, "mount tmpfs root", staging, "MS_NOSUID|MS_NODEV", err)
	}
	root, err := unix.Open(staging, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return ExitSetupFailed, stepErr(StepRootTmpfs, "open new root", staging, "O_PATH", err)
	}

	// 5. The planned mounts, in plan order (parents before children).
	for i, m := range cfg.Mounts {
		if err := doMount(rep, cfg, root, m, trees[i]); err != nil {
			return ExitSetupFailed, err
		}
	}
	t.mark("mounts")

	// 6. pivot_root into the new root and detach the old one. The
	// pivot_root(".", ".") form stacks the old root on top of the new one;
	// the lazy unmount then removes every host mount from our view.
	if err := unix.Fchdir(root); err != nil {
		return ExitSetupFailed, stepErr(StepPivotRoot, "chdir", staging, "", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return ExitSetupFailed, stepErr(StepPivotRoot, "pivot_root", staging, "", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return ExitSetupFailed, stepErr(StepPivotRoot, "detach old root", "/", "MNT_DETACH", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return ExitSetupFailed, stepErr(StepPivotRoot, "chdir", "/", "", err)
	}
	unix.Close(root)
	t.mark("pivot_root")

	// 7. The root tmpfs is read-only from now on: the tool writes only to
	// the work dir and the planned tmpfs mounts. A bubblewrap line's root
	// (RootToCommand) stays writable instead, its own entries the
	// command's, as under bubblewrap: it is the 1 MiB tmpfs of step 4, and
	// what is mounted on it is not touched.
	if cfg.RootToCommand {
		if err := giveRootEntries(cfg.UID, cfg.GID); err != nil {
			return ExitSetupFailed, err
		}
	} else if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return ExitSetupFailed, stepErr(StepRootReadOnly, "remount read-only", "/", "MS_REMOUNT|MS_BIND|MS_RDONLY|MS_NOSUID|MS_NODEV", err)
	}

	// 8. chdir into the work dir and check we are where we meant to be
	// (a path that resolves elsewhere is refused, not followed).
	wd := cfg.Workdir
	if wd == "" {
		wd = "/"
	}
	if err := unix.Chdir(wd); err != nil {
		se := stepErr(StepChdir, "chdir", wd, "", err)
		if errors.Is(err, unix.EACCES) {
			se = se.hint(hintWorkdir)
		}
		return ExitSetupFailed, se
	}
	if got, err := os.Getwd(); err != nil || got != wd {
		return ExitSetupFailed, stepErr(StepChdir, "getcwd after chdir", wd, "got "+got, errOr(err, errors.New("working directory is not the planned one")))
	}

	// 9. Hostname (own UTS namespace).
	if cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			return ExitSetupFailed, stepErr(StepHostname, "sethostname", cfg.Hostname, "", err)
		}
	}

	// 10. Loopback up in the sandbox's own network namespace, then the
	// egress listeners on it, handed to the launcher before any tool code
	// runs: the tool finds them bound (it cannot take their ports) and
	// every byte it sends there reaches the launcher's policy proxy.
	if cfg.LoopbackUp {
		if err := loopbackUp(); err != nil {
			return ExitSetupFailed, stepErr(StepLoopback, "bring up", "lo", "SIOCSIFFLAGS IFF_UP", err)
		}
	}
	if len(cfg.Listen) > 0 {
		lfds, err := openListeners(cfg.Listen)
		if err != nil {
			return ExitSetupFailed, stepErr(StepLoopback, "open egress listeners", "lo", "", err)
		}
		if err := rep.sendFDs(event{Type: "listeners", Listeners: cfg.Listen}, lfds); err != nil {
			return ExitSetupFailed, stepErr(StepLoopback, "hand over egress listeners", "report socket", "SCM_RIGHTS", err)
		}
		for _, fd := range lfds {
			unix.Close(fd)
		}
	}
	t.mark("net")

	// 10a. A pre-built sandbox waits here for its call: everything that
	// does not depend on the call is done (root, mounts, network), and
	// everything from step 11 on runs after it exactly as in a one-shot
	// run, so the tool's view is the same: step 11 needs the call's argv
	// and PATH (and allocates, which step 20's RLIMIT_AS forbids after),
	// and steps 12-21, from the cgroup entry to the execve, are the exec
	// thread's own state, set on the thread that execs. The call comes
	// from the launcher only (the report socket's other end is the
	// launcher's; the caller's descriptors are opaque to us: dup3 onto
	// 0-2, nothing else is done with them).
	// While waiting the init is root of its own user namespace only, and
	// the parent-death signal of the clone is still armed (no credential
	// change yet).
	if cfg.AwaitCall {
		rep.send(event{Type: "await_call"})
		call, err := awaitCall(fds.report)
		if err != nil {
			return ExitSetupFailed, err
		}
		cfg.Argv, cfg.Env = call.Argv, call.Env
		t.last = time.Now() // the wait is not setup time
	}

	// 11. Resolve the tool inside the sandbox (before seccomp: stat only)
	// and build everything execve needs now: after step 20 this process
	// may not allocate (RLIMIT_AS is below what the Go runtime reserves).
	if len(cfg.Argv) == 0 {
		return ExitSetupFailed, stepErr(StepResolveTool, "resolve tool", "", "", errors.New("empty argv"))
	}
	path, err := lookPath(cfg.Argv[0], cfg.Env)
	if err != nil {
		code := ExitNotFound
		if errors.Is(err, unix.EACCES) {
			code = ExitCannotExec
		}
		return code, stepErr(StepResolveTool, "resolve tool", cfg.Argv[0], "PATH of the tool's environment", err)
	}
	ex, err := prepareExec(cfg, path)
	if err != nil {
		return ExitSetupFailed, stepErr(StepResolveTool, "prepare execve", path, "", err)
	}
	t.mark("setup")

	// 12-21 run on their own locked thread; on success they never return.
	err = execTool(cfg, ex, rep, t, tasks)
	code := ExitSetupFailed
	if errors.Is(err, unix.ENOENT) {
		code = ExitNotFound
	} else if errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOEXEC) {
		code = ExitCannotExec
	}
	return code, err
}

// execTool performs steps 12-21 (cgroup entry to execve) on a fresh OS
// thread that is never unlocked: that thread calls execve, so the
// credentials, capabilities, no_new_privs, seccomp filter and rlimits it
// sets are exactly the tool's, and no other goroutine of the init ever
// runs with them. It returns only
// when a step failed (the thread then dies with its goroutine).
func execTool(cfg *Config, ex *execArgs, rep *reporter, t *timer, tasks []int) error {
	ch := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		ch <- dropAndExec(cfg, ex, rep, t, tasks)
	}()
	return <-ch
}

func dropAndExec(cfg *Config, ex *execArgs, rep *reporter, t *timer, tasks []int) error {
	// 12. cgroup v1: this thread, the one that becomes the tool, moves
	// itself into the sandbox's cgroup, before it drops anything and
	// before any tool code can run. A thread moving itself ("0" in
	// tasks) takes no global lock; migrating the whole process from the
	// launcher waits for an RCU grace period. Every thread the tool will
	// ever have descends from this one (execve ends the others).
	for i, fd := range tasks {
		if _, err := unix.Write(fd, []byte("0")); err != nil {
			return stepErr(StepEnterCgroup, "enter cgroup", cfg.CgroupTasks[i], "write 0 (this thread)", err)
		}
		unix.Close(fd)
	}

	// 13. Empty the bounding set so no later exec (setuid or file-caps
	// binary) can ever regain a capability. Needs CAP_SETPCAP, so it comes
	// before the uid change in step 15.
	lastCap, err := lastCapability()
	if err != nil {
		return stepErr(StepDropBounding, "read", "/proc/sys/kernel/cap_last_cap", "", err)
	}
	for c := 0; c <= lastCap; c++ {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return stepErr(StepDropBounding, "drop bounding capability", fmt.Sprintf("cap %d", c), "PR_CAPBSET_DROP", err)
		}
	}

	// 14. Ambient capabilities would survive the exec: clear them.
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return stepErr(StepClearAmbient, "clear ambient capabilities", "", "PR_CAP_AMBIENT_CLEAR_ALL", err)
	}

	// 15. Identity: groups, then gid, then uid (after the uid change we
	// could no longer change groups or gid). Raw per-thread syscalls: the
	// libc/Go wrappers would change every thread of the init.
	if cfg.SetGroups {
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			return stepErr(StepSetIDs, "setgroups", "[]", "", e)
		}
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(cfg.GID), uintptr(cfg.GID), uintptr(cfg.GID)); e != 0 {
		return stepErr(StepSetIDs, "setresgid", fmt.Sprint(cfg.GID), "", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(cfg.UID), uintptr(cfg.UID), uintptr(cfg.UID)); e != 0 {
		return stepErr(StepSetIDs, "setresuid", fmt.Sprint(cfg.UID), "", e)
	}

	// 16. Empty effective, permitted and inheritable sets. A non-zero uid
	// already lost them in step 15; a profile running as uid 0 inside
	// relies on this step.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return stepErr(StepClearCaps, "capset", "all sets empty", "", err)
	}

	// 17. The uid change of step 15 cleared the parent-death signal the
	// launcher asked for at clone (the kernel does so on every credential
	// change): set it again, then make sure the launcher did not die in
	// between, or the tool could outlive it. The report pipe's read end is
	// the launcher's: POLLERR on our write end means it is gone.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return stepErr(StepParentDeath, "prctl", "PR_SET_PDEATHSIG", "SIGKILL", err)
	}
	if rep.readerGone() {
		return stepErr(StepParentDeath, "check launcher", "report pipe", "POLLERR", errors.New("the launcher exited during setup"))
	}

	// 18. no_new_privs: exec can never grant privileges again (setuid bits,
	// file capabilities), and it lets an unprivileged thread load seccomp.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return stepErr(StepNoNewPrivs, "prctl", "PR_SET_NO_NEW_PRIVS", "", err)
	}

	// 19. seccomp, after every setup syscall above, so the filter need not
	// allow mount, pivot_root, capset or setresuid for us. Loaded on this
	// thread only; execve keeps it. The filter allows what steps 20-21
	// need (prlimit64 on itself, execve).
	lfd := -1
	switch {
	case cfg.SeccompListener && len(cfg.Seccomp) == 0:
		return stepErr(StepSeccomp, "load seccomp", "", "SECCOMP_FILTER_FLAG_NEW_LISTENER", errors.New("a template's plan has no filter"))
	case cfg.SeccompListener:
		var err error
		if lfd, err = InstallSeccompListener(cfg.Seccomp); err != nil {
			return stepErr(StepSeccomp, "load seccomp", cfg.SeccompPolicy, "SECCOMP_SET_MODE_FILTER|SECCOMP_FILTER_FLAG_NEW_LISTENER", err)
		}
	case len(cfg.Seccomp) > 0:
		if err := InstallSeccomp(cfg.Seccomp); err != nil {
			return stepErr(StepSeccomp, "load seccomp", cfg.SeccompPolicy, "SECCOMP_SET_MODE_FILTER", err)
		}
	}
	// The caller's own filters after the profile's, never instead of it:
	// the kernel runs every filter and the strictest answer wins. They
	// must allow what steps 20-21 need (prlimit64, execve), as bubblewrap
	// requires of its callers' filters for its own execve.
	for i, prog := range cfg.ExtraSeccomp {
		if err := InstallSeccomp(prog); err != nil {
			unix.Close(lfd)
			return stepErr(StepSeccomp, "load seccomp", fmt.Sprintf("the caller's filter %d", i+1), "SECCOMP_SET_MODE_FILTER", err)
		}
	}

	// 19a. A template's listener goes to the launcher before any tool
	// code runs, and the init's own descriptor is closed here, not left
	// to close-on-exec: the tool (the template's import-time code) must
	// never hold the listener that answers its own notifications.
	if lfd >= 0 {
		err := rep.sendFDs(event{Type: "seccomp_listener"}, []int{lfd})
		unix.Close(lfd)
		if err != nil {
			return stepErr(StepHandListener, "hand over seccomp listener", "report socket", "SCM_RIGHTS", err)
		}
	}
	t.mark("privileges")
	t.flush()

	// 20. rlimits, as raw prlimit64 calls on ourselves right before
	// execve: the tool never runs one instruction without them, and no
	// helper program sits in between. RLIMIT_AS goes last: the Go runtime
	// of this process reserves more address space than a tool's limit, so
	// after it nothing here may allocate (a Go setrlimit + syscall.Exec
	// crashed in 5 of 3,260 runs; raw calls on prepared arrays had none).
	for i := range ex.limits {
		l := &ex.limits[i]
		if _, _, e := unix.RawSyscall6(unix.SYS_PRLIMIT64, 0, uintptr(l.resource), uintptr(unsafe.Pointer(&l.lim)), 0, 0, 0); e != 0 {
			return stepErr(StepRlimits, "prlimit64", l.name, fmt.Sprint(l.lim.Max), e)
		}
	}

	// 21. execve, raw: no allocation between the rlimits and the new
	// image. The report pipe is close-on-exec, so the launcher sees EOF
	// exactly when the tool starts (or this thread reports why not).
	// The launcher made this process a session leader with no
	// controlling terminal (setsid at clone), so TIOCSTI cannot push input
	// into the caller's terminal (CVE-2017-5226).
	_, _, e := unix.RawSyscall(unix.SYS_EXECVE, uintptr(unsafe.Pointer(ex.path)),
		uintptr(unsafe.Pointer(&ex.argv[0])), uintptr(unsafe.Pointer(&ex.envp[0])))
	runtime.KeepAlive(ex)
	return stepErr(StepExec, "execve", cfg.Argv[0], "", e)
}

// execArgs is everything steps 20 and 21 (rlimits, execve) use, built in
// step 11 so that they allocate nothing.
type execArgs struct {
	path   *byte
	argv   []*byte // NULL-terminated
	envp   []*byte // NULL-terminated
	limits []limit // RLIMIT_AS last
}

type limit struct {
	name     string
	resource int
	lim      unix.Rlimit
}

// prepareExec builds argv/envp as C arrays and the rlimits in the order
// step 20 sets them.
// A limit above the current hard limit is lowered to it: in its user
// namespace the init cannot raise a hard limit, and lower is tighter.
func prepareExec(cfg *Config, path string) (*execArgs, error) {
	ex := &execArgs{}
	var err error
	if ex.path, err = unix.BytePtrFromString(path); err != nil {
		return nil, err
	}
	argv0 := path
	if cfg.Argv0 != "" {
		argv0 = cfg.Argv0
	}
	argv := append([]string{argv0}, cfg.Argv[1:]...)
	if ex.argv, err = cStrings(argv); err != nil {
		return nil, fmt.Errorf("argv: %w", err)
	}
	if ex.envp, err = cStrings(cfg.Env); err != nil {
		return nil, fmt.Errorf("environment: %w", err)
	}
	for _, rl := range rlimitOrder(cfg.Rlimits) {
		var cur unix.Rlimit
		if err := unix.Getrlimit(rl.Resource, &cur); err != nil {
			return nil, fmt.Errorf("getrlimit %s: %w", rl.Name, err)
		}
		v := min(rl.Value, cur.Max)
		ex.limits = append(ex.limits, limit{name: rl.Name, resource: rl.Resource, lim: unix.Rlimit{Cur: v, Max: v}})
	}
	return ex, nil
}

// rlimitOrder is the order step 20 sets rls in: the plan's, with
// RLIMIT_AS moved last (after it, the process could not even map a page).
func rlimitOrder(rls []Rlimit) []Rlimit {
	out := make([]Rlimit, 0, len(rls))
	var as []Rlimit
	for _, rl := range rls {
		if rl.Resource == unix.RLIMIT_AS {
			as = append(as, rl)
			continue
		}
		out = append(out, rl)
	}
	return append(out, as...)
}

// cStrings is a NULL-terminated array of C strings.
func cStrings(ss []string) ([]*byte, error) {
	out := make([]*byte, len(ss)+1)
	for i, s := range ss {
		p, err := unix.BytePtrFromString(s)
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

func readConfig(fd int) (*Config, error) {
	f := os.NewFile(uintptr(fd), "config")
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

// awaitCall is step 10a: one Call message on the report socket, with
// exactly CallFDs descriptors, dup3'd onto 0-2 (without close-on-exec:
// they are the tool's). EOF means the launcher went away.
func awaitCall(fd int) (*Call, error) {
	buf := make([]byte, MaxCallBytes)
	oob := make([]byte, unix.CmsgSpace(4*(CallFDs+1)))
	var n, oobn, flags int
	var err error
	for {
		n, oobn, flags, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, stepErr(StepAwaitCall, "receive call", "report socket", "recvmsg", err)
	}
	if n == 0 && oobn == 0 {
		return nil, stepErr(StepAwaitCall, "receive call", "report socket", "EOF", errors.New("the launcher went away before the call"))
	}
	var got []int
	if oobn > 0 {
		cms, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, stepErr(StepAwaitCall, "parse call descriptors", "report socket", "SCM_RIGHTS", err)
		}
		for _, cm := range cms {
			fds, err := unix.ParseUnixRights(&cm)
			if err != nil {
				return nil, stepErr(StepAwaitCall, "parse call descriptors", "report socket", "SCM_RIGHTS", err)
			}
			got = append(got, fds...)
		}
	}
	// Received with close-on-exec, so none leaks into the tool unless
	// dup3'd onto 0-2 below.
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || len(got) != CallFDs {
		return nil, stepErr(StepAwaitCall, "check call", "report socket", fmt.Sprintf("%d bytes, %d descriptors, flags %#x", n, len(got), flags),
			fmt.Errorf("a call is one message of at most %d bytes with %d descriptors", MaxCallBytes, CallFDs))
	}
	var call Call
	if err := json.Unmarshal(buf[:n], &call); err != nil {
		return nil, stepErr(StepAwaitCall, "decode call", "report socket", "JSON", err)
	}
	for i, fd := range got {
		if err := unix.Dup3(fd, i, 0); err != nil {
			return nil, stepErr(StepAwaitCall, "dup3", fmt.Sprintf("fd %d -> %d", fd, i), "stdio", err)
		}
		unix.Close(fd)
	}
	return &call, nil
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
	firstErr := error(unix.ENOENT)
	for _, p := range candidates(argv0, env) {
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
