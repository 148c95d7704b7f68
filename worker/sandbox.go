package worker

import (
	"context"
	"errors"
	"time"
)

// Sandboxes is what the worker needs from the launcher. LauncherSandboxes
// (launcher.go) is the implementation used by `str worker`; the interface
// keeps the protocol logic testable where namespaces are unavailable.
type Sandboxes interface {
	// CheckProfile validates a profile name; an unknown name is an error
	// (the worker replies INVALID_REQUEST).
	CheckProfile(name string) error
	// ToolOwner is the host uid/gid the sandboxed tool's files appear as.
	// The work dir, output/ and the status FIFO are chowned to it.
	ToolOwner(profile string) (uid, gid int, err error)
	// Start creates and starts one sandbox. An error wrapping
	// ErrInvalidSandboxRequest is the request's fault (INVALID_REQUEST);
	// any other is SANDBOX_FAILED. The sandbox is killed when ctx ends.
	Start(ctx context.Context, spec SandboxSpec) (RunningSandbox, error)
}

// SandboxSpec is one tool execution as the launcher sees it.
type SandboxSpec struct {
	Profile string
	Argv    []string // [python, runner.py, runner_args.json]
	Env     []string // added to the profile's environment
	Workdir string   // bound read-write at the same path; the tool's cwd
	// ReadOnly host directories bound at the same path (tools dir,
	// runner dir, site dir).
	ReadOnly []string
	// Timeout is the wall-clock limit (request timeout + 5 s).
	Timeout time.Duration
}

// RunningSandbox is a started sandbox.
type RunningSandbox interface {
	// Wait returns after the whole sandbox is gone.
	Wait() (*SandboxExit, error)
	Kill() error
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
}

// ErrInvalidSandboxRequest marks Start errors that are the request's fault.
var ErrInvalidSandboxRequest = errors.New("invalid sandbox request")

// ErrUnknownProfile marks CheckProfile errors for names no profile has.
var ErrUnknownProfile = errors.New("unknown sandbox profile")
