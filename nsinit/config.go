package nsinit

// Config is everything the sandbox's init does, computed by the
// launcher's plan (its "child" part, as a plan prints it) and compiled
// into a Program (CompileDirect). nsinit takes no decision of its own: it
// performs this list in a fixed order.
type Config struct {
	Version int `json:"version"` // ConfigVersion

	// Mounts are performed in order under the new root before pivot_root.
	Mounts []Mount `json:"mounts"`

	Hostname   string `json:"hostname"`
	LoopbackUp bool   `json:"loopback_up"` // the sandbox has its own network namespace

	// Listen are the egress listeners step 10 opens once lo is up and
	// hands to the launcher, whose egress proxy serves them from the host
	// side: no process of ours stays inside to relay.
	Listen []Listener `json:"listen,omitempty"`

	Rlimits []Rlimit `json:"rlimits"`

	// Identity the tool runs as (inside the user namespace, if any).
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// RootToCommand (a bubblewrap line, str bwrap): step 7 gives the root
	// tmpfs's own entries (rootEntries) to UID and GID and leaves it
	// writable, as bubblewrap's root is, instead of remounting it read-only.
	RootToCommand bool   `json:"root_to_command,omitempty"`
	Caps          uint64 `json:"caps,omitempty"`        // kept (bounding, effective, permitted), its user namespace's only (bit n: capability n; str bwrap): steps 13-16
	Inheritable   uint64 `json:"inheritable,omitempty"` // the kept ones also inheritable and ambient (str bwrap's --cap-add/--cap-drop): step 16
	// SetGroups is false in a user namespace made without privilege
	// (rootless: setgroups(2) denied, only the caller's ids mapped): the
	// clone child then changes no id before step 15.
	SetGroups bool `json:"set_groups"`

	Argv []string `json:"argv"`
	// Argv0, when set, is the tool's argv[0] (bubblewrap's --argv0); the
	// program executed is still Argv[0] resolved in PATH.
	Argv0 string `json:"argv0,omitempty"`
	// AwaitCall: a pre-built sandbox (str serve's pool). Argv and Env are
	// empty: the call brings them and the caller's stdio at sub-step 10a.
	AwaitCall bool     `json:"await_call,omitempty"`
	Env       []string `json:"env"`
	Workdir   string   `json:"workdir"` // path inside the sandbox

	// PassFDs is how many inherited fds (at 3, 4, ... already) the tool
	// keeps; every other fd is closed at its execve.
	PassFDs int `json:"pass_fds"`

	// CgroupTasks are the sandbox's cgroup v1 "tasks" files, one per
	// controller; the init's exec thread moves itself in (step 12). Empty
	// on cgroup v2, where the init is born in its cgroup.
	CgroupTasks []string `json:"cgroup_tasks,omitempty"`

	// Seccomp is the compiled classic-BPF program, loaded at step 19, as
	// struct sock_filter records (8 bytes each; package seccomp).
	SeccompPolicy string `json:"seccomp_policy"`
	Seccomp       []byte `json:"seccomp_bpf"`
	// ExtraSeccomp are the caller's own programs (str bwrap's --seccomp,
	// --add-seccomp-fd), in the same form, loaded after the profile's.
	ExtraSeccomp [][]byte `json:"extra_seccomp_bpf,omitempty"`
	// SeccompListener: a per-tool template's. Step 19 loads Seccomp with
	// a listener, which sub-step 19a hands to the launcher's supervisor.
	SeccompListener bool `json:"seccomp_listener,omitempty"`

	Join *Join `json:"join,omitempty"` // str bwrap's --userns, --pidns: sub-step 0a

	// BestEffort permits the documented fallbacks (e.g. no fresh /proc),
	// each reported as a warning event.
	BestEffort bool `json:"best_effort"`
}

// Join: the clone makes no namespace; its child joins UserNS (a
// launcher descriptor), unshares Unshare (the others, no CLONE_NEWUSER),
// joins PidNS (-1: none; then CLONE_NEWPID makes one) and forks (0a).
type Join struct {
	UserNS  int    `json:"userns_fd"`
	PidNS   int    `json:"pidns_fd"`
	Unshare uint64 `json:"unshare"`
}

// MountKind says what a Mount entry creates.
type MountKind string

const (
	MountTmpfs   MountKind = "tmpfs"   // tmpfs at Target with Data (size=,mode=)
	MountBind    MountKind = "bind"    // recursive bind of host Source to Target
	MountProc    MountKind = "proc"    // fresh procfs for the new pid namespace
	MountMqueue  MountKind = "mqueue"  // the sandbox's own ipc namespace's POSIX message queues
	MountDevNode MountKind = "devnode" // bind of one host device node (/dev/null, ...)
	MountDevpts  MountKind = "devpts"  // private devpts instance + /dev/ptmx symlink
	MountSymlink MountKind = "symlink" // symlink Target -> Source (e.g. /lib -> usr/lib)
	MountFile    MountKind = "file"    // regular file with Contents (e.g. generated /etc/passwd)
	MountDir     MountKind = "dir"     // empty directory
	MountChmod   MountKind = "chmod"   // set Target's mode to Mode (it must exist; no symlink on the way)
	// MountRemountRO makes the mount Target is on read-only (that mount
	// only, not those below it; Target must exist, no symlink on the way).
	MountRemountRO MountKind = "remount-ro"
)

