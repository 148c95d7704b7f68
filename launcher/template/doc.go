// Package template is the per-tool template supervisor (root only;
// Start, Template.Call). A template is one Python that imported a tool
// once, in a sandbox of the tool's profile made by package launcher,
// whose filter is seccomp.TemplatePolicy, loaded with a listener (the
// init's sub-step 19a). Each call is a clone of it into user, mount,
// pid, network, ipc, uts and cgroup namespaces of its own, which the
// supervisor lets through the filter's notification once per order,
// then maps a host id pair of the template's into (through the id-map
// opener of mapper.go), brings lo up in (netns.go, the one file that
// calls setns), moves into its slot's cgroup, sets the process limit of,
// attaches fresh mounts in (netns.go again), and verifies from the host
// before it sends the call. The steps are T1-T4 and C1-C12 in
// template.go; docs/security-design.md ("Per-tool templates") says what a
// template shares with its children and why each item is safe.
//
// The child itself (the runner's template mode, Python forked from the
// template) does only what acts on its own process and cannot be done
// from outside: chdir /, empty its bounding set, set its ids, clear its
// capabilities, re-arm its parent-death signal, make itself dumpable,
// put /dev/null on 0-2 and close its other descriptors, reseed its RNGs
// (its own memory), and load the call filter whose bytes it is sent.
//
// What it does on the host, in the launcher's process (the worker's,
// str-bench's, a test's): it leases the calls' host id pairs and makes
// their cgroups through the launcher (Launcher.LeaseHostIDs,
// Launcher.NewCgroup); answers the template filter's seccomp
// notifications (SECCOMP_IOCTL_NOTIF_RECV/SEND: continue the ordered
// clone, EPERM for anything else); writes each call's setgroups, and
// its uid_map and gid_map through descriptors its mapper opened; opens
// each call's egress listeners from one locked thread that joins the
// call's network namespace and goes back (setns), served by the
// launcher (Sandbox.ServeEgress); moves each call into its slot's
// cgroup; sets its RLIMIT_NPROC (prlimit); makes its fresh tmpfs and
// proc mounts (fsopen, fsconfig, fsmount) and clones its work dir
// (open_tree), and attaches them in the call's mount namespace from one
// locked thread that never ends, has an fs_struct of its own (unshare
// CLONE_FS) and joins that namespace for the move_mount calls (setns
// through the call's pidfd) and goes back; kills calls through their
// pidfd and their cgroup; reads /proc of the template and of each call
// to verify them.
//
// The id-map opener (mapper.go) is the running program itself, executed
// again as str-id-mapper by a raw clone that joined the template's user
// namespace as its root (a leased host id, not host root); this
// package's init turns such a start into serveMapper. A program can
// start a template only through this package (Start), so every program
// that can (str, str-worker, str-bench, the tests) links this init and serves
// as its own mapper by construction.
//
// What it protects against: a template's import-time code reaching
// namespaces or mounts (its filter, its empty /proc, its read-only tmpfs
// mounts), or sharing a thread, a descriptor or a writable shared
// mapping with the calls (T3, checked from the host, and again at each
// fork order); a clone the supervisor did not order; a child that is
// not the template's, or shares one of its namespaces (C3); a call that
// did not drop everything before its data is sent (C9: ids,
// capabilities, no_new_privs, seccomp, threads, namespaces,
// descriptors, cwd, cgroup, RLIMIT_NPROC, each fresh mount the top one
// at its target, alone in its pid namespace); a call
// outliving its wall clock, or its slot's ids or cgroup passing to the
// next call while anything of it is left; one address-space layout
// shared for too long (MaxCalls, MaxAge).
//
// What it does not protect against: the children share the template's
// memory as it was at the fork (copy-on-write: the imported tool,
// gc.freeze'd) and its address-space layout, within the recycling
// limits; docs/security-design.md lists each shared item and why it is
// safe.
//
// What it trusts: package launcher (the plan, the sandbox, id leases,
// cgroups, work dirs, the egress session); the caller (the worker),
// which decides the profile, the binds and the runner arguments; the
// kernel's checks of seccomp notifications, pidfds and id maps. Not the
// template's Python or the runner's template mode (worker/runner): what
// a call was told to do is verified from the host (C9) before its data
// is sent.
//
// Needs: root (the calls' host ids are leased); seccomp user
// notification with SECCOMP_USER_NOTIF_FLAG_CONTINUE; pidfd_open; the
// mount API with fsconfig pidns= for proc (Linux 6.18); the running
// program's file executable by others (the mapper runs it as a leased
// id).
package template
