// Package planfmt renders a launcher.Plan for a reviewer (`str profile
// show NAME --plan`, `str bwrap --plan`): every mount, namespace, id map, rlimit,
// cgroup limit and seccomp rule, in the order the launcher and the init
// apply them. It only reads the plan and formats text: it does nothing on
// the host.
package planfmt

import (
	"fmt"
	"strings"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
)

// Plan renders a plan for a reviewer: every mount with its flags,
// the clone flags, id maps, rlimits, cgroup limits and seccomp rules with
// their actions, in the order they are applied.
func Plan(pl *launcher.Plan, bytes func(profiles.Quantity) string) string {
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	w("profile: %s\n", pl.Profile)
	if pl.Runtime != "" && pl.Runtime != profiles.RuntimeNamespaces {
		// Only what the class keeps of the plan below applies (docs/runtimes.md).
		w("runtime: %s (the mounts, ids, environment, rlimits and cgroup limits below, run by it; not the clone flags, id maps or seccomp)\n", pl.Runtime)
	}
	w("mode: %s\n", map[bool]string{true: "rootless (user namespace, caller mapped to the tool uid)", false: "root (user namespace, a host id block leased per sandbox)"}[pl.Rootless])
	w("\nnamespaces (clone flags): %s\n", strings.Join(pl.CloneNames, " | "))
	if !pl.Rootless && len(pl.UIDMappings) == 0 {
		w("  uid/gid map: inside 0 (the init) -> the block's first host id, inside %d (the tool) -> its second; blocks of %d ids leased from %s\n",
			pl.Child.UID, launcher.IDsPerSandbox, pl.IDRange)
	}
	for _, m := range pl.UIDMappings {
		w("  uid map: inside %d -> host %d (size %d)\n", m.Inside, m.Outside, m.Size)
	}
	for _, m := range pl.GIDMappings {
		w("  gid map: inside %d -> host %d (size %d)\n", m.Inside, m.Outside, m.Size)
	}
	if pl.MapRoot {
		w("  binds: every bind not mapped to its owner is id-mapped host root -> inside 0 (step L3; a mount whose filesystem refuses is left as it is)\n")
	}
	if pl.Child.Caps != 0 {
		w("  capabilities kept (in the sandbox's user namespace only): %#x\n", pl.Child.Caps)
	}
	w("\nfilesystem (in order, under a fresh tmpfs root; every mount nosuid, nodev except device nodes):\n")
	for i, m := range pl.Child.Mounts {
		w("  %2d. %s\n", i+1, describeMount(m))
	}
	if pl.Child.RootToCommand {
		w("  then: pivot_root, detach old root, give / and the entries made on it to uid %d gid %d (writable, as bubblewrap's), chdir %s\n", pl.Child.UID, pl.Child.GID, pl.Child.Workdir)
	} else {
		w("  then: pivot_root, detach old root, remount / read-only, chdir %s\n", pl.Child.Workdir)
	}
	w("  the work dir (step L9, a sandbox of the worker's): root mode, a tmpfs the launcher mounts on it, %s and %d inodes, owned by the tool's leased ids,\n"+
		"    with input/ (the caller's), output/ and %s/ (the runner's arguments, result and status FIFO, on a tmpfs of its own, %s, off the tool's cap); rootless, plain directories, uncapped\n",
		bytes(pl.WorkDir.Size), pl.WorkDir.Inodes, workdir.RunnerDirName, bytes(profiles.Quantity(workdir.RunnerSpace)))
	w("\ninit: the steps below compiled into raw system calls that the launcher's own clone child runs before the tool's execve (no second program)\n")
	w("init sequence (nsinit, every sandbox):\n")
	for _, l := range nsinit.DocList() {
		w("  %s\n", l)
	}
	host := fmt.Sprintf("host uid %d gid %d", pl.ToolUID, pl.ToolGID)
	if pl.ToolUID < 0 {
		host = "host ids: the leased block's"
	}
	if pl.CallerNetwork {
		w("\nnetwork: the caller's own (no network namespace, no egress proxy, no listeners: the command reaches what the caller reaches, as under bubblewrap)\n")
	} else {
		networkPolicy(w, pl)
	}
	w("\nidentity: uid %d gid %d inside (%s); hostname %q; loopback up: %v\n",
		pl.Child.UID, pl.Child.GID, host, pl.Child.Hostname, pl.Child.LoopbackUp)
	w("privileges: bounding, ambient, effective, permitted, inheritable sets emptied; no_new_privs; new session (setsid); the tool is executed as PID 1\n")
	w("\nrlimits (soft = hard):\n")
	for _, r := range pl.Child.Rlimits {
		w("  %-14s %d\n", r.Name, r.Value)
	}
	cg := pl.Cgroup
	if cg.Unenforced != "" {
		w("\ncgroup: none (%s): limits not enforced\n", cg.Unenforced)
		w("  not applied: memory.max %s, cpu.max %.2f CPUs, pids.max %d (str doctor says how to get them)\n",
			bytes(profiles.Quantity(cg.MemoryMax)), float64(cg.CPUQuotaUs)/float64(cg.CPUPeriodUs), cg.PidsMax)
		w("  still enforced: the rlimits above (RLIMIT_NPROC, counted in the sandbox's user namespace, bounds its processes) and the timeout\n")
	} else {
		w("\ncgroup (%s):\n", cg.Mode)
		w("  memory.max %s, swap %d\n", bytes(profiles.Quantity(cg.MemoryMax)), cg.SwapMax)
		w("  cpu.max %d %d (%.2f CPUs)\n", cg.CPUQuotaUs, cg.CPUPeriodUs, float64(cg.CPUQuotaUs)/float64(cg.CPUPeriodUs))
		w("  pids.max %d\n", cg.PidsMax)
	}
	if pl.Timeout > 0 {
		w("\ntimeout: %s wall clock, then the whole sandbox is killed (SIGKILL to its PID 1 ends its pid namespace, every process in it", pl.Timeout.Round(time.Millisecond))
		if cg.Mode != launcher.CgroupNone {
			w("; and the cgroup is killed")
		}
		w(")\n")
	}
	w("\nenvironment (rebuilt from nothing):\n")
	for _, e := range pl.Child.Env {
		w("  %s\n", e)
	}
	for i, prog := range pl.Child.ExtraSeccomp {
		w("\nthe caller's seccomp filter %d (%d BPF instructions), loaded after the profile's (if any), before the rlimits and execve\n", i+1, len(prog)/8)
	}
	if pl.Child.SeccompPolicy == "" {
		w("\nno seccomp policy of the profile: the caller's filters replace it (caller_seccomp: %s)\n", pl.CallerSeccomp)
		return b.String()
	}
	w("\nseccomp policy %q (%d BPF instructions), loaded before the rlimits and execve; default: %s; foreign/x32 arch: kill process\n",
		pl.Child.SeccompPolicy, len(pl.Child.Seccomp)/8, pl.SeccompDefault)
	for _, r := range pl.Seccomp {
		cond := ""
		if r.Condition != "" {
			cond = " if " + r.Condition
		}
		w("  %-22s %-14s%s  # %s\n", r.Syscall, r.Action, cond, r.Reason)
	}
	return b.String()
}

