// Package nsinit is the sandbox's first process: str re-executes itself
// (/proc/self/exe, argv[0] "str-nsinit") into new pid, mount, ipc, uts,
// cgroup (and net, and user) namespaces, and this package runs there as
// PID 1. Its whole job is one linear, numbered sequence (see run): read the
// plan, build a fresh root from tmpfs and read-only binds, pivot_root, set
// the hostname, bring up loopback, drop every privilege, load seccomp last,
// start the tool, then reap and forward signals until the tool exits.
//
// What it protects against: a tool reading or writing host files outside
// its binds; seeing or signalling host processes; reaching the network
// (restrictive); regaining privileges through setuid binaries or file
// capabilities (no_new_privs, empty bounding set); using kernel attack
// surface the policy denies (seccomp); typing into the caller's terminal
// (setsid, CVE-2017-5226); inheriting file descriptors (close-on-exec for
// everything but 0-2 and the pass-list, CVE-2024-21626); escaping limits by
// forking before they apply (rlimits are set in the tool's own process by
// prlimit(1) before it execs the tool; the cgroup is entered before nsinit
// runs any setup).
//
// What it does not protect against: kernel bugs reachable through the
// allowed syscalls; side channels; a tool using its whole quota of CPU,
// memory or disk in the tmpfs mounts (the cgroup bounds that, not nsinit);
// data the caller chose to bind into the sandbox.
//
// What it trusts: the plan from the launcher (fd 3) — nsinit takes no
// decision of its own; the host's /usr (bound read-only; prlimit(1) from
// util-linux runs from it after privileges are gone, with no more rights
// than the tool).
//
// Kernel features: user namespaces for rootless mode; open_tree,
// move_mount and mount_setattr (5.12+) for recursive read-only binds;
// close_range (5.11+); seccomp filter mode; a /proc that can be mounted
// afresh (not masked by a container runtime — see str doctor).
//
// Every failure is a *StepError naming the step, the action and the path;
// it is sent to the launcher on the report pipe (fd 4) and printed.
package nsinit
