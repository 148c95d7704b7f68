package worker

import (
	"context"
	"errors"
	"github.com/securetoolruntime/str/egress"
	"io"
	"os"
	"time"
)

// Sandboxes is what the worker needs from the launcher. LauncherSandboxes
// (launcher.go) is the implementation used by `str worker`; the interface
// keeps the protocol logic testable where namespaces are unavailable.
type Sandboxes interface {
	// CheckProfile validates a profile name; an unknown name is an error
	// (the worker replies INVALID_REQUEST).
	CheckProfile(name string) error
	// Create plans one sandbox and reserves what it holds before it runs
	// (its cgroup, its host uid); nothing runs until Start. spec.Workdir
	// must exist. An error wrapping ErrInvalidSandboxRequest is a spec
	// the sandbox refuses (a bind source missing, an unknown profile);
	// the worker checks a call's own parts before, so it replies
	// TOOL_NOT_AVAILABLE or SANDBOX_FAILED, never INVALID_REQUEST; any
	// other error is SANDBOX_FAILED. The
	// sandbox is killed when ctx ends. Every CreatedSandbox is either
	// started or released with Kill.
	Create(ctx context.Context, spec SandboxSpec) (CreatedSandbox, error)
}

// CreatedSandbox is a sandbox that exists but runs nothing yet.
type CreatedSandbox interface {
	// Owner is the host uid/gid the sandboxed tool runs as, and so what
	// its files appear as: the work dir, output/ and the status FIFO are
	// chowned to it. Each sandbox may have its own.
	Owner() (uid, gid int)
	// Start runs spec.Argv. On error the sandbox is already released.
	Start() (RunningSandbox, error)
	// Kill releases a sandbox that will not be started.
	Kill() error
}

// SandboxSpec is one tool execution as the launcher sees it.
type SandboxSpec struct {
	Profile string
	Argv    []string // [python, runner.py, --done-fd, 3, runner_args.json] (see runner.py)
	Env     []string // added to the profile's environment
	Workdir string   // bound read-write at the same path; the tool's cwd
	// ReadOnly host directories bound at the same path (tools dir,
	// runner dir, site dir).
	ReadOnly []string
	// Timeout is the wall-clock limit, from Start: the call's
	// (Server.callTimeout: request timeout + 5 s, at most the profile's;
	// a sandbox refuses more). 0 = the profile's.
	Timeout time.Duration
	// Idle, when > 0, makes a sandbox that waits unarmed (a pooled one):
	// it is killed (TimedOut) Idle after Start unless Arm gives it its
	// call's timeout first; Timeout is then only the ceiling Arm may ask.
	Idle time.Duration
	// Stderr receives the sandbox's standard error (the runner's, the
	// tool's and the sandbox setup's); nil discards it.
	Stderr io.Writer
	// Network narrows the profile's network policy (the manifest tool's
	// `network`); nil keeps the profile's.
	Network *egress.Policy
	// ExtraFiles become the tool's descriptors 3, 4, ... (the runner's
	// done pipe; a warm sandbox's arguments pipe). The caller keeps its
	// copies and closes them once Start has returned.
	ExtraFiles []*os.File
}

// RunningSandbox is a started sandbox.
type RunningSandbox interface {
	// Wait returns after the whole sandbox is gone.
	Wait() (*SandboxExit, error)
	Kill() error
	// Arm starts the wall clock of a sandbox that waits unarmed
	// (SandboxSpec.Idle): from now it is killed (TimedOut) after timeout,
	// which may not exceed its Timeout. It fails for a sandbox created
	// without Idle, armed already, or ending (its idle limit ran out, it
	// was killed or it exited): then it cannot serve the call.
	Arm(timeout time.Duration) error
}

// SandboxExit is how a sandbox ended.
type SandboxExit struct {
	ExitCode   int
	Signal     int
	SignalName string
	TimedOut   bool
	OOMKilled  bool
	PidsLimit  bool
	Cancelled  bool
	// SetupError is set when the sandbox failed before the tool ran; its
	// message names the setup step.
	SetupError error
	// SetupTime is how long the sandbox took to set up (0 = unknown).
	SetupTime time.Duration
	// Network is what the network policy denied; KilledForViolation says
	// the policy's on_violation: kill ended the sandbox.
	Network            NetworkReport
	KilledForViolation bool
}

// NetworkReport is what a sandbox's network policy denied, aggregated
// and capped (Dropped counts the distinct denials the cap left out), with
// the short text block an agent can show its model.
type NetworkReport struct {
	Violations []egress.Event
	Dropped    int
	Summary    string
}

// networkReporter is a running sandbox that can tell what its network
// policy denied so far (the worker replies before the sandbox is gone).
type networkReporter interface {
	NetworkReport() NetworkReport
}

// liveNetworkReport is sb's report so far, or none.
func liveNetworkReport(sb RunningSandbox) NetworkReport {
	if r, ok := sb.(networkReporter); ok {
		return r.NetworkReport()
	}
	return NetworkReport{}
}

// ErrInvalidSandboxRequest marks Create errors for a spec the sandbox
// refuses (see Sandboxes.Create: the worker answers TOOL_NOT_AVAILABLE or
// SANDBOX_FAILED on it, never INVALID_REQUEST).
var ErrInvalidSandboxRequest = errors.New("invalid sandbox request")

// ErrUnknownProfile marks CheckProfile errors for names no profile has.
var ErrUnknownProfile = errors.New("unknown sandbox profile")