// AddViews fills in the reviewer's view of pl's seccomp rules
// (Plan.Seccomp, Plan.SeccompDefault: what Plan and `str profile show
// --plan --json` print) when its policy is an embedded one, whose
// precompiled program carries none; sandboxes do not need it.
func AddViews(pl *launcher.Plan) error {
	if len(pl.Seccomp) > 0 || pl.Child.SeccompPolicy == "" {
		return nil
	}
	var err error
	pl.Seccomp, pl.SeccompDefault, err = seccomp.EmbeddedViews(pl.Child.SeccompPolicy)
	return err
}

// treeSource says who clones a bind source: the launcher on the host
// (root mode; the init's descriptor) or the init itself (rootless).
func treeSource(m nsinit.Mount) string {
	switch {
	case m.TreeFD > 0:
		return fmt.Sprintf("; cloned on the host by the launcher (init fd %d)", m.TreeFD)
	case m.TreeFD == nsinit.SourceAbsent:
		return "; absent, skipped"
	}
	return "; cloned by the init"
}

func describeMount(m nsinit.Mount) string {
	switch m.Kind {
	case nsinit.MountBind:
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		opt := ""
		if m.Optional {
			opt = " (optional)"
		}
		if m.NoFollow {
			opt += " (no symlink)"
		}
		if m.IDMapOwner {
			opt += " (id-mapped: its owner's host uid and gid are the tool's)"
		}
		if m.WriteBack {
			opt += " (capped: an overlay whose upper layer is a tmpfs of the profile's work_dir; the tool's changes are copied back at step L10)"
		}
		if o := m.Overlay; o != nil {
			upper := "a tmpfs of the launcher's, capped like the work dir"
			switch {
			case o.Upper != "":
				upper = o.Upper + " (work dir " + o.Work + ")"
			case m.ReadOnly:
				upper = "none"
			}
			return fmt.Sprintf("overlay %s -> %s, lower %s (top first), upper %s, nosuid,nodev; made on the host by the launcher (init fd %d)",
				mode, m.Target, strings.Join(o.Lower, ":"), upper, m.TreeFD)
		}
		nodev := ",nodev"
		if m.Devices {
			nodev = " (devices usable: --dev-bind)"
		}
		return fmt.Sprintf("bind %s %s -> %s, recursive, nosuid%s%s%s", mode, m.Source, m.Target, nodev, opt, treeSource(m))
	case nsinit.MountDevNode:
		return fmt.Sprintf("device %s -> %s, nosuid,noexec%s", m.Source, m.Target, treeSource(m))
	case nsinit.MountTmpfs:
		ro := ""
		if m.ReadOnly {
			ro = ",ro"
		}
		return fmt.Sprintf("tmpfs %s (%s%s), nosuid,nodev", m.Target, m.Data, ro)
	case nsinit.MountSymlink:
		return fmt.Sprintf("symlink %s -> %s", m.Target, m.Source)
	case nsinit.MountFile:
		return fmt.Sprintf("file %s (generated, %d bytes, mode %o)", m.Target, len(m.Contents), m.Mode)
	case nsinit.MountProc:
		return fmt.Sprintf("proc %s (fresh, for the new pid namespace), nosuid,nodev,noexec", m.Target)
	case nsinit.MountMqueue:
		return fmt.Sprintf("mqueue %s (the sandbox's ipc namespace), nosuid,nodev,noexec", m.Target)
	case nsinit.MountChmod:
		return fmt.Sprintf("chmod %s %#o", m.Target, m.Mode)
	case nsinit.MountRemountRO:
		return fmt.Sprintf("remount-ro %s (the mount it is on, not those below)", m.Target)
	case nsinit.MountDir:
		return fmt.Sprintf("dir %s (mode %#o)", m.Target, m.Mode)
	case nsinit.MountDevpts:
		return fmt.Sprintf("devpts %s (%s), nosuid,noexec", m.Target, m.Data)
	}
	return fmt.Sprintf("%s %s", m.Kind, m.Target)
}

// networkPolicy is the plan's network part when the sandbox has its own
// network namespace: the policy and the listeners the proxy serves.
func networkPolicy(w func(string, ...any), pl *launcher.Plan) {
	n := pl.Network
	w("\nnetwork: policy %s", n.Mode)
	if len(n.AllowedHosts) > 0 {
		w(", hosts %v", n.AllowedHosts)
	}
	if n.Mode != "isolated" {
		w(", ports %v", n.CapturePorts())
	}
	if len(n.AllowedCIDRs) > 0 {
		w(", cidrs %v", n.AllowedCIDRs)
	}
	if len(n.DNSServers) > 0 {
		w(", resolved with %v", n.DNSServers)
	}
	if n.OnViolation != "" {
		w(", on violation: %s", n.OnViolation)
	}
	w("\n  own network namespace with only lo; the launcher's egress proxy serves (the sandbox enforces nothing):\n")
	for _, l := range pl.Child.Listen {
		w("    %-12s %s %s\n", l.Name, l.Network, l.Addr)
	}
}
