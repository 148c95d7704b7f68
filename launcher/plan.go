package launcher

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// ErrInvalidRequest marks errors that are the caller's fault: an unknown
// profile, an override that loosens the profile, a malformed bind. The
// worker maps it to INVALID_REQUEST; everything else is a sandbox failure.
var ErrInvalidRequest = errors.New("invalid sandbox request")

// Host is what the plan needs to know about the machine. New reads it
// once (Launcher.Host); tests build it by hand.
type Host struct {
	UID, GID int // the caller's effective ids
	// Root is root mode (procfs.RootMode): sandboxes run as leased host
	// ids. False for every other uid and for uid 0 of a user namespace
	// that maps one id (a str nested in a sandbox), which run rootless.
	Root   bool
	Cgroup CgroupMode // which cgroup hierarchy limits are applied through
	// RequireCgroup refuses an unprivileged caller's plan on a host with
	// no cgroup it may write (CgroupNone) unless the profile is
	// best_effort, as a root caller's always is: STR_REQUIRE_CGROUP=1, or
	// a worker (Options.RequireCgroup). Unset, an unprivileged caller runs
	// without the profile's cgroup limits and is told so (CgroupPlan.Unenforced).
	RequireCgroup bool
	// Lstat and Readlink look at host paths (bind sources); nil means the os
	// functions.
	Lstat    func(string) (fs.FileInfo, error)
	Readlink func(string) (string, error)
	// Getenv supplies the caller's environment for the profile's
	// passthrough list; nil means nothing is passed through.
	Getenv func(string) string
	// NoFile is the launcher's RLIMIT_NOFILE (soft; 0: unknown, no
	// limit but the init's), which bounds a plan's bind sources.
	NoFile uint64
}

// CgroupMode is the cgroup hierarchy in use.
type CgroupMode string

const (
	CgroupV2   CgroupMode = "v2"   // unified hierarchy: CLONE_INTO_CGROUP, cgroup.kill
	CgroupV1   CgroupMode = "v1"   // legacy/hybrid controllers: enter after clone, freeze+kill
	CgroupNone CgroupMode = "none" // no writable cgroup: best_effort, or an unprivileged caller (Host.RequireCgroup)
)

// Plan is the complete, concrete description of one sandbox: what `str
// profile show NAME --plan` prints and what apply performs. Building it
// touches nothing but the Host description.
type Plan struct {
	Profile       string   `json:"profile"`
	Rootless      bool     `json:"rootless"`
	UserNamespace bool     `json:"user_namespace"`
	CloneFlags    uintptr  `json:"clone_flags"`
	CloneNames    []string `json:"clone_flag_names"`
	UIDMappings   []IDMap  `json:"uid_mappings,omitempty"`
	GIDMappings   []IDMap  `json:"gid_mappings,omitempty"`
	// ExtraIDMaps (root mode, a per-tool template: launcher/template)
	// are added to both maps after the leased block's: the host id pairs
	// the template's calls will run as, leased with it, so that the
	// supervisor may map one into each call's own user namespace.
	ExtraIDMaps []IDMap `json:"extra_id_maps,omitempty"`
	// ToolUID/ToolGID are the host ids the tool runs as and its files
	// belong to; -1 in a root-mode plan until Create leases an id block.
	ToolUID int `json:"tool_host_uid"`
	ToolGID int `json:"tool_host_gid"`
	// MapRoot (root mode; set by str bwrap only, for a root caller): at
	// step L3 every bind tree not mapped to its owner (Mount.IDMapOwner)
	// is id-mapped so that host uid and gid 0 are the sandbox's 0 (its
	// leased host ids): root's files are the command's, as host root's
	// are a command's under bubblewrap run by root (idmap.MapRoot;
	// SECURITY.md, "Root and rootless").
	MapRoot bool `json:"map_root,omitempty"`

	Cgroup  CgroupPlan    `json:"cgroup"`
	Timeout time.Duration `json:"timeout_ns"`
	// WorkDir is the profile's work dir cap: root mode, a sandbox made
	// through the Provider gets a tmpfs of this size and inode count as
	// its work dir (step L9); rootless, a plain directory.
	WorkDir profiles.WorkDir `json:"work_dir"`
	// Idle > 0: the sandbox waits unarmed, killed Idle after its start
	// unless Arm gives it its timeout (at most Timeout) first.
	Idle time.Duration `json:"idle_ns,omitempty"`

	Child   nsinit.Config      `json:"child"`
	Seccomp []seccomp.RuleView `json:"seccomp_rules"`
	// SeccompDefault is the action for syscalls no rule names.
	SeccompDefault string `json:"seccomp_default_action"`
	// CallerSeccomp is the profile's caller_seccomp (replace or stack):
	// what a caller's own filters do to the profile's (SetCallerSeccomp).
	CallerSeccomp string `json:"caller_seccomp"`

	BestEffort bool `json:"best_effort"`

	// Network is the sandbox's network policy, served by the launcher's
	// egress proxy on the listeners the init opens (Child.Listen).
	Network egress.Policy `json:"network"`
	// CallerNetwork: the sandbox makes no network namespace and is on
	// the caller's network (Request.CallerNetwork under a profile that
	// allows it): no listeners, no proxy, Network unused.
	CallerNetwork bool `json:"caller_network,omitempty"`

	// NoFile is the launcher's RLIMIT_NOFILE (Host.NoFile): SetMounts
	// checks a new filesystem's bind sources against it too.
	NoFile uint64 `json:"launcher_nofile,omitempty"`

	// IDRange is where root-mode sandboxes lease their host ids.
	IDRange IDRange `json:"id_range"`

	// Runtime is the profile's runtime class (tightened by the request):
	// namespaces is this package's; any other is refused by
	// CreateFromPlan and run by Run through runtimes.go.
	Runtime string `json:"runtime"`
}

