package launcher

import (
	"io"
	"os"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher/writeback"
)

// Request is what a caller asks of one sandbox: a command plus what may be
// tightened relative to the profile. It never loosens a profile.
type Request struct {
	Profile string   // profile name or trust-level alias; "" = "standard"
	Argv    []string // Argv[0] is resolved inside the sandbox (absolute, or searched in the profile's PATH)
	Env     []string // extra K=V added after the profile's environment

	// Workdir is a host directory bound read-write at the same path inside
	// and made the tool's working directory. "" = /tmp inside.
	Workdir string
	// WorkdirAsOwner (root mode) binds Workdir id-mapped: its owner's host
	// uid and gid are the tool's through the mount, so the tool may write
	// where the owner may and what it writes belongs to the owner on the
	// host, as rootless. A work dir owned by root (uid or gid 0) is not
	// mapped: no tool may leave root's files on the host; it is bound as
	// it is (the tool writes only where its mode lets others, as its own
	// leased ids). Rootless the tool is the caller already; nothing is
	// mapped. `str run --workdir` always sets it.
	WorkdirAsOwner bool
	// WorkdirLive (root mode) binds Workdir as it is, live and bounded by
	// its filesystem only. Without it, root mode caps what the tool may
	// write there like a worker's work dir: the tool sees an overlay of
	// Workdir whose upper layer is a tmpfs capped by the profile's
	// work_dir (size, inodes), and what it changed is copied back into
	// Workdir once the sandbox has ended (step L10; Result.WriteBack),
	// as the identity the live bind would have written with. Rootless
	// the bind is always live (an unprivileged caller mounts nothing on
	// the host).
	WorkdirLive bool
	// Binds are extra host paths made visible inside.
	Binds []Bind

	// Tighten-only limits; zero values mean "the profile's value".
	Timeout time.Duration
	Memory  int64 // bytes
	CPUs    int64 // milli-CPUs
	Pids    int64 // pids.max
	// Runtime asks a runtime class at least as strong as the profile's
	// (profiles.RuntimeClasses); "" is the profile's.
	Runtime string
	// Network narrows the profile's network policy (nil: the profile's).
	Network *egress.Policy
	// Credentials are secrets the tool may use without seeing them: the
	// sandbox gets NAME=placeholder, and the egress proxy puts the value in
	// requests to the credential's hosts only (egress.Credential). Their
	// hosts must be within the network policy's allowed_hosts.
	Credentials []egress.Credential

	// Idle, when > 0, makes a sandbox that waits unarmed (a pooled one,
	// started ahead of its call): its wall clock is Idle from Start, and
	// Sandbox.Arm replaces it with the run's own timeout (at most Timeout)
	// counted from the Arm. A sandbox never armed is killed Idle after its
	// start (TimedOut). RLIMIT_CPU still counts from the process's start:
	// what the tool does before the Arm is charged to its run.
	Idle time.Duration

	// AwaitCall makes a pre-built sandbox (str serve's pool): no Argv;
	// the init does everything up to its step 10a and waits there until
	// Sandbox.Call hands it the call's argv, environment and stdio. It
	// needs Idle (it waits unarmed; Call arms it).
	AwaitCall bool

	// RecordNamespaces makes Start read the inode of each of the init's
	// namespaces (Sandbox.Namespaces) between the clone (L4) and the
	// child's release, while it waits for its id maps: read later, a tool
	// that has already exited has none to read (str bwrap's --info-fd and
	// --json-status-fd report them).
	RecordNamespaces bool

	// CallerNetwork (str bwrap, a line without --unshare-net) asks for
	// the caller's own network: no network namespace, no egress
	// listeners, no proxy variables. NewPlan grants it only under a
	// profile whose share_caller_network is allow (Plan.CallerNetwork
	// says whether it did); str run and the worker never ask.
	CallerNetwork bool

	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// ExtraFiles become the tool's fds 3, 4, ...; every other fd is closed.
	ExtraFiles []*os.File
}

// Bind is one extra bind mount. Target "" means the same path as Source.
type Bind struct {
	Source   string
	Target   string
	Writable bool
}

// Result is the outcome of one sandbox run. JSON field names are stable
// (they are what `str run --result` prints).
type Result struct {
	ExitCode   int    `json:"exit_code"`             // the tool's status, 128+signal when killed by one
	Signal     int    `json:"signal"`                // signal that killed the tool, 0 if it exited
	SignalName string `json:"signal_name,omitempty"` // "SIGKILL"
	TimedOut   bool   `json:"timed_out"`
	OOMKilled  bool   `json:"oom_killed"`
	PidsLimit  bool   `json:"pids_limit_hit"` // a fork failed at pids.max
	Cancelled  bool   `json:"cancelled"`      // the caller's context ended the run

	WallTimeMs      float64 `json:"wall_time_ms"`
	CPUTimeMs       float64 `json:"cpu_time_ms"` // user+system of the whole cgroup
	PeakMemoryBytes int64   `json:"peak_memory_bytes"`

	// Timings of each setup phase in milliseconds, in order.
	Timings []Phase `json:"timings"`
	// SetupTime is the sum of the setup phases among Timings: the
	// launcher's before the run and every one of the init's (Exit.SetupTime).
	SetupTime time.Duration `json:"-"`
	// Warnings lists best-effort fallbacks that were taken.
	Warnings []string `json:"warnings,omitempty"`

	// Violations are the network policy's denials (aggregated, capped),
	// ViolationsDropped how many distinct ones the cap left out, and
	// ViolationSummary the short text block an agent can show its model.
	Violations        []egress.Event `json:"violations,omitempty"`
	ViolationsDropped int            `json:"violations_dropped,omitempty"`
	ViolationSummary  string         `json:"violation_summary,omitempty"`
	// KilledForViolation: the policy says on_violation: kill, and it did.
	KilledForViolation bool `json:"killed_for_violation,omitempty"`

	// Resident: the run was a resident launcher's (str serve) pre-built
	// sandbox; WallTimeMs then counts from the call, not the build.
	Resident bool `json:"resident,omitempty"`

	// SetupError is set when the sandbox failed before the tool ran.
	SetupError *StepError `json:"setup_error,omitempty"`

	// WriteBack is what step L10 copied back into a capped work dir
	// (Request.WorkdirLive unset, root mode); its Error, the first
	// failure of the copy (the tool's other changes are still copied).
	WriteBack *writeback.Report `json:"write_back,omitempty"`
}
