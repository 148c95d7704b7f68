package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/securetoolruntime/str/launcher/procfs"
)

// Why a covered /proc matters: a sandbox is a user namespace, and the
// kernel lets a user namespace mount a fresh procfs only while some procfs
// mount in its mount namespace is fully visible: no mount below it covers
// anything but a permanently empty directory (fs/namespace.c,
// mount_too_revealing/mnt_already_visible). Mounts the worker inherits are
// locked in the sandbox's user namespace, so one bind mount over
// /proc/kmsg in the worker's namespace is enough to make every sandbox
// fail at "mount proc". The functions below find those mounts and name
// who usually puts them there.

// procMount is one line of /proc/self/mountinfo (proc(5)) for a mount at
// or below /proc.
type procMount struct {
	Point  string // the mount point, unescaped
	FSType string
	Super  string // the super block's options (procfs: hidepid=, subset=)
}

// parseProcMounts returns the mounts at or below /proc in a mountinfo
// text. Lines it cannot read are skipped: mountinfo is the kernel's, and
// a doctor that stops at a surprise explains nothing.
func parseProcMounts(mountinfo string) []procMount {
	var out []procMount
	for _, l := range strings.Split(mountinfo, "\n") {
		// ID PARENT MAJ:MIN ROOT POINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPER
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 1 {
			continue
		}
		point := procfs.UnescapeMountinfo(f[4])
		if point != "/proc" && !strings.HasPrefix(point, "/proc/") {
			continue
		}
		m := procMount{Point: point, FSType: g[0]}
		if len(g) >= 3 {
			m.Super = g[2]
		}
		out = append(out, m)
	}
	return out
}

// Who mounts over which /proc paths. The systemd lists are those of
// systemd's namespace setup (v252, Debian 12) for the unit settings named;
// the runtime list is the OCI runtime default masked and read-only paths
// (Docker, containerd, CRI-O, Podman).
var (
	procBySystemdKernelLogs = []string{"/proc/kmsg"}
	procBySystemdTunables   = []string{"/proc/acpi", "/proc/apm", "/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq",
		"/proc/kallsyms", "/proc/kcore", "/proc/latency_stats", "/proc/mtrr", "/proc/scsi", "/proc/sys", "/proc/sysrq-trigger", "/proc/timer_stats"}
	procByRuntime = []string{"/proc/acpi", "/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/kcore",
		"/proc/keys", "/proc/latency_stats", "/proc/sched_debug", "/proc/scsi", "/proc/sys", "/proc/sysrq-trigger",
		"/proc/timer_list", "/proc/timer_stats"}
)

// The causes a covered /proc is attributed to, each with its fix.
const (
	causeKernelLogs = "systemd ProtectKernelLogs=yes"
	causeTunables   = "systemd ProtectKernelTunables=yes"
	causeRuntime    = "the container runtime's masked paths"
	causeUnknown    = "a mount made by hand or by another tool"
)

var procCoverFix = map[string]string{
	causeKernelLogs: "remove ProtectKernelLogs= from the worker's unit (it mounts over /proc/kmsg; deploy/systemd/str-worker.service says why it is not set)",
	causeTunables:   "remove ProtectKernelTunables= from the worker's unit (it mounts /proc/sys and more read-only; deploy/systemd/str-worker.service says why it is not set)",
	causeRuntime: "run the worker's container with an unmasked /proc (docker: --security-opt systempaths=unconfined; " +
		"podman: --security-opt unmask=ALL; Kubernetes: securityContext.procMount: Unmasked)",
	causeUnknown: "unmount it in the worker's mount namespace (findmnt -R /proc shows it)",
}

// procPlace says where this process runs, for the attribution: inside a
// container, in a systemd service (systemd sets INVOCATION_ID for every
// unit it starts), or neither known.
type procPlace struct{ container, systemdUnit bool }

// procCoverCause names the likely causes of a mount at path (below /proc).
func procCoverCause(path string, at procPlace) []string {
	in := func(list []string) bool {
		for _, p := range list {
			if path == p || strings.HasPrefix(path, p+"/") {
				return true
			}
		}
		return false
	}
	switch {
	case in(procBySystemdKernelLogs):
		return []string{causeKernelLogs}
	// In a unit (which may itself run in a container) the unit's own
	// settings are the likelier cause: they apply last.
	case at.systemdUnit && in(procBySystemdTunables):
		return []string{causeTunables}
	case at.container && in(procByRuntime):
		return []string{causeRuntime}
	case in(procByRuntime) && !in(procBySystemdTunables):
		return []string{causeRuntime}
	case in(procBySystemdTunables) && in(procByRuntime):
		// Both put a mount here and neither place is known: name both.
		return []string{causeTunables, causeRuntime}
	case in(procBySystemdTunables):
		return []string{causeTunables}
	}
	return []string{causeUnknown}
}

// procCover is the verdict on /proc: the covering mounts, each with its
// likely cause, and the fixes, one per cause.
type procCover struct {
	Covered []string // "PATH (CAUSE)", in mountinfo order
	Fixes   []string
}

// coveredProc reads the mountinfo text and says what covers /proc. The
// binfmt_misc automount below /proc/sys/fs is on a permanently empty
// directory, which the kernel tolerates.
func coveredProc(mountinfo string, at procPlace) procCover {
	var v procCover
	causes := map[string]bool{}
	for _, m := range parseProcMounts(mountinfo) {
		if m.Point == "/proc" || strings.HasPrefix(m.Point, "/proc/sys/fs/binfmt_misc") {
			continue
		}
		cs := procCoverCause(m.Point, at)
		v.Covered = append(v.Covered, fmt.Sprintf("%s (%s)", m.Point, strings.Join(cs, " or ")))
		for _, c := range cs {
			causes[c] = true
		}
	}
	for c := range causes {
		v.Fixes = append(v.Fixes, procCoverFix[c])
	}
	sort.Strings(v.Fixes)
	return v
}

// checkProcCovered is str doctor's /proc check: names every mount that
// covers part of /proc, its likely cause and the fix. The kernel still
// allows the fresh /proc when another procfs mount in the namespace is
// fully visible, so a covered /proc is reported, and fails the doctor
// only through the sandbox check, whose "mount proc" failure gets the
// returned fix.
func checkProcCovered(check func(name string, good bool, detail, fix string), info func(name, detail string), engine string) (fix string) {
	at := procPlace{container: engine != "", systemdUnit: os.Getenv("INVOCATION_ID") != ""}
	v := coveredProc(readFile("/proc/self/mountinfo"), at)
	if len(v.Covered) == 0 {
		check("unmasked /proc", true, "nothing is mounted over /proc's files", "")
		return ""
	}
	fix = strings.Join(v.Fixes, "; ")
	info("covered /proc", "mounts over /proc: "+strings.Join(v.Covered, ", ")+
		"; the kernel refuses a sandbox its own /proc while any part of /proc is covered, unless another procfs mount here is fully visible: if the sandbox below fails at \"mount proc\", this is why; fix: "+fix)
	return fix + "; or use a best_effort profile (runs without /proc and says so)"
}