// IDMap is one line of /proc/PID/uid_map or gid_map.
type IDMap struct {
	Inside  int `json:"inside"`
	Outside int `json:"outside"`
	Size    int `json:"size"`
}

// CgroupPlan is the sandbox cgroup's limits.
type CgroupPlan struct {
	Mode        CgroupMode `json:"mode"`
	MemoryMax   int64      `json:"memory_max"`
	SwapMax     int64      `json:"swap_max"`
	CPUQuotaUs  int64      `json:"cpu_quota_us"`
	CPUPeriodUs int64      `json:"cpu_period_us"`
	PidsMax     int64      `json:"pids_max"`
	// Unenforced says why the limits above are not applied (Mode none):
	// "not delegated to uid N". Empty when they are.
	Unenforced string `json:"unenforced,omitempty"`
}

// Warning is the one line a plan without its cgroup limits carries into
// its result (Result.Warnings, printed by str run and str bwrap): what is
// not enforced, why, and where to look; "" when the limits apply.
func (c CgroupPlan) Warning() string {
	if c.Unenforced == "" {
		return ""
	}
	return "cgroup limits not applied (memory.max, cpu.max, pids.max): no cgroup (" + c.Unenforced +
		"); rlimits and the timeout still hold; see str doctor"
}

const cpuPeriodUs = 100000

// FitTimeout is the one place a sandbox's wall clock is fitted to its
// profile: asked, at most the profile's timeout (0 there = none); asked 0
// (or less) is the profile's. The plan takes its Timeout from it, and so
// does every caller that asks for a sandbox's clock (the worker's call
// and probe timeouts): a sandbox refuses more than its profile's (the
// tighten-only check, Arm), it does not cap.
func FitTimeout(p *profiles.Profile, asked time.Duration) time.Duration {
	limit := time.Duration(p.Timeout)
	switch {
	case asked <= 0:
		return limit
	case limit > 0 && asked > limit:
		return limit
	}
	return asked
}

