// Package gvisor runs a sandbox's plan under gVisor (runsc): the runtime
// class "gvisor" of a profile (profiles.RuntimeGVisor; docs/runtimes.md).
// The launcher hands it the parts of its Plan (Spec); Bundle turns them
// into an OCI bundle (pure: a config.json value and the generated files,
// unit-tested without runsc) and Run writes the bundle and runs it with
// `runsc run`, one container per run.
//
// What it does on the host: it writes a bundle directory (mode 0700,
// under the system's temporary directory) and runs the runsc program
// found on PATH (runsc --root BUNDLE/state --network=none
// --platform=ptrace run), which as root creates the container's cgroup
// (linux.cgroupsPath) and the sandbox's namespaces itself; on a timeout
// or a cancel it runs `runsc kill`, and always `runsc delete --force`
// after the run. It mounts nothing and changes no owner itself.
//
// What it protects against, beyond str's own namespaces: the tool's
// system calls are served by gVisor's kernel (the Sentry, itself
// confined by its own seccomp filter), not the host's, so a bug in the
// host kernel's system-call surface (the class of most container
// escapes) is not reachable from the tool; files reach it through
// gVisor's gofer. What it does not: a bug in gVisor itself or in the
// smaller host surface the Sentry uses; side channels; the host's
// resources beyond the cgroup limits runsc applies.
//
// What it trusts: the runsc binary on PATH (the operator's, as Debian's
// runsc package installs it) and the plan (the launcher's).
//
// What this increment does not do yet (refused with a reason, never run
// under a weaker class): the restricted and allow_egress network policies
// (gVisor's network stack does not reach str's egress proxy yet), a
// rootless caller (runsc --rootless), descriptors passed to the tool,
// pre-built sandboxes (AwaitCall, the worker's pool) and mount kinds
// other than binds, files, symlinks, tmpfs and /proc.
package gvisor
