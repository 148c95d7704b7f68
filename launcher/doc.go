// Package launcher is the parent side of a sandbox. It turns a profile and
// a Request into a Plan (pure: NewPlan touches nothing but a description
// of the host, and is what `str profile show NAME --plan` prints), then
// applies it in a few numbered steps (CreateFromPlan and Sandbox.run; the
// step constants are nsinit.StepLCgroup..StepLTeardown):
//
//	L1. root mode: lease the sandbox's host id block (ids.go); create its
//	    cgroup with memory.max (swap 0), pids.max and cpu.max (cgroup.go,
//	    v2, or the v1 fallback on hybrid hosts), under an opaque name and
//	    a lock file held for the sandbox's life
//	L2. make the report socket
//	L3. root mode, at Start: clone every bind source on the host
//	    (binds.go: open O_PATH, open_tree OPEN_TREE_CLONE|AT_RECURSIVE,
//	    made private) and pass the detached trees to the init, which
//	    attaches them by descriptor: a bind needs no permission of the
//	    sandbox's uids on the source's parent directories (rootless, the
//	    init clones each source itself, as the caller's own uid); a tree
//	    marked IDMapOwner is id-mapped to its owner first (launcher/idmap)
//	L4. compile the plan into the init's program (nsinit.CompileDirect:
//	    the init's numbered steps as raw system calls) and clone the
//	    child that runs it (direct.go) with the plan's clone flags (a user
//	    namespace always), from nsinit's cloner thread (Pdeathsig follows
//	    it; it lives as long as the process); write its uid/gid maps
//	    (rootless after setgroups "deny"), then let it go. On cgroup v2
//	    the child is born in its cgroup (CLONE_INTO_CGROUP)
//	L5. cgroup v1: open the cgroup's tasks files to the init's host ids;
//	    its exec thread moves itself in before it drops anything
//	L6. (no plan is sent: it is the child's program) the child performs
//	    the numbered sequence and executes the tool in its own place (the
//	    tool is PID 1)
//	L7. enforce the wall-clock timeout (SIGKILL) and the caller's
//	    cancellation (SIGINT, SIGKILL after CancelGrace); PID 1's death
//	    takes the whole pid namespace. A sandbox made to wait unarmed
//	    (Request.Idle: a pooled one) gets its idle limit instead, until
//	    Sandbox.Arm starts its timeout from the moment of the claim
//	L8. after the child is reaped: kill what is left in the cgroup, read
//	    peak memory, CPU, OOM and pids events, remove the cgroup (str
//	    serve: its v1 pids, cpu, cpuacct and freezer cgroups are kept for
//	    the next sandbox when empty and clean, cgroupreuse.go and
//	    launcher/resident's cgroups.go), release
//	    the id block
//	L9. a sandbox made through the Provider (launcher/provider; the
//	    worker's): its work dir (launcher/workdir): made before the plan, which binds it;
//	    after L1, root mode, a tmpfs capped by the profile's work_dir and
//	    owned by the leased ids, .str/ (the runner's files) on a small
//	    tmpfs of its own, input/, output/, the status FIFO, chowned to the
//	    tool; removed by Box.Release; workdir.SweepStale at the caller's start
//	L10. a capped `str run --workdir` (root mode): once every process of
//	    the sandbox is reaped, copy what the tool changed back into the
//	    directory (package launcher/writeback; its overlay is made at L3)
//
// Each optional boundary is a package of its own, with its own doc: the
// resident launcher (`str serve`, launcher/resident), the per-tool
// template supervisor (launcher/template), the installation sandbox
// (launcher/install, steps I1-I6: pip in a sandbox of this launcher),
// the id-mapped bind (launcher/idmap), the copy back
// (launcher/writeback) and TLS termination (launcher/intercept).
//
// What it protects against: a request loosening its profile (overrides may
// only tighten; every problem is collected before anything is created); a
// sandbox outliving its launcher (Pdeathsig, re-armed by the init after
// its uid change; cgroup kill; the next launcher to create a sandbox
// removes the cgroups whose lock nobody holds); a tool running outside its
// limits for any moment; two sandboxes sharing a host uid.
//
// What it does not: it trusts the profiles it loads (embedded, or from the
// directory the operator names) and the host paths the caller binds. What
// a tool reads or writes inside a bind is still judged by the file
// permissions against the tool's own host uid (root mode: "other"; the
// work dir the launcher hands to it); only the directories above a bind
// source need nothing. Rootless, the init clones the sources as the
// caller's own uid, so the caller must be able to reach them.
//
// Needs: root, or user namespaces plus a delegated cgroup subtree
// (cgroup v2: the launcher's cgroup writable, e.g. systemd Delegate=yes;
// the launcher then moves itself into a "str-supervisor" leaf and creates
// sandboxes beside it, in its own cgroup, named
// "str-<state directory>-s<id>"; cgroup v1: the launcher's own
// cgroup writable in the memory, pids, cpu, cpuacct and freezer
// hierarchies). `str doctor` checks all of it.
package launcher