// NewPlan turns a (tightened) profile and a request into a Plan. prog is
// the compiled seccomp policy the profile names.
func NewPlan(p *profiles.Profile, req Request, host Host, prog *seccomp.Program) (*Plan, error) {
	var problems []error
	bad := func(format string, a ...any) {
		problems = append(problems, fmt.Errorf("%w: "+format, append([]any{ErrInvalidRequest}, a...)...))
	}
	if host.Lstat == nil {
		host.Lstat = os.Lstat
	}
	if host.Readlink == nil {
		host.Readlink = os.Readlink
	}
	switch {
	case req.AwaitCall && (len(req.Argv) > 0 || req.Idle <= 0 || len(req.ExtraFiles) > 0):
		bad("a sandbox that awaits its call has no command, waits unarmed (Idle > 0) and passes no descriptors")
	case !req.AwaitCall && len(req.Argv) == 0:
		bad("no command given")
	}

	pl := &Plan{Profile: p.Name, Runtime: p.RuntimeClass(), BestEffort: p.BestEffort, Timeout: FitTimeout(p, req.Timeout), WorkDir: p.WorkDir, NoFile: host.NoFile}
	if req.Idle < 0 {
		bad("idle limit %s: must not be negative", req.Idle)
	}
	pl.Idle = req.Idle

	// Namespaces: all of them, always. The network namespace holds only
	// lo; what leaves it goes through the launcher's egress proxy, whose
	// listeners the init opens on lo (the network policy decides; the
	// sandbox enforces nothing).
	// The one exception (str bwrap, a line without --unshare-net, under a
	// profile whose share_caller_network is allow): no network namespace,
	// no loopback or listeners for the init's step 10, and no proxy.
	pl.CloneFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP
	pl.CloneNames = []string{"CLONE_NEWUSER", "CLONE_NEWNS", "CLONE_NEWPID", "CLONE_NEWIPC", "CLONE_NEWUTS", "CLONE_NEWCGROUP"}
	pl.Network = p.Network
	pl.CallerNetwork = req.CallerNetwork && p.SharesCallerNetwork()
	if req.CallerNetwork && len(req.Credentials) > 0 {
		bad("credentials need the egress proxy: the caller's network has none")
	}
	if !pl.CallerNetwork {
		pl.CloneFlags |= unix.CLONE_NEWNET
		pl.CloneNames = append(pl.CloneNames, "CLONE_NEWNET")
		pl.Child.LoopbackUp = true
		pl.Child.Listen = egressListeners(p.Network)
	}
	// Every sandbox has its own user namespace, root mode too: the init is
	// root of that namespace only, an unprivileged uid on the host.
	pl.Rootless = !host.Root
	pl.UserNamespace = true
	if p.UserNamespace == "never" {
		bad("profile %s: user_namespace: never is no longer supported: every sandbox has its own user namespace", p.Name)
	}
	if pl.Rootless {
		// One id is all an unprivileged user may map: the caller becomes
		// the tool's uid inside. setgroups is denied by the kernel.
		pl.UIDMappings = []IDMap{{Inside: int(p.UID), Outside: host.UID, Size: 1}}
		pl.GIDMappings = []IDMap{{Inside: int(p.GID), Outside: host.GID, Size: 1}}
		pl.ToolUID, pl.ToolGID = host.UID, host.GID
		// The clone child runs as the mapped uid, not 0: it holds the new
		// namespace's capabilities from the clone (no execve comes before
		// the tool's) and drops them all at steps 13-16.
		pl.Child.SetGroups = false
	} else {
		// Root: the ids come from a block leased per sandbox at Create
		// (assignIDs); until then the tool's host ids are unknown (-1).
		pl.ToolUID, pl.ToolGID = -1, -1
		pl.Child.SetGroups = true
	}

	// Cgroup limits. Swap is always 0: a sandbox never swaps.
	pl.Cgroup = CgroupPlan{
		Mode:        host.Cgroup,
		MemoryMax:   int64(p.Cgroup.Memory),
		SwapMax:     0,
		CPUQuotaUs:  int64(p.Cgroup.CPUs) * cpuPeriodUs / 1000,
		CPUPeriodUs: cpuPeriodUs,
		PidsMax:     p.Cgroup.Pids, // the init is one task that becomes the tool: no allowance
	}
	// No cgroup this caller may write: root's is a host misconfiguration
	// (an error unless the profile is best_effort); an unprivileged
	// caller's is the common case (nothing delegated to it), run without
	// the limits and said in the plan and the result, unless the operator
	// requires them (STR_REQUIRE_CGROUP=1, a worker). What holds without
	// a cgroup: the rlimits (RLIMIT_NPROC bounds a fork bomb), and the
	// timeout, which SIGKILLs the pid namespace's init and with it every
	// process of the namespace (a double-forked daemon too).
	if host.Cgroup == CgroupNone {
		switch {
		case pl.Rootless && p.Rlimits.AS == profiles.UnlimitedAS:
			bad("no cgroup delegated to uid %d, and profile %s has rlimits.as: unlimited, which needs memory.max to bound the sandbox (see str doctor)", host.UID, p.Name)
		case pl.Rootless && (p.BestEffort || !host.RequireCgroup):
			pl.Cgroup.Unenforced = fmt.Sprintf("not delegated to uid %d", host.UID)
		case p.BestEffort:
			pl.Cgroup.Unenforced = "no writable cgroup hierarchy (best_effort)"
		case pl.Rootless:
			bad("no cgroup delegated to uid %d, and STR_REQUIRE_CGROUP=1 (or a worker) requires one unless profile %s is best_effort (see str doctor)", host.UID, p.Name)
		default:
			bad("no writable cgroup hierarchy on this host and profile %s is not best_effort (see str doctor)", p.Name)
		}
	}

	// The child's side.
	c := &pl.Child
	c.Version = nsinit.ConfigVersion
	c.Hostname = p.Hostname
	c.UID, c.GID = p.UID, p.GID
	c.Argv = append([]string(nil), req.Argv...)
	c.AwaitCall = req.AwaitCall
	c.BestEffort = p.BestEffort
	c.PassFDs = len(req.ExtraFiles)
	c.Rlimits = rlimits(p)
	extra := slices.Clone(req.Env)
	if !pl.CallerNetwork {
		extra = append(extra, egress.Env(p.Network)...)
	}
	env, err := buildEnv(p, extra, host.Getenv)
	if err != nil {
		bad("%v", err)
	}
	c.Env = env
	if prog != nil {
		c.SeccompPolicy = prog.Policy
		c.Seccomp = seccomp.EncodeFilter(prog.Filter)
		pl.Seccomp = prog.Rules
		pl.SeccompDefault = prog.DefaultAction
	}
	pl.CallerSeccomp = cmp.Or(p.CallerSeccomp, profiles.CallerSeccompReplace)

	mounts, workdir, errs := buildMounts(p, req, host)
	for _, e := range errs {
		bad("%v", e)
	}
	c.Mounts = mounts
	c.Workdir = workdir

	// Descriptors: the tool's pass-list and, root mode, one detached tree
	// per bind source, cloned on the host by the launcher (step L3) and
	// found by the init at its TreeFD; rootless, the init clones the
	// sources itself (it is the caller's uid on the host). One limit for
	// both modes, so a plan valid as root is valid rootless.
	if n := len(req.ExtraFiles); n > nsinit.MaxPassFDs {
		bad("%d descriptors to pass, at most %d", n, nsinit.MaxPassFDs)
	}
	sources := 0
	for _, m := range mounts {
		if hasSource(m) {
			sources++
		}
	}
	if err := checkBindSources(sources, host.NoFile); err != nil {
		problems = append(problems, err)
	}
	if !pl.Rootless {
		numberTrees(c.Mounts, nsinit.FirstTreeFD(c.PassFDs))
	}

	if len(problems) > 0 {
		return nil, errors.Join(problems...)
	}
	return pl, nil
}

