// Package launcher is the parent side of a sandbox. It turns a profile and
// a Request into a Plan (pure: NewPlan touches nothing but a description
// of the host, and is what `str profile show NAME --plan` prints), then
// applies it in a few numbered steps (Sandbox.run):
//
//	L1. create the sandbox's cgroup with memory.max (swap 0), pids.max and
//	    cpu.max (containerd/cgroups; v2, or the v1 fallback on hybrid hosts)
//	L2. make the config and report pipes
//	L3. clone /proc/self/exe as nsinit with the plan's clone flags, uid/gid
//	    maps and Pdeathsig, from a locked OS thread that lives until the
//	    child is reaped; on cgroup v2 the child is born in its cgroup
//	    (CLONE_INTO_CGROUP)
//	L4. cgroup v1 only: move the child into its cgroup before it may run
//	L5. send the plan; only now does nsinit start its setup
//	L6. enforce the wall-clock timeout and the caller's cancellation by
//	    killing nsinit (PID 1: the whole pid namespace dies) and the cgroup
//	L7. after the child is reaped: kill what is left in the cgroup, read
//	    peak memory, CPU, OOM and pids events, remove the cgroup
//
// What it protects against: a request loosening its profile (overrides may
// only tighten; every problem is collected before anything is created); a
// sandbox outliving its launcher (Pdeathsig on nsinit, cgroup kill, and
// the next launcher start removes the cgroups of launchers that died);
// a sandbox running outside its limits for any moment.
//
// What it does not: it trusts the profiles it loads (embedded, or from the
// directory the operator names) and the host paths the caller binds.
//
// Needs: root, or user namespaces plus a delegated cgroup subtree
// (cgroup v2: the launcher's cgroup writable, e.g. systemd Delegate=yes;
// the launcher then moves itself into a "str-supervisor" leaf and creates
// sandboxes under "<own cgroup>/str"; cgroup v1: the launcher's own
// cgroup writable in the memory, pids, cpu, cpuacct and freezer
// hierarchies). `str doctor` checks all of it.
package launcher
