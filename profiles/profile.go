package profiles

import "github.com/securetoolruntime/str/egress"

import "time"

// Profile is one sandbox profile as decoded from YAML (schema version 1).
// Every field is explicit; unknown fields are rejected at decode time.
// Quantities (memory sizes, CPU counts) use Kubernetes notation in YAML
// ("512Mi", "2Gi", "4G", "500m") and are stored here already parsed.
type Profile struct {
	Version     int      `yaml:"version"`
	Name        string   `yaml:"name"`
	Description string   `yaml:"description"`
	Aliases     []string `yaml:"aliases"` // trust-level names that resolve to this profile (e.g. "untrusted")

	// BestEffort allows documented fallbacks (no fresh /proc, no cgroup)
	// that are otherwise hard errors. Each fallback is logged loudly.
	BestEffort bool `yaml:"best_effort"`

	// UserNamespace: "auto" (only when not root), "always", "never".
	UserNamespace string `yaml:"user_namespace"`
	// Network is the sandbox's network policy (package egress): every
	// sandbox has its own network namespace; isolated, restricted and
	// allow_egress say what leaves it through the launcher's proxy.
	Network egress.Policy `yaml:"network"`
	// ShareCallerNetwork is "allow" or "deny" (the default): whether
	// `str bwrap` may run a bubblewrap line that does not unshare the
	// network on the caller's own network, as bubblewrap does (no
	// network namespace, no egress proxy: the command reaches whatever
	// the caller reaches). Only str bwrap asks for it; str run and the
	// worker never share the caller's network, whatever this says.
	ShareCallerNetwork string `yaml:"share_caller_network"`
	// RootCapabilities is "allow" or "deny" (the default): whether a
	// `str bwrap` line run by uid 0 (the command uid 0 too) that adds or
	// drops no capability keeps the caller's own, as bubblewrap run by
	// root does, over the sandbox's own user namespace only (never the
	// host's). Denied, it keeps none, and --cap-add/--cap-drop start from
	// none. str run and the worker never keep any.
	RootCapabilities string `yaml:"root_capabilities" json:",omitempty"`
	Hostname         string `yaml:"hostname"`
	UID              uint32 `yaml:"uid"`
	GID              uint32 `yaml:"gid"`

	Rlimits Rlimits  `yaml:"rlimits"`
	Cgroup  Cgroup   `yaml:"cgroup"`
	Timeout Duration `yaml:"timeout"` // default wall-clock timeout; 0 = none

	Mounts Mounts `yaml:"mounts"`
	Env    Env    `yaml:"env"`

	// WorkDir caps the task's work dir (its inputs, outputs, status FIFO
	// and whatever the tool writes in its cwd).
	WorkDir WorkDir `yaml:"work_dir"`

	// Seccomp names a policy in the seccomp package ("restrictive", ...).
	Seccomp string `yaml:"seccomp"`
	// CallerSeccomp is what a `str bwrap` line's own seccomp programs
	// (--seccomp, --add-seccomp-fd) do to Seccomp: CallerSeccompReplace
	// (also when empty) loads only the caller's, as bubblewrap does;
	// CallerSeccompStack keeps the profile's filter and stacks the
	// caller's after it. `str run` and the worker never take a caller's
	// filter.
	CallerSeccomp string `yaml:"caller_seccomp" json:",omitempty"`

	// Runtime is the isolation technology the profile's tools run under
	// (RuntimeNamespaces, the default when empty; RuntimeGVisor;
	// RuntimeMicroVM), from the weakest to the strongest. A request may
	// only ask a stronger one (Overrides.Runtime), and a class this host
	// cannot run is a refusal, never a run under a weaker one
	// (docs/runtimes.md).
	Runtime string `yaml:"runtime" json:",omitempty"`
}

// The values of Profile.Runtime, weakest first (RuntimeClasses).
const (
	RuntimeNamespaces = "namespaces" // str's own namespaces, seccomp and cgroups (nsinit)
	RuntimeGVisor     = "gvisor"     // runsc: gVisor's user-space kernel between the tool and the host's
	RuntimeMicroVM    = "microvm"    // a guest kernel under QEMU (not yet in this str)
)