// fdReserve is what checkBindSources keeps of RLIMIT_NOFILE for the
// descriptors that are not bind sources: the launcher's own, the tool's
// 0-2 and pass-list (nsinit.MaxPassFDs), the init's setup.
const fdReserve = 256

// checkBindSources is the one limit on a plan's bind sources (binds and
// /dev's nodes), the same in both modes so that a plan valid as root is
// valid rootless: the init's table (nsinit.MaxBindSources) and the
// launcher's RLIMIT_NOFILE (nofile; 0 unknown), since each source is
// two descriptors at once at the clone: root mode the launcher's tree
// and the clone child's copy of it moved above the tool's (init step 1),
// rootless the child's own clone of it and the launcher's copied table.
func checkBindSources(n int, nofile uint64) error {
	if n > nsinit.MaxBindSources {
		return fmt.Errorf("%w: %d bind mounts (binds and /dev's nodes), at most %d (the init's table of descriptors)", ErrInvalidRequest, n, nsinit.MaxBindSources)
	}
	if nofile > 0 && uint64(2*n+fdReserve) > nofile {
		return fmt.Errorf("%w: %d bind mounts (binds and /dev's nodes) need %d descriptors at once, above the launcher's RLIMIT_NOFILE %d: raise it (ulimit -n), or bind fewer paths", ErrInvalidRequest, n, 2*n+fdReserve, nofile)
	}
	return nil
}