// Mount is one filesystem step. Target is always absolute and is relative
// to the new root.
type Mount struct {
	Kind     MountKind `json:"kind"`
	Source   string    `json:"source,omitempty"`
	Target   string    `json:"target"`
	ReadOnly bool      `json:"read_only,omitempty"`
	Data     string    `json:"data,omitempty"`
	Contents string    `json:"contents,omitempty"`
	// Mode is a file's, a new directory's or a chmod's mode, exactly (the
	// umask does not apply); a directory's missing parents get 0700 and
	// r-x for the group and others who have any bit of it (see mkdirAll).
	// A MountFile that is ReadOnly is bound read-only onto itself.
	Mode uint32 `json:"mode,omitempty"`
	// Optional entries whose Source is missing on the host are skipped.
	Optional bool `json:"optional,omitempty"`
	// NoFollow: Source's last component must not be a symlink (the work
	// dir); it is opened O_PATH|O_NOFOLLOW and refused if it is one.
	NoFollow bool `json:"no_follow,omitempty"`
	// TreeFD says where a bind's (or device node's) source comes from:
	// > 0, the init's descriptor holding the detached tree the launcher
	// cloned from Source on the host (root mode: the init's host uid may
	// not even reach the path's parents); 0, the init clones Source
	// itself at step 3 (rootless: it is the caller's own uid on the host);
	// SourceAbsent, an optional source the launcher found missing.
	TreeFD int `json:"tree_fd,omitempty"`
	// IDMapOwner and WriteBack are the launcher's alone (root mode; the
	// init does nothing with them): the tree it passes is id-mapped to
	// the source's owner, or an overlay whose changes it copies back
	// (`str run --workdir`: SECURITY.md, "Root and rootless", and L10).
	IDMapOwner bool `json:"id_map_owner,omitempty"`
	WriteBack  bool `json:"write_back,omitempty"`
	// Overlay is the launcher's alone too (root mode, str bwrap's
	// overlays): the tree it passes is that overlay, not Source's clone.
	Overlay *Overlay `json:"overlay,omitempty"`
	Devices bool     `json:"devices,omitempty"` // a bind without nodev (str bwrap's --dev-bind)
}

// Overlay is made by the launcher at L3 of the Lower host dirs (top first)
// over Upper with Work ("": over a tmpfs of its own; read-only: none).
type Overlay struct {
	Lower []string `json:"lower"`
	Upper string   `json:"upper,omitempty"`
	Work  string   `json:"work,omitempty"`
}

// ConfigVersion is the version of Config's form, as a plan shows it (2:
// the launcher passes the bind sources' trees, Mount.TreeFD).
const ConfigVersion = 2

// SourceAbsent is the TreeFD of an optional bind whose source the
// launcher found missing: the init skips it.
const SourceAbsent = -1

// A root-mode plan numbers the launcher's mount trees from
// FirstTreeFD(n) on, in plan order (n: the tool's pass-list), after 0-2,
// the pass-list at 3..3+n-1 (exactly where the tool gets them) and two
// descriptors of the setup; a Program takes a mount's tree from
// DirectFiles.Trees by that index. Every number is below MaxInitFDs.
const (
	// MaxPassFDs is how many descriptors a sandbox may pass on to its
	// tool: the one limit of the launcher's plan.
	MaxPassFDs = 64
	// MaxBindSources is how many bind and device-node mounts a plan may
	// have: each holds a slot until step 5 (maxSlots; 256 left for the rest).
	MaxBindSources = 3840
	// MaxInitFDs bounds every descriptor number a plan names.
	MaxInitFDs = 5 + MaxPassFDs + MaxBindSources + 1
)

// FirstTreeFD is the number of the first mount tree the launcher passes
// to a sandbox whose tool keeps pass descriptors.
func FirstTreeFD(pass int) int { return 5 + pass }

// Rlimit is one setrlimit call; soft and hard limits are equal.
type Rlimit struct {
	Name     string `json:"name"` // "RLIMIT_AS"
	Resource int    `json:"resource"`
	Value    uint64 `json:"value"`
}

// Listener is one socket the init opens for the launcher's egress proxy.
type Listener struct {
	Name    string `json:"name"`    // "proxy", "dns-udp", "dns-tcp", "capture-443"
	Network string `json:"network"` // "tcp" or "udp"
	Addr    string `json:"addr"`    // "127.0.0.1:3128", "0.0.0.0:443"
}
