package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/outcome"
	"github.com/securetoolruntime/str/launcher/resident"
	"github.com/securetoolruntime/str/profiles"
)

// Exit codes of `str run` when the failure is str's, not the tool's
// (outcome.Of's, and bad flags).
const (
	exitLauncher    = outcome.ExitLauncher // str could not build or start the sandbox (usage, profile, setup step)
	exitUsage       = 2                    // bad flags (before anything was attempted)
	runUsageSummary = `usage: str run [flags] -- CMD [ARGS...]

Runs CMD in a fresh sandbox and exits with its status (128+N if signal N
killed it). str's own exit codes: 124 timed out, 125 sandbox setup failed
(the message names the step and path), 126 CMD not executable, 127 CMD not
found inside the sandbox, 123 the resident launcher (str serve) died during
the call (CMD may have run; str run does not run it again), 2 bad flags.

flags:
`
)

// multiFlag collects a repeatable flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func cmdRun(args []string) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, runUsageSummary); fs.PrintDefaults() }
	var binds, roBinds, envs multiFlag
	profile := fs.String("profile", "standard", "profile name or trust level (str profile list)")
	profileDir := fs.String("profile-dir", os.Getenv("STR_PROFILE_DIR"), "directory with extra *.yaml profiles")
	fs.Var(&binds, "bind", "bind host `SRC[:DST]` read-write (repeatable)")
	fs.Var(&roBinds, "ro-bind", "bind host `SRC[:DST]` read-only (repeatable)")
	workdir := fs.String("workdir", "", "host `DIR` bound read-write at the same path and made the working directory; as root it is bound id-mapped: "+
		"DIR's owner is the tool inside, so the tool writes where the owner may and its files belong to the owner on the host; a DIR owned by root is bound as it is "+
		"(no tool leaves root's files on the host: the tool writes only where DIR's mode lets others, as its own ids); as root the tool's writes are capped by the profile's work_dir "+
		"(they land on a capped tmpfs over DIR and are copied into DIR when the sandbox ends: --result's write_back)")
	workdirLive := fs.Bool("workdir-live", false, "as root, bind -workdir DIR live instead: the tool writes into DIR directly, bounded by DIR's filesystem only (not the profile's work_dir cap)")
	// -workdir-owner was the opt-in for what -workdir does now; accepted
	// so that scripts keep working.
	fs.Bool("workdir-owner", true, "accepted for compatibility: as root -workdir is always id-mapped to its owner (unless root owns it)")
	timeout := fs.String("timeout", "", "wall-clock timeout (`DUR`: 10s, 2m; may only be shorter than the profile's)")
	memory := fs.String("memory", "", "memory limit (`Q`: 256Mi, 1G; may only be lower than the profile's)")
	cpus := fs.String("cpus", "", "CPU limit (`Q`: 1, 500m; may only be lower than the profile's)")
	pids := fs.Int64("pids", 0, "max processes in the sandbox (may only be lower than the profile's)")
	runtimeClass := fs.String("runtime", "", "runtime class: namespaces, gvisor or microvm (may only be stronger than the profile's; see str runtimes)")
	netMode := fs.String("net", "", "network policy: isolated, restricted or allow_egress (may only narrow the profile's)")
	var allowHosts, allowPorts, allowCIDRs multiFlag
	fs.Var(&allowHosts, "allow-host", "restricted: a `HOST` or *.DOMAIN the tool may reach (repeatable)")
	fs.Var(&allowPorts, "allow-port", "restricted: a `PORT` the allowed hosts may be reached on (repeatable; default 443)")
	fs.Var(&allowCIDRs, "allow-cidr", "a `CIDR` the tool may reach although private or an IP literal (repeatable; must be within the profile's)")
	fs.Var(&envs, "env", "add `K=V` to the tool's environment (repeatable)")
	var credFlags credentialFlags
	credFlags.register(fs)
	resultPath := fs.String("result", "", "write the result JSON to `PATH` (- for stdout, after the command's output)")
	serveSocket := fs.String("serve", "", "run through the resident launcher (str serve) listening on `SOCKET` when it is reachable and the request is poolable; else one-shot (default $STR_SERVE_SOCKET if set, else serve.sock in the state directory: /run/str/serve.sock for root; \"\" for none)")
	oneShot := fs.Bool("one-shot", false, "never use a resident launcher")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	argv := fs.Args()
	if len(argv) == 0 {
		fmt.Fprintln(os.Stderr, "str run: no command given (str run [flags] -- CMD [ARGS...])")
		return exitUsage
	}

	req := launcher.Request{
		Profile: *profile, Runtime: *runtimeClass, Argv: argv, Env: envs, Workdir: *workdir, WorkdirAsOwner: true, WorkdirLive: *workdirLive, Pids: *pids,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
	}
	var bad []error
	if *netMode != "" || len(allowHosts) > 0 || len(allowPorts) > 0 || len(allowCIDRs) > 0 {
		n := &egress.Policy{Mode: egress.Mode(*netMode), AllowedHosts: allowHosts, AllowedCIDRs: allowCIDRs}
		for _, p := range allowPorts {
			port, err := strconv.Atoi(p)
			if err != nil {
				bad = append(bad, fmt.Errorf("--allow-port %q: not a number", p))
			}
			n.AllowedPorts = append(n.AllowedPorts, port)
		}
		req.Network = n
	}
	creds, credErrs := credFlags.build(os.Getenv)
	req.Credentials, bad = creds, append(bad, credErrs...)
	for _, b := range binds {
		req.Binds = append(req.Binds, parseBind(b, true))
	}
	for _, b := range roBinds {
		req.Binds = append(req.Binds, parseBind(b, false))
	}
	if *timeout != "" {
		d, err := profiles.ParseDuration(*timeout)
		if err != nil || d <= 0 {
			bad = append(bad, fmt.Errorf("--timeout %q: %v", *timeout, errOrPositive(err)))
		}
		req.Timeout = d
	}
	if *memory != "" {
		q, err := profiles.ParseBytes(*memory)
		if err != nil || q <= 0 {
			bad = append(bad, fmt.Errorf("--memory %q: %v", *memory, errOrPositive(err)))
		}
		req.Memory = int64(q)
	}
	if *cpus != "" {
		q, err := profiles.ParseCPUs(*cpus)
		if err != nil || q <= 0 {
			bad = append(bad, fmt.Errorf("--cpus %q: %v", *cpus, errOrPositive(err)))
		}
		req.CPUs = int64(q)
	}
	if len(bad) > 0 {
		fmt.Fprintln(os.Stderr, "str run:", errors.Join(bad...))
		return exitUsage
	}

	// SIGTERM/SIGINT to str run: end the sandbox cleanly (the context kills
	// it and the cgroup is removed) rather than leave it to Pdeathsig.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer stop()

	// A resident launcher first, when one is named and the request may be
	// poolable: the plan of a pre-built sandbox of the profile, so no
	// binds, work dir, credentials, limits or network flags (each needs
	// another plan) and no profile directory (the server has its own
	// profiles). It answers "not poolable" for anything else its
	// pre-built sandboxes cannot honour, and then, or when nothing
	// listens, the run is one-shot. Nothing of the one-shot path
	// (profiles, the launcher) is loaded before this answer.
	socket := residentSocket(fs, *serveSocket, *oneShot)
	if socket != "" && req.Runtime == "" && len(req.Binds) == 0 && req.Workdir == "" && len(req.Credentials) == 0 &&
		req.Memory == 0 && req.CPUs == 0 && req.Pids == 0 && req.Network == nil && *profileDir == "" {
		rreq := resident.Request{Profile: req.Profile, Argv: req.Argv, Env: req.Env, Environ: os.Environ(),
			Timeout: req.Timeout, WantResult: *resultPath != ""}
		out, err := resident.Call(ctx, socket, rreq, [3]*os.File{os.Stdin, os.Stdout, os.Stderr})
		var re *resident.Error
		switch {
		case err == nil:
			if *resultPath != "" {
				if err := writeResult(*resultPath, out.Result); err != nil {
					fmt.Fprintln(os.Stderr, "str run: --result:", err)
				}
			}
			if out.Stderr != "" {
				os.Stderr.WriteString(out.Stderr)
			}
			return out.Status
		case errors.Is(err, resident.ErrNoResident), errors.Is(err, resident.ErrNotPoolable):
			// one-shot below
		case errors.As(err, &re) && re.Refused:
			// The caller may still run one-shot with its own privileges.
			fmt.Fprintln(os.Stderr, "str run: warning: the resident launcher refused this caller; running one-shot:", err)
		case errors.As(err, &re) && re.Untrusted:
			fmt.Fprintln(os.Stderr, "str run: warning: not using this socket; running one-shot:", err)
		case errors.As(err, new(*resident.LostError)):
			fmt.Fprintln(os.Stderr, "str run:", err)
			return outcome.ExitResidentLost
		default:
			fmt.Fprintln(os.Stderr, "str run:", err)
			return exitLauncher
		}
	}

	// STR_CGROUP_PARENT names the cgroup v2 parent for sandboxes (a
	// delegated subtree); unset, the launcher's own cgroup (v2Base).
	l, err := launcher.New(launcher.Options{ProfileDir: *profileDir, Decoder: workerDecoder{}, CgroupParent: os.Getenv("STR_CGROUP_PARENT")})
	if err != nil {
		fmt.Fprintln(os.Stderr, "str run:", err)
		return exitLauncher
	}

	res, err := l.Run(ctx, req)
	if err != nil {
		fmt.Fprintln(os.Stderr, "str run:", err)
		return exitLauncher
	}
	if *resultPath != "" {
		data, err := json.MarshalIndent(res, "", "  ")
		if err == nil {
			err = writeResult(*resultPath, append(data, '\n'))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "str run: --result:", err)
		}
	}
	// The same exit code and text as a served run's (the server applies
	// the same Outcome).
	code, text := outcome.Of(res)
	fmt.Fprint(os.Stderr, text)
	return code
}

func errOrPositive(err error) error {
	if err != nil {
		return err
	}
	return errors.New("must be greater than zero")
}

func parseBind(s string, writable bool) launcher.Bind {
	src, dst, _ := strings.Cut(s, ":")
	return launcher.Bind{Source: src, Target: dst, Writable: writable}
}

// writeResult writes the result's JSON (as the server sends it for a
// served run) to path, "-" for stdout.
func writeResult(path string, data []byte) error {
	if path == "-" {
		_, err := os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// residentSocket is the resident launcher's socket str run tries first,
// "" for none: none with --one-shot; else --serve when given ("" is
// none); else resident.ImplicitSocket ($STR_SERVE_SOCKET when
// set, empty is none; else the state directory's, which is simply not
// there on a host without str serve).
func residentSocket(fs *flag.FlagSet, serve string, oneShot bool) string {
	if oneShot {
		return ""
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "serve" })
	if given {
		return serve
	}
	return resident.ImplicitSocket()
}