func rlimits(p *profiles.Profile) []nsinit.Rlimit {
	r := p.Rlimits
	return []nsinit.Rlimit{
		{Name: "RLIMIT_AS", Resource: unix.RLIMIT_AS, Value: r.AS.Rlimit()},
		{Name: "RLIMIT_CPU", Resource: unix.RLIMIT_CPU, Value: uint64(time.Duration(r.CPU) / time.Second)},
		{Name: "RLIMIT_FSIZE", Resource: unix.RLIMIT_FSIZE, Value: uint64(r.FSize)},
		{Name: "RLIMIT_NOFILE", Resource: unix.RLIMIT_NOFILE, Value: uint64(r.NoFile)},
		{Name: "RLIMIT_NPROC", Resource: unix.RLIMIT_NPROC, Value: uint64(r.NProc)},
		{Name: "RLIMIT_STACK", Resource: unix.RLIMIT_STACK, Value: uint64(r.Stack)},
		{Name: "RLIMIT_CORE", Resource: unix.RLIMIT_CORE, Value: uint64(r.Core)},
	}
}

// buildEnv rebuilds the environment from nothing: the profile's fixed
// values, then the passthrough names set in the caller's environment, then
// the request's additions. Sorted, so the plan is deterministic.
func buildEnv(p *profiles.Profile, extra []string, getenv func(string) string) ([]string, error) {
	m := map[string]string{}
	for k, v := range p.Env.Set {
		m[k] = v
	}
	if getenv != nil {
		for _, k := range p.Env.Passthrough {
			if v := getenv(k); v != "" {
				m[k] = v
			}
		}
	}
	for _, kv := range extra {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(k, "\x00") || strings.ContainsRune(v, 0) {
			return nil, fmt.Errorf("environment entry %q is not KEY=VALUE", kv)
		}
		m[k] = v
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+m[k])
	}
	return env, nil
}

