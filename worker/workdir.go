package worker

// Work dirs: a call's, a pooled sandbox's work area and the start-up
// probe's are made by the launcher with the sandbox (provider.Provider:
// launcher/workdir, step L9), directly under SANDBOX_WORK_DIR, named
// by a prefix of the worker's and 16 random hex digits, never a request's
// string: a task id is a name in logs, replies and status messages, never
// a path. The launcher caps them (root mode), fills them, hands them to
// the tool, removes them (Sandbox.Release), and at start-up sweeps what a
// previous run left (workdir.SweepStale, from prepareDirs).

// Prefixes of the work dir names (workdir.Spec.Prefix).
const (
	callDirPrefix  = "call-"
	probeDirPrefix = ".probe-"
	// warmDirPrefix is pool.go's.
)