// RuntimeClasses are the runtime classes from the weakest to the strongest.
var RuntimeClasses = []string{RuntimeNamespaces, RuntimeGVisor, RuntimeMicroVM}

// RuntimeClass is the profile's runtime, RuntimeNamespaces when unset.
func (p *Profile) RuntimeClass() string {
	if p.Runtime == "" {
		return RuntimeNamespaces
	}
	return p.Runtime
}

// The values of Profile.CallerSeccomp.
const (
	CallerSeccompReplace = "replace"
	CallerSeccompStack   = "stack"
)

// The values of ShareCallerNetwork.
const (
	Allow = "allow"
	Deny  = "deny"
)

// SharesCallerNetwork reports whether the profile lets str bwrap put a
// line that does not unshare the network on the caller's network.
func (p *Profile) SharesCallerNetwork() bool { return p.ShareCallerNetwork == Allow }

// Rlimits are the per-process resource limits (soft = hard).
type Rlimits struct {
	AS     AddressSpace `yaml:"as"`     // bytes, or "unlimited" (see AddressSpace)
	CPU    Duration     `yaml:"cpu"`    // whole seconds
	FSize  Quantity     `yaml:"fsize"`  // bytes
	NoFile int64        `yaml:"nofile"` // count
	NProc  int64        `yaml:"nproc"`  // count
	Stack  Quantity     `yaml:"stack"`  // bytes
	Core   Quantity     `yaml:"core"`   // bytes; must be 0
}

// Cgroup limits for the sandbox's own cgroup.
type Cgroup struct {
	Memory Quantity `yaml:"memory"` // memory.max (bytes); swap is always 0
	CPUs   Quantity `yaml:"cpus"`   // in milli-CPUs after parsing ("1" = 1000, "500m" = 500)
	Pids   int64    `yaml:"pids"`   // pids.max
}

// Mounts describes the filesystem the tool sees besides the fixed parts
// (tmpfs root, /proc, minimal /dev, tmpfs over /var/run/secrets) that
// the launcher always provides.
type Mounts struct {
	// ReadOnly host paths bound recursively read-only at the same path.
	// A host path that is a symlink (e.g. /lib -> usr/lib) is recreated as
	// the same symlink. Optional entries are skipped when absent on the host.
	ReadOnly []PathSpec `yaml:"ro_binds"`
	// Tmpfs mounts, size-capped (e.g. /tmp, and /var for permissive).
	Tmpfs []TmpfsSpec `yaml:"tmpfs"`
	// DevShm: size of the tmpfs at /dev/shm; 0 = no /dev/shm.
	DevShm Quantity `yaml:"dev_shm"`
	// Generated /etc/passwd and /etc/group with root, nobody and the tool's uid.
	GeneratePasswd bool `yaml:"generate_passwd"`
}

type PathSpec struct {
	Path     string `yaml:"path"`
	Optional bool   `yaml:"optional"`
}

type TmpfsSpec struct {
	Path string   `yaml:"path"`
	Size Quantity `yaml:"size"`
	Mode string   `yaml:"mode"` // octal, e.g. "1777"
}

// WorkDir is the cap of a task's work dir. In root mode the worker
// mounts a tmpfs of this size and inode count on it (its pages are
// charged to the memory cgroup of whoever writes them: the tool); a tool
// that reaches either limit gets ENOSPC. Rootless, the work dir is a
// plain bind of a host directory and these limits are not enforced (the
// worker says so at start-up).
type WorkDir struct {
	Size   Quantity `yaml:"size"`   // bytes (tmpfs size=)
	Inodes int64    `yaml:"inodes"` // files, directories and FIFOs (tmpfs nr_inodes=)
}

// Env is the tool's environment, always rebuilt from scratch.
type Env struct {
	Set         map[string]string `yaml:"set"`         // fixed values
	Passthrough []string          `yaml:"passthrough"` // copied from the caller when set there
}

// Quantity is a parsed Kubernetes-style quantity. For byte sizes it is a
// number of bytes; for CPUs it is milli-CPUs.
type Quantity int64

// Duration is a time.Duration decoded from "60s", "5m" or a bare integer
// number of seconds.
type Duration time.Duration