// buildMounts lists the filesystem steps in the order nsinit performs them:
// parents always come before what is mounted inside them.
func buildMounts(p *profiles.Profile, req Request, host Host) ([]nsinit.Mount, string, []error) {
	var ms []nsinit.Mount
	var errs []error
	targets := map[string]bool{}
	add := func(m nsinit.Mount) {
		if targets[m.Target] {
			errs = append(errs, fmt.Errorf("two mounts at %s", m.Target))
			return
		}
		targets[m.Target] = true
		ms = append(ms, m)
	}

	// 1. The profile's read-only host paths. A top-level symlink such as
	// /lib -> usr/lib (merged /usr) is recreated as the same symlink;
	// anything else is bound, following symlinks to the real file.
	for _, ps := range p.Mounts.ReadOnly {
		fi, err := host.Lstat(ps.Path)
		if err != nil {
			if ps.Optional && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			errs = append(errs, fmt.Errorf("read-only bind %s: %v", ps.Path, err))
			continue
		}
		if fi.Mode()&fs.ModeSymlink != 0 && filepath.Dir(ps.Path) == "/" {
			dest, err := host.Readlink(ps.Path)
			if err == nil && !filepath.IsAbs(dest) && !strings.Contains(dest, "..") {
				add(nsinit.Mount{Kind: nsinit.MountSymlink, Source: dest, Target: ps.Path})
				continue
			}
		}
		add(nsinit.Mount{Kind: nsinit.MountBind, Source: ps.Path, Target: ps.Path, ReadOnly: true, Optional: ps.Optional})
	}

	// 2. Generated /etc/resolv.conf (the egress DNS stub on lo) and
	// /etc/hosts (localhost only: the host's names are none of the tool's
	// business); minimal generated /etc/passwd and /etc/group likewise.
	add(nsinit.Mount{Kind: nsinit.MountFile, Target: "/etc/resolv.conf", Mode: 0o644, Contents: egress.ResolvConf()})
	add(nsinit.Mount{Kind: nsinit.MountFile, Target: "/etc/hosts", Mode: 0o644, Contents: "127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"})
	if p.Mounts.GeneratePasswd {
		add(nsinit.Mount{Kind: nsinit.MountFile, Target: "/etc/passwd", Mode: 0o644, Contents: passwd(p.UID, p.GID)})
		add(nsinit.Mount{Kind: nsinit.MountFile, Target: "/etc/group", Mode: 0o644, Contents: group(p.GID)})
	}

	// 3. Size-capped tmpfs mounts of the profile (/tmp, /var, ...).
	for _, t := range p.Mounts.Tmpfs {
		mode := t.Mode
		if mode == "" {
			mode = "0755"
		}
		add(nsinit.Mount{Kind: nsinit.MountTmpfs, Target: t.Path, Data: fmt.Sprintf("size=%d,mode=%s", int64(t.Size), mode)})
	}

	// 4. The request's binds and the work dir, shallowest first so a bind
	// lands on a tmpfs already mounted.
	var extra []nsinit.Mount
	for _, b := range req.Binds {
		if !isAbsClean(b.Source) {
			errs = append(errs, fmt.Errorf("bind source %q must be an absolute, clean path", b.Source))
			continue
		}
		dst := b.Target
		if dst == "" {
			dst = b.Source
		}
		if !isAbsClean(dst) || dst == "/" {
			errs = append(errs, fmt.Errorf("bind target %q must be an absolute, clean path other than /", dst))
			continue
		}
		if _, err := host.Lstat(b.Source); err != nil {
			errs = append(errs, fmt.Errorf("bind source %s: %v", b.Source, err))
			continue
		}
		extra = append(extra, nsinit.Mount{Kind: nsinit.MountBind, Source: b.Source, Target: dst, ReadOnly: !b.Writable})
	}
	workdir := "/tmp"
	if req.Workdir != "" {
		wd := req.Workdir
		if !isAbsClean(wd) || wd == "/" {
			errs = append(errs, fmt.Errorf("work dir %q must be an absolute, clean path other than /", wd))
		} else if fi, err := host.Lstat(wd); err != nil {
			errs = append(errs, fmt.Errorf("work dir %s: %v", wd, err))
		} else if fi.Mode()&fs.ModeSymlink != 0 {
			errs = append(errs, fmt.Errorf("work dir %s is a symlink: name the directory itself", wd))
		} else if !fi.IsDir() {
			errs = append(errs, fmt.Errorf("work dir %s is not a directory", wd))
		} else {
			// no_follow: checked a directory above, and cloned through an
			// O_NOFOLLOW descriptor, so a symlink swapped in meanwhile is
			// refused rather than followed.
			// Id-mapped to its owner only when that owner is not root: a
			// root-owned dir is bound as it is (the tool reads it, and
			// writes only where its mode lets others, as its own leased
			// ids), so no tool ever creates root's files on the host. L3
			// checks the owner again on the tree it maps.
			// WriteBack: root mode caps the tool's writes there with the
			// profile's work_dir, as a worker's work dir (step L10).
			extra = append(extra, nsinit.Mount{Kind: nsinit.MountBind, Source: wd, Target: wd, NoFollow: true,
				IDMapOwner: req.WorkdirAsOwner && host.Root && !rootOwned(fi),
				WriteBack:  host.Root && !req.WorkdirLive})
			workdir = wd
		}
	}
	sort.SliceStable(extra, func(i, j int) bool {
		return strings.Count(extra[i].Target, "/") < strings.Count(extra[j].Target, "/")
	})
	for _, m := range extra {
		if PathUnder(m.Target, "/proc") || PathUnder(m.Target, "/dev") {
			errs = append(errs, fmt.Errorf("bind target %s: /proc and /dev are the sandbox's own", m.Target))
			continue
		}
		add(m)
	}

	// 5. A minimal /dev: a tmpfs with bind-mounted device nodes (binds,
	// not mknod, so it works in a user namespace too), a private devpts
	// and, if the profile has one, /dev/shm.
	add(nsinit.Mount{Kind: nsinit.MountTmpfs, Target: "/dev", Data: "size=64k,mode=0755"})
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		add(nsinit.Mount{Kind: nsinit.MountDevNode, Source: "/dev/" + d, Target: "/dev/" + d})
	}
	add(nsinit.Mount{Kind: nsinit.MountDevpts, Target: "/dev/pts", Data: "newinstance,ptmxmode=0666,mode=0620"})
	add(nsinit.Mount{Kind: nsinit.MountSymlink, Source: "pts/ptmx", Target: "/dev/ptmx"})
	add(nsinit.Mount{Kind: nsinit.MountSymlink, Source: "/proc/self/fd", Target: "/dev/fd"})
	add(nsinit.Mount{Kind: nsinit.MountSymlink, Source: "/proc/self/fd/0", Target: "/dev/stdin"})
	add(nsinit.Mount{Kind: nsinit.MountSymlink, Source: "/proc/self/fd/1", Target: "/dev/stdout"})
	add(nsinit.Mount{Kind: nsinit.MountSymlink, Source: "/proc/self/fd/2", Target: "/dev/stderr"})
	if p.Mounts.DevShm > 0 {
		add(nsinit.Mount{Kind: nsinit.MountTmpfs, Target: "/dev/shm", Data: fmt.Sprintf("size=%d,mode=1777", int64(p.Mounts.DevShm))})
	}

	// 6. A fresh /proc for the new pid namespace: it shows only the
	// sandbox's processes.
	add(nsinit.Mount{Kind: nsinit.MountProc, Target: "/proc"})

	// 7. Service-account tokens and similar secrets are never visible, even
	// if a profile binds /var: an empty read-only tmpfs over them.
	add(nsinit.Mount{Kind: nsinit.MountTmpfs, Target: "/var/run/secrets", ReadOnly: true, Data: "size=4k,mode=0755"})

	return ms, workdir, errs
}

