// Package nsinit is the sandbox's first process: the init's steps,
// compiled in the launcher (CompileDirect) into a Program of raw system
// calls that the launcher's own clone child runs (no program of its own,
// no second Go runtime), in new user, pid, mount, ipc, uts, cgroup and
// network namespaces. Its whole job is one linear, numbered sequence (see
// compileDirect and DocList): build a fresh root from tmpfs and read-only
// binds, pivot_root, set the hostname, bring up loopback, drop every
// privilege, load seccomp, set the rlimits and execve the tool in the
// child's own place, so the tool is the sandbox's PID 1 and nothing of
// str stays inside. Every sandbox runs it: root and rootless, one-shot,
// pre-built, a worker's, a template's, a bubblewrap line's.
//
// What it protects against: a tool reading or writing host files outside
// its binds; seeing or signalling host processes; reaching the network;
// regaining privileges through setuid binaries or file capabilities
// (no_new_privs, empty bounding set); using kernel attack surface the
// policy denies (seccomp); typing into the caller's terminal (setsid at
// clone, CVE-2017-5226); inheriting file descriptors (the launcher's are
// closed, and close-on-exec for everything but 0-2 and the pass-list,
// CVE-2024-21626); overwriting an init binary through /proc/PID/exe
// (there is none: the child executes only the tool, CVE-2019-5736);
// escaping limits by forking before they apply (rlimits are set by raw
// prlimit64 right before the execve; on cgroup v2 the child is born in
// its cgroup, on v1 it moves itself in before it drops anything).
//
// What it does not protect against: kernel bugs reachable through the
// allowed syscalls; side channels; a tool using its whole quota of CPU,
// memory or disk in the tmpfs mounts (the cgroup bounds that, not nsinit);
// data the caller chose to bind into the sandbox. As PID 1 the tool must
// reap its own orphans; zombies it leaves count against pids.max until it
// exits, and its exit kills every process of the sandbox.
//
// What it trusts: the plan the launcher compiled and, root mode, the
// mount trees it passes (clones of the plan's bind sources), nothing else
// — nsinit takes no decision of its own. It holds no host privilege at any time: it is
// root only of the sandbox's own user namespace, mapped to an unprivileged
// host uid of its own (rootless: the caller's).
//
// Kernel features: user namespaces; open_tree, move_mount and
// mount_setattr (5.12+) for recursive read-only binds and for attaching
// the trees the launcher cloned on the host (SECURITY.md, "The init's
// sequence"; the id-mapped work dir needs a filesystem with idmapped-mount
// support, e.g. ext4, xfs, btrfs, tmpfs 6.3+); close_range (5.11+);
// seccomp filter mode; a /proc that can be mounted afresh (not masked by a
// container runtime — see str doctor).
//
// Every failure is a *StepError naming the step (a Step constant), the
// action, the object and the cause, which the launcher builds from the
// failed operation's index and errno the child sends (Program.Event).
package nsinit
