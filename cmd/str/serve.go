package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/internal/jsonlog"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/resident"
	"github.com/securetoolruntime/str/launcher/statedir"
)

const serveUsageSummary = `usage: str serve [--socket PATH] [flags]

Keeps --pool sandboxes per served profile pre-built (namespaces, mounts,
cgroup, host ids: everything up to the tool's own steps), each waiting for
one call, and serves ` + "`str run`" + ` with them (the default socket, in str's state
directory, is where str run looks by itself; another is named to str run with
--serve PATH or STR_SERVE_SOCKET=PATH): the caller's argv, environment and stdio go to a waiting sandbox,
whose init then runs the same last steps as a one-shot run. Root only.
Callers are checked with SO_PEERCRED: root, --allow-uid and members of
--allow-group. A request the pre-built sandboxes cannot honour (binds, a
work dir, lower limits, a narrower network, another profile) is answered
"not poolable" and str run runs it one-shot.

flags:
`

func cmdServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, serveUsageSummary); fs.PrintDefaults() }
	socket := fs.String("socket", "", "the socket's `PATH` (default serve.sock in the state directory, where str run looks by itself: /run/str/serve.sock; its directory must be root's and writable by no one else; created root:GROUP 0660 with --allow-group, 0600 without; 0666 with --allow-uid, where SO_PEERCRED alone decides)")
	profilesFlag := fs.String("profiles", "restrictive,standard", "the served profiles, comma-separated")
	pool := fs.Int("pool", 2, "pre-built sandboxes per profile")
	idle := fs.Duration("idle", resident.DefaultIdle, "a pre-built sandbox not called within this is replaced")
	var uids multiFlag
	fs.Var(&uids, "allow-uid", "a `UID` (or user name) that may use the socket besides root (repeatable)")
	group := fs.String("allow-group", "", "a `GROUP` (name or gid) whose members may use the socket")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	var bad []error
	if *socket == "" {
		// The default: the state directory's, made (0700) if missing and
		// checked as every state directory is (statedir.Secure).
		dir := statedir.Dir(os.Getenv)
		err := statedir.Check(os.Getenv)
		if err == nil {
			err = statedir.Secure(dir)
		}
		if err != nil {
			bad = append(bad, err)
		}
		*socket = resident.DefaultSocket(os.Getenv)
	}
	if fs.NArg() > 0 {
		bad = append(bad, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	opts := resident.Options{Socket: *socket, Pool: *pool, Idle: *idle, AllowGID: -1}
	for _, p := range strings.Split(*profilesFlag, ",") {
		if p = strings.TrimSpace(p); p != "" {
			opts.Profiles = append(opts.Profiles, p)
		}
	}
	if len(opts.Profiles) == 0 {
		bad = append(bad, errors.New("--profiles names no profile"))
	}
	if *pool < 1 || *pool > 64 {
		bad = append(bad, fmt.Errorf("--pool %d: 1..64", *pool))
	}
	for _, u := range uids {
		id, err := strconv.Atoi(u)
		if err != nil {
			usr, lerr := user.Lookup(u)
			if lerr != nil {
				bad = append(bad, fmt.Errorf("--allow-uid %q: not a uid or a known user", u))
				continue
			}
			id, _ = strconv.Atoi(usr.Uid)
		}
		if id < 0 {
			bad = append(bad, fmt.Errorf("--allow-uid %q: negative", u))
			continue
		}
		opts.AllowUIDs = append(opts.AllowUIDs, id)
	}
	if *group != "" {
		id, err := strconv.Atoi(*group)
		if err != nil {
			g, lerr := user.LookupGroup(*group)
			if lerr != nil {
				bad = append(bad, fmt.Errorf("--allow-group %q: not a gid or a known group", *group))
			} else {
				id, _ = strconv.Atoi(g.Gid)
			}
		}
		if id < 0 {
			bad = append(bad, fmt.Errorf("--allow-group %q: negative", *group))
		}
		opts.AllowGID = id
	}
	if len(bad) > 0 {
		fmt.Fprintln(os.Stderr, "str serve:", errors.Join(bad...))
		return exitUsage
	}
	log := jsonlog.New("info")
	l, err := launcher.New(launcher.Options{CgroupParent: os.Getenv("STR_CGROUP_PARENT"), LongLived: true, Logger: log})
	if err != nil {
		fmt.Fprintln(os.Stderr, "str serve:", err)
		return exitLauncher
	}
	opts.Log = log
	r, err := resident.New(l, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitLauncher
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		r.Close()
	}()
	start := time.Now()
	fmt.Fprintf(os.Stderr, "str serve: %s: profiles %s, %d pre-built each\n", *socket, strings.Join(opts.Profiles, ","), *pool)
	if (len(opts.AllowUIDs) > 0 || opts.AllowGID >= 0) && !othersReach(*socket) {
		fmt.Fprintf(os.Stderr, "str serve: warning: --allow-uid/--allow-group: a directory above %s lets only root through; name a socket others can reach (--socket) and tell their str run (STR_SERVE_SOCKET)\n", *socket)
	}
	err = r.Serve()
	r.Close() // removes the socket, if still its own
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "str serve: stopped after %s\n", time.Since(start).Round(time.Second))
	return 0
}

// othersReach reports whether every directory above path lets others
// search it (x for group or others), so that a caller other than root can
// reach the socket at all.
func othersReach(path string) bool {
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o011 == 0 {
			return false
		}
		if d == filepath.Dir(d) {
			return true
		}
	}
}