// egressListeners are the sockets the init opens on the sandbox's lo for
// the egress proxy: the HTTP/SOCKS5 port and the DNS stub always (an
// isolated sandbox's attempts are recorded too), plus one capture port per
// port the policy lets proxy-unaware clients reach.
func egressListeners(p egress.Policy) []nsinit.Listener {
	ls := []nsinit.Listener{
		{Name: "proxy", Network: "tcp", Addr: egress.ProxyAddr},
		{Name: "dns-udp", Network: "udp", Addr: egress.DNSAddr},
		{Name: "dns-tcp", Network: "tcp", Addr: egress.DNSAddr},
	}
	for _, port := range p.CapturePorts() {
		ls = append(ls, nsinit.Listener{Name: "capture-" + strconv.Itoa(port), Network: "tcp", Addr: "0.0.0.0:" + strconv.Itoa(port)})
	}
	return ls
}

// PathUnder: path is dir or lies under it (both clean and absolute).
func PathUnder(path, dir string) bool { return path == dir || strings.HasPrefix(path, dir+"/") }

func passwd(uid, gid uint32) string {
	s := "root:x:0:0:root:/root:/usr/sbin/nologin\n"
	if uid != 0 && uid != 65534 {
		s += fmt.Sprintf("sandbox:x:%d:%d:sandbox:/tmp:/usr/sbin/nologin\n", uid, gid)
	}
	return s + "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
}

func group(gid uint32) string {
	s := "root:x:0:\n"
	if gid != 0 && gid != 65534 {
		s += "sandbox:x:" + strconv.Itoa(int(gid)) + ":\n"
	}
	return s + "nogroup:x:65534:\n"
}

// rootOwned reports whether fi's owner is root (uid or gid 0); false when
// the owner is unknown (a test's description of the host).
func rootOwned(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && (st.Uid == 0 || st.Gid == 0)
}
