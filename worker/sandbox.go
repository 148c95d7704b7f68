package worker

import (
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/profiles"
)

// The sandbox API is the launcher's (provider.Provider): the worker names
// a profile and a timeout, gets a sandbox whose work dir the launcher
// made, capped, filled and handed to the tool, puts its inputs and the
// runner's arguments in it, and starts it. The worker mounts and chowns
// nothing. `str worker` uses template.Provider (SANDBOX_MODE=none:
// Unsandboxed); unit tests use launcher/launchertest. These names are the
// launcher's, under the worker's older names.
type (
	// Sandboxes makes sandboxes.
	Sandboxes = provider.Provider
	// SandboxSpec is one tool execution as the launcher sees it. Its
	// Argv is [python, runner.py, --done-fd, 3, .str/runner_args.json]
	// (see runner.py), relative to the work dir.
	SandboxSpec = provider.Spec
	// Sandbox is one sandbox: created, then started.
	Sandbox = provider.Box
	// SandboxExit is how a sandbox ended.
	SandboxExit = provider.Exit
	// NetworkReport is what a sandbox's network policy denied.
	NetworkReport = provider.NetworkReport
)

// ErrInvalidSandboxRequest marks Create errors for a spec the sandbox
// refuses (the worker answers TOOL_NOT_AVAILABLE or SANDBOX_FAILED on it,
// never INVALID_REQUEST: it checked the call's parts before).
var ErrInvalidSandboxRequest = launcher.ErrInvalidRequest

// ErrUnknownProfile marks CheckProfile errors for names no profile has.
var ErrUnknownProfile = profiles.ErrUnknownProfile
