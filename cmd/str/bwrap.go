package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/securetoolruntime/str/bwrap"
	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/planfmt"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// bwrapVersion is the bubblewrap release whose manual `str bwrap`
// follows; --version prints it first so that callers which check the
// version find the one whose command line they speak.
const bwrapVersion = "0.11.1"

// exitBwrapFailed is bubblewrap's status for any failure of its own
// (usage, setup): its callers expect 1, not str run's 2 and 125.
const exitBwrapFailed = 1

const bwrapUsage = `usage: %s [--plan] [--str-profile NAME] [OPTIONS...] [--] COMMAND [ARGS...]

bubblewrap's command line (its %s manual), run in a str sandbox.
Options str cannot honour exactly are refused by name (see
docs/bwrap.md in str's source). str's own options, first on the line:
    --plan               print the sandbox's plan and exit
    --str-profile NAME   the str profile whose limits, seccomp filter and
                         network policy apply (default $STR_BWRAP_PROFILE,
                         else standard, which lets a line without
                         --unshare-net share the caller's network;
                         nesting lets the command run bubblewrap or str
                         inside)
Options honoured:
    %s
`

// cmdBwrap runs a bubblewrap command line (`str bwrap ARGS…`, or str
// invoked as bwrap). name is how the usage names the program.
func cmdBwrap(name string, args []string) int {
	// --die-with-parent arms the parent-death signal on this process's
	// main thread: the kernel sends it when the thread that started us
	// exits, and only the thread-group leader is that thread's child.
	// Locked now, before the first point where the scheduler could have
	// moved main off it; checked below before it is relied on.
	runtime.LockOSThread()
	parent := os.Getppid()

	// --level-prefix: each diagnostic starts with its syslog level, <3>
	// for errors and <4> for warnings (set once the line is parsed).
	errPrefix, warnPrefix := "", ""
	diag := func(prefix, format string, a ...any) {
		// One line per problem (Translate joins all of a line's).
		for _, l := range strings.Split(fmt.Sprintf(format, a...), "\n") {
			fmt.Fprintf(os.Stderr, "%s%s: %s\n", prefix, name, l)
		}
	}
	fail := func(format string, a ...any) int {
		diag(errPrefix, format, a...)
		return exitBwrapFailed
	}
	// The usage names the program as it was called, as bubblewrap's does
	// (argv[0]); diagnostics start with the plain name.
	usageName := name
	if name == "bwrap" {
		usageName = os.Args[0]
	}
	planOnly, profile, args, err := strBwrapOptions(args)
	if err != nil {
		return fail("%v", err)
	}

	cmd, err := bwrap.Parse(args, readAllFD)
	if err != nil {
		if errors.Is(err, bwrap.ErrNoCommand) {
			fmt.Fprintf(os.Stderr, bwrapUsage, usageName, bwrapVersion, strings.Join(bwrap.HonouredOptions(), " "))
			return exitBwrapFailed
		}
		return fail("%v", err)
	}
	chdirs := 0
	for _, op := range cmd.Ops {
		switch op.Option {
		case "--level-prefix":
			errPrefix, warnPrefix = "<3>", "<4>"
		case "--chdir":
			chdirs++
		}
	}
	if chdirs > 1 { // bubblewrap's own warning (its test "warning logged for redundant --chdir")
		diag(warnPrefix, "Only the last --chdir option will take effect")
	}
	switch {
	case cmd.Help:
		fmt.Printf(bwrapUsage, usageName, bwrapVersion, strings.Join(bwrap.HonouredOptions(), " "))
		return 0
	case cmd.Version:
		info, _ := debug.ReadBuildInfo()
		fmt.Printf("bubblewrap %s (%s)\n", bwrapVersion, versionLine(info))
		return 0
	}

	cwd, _ := os.Getwd()
	hostname, _ := os.Hostname()
	sb, err := bwrap.Translate(cmd, bwrap.Host{
		UID: os.Getuid(), GID: os.Getgid(), Environ: os.Environ(), Cwd: cwd, Hostname: hostname, Root: procfs.RootMode(), Caps: effectiveCaps(),
		Lstat: os.Lstat, Stat: os.Stat, ReadDir: os.ReadDir, Readlink: os.Readlink, ReadFD: readAllFD,
	})
	if err != nil {
		return fail("%v", err)
	}

	req := launcher.Request{Profile: profile, Argv: sb.Argv, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		RecordNamespaces: sb.InfoFD >= 0 || sb.JSONStatusFD >= 0}
	// Without --unshare-net bubblewrap leaves the command on the
	// caller's network: so does str, unless the profile forbids it
	// (share_caller_network), when the profile's egress policy applies
	// through str's proxy instead (the plan decides: Plan.CallerNetwork).
	if sb.ShareNet {
		req.CallerNetwork = true
	} else {
		req.Network = &egress.Policy{Mode: egress.Isolated}
	}
	l, err := launcher.New(launcher.Options{ProfileDir: os.Getenv("STR_PROFILE_DIR"), Decoder: workerDecoder{}, CgroupParent: os.Getenv("STR_CGROUP_PARENT")})
	if err != nil {
		return fail("%v", err)
	}
	pl, err := l.Plan(req)
	if err == nil && planOnly {
		err = planfmt.AddViews(pl)
	}
	if err != nil {
		return fail("%v", err)
	}
	// The command line describes the whole filesystem, environment,
	// working directory and ids; the profile keeps the rest (namespaces,
	// limits, rlimits, seccomp, network policy, capabilities dropped).
	if pl.Rootless {
		// --bind-fd: rootless, the init clones the source itself, in a
		// process that does not hold the caller's descriptor: it gets the
		// path the descriptor names now (root mode, the launcher clones
		// it here, through the descriptor itself).
		for i, m := range sb.Mounts {
			if rest, ok := strings.CutPrefix(m.Source, "/proc/self/fd/"); ok && m.Kind == nsinit.MountBind {
				fd, _, _ := strings.Cut(rest, "/")
				p, err := os.Readlink("/proc/self/fd/" + fd)
				if err != nil {
					return fail("--bind-fd %s: %v", fd, err)
				}
				sb.Mounts[i].Source = filepath.Join(p, strings.TrimPrefix(rest, fd))
			}
		}
	}
	if err := pl.SetMounts(sb.Mounts); err != nil {
		return fail("%v", err)
	}
	env := sb.Env
	if sb.ShareNet && !pl.CallerNetwork {
		// The profile forbids the caller's network: its egress policy,
		// served by str's proxy, which a proxy-aware client finds through
		// these. On the caller's network (or --unshare-net) nothing is
		// added: the environment is the line's alone, as bubblewrap's.
		env = append(env, egress.Env(pl.Network)...)
	}
	pl.Child.Env = env
	pl.Child.Workdir = sb.Workdir
	pl.Child.Argv0 = sb.Argv0
	// --seccomp, --add-seccomp-fd: the line's own filters, in its order;
	// unless the profile says caller_seccomp: stack, instead of the
	// profile's (bubblewrap's behaviour: the caller's filter decides).
	policy := pl.Child.SeccompPolicy
	pl.SetCallerSeccomp(sb.Seccomp)
	// --disable-userns: where the profile's policy lets the tool make user
	// namespaces (nesting), or the line's own filters replace the policy
	// that refused them, str stacks a filter that refuses them; it is
	// loaded before the line's own filters, so they need not allow prctl
	// for it. --assert-userns-disabled alone only checks.
	if sb.UsernsDisabled || sb.UsernsAsserted {
		err := checkUsernsDenied(l, policy)
		if err == nil && pl.Child.SeccompPolicy == "" {
			err = errors.New("the profile's seccomp policy, which refuses user namespaces, is replaced by this line's own --seccomp/--add-seccomp-fd filters; add --disable-userns or use a profile with caller_seccomp: stack")
		}
		switch {
		case err == nil: // the profile's policy refuses them, and stays
		case !sb.UsernsDisabled:
			return fail("--assert-userns-disabled: %v", err)
		default:
			f, err := bwrap.UsernsFilter()
			if err != nil {
				return fail("--disable-userns: %v", err)
			}
			pl.Child.ExtraSeccomp = append([][]byte{f}, pl.Child.ExtraSeccomp...)
		}
	}
	// The root and what the line made on it are the command's and stay
	// writable, as bubblewrap's tmpfs root (init step 7); a line that
	// binds a directory over / has that bind as its root under
	// bubblewrap, so str's stays read-only.
	pl.Child.RootToCommand = !sb.RootBound
	if sb.Hostname != "" {
		pl.Child.Hostname = sb.Hostname
	}
	pl.SetToolIDs(sb.UID, sb.GID)
	// --userns, --pidns: the init joins them (its sub-step 0a).
	if sb.UserNS >= 0 {
		if err := pl.JoinNamespaces(sb.UserNS, sb.PidNS); err != nil {
			return fail("--userns: %v", err)
		}
	}
	// As root: root's files are the sandbox's root's through every bind
	// (step L3). The kept capabilities are the sandbox's own user
	// namespace's (init steps 13-16): --cap-add's, and a root caller's own
	// where the profile allows it (root_capabilities), as bubblewrap run
	// by root keeps them; inheritable and ambient only when the line
	// sets them, as bubblewrap's capset.
	pl.MapRoot = sb.MapRoot && !pl.Rootless
	pl.Child.Caps = sb.Caps
	if prof, err := l.Profiles().Lookup(pl.Profile); err == nil && prof.RootCapabilities == profiles.Allow {
		pl.Child.Caps = sb.RootCaps
	}
	if sb.CapsSet {
		pl.Child.Inheritable = pl.Child.Caps
	}
	// --block-fd: the sandbox is built up to its init's step 10a (every
	// mount, the namespaces, the listeners) and waits there; the command
	// comes as its call once the descriptor has data or is closed. The
	// wait is bounded by the profile's timeout, and the command's own
	// clock starts at the call. --userns-block-fd waits at the same
	// point, first: bubblewrap waits there for its caller to write the
	// user namespace's maps, which str has written already.
	type block struct {
		opt string
		fd  int
	}
	var blocks []block
	for _, b := range []block{{"--userns-block-fd", sb.UsernsBlockFD}, {"--block-fd", sb.BlockFD}} {
		if b.fd >= 0 {
			blocks = append(blocks, b)
		}
	}
	var callArgv, callEnv []string
	if len(blocks) > 0 {
		callArgv, callEnv = pl.Child.Argv, pl.Child.Env
		pl.Child.Argv, pl.Child.AwaitCall, pl.Idle = nil, true, pl.Timeout
	}

	if planOnly {
		if len(blocks) > 0 {
			fmt.Printf("command: %q\nenvironment: %q\n", callArgv, callEnv)
			for _, b := range blocks {
				fmt.Printf("started once descriptor %d has data or is closed (%s): the init waits at step 10a, the command is its call\n", b.fd, b.opt)
			}
		} else {
			fmt.Printf("command: %q\nenvironment: %q\n", pl.Child.Argv, pl.Child.Env)
		}
		switch {
		case pl.CallerNetwork:
			fmt.Printf("network: the caller's (the line does not unshare it, as under bubblewrap; profile %s has share_caller_network: allow): no network namespace, no proxy\n", pl.Profile)
		case sb.ShareNet:
			fmt.Printf("network: not the caller's, though the line does not unshare it: profile %s does not allow share_caller_network, so the sandbox has a network namespace of its own, its egress policy (%s) applies through str's proxy, and the policy's variables are added to the environment (docs/bwrap.md)\n", pl.Profile, pl.Network.Mode)
		default:
			fmt.Printf("network: --unshare-net: an own network namespace with only lo\n")
		}
		fmt.Println()
		fmt.Print(planfmt.Plan(pl, profiles.FormatBytes))
		return 0
	}

	if sb.DieWithParent {
		if unix.Gettid() != unix.Getpid() {
			return fail("--die-with-parent: str bwrap is not on its main thread; the parent-death signal cannot be armed")
		}
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
			return fail("--die-with-parent: prctl(PR_SET_PDEATHSIG): %v", err)
		}
		// The parent may have died before the signal was armed: then we
		// were reparented already (its pid is gone from our ppid).
		if os.Getppid() != parent {
			return fail("--die-with-parent: the parent (pid %d) has already exited", parent)
		}
	}
	// --sync-fd: this process holds the descriptors (str never passes
	// them into the sandbox) and lives exactly as long as the sandbox.
	var syncFiles []*os.File
	for _, fd := range sb.SyncFDs {
		syncFiles = append(syncFiles, os.NewFile(uintptr(fd), "sync-fd"))
	}
	defer runtime.KeepAlive(syncFiles)

	// --lock-file: a read lock on each host file for the sandbox's life,
	// held by this process (bubblewrap's pid 1 holds it inside).
	for _, path := range sb.LockFiles {
		f, err := os.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			return fail("--lock-file: Unable to open lock file %s: %v", path, err)
		}
		defer f.Close()
		lk := unix.Flock_t{Type: unix.F_RDLCK, Whence: 0}
		if err := unix.FcntlFlock(f.Fd(), unix.F_SETLK, &lk); err != nil {
			return fail("--lock-file: Unable to lock file %s: %v", path, err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()
	s, err := l.CreateFromPlan(ctx, pl, req)
	if err != nil {
		return fail("%v", err)
	}
	if err := s.Start(); err != nil {
		return fail("%v", err)
	}
	var status io.Writer
	if sb.InfoFD >= 0 || sb.JSONStatusFD >= 0 {
		// The namespaces as the launcher read them before the init ran:
		// the command may have exited already.
		ns := s.Namespaces()
		info := bwrap.Info(s.Pid(), func(_ int, name string) uint64 {
			if name == "net" && pl.CallerNetwork {
				return 0 // not the sandbox's own: bubblewrap reports only the namespaces it made
			}
			return ns[name]
		})
		if sb.InfoFD >= 0 {
			f := os.NewFile(uintptr(sb.InfoFD), "info-fd")
			if _, err := f.WriteString(info.Pretty()); err != nil {
				s.Kill()
				return fail("--info-fd %d: %v", sb.InfoFD, err)
			}
			f.Close()
		}
		if sb.JSONStatusFD >= 0 {
			f := os.NewFile(uintptr(sb.JSONStatusFD), "json-status-fd")
			defer f.Close()
			if _, err := f.WriteString(info.Line()); err != nil {
				s.Kill()
				return fail("--json-status-fd %d: %v", sb.JSONStatusFD, err)
			}
			status = f
		}
	}
	if len(blocks) > 0 {
		for _, b := range blocks {
			if err := awaitBlockFD(ctx, s, b.fd); err != nil {
				s.Kill()
				return fail("%s %d: %v", b.opt, b.fd, err)
			}
		}
		if err := s.Call(callArgv, callEnv, [nsinit.CallFDs]*os.File{os.Stdin, os.Stdout, os.Stderr}, pl.Timeout); err != nil && !errors.Is(err, launcher.ErrEnded) {
			s.Kill()
			return fail("%s %d: %v", blocks[len(blocks)-1].opt, blocks[len(blocks)-1].fd, err)
		}
	}
	res, err := s.Wait()
	if err != nil {
		return fail("%v", err)
	}
	for _, w := range res.Warnings {
		diag(warnPrefix, "warning: %s", w)
	}
	if res.ViolationSummary != "" {
		fmt.Fprintln(os.Stderr, res.ViolationSummary)
	}
	code := res.ExitCode
	switch {
	case res.SetupError != nil:
		diag(errPrefix, "%s", res.SetupError.Error())
		code = exitBwrapFailed
	case res.TimedOut:
		diag(errPrefix, "the str profile's timeout (%s) killed the sandbox", pl.Timeout)
	case res.OOMKilled:
		diag(errPrefix, "the memory limit was hit; the OOM killer ended the command")
	}
	// The exit code is reported only for a command that ran: a setup or
	// exec failure has none (bubblewrap's rule).
	if status != nil && res.SetupError == nil {
		fmt.Fprintf(status, "{ \"exit-code\": %d }\n", code)
	}
	return code
}

// strBwrapOptions takes str's own options off the front of a bwrap line:
// --plan and --str-profile NAME (or =NAME), in any order, before the
// first of bubblewrap's. Without --str-profile the profile is
// $STR_BWRAP_PROFILE, else standard: the caller's choice either way, for
// callers that can only name a program called bwrap (a test suite's
// BWRAP=, a client's configured path).
func strBwrapOptions(args []string) (planOnly bool, profile string, rest []string, err error) {
	profile = cmp.Or(os.Getenv("STR_BWRAP_PROFILE"), "standard")
	for len(args) > 0 {
		switch a := args[0]; {
		case a == "--plan":
			planOnly, args = true, args[1:]
		case a == "--str-profile":
			if len(args) < 2 || args[1] == "" {
				return false, "", nil, errors.New("--str-profile takes a profile name")
			}
			profile, args = args[1], args[2:]
		case strings.HasPrefix(a, "--str-profile="):
			if profile = strings.TrimPrefix(a, "--str-profile="); profile == "" {
				return false, "", nil, errors.New("--str-profile takes a profile name")
			}
			args = args[1:]
		default:
			return planOnly, profile, args, nil
		}
	}
	return planOnly, profile, args, nil
}

// checkUsernsDenied loads the plan's seccomp policy (an embedded name or
// an operator's file) and checks its meaning refuses user namespaces.
func checkUsernsDenied(l *launcher.Launcher, policy string) error {
	p, err := l.SeccompPolicy(policy)
	if err != nil {
		return fmt.Errorf("seccomp policy %s: %w", policy, err)
	}
	return bwrap.CheckUsernsDenied(policy, p.Evaluate, bwrap.NativeAuditArch())
}

// effectiveCaps is this process's effective capability set (0 when it
// cannot be read: then a root caller keeps none).
func effectiveCaps() uint64 {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) != nil {
		return 0
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32
}

// readAllFD reads a descriptor to its end and closes it (--args, --file).
func readAllFD(fd int) ([]byte, error) {
	f := os.NewFile(uintptr(fd), fmt.Sprintf("fd %d", fd))
	if f == nil {
		return nil, fmt.Errorf("fd %d: invalid", fd)
	}
	defer f.Close()
	return io.ReadAll(f)
}

// awaitBlockFD waits until the sandbox's init waits for its call (or the
// sandbox has ended: Wait then says why), then until fd has data to read
// or is closed (one byte is read, as bubblewrap reads it).
func awaitBlockFD(ctx context.Context, s *launcher.Sandbox, fd int) error {
	select {
	case <-s.AwaitingCall():
	case <-s.Ended():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	read := make(chan error, 1)
	go func() {
		var b [1]byte
		for {
			_, err := unix.Read(fd, b[:])
			if err == unix.EINTR {
				continue
			}
			read <- err
			return
		}
	}()
	select {
	case err := <-read:
		return err
	case <-s.Ended():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
