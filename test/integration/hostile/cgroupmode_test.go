package hostile

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/profiles"
)

// cgroupMode is the hierarchy the battery runs on, decided before any
// case: the cases whose outcome differs by mode read it, and
// TestHostile/cgroup_mode checks that the sandboxes really got cgroups of
// that kind.
type cgroupMode string

const (
	modeV2 cgroupMode = "v2" // unified hierarchy at /sys/fs/cgroup (the VM harness)
	modeV1 cgroupMode = "v1" // the v1 fallback (hosts whose controllers are bound to v1)
)

// hostCgroupMode reads the host's hierarchy the way the launcher does
// (launcher.DetectCgroup): cgroup2fs at /sys/fs/cgroup is v2, else v1.
// STR_CGROUP_V2=1 (set by the VM harness, test/integration/vm) demands
// v2: a guest that silently fell back to v1, or has no cgroup2 mount,
// fails here instead of passing the battery in the wrong mode.
func hostCgroupMode(t *testing.T) cgroupMode {
	t.Helper()
	var st unix.Statfs_t
	v2 := unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	if os.Getenv("STR_CGROUP_V2") == "1" && !v2 {
		t.Fatalf("STR_CGROUP_V2=1 but /sys/fs/cgroup is not cgroup2fs (statfs type %#x): the battery must run on cgroup v2 here", st.Type)
	}
	if v2 {
		if got := launcher.DetectCgroup(); got != launcher.CgroupV2 {
			t.Fatalf("/sys/fs/cgroup is cgroup2fs but the launcher detects %q", got)
		}
		return modeV2
	}
	return modeV1
}

// cgroupModeCase is checkCgroupMode's subtest of TestHostile, which
// SECURITY.md's table may name though it is not one of cases().
const cgroupModeCase = "cgroup_mode"

var sandboxCgroupName = regexp.MustCompile(`^str-[0-9a-f]{12}-s[0-9a-f]{16}$`)

// checkCgroupMode: a standard sandbox holds while the harness finds its
// process on the host and reads its cgroup: on v2 one unified cgroup of
// its own (an opaque sNNNN name) with the profile's memory.max, pids.max
// and cpu.max; on v1 its own cgroup in the memory and pids hierarchies
// with the profile's limits. Inside, the tool's cgroup namespace shows
// "0::/" on v2 (the init is born in its cgroup, CLONE_INTO_CGROUP, and
// unshares the namespace there) and the v1 controllers' lines on v1.
func checkCgroupMode(t *testing.T, h *harness, mode cgroupMode) {
	set, err := profiles.Embedded()
	must(t, err)
	prof, err := set.Lookup("standard")
	must(t, err)
	memMax := strconv.FormatInt(int64(prof.Cgroup.Memory), 10)
	pidsMax := strconv.FormatInt(prof.Cgroup.Pids, 10)

	marker := strings.ReplaceAll("4444"+newID(""), "-", "")
	id := h.a.invoke("h_standard", map[string]any{"args": map[string]any{"case": "cgroup_probe", "marker": marker, "hold": 120}, "session_id": "s-cgroup"})
	defer func() { h.a.cancel(id); h.a.reply(t, id, rpcWait) }()
	waitFor(t, "the probe's status", rpcWait, func() bool { return len(h.a.status(id)) > 0 })
	inside := strings.TrimPrefix(h.a.status(id)[0], "probing ")
	var pids []string
	waitFor(t, "the probe's child on the host", time.Minute, func() bool { pids = findProcs("600." + marker); return len(pids) > 0 })
	paths, err := procfs.Cgroups(pids[0])
	must(t, err)
	t.Logf("cgroup mode %s; the sandbox's /proc/PID/cgroup on the host: %q, inside: %q", mode, paths, inside)
	read := func(p string) string {
		v, err := os.ReadFile(p)
		must(t, err)
		return strings.TrimSpace(string(v))
	}
	switch mode {
	case modeV2:
		path, ok := paths[""]
		if len(paths) != 1 || !ok {
			t.Fatalf("v2: the sandbox's /proc/PID/cgroup is %q, want a single 0:: line (a v1 line means a fallback to v1)", paths)
		}
		if !sandboxCgroupName.MatchString(filepath.Base(path)) {
			t.Fatalf("v2: the sandbox runs in %s, not a sandbox cgroup of its own", path)
		}
		dir := filepath.Join("/sys/fs/cgroup", path)
		for file, want := range map[string]string{"memory.max": memMax, "pids.max": pidsMax,
			"cpu.max": strconv.FormatInt(int64(prof.Cgroup.CPUs)*100, 10) + " 100000"} { // milli-CPUs of a 100 ms period
			if got := read(filepath.Join(dir, file)); got != want {
				t.Errorf("v2: %s/%s = %q, want %q (profile standard)", dir, file, got, want)
			}
		}
		if inside != "0::/" {
			t.Errorf("v2: the tool sees /proc/self/cgroup %q, want 0::/ (its own cgroup namespace)", inside)
		}
	case modeV1:
		for ctl, file := range map[string][2]string{"memory": {"memory.limit_in_bytes", memMax}, "pids": {"pids.max", pidsMax}} {
			p, ok := paths[ctl]
			if !ok || !sandboxCgroupName.MatchString(filepath.Base(p)) {
				t.Fatalf("v1: the sandbox's %s cgroup is %q, not a sandbox cgroup of its own (%q)", ctl, p, paths)
			}
			if got := read(filepath.Join("/sys/fs/cgroup", ctl, p, file[0])); got != file[1] {
				t.Errorf("v1: %s/%s = %q, want %q (profile standard)", p, file[0], got, file[1])
			}
		}
		if !strings.Contains(inside, ":memory:") {
			t.Errorf("v1: the tool sees /proc/self/cgroup %q, want the v1 controllers", inside)
		}
	}
}
