// Package hostbox is a provider.Box WITHOUT ANY ISOLATION: its command
// runs as a plain child process of the caller. It is what
// SANDBOX_MODE=none uses (the worker's Unsandboxed) and what
// launchertest's fake of the launcher's Provider is made of, its only
// callers. What it keeps of a sandbox: the work dir layout (plain
// directories, uncapped: workdir.MakeUncapped), the wall clock
// and the idle limit (Arm has Sandbox.Arm's checks), the cancellation,
// and its own process group, killed as a whole when the command exits,
// times out or is cancelled.
//
// Python (python.go) is the other program this package starts with no
// isolation: the host's own Python interpreter on a script of str's own,
// for the worker (the installer's site-packages query and the runner's
// bytecode cache), with its own checklist.
//
// What it does on the host: it starts the command (exec, in a process
// group of its own; as the ids of cred when the caller gives them, root
// only), makes the work dir and hands it to those ids, and kills the
// process group.
//
// What it protects against: nothing of what a sandbox protects against.
// A tool in a host box reads and writes everything its uid may, reaches
// the network and sees every process; what it starts ends with it only
// because its process group is killed (a process that leaves the group,
// by setsid or setpgid, survives). What it keeps from the tool: the
// caller's environment (env is the whole of the command's).
//
// What it trusts: everything it runs.
package hostbox
