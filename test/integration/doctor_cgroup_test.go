package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// TestDoctorCgroupNotDelegated: str doctor as a user whose cgroup was not
// delegated (uid 65534, no setup) names delegation and this host's
// hierarchy. It blamed "the container's cgroup is mounted read-only" on a
// read-write mount and offered a v2 subtree on a v1 host.
func TestDoctorCgroupNotDelegated(t *testing.T) {
	needRoot(t) // to drop to uid 65534
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	version, mount := "v1", "/sys/fs/cgroup/memory"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		version, mount = "v2", "/sys/fs/cgroup"
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(mount, &fs); err != nil {
		mustwork.Skip(t, "no cgroup "+version+" mount at "+mount+": "+err.Error())
	}
	if fs.Flags&unix.ST_RDONLY != 0 {
		mustwork.Skip(t, mount+" is mounted read-only here: this test needs a read-write mount the user was not delegated")
	}
	// The binary must be reachable by uid 65534.
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	bin := strCopyIn(t, dir)
	// Unprivileged, str runs without the limits: a warning saying they
	// are not enforced; with STR_REQUIRE_CGROUP=1 it refuses: a failure.
	for _, c := range []struct{ env, mark, says string }{
		{"STR_REQUIRE_CGROUP=0", "[warn] cgroup", "limits not enforced for uid 65534"},
		{"STR_REQUIRE_CGROUP=1", "[FAIL] cgroup", "not writable"},
	} {
		cmd := exec.Command("setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", bin, "doctor")
		cmd.Env = []string{"PATH=/usr/bin:/bin", "STR_STATE_DIR=" + filepath.Join(dir, "state"), c.env}
		out, _ := cmd.CombinedOutput() // doctor exits non-zero when a check fails
		var line, fix string
		lines := strings.Split(string(out), "\n")
		for i, l := range lines {
			if strings.HasPrefix(l, c.mark) && i+1 < len(lines) {
				line, fix = l, lines[i+1]
			}
		}
		if line == "" {
			t.Fatalf("str doctor as uid 65534, %s: no %q line (was its cgroup delegated?):\n%s", c.env, c.mark, out)
		}
		if !strings.Contains(line, c.says) {
			t.Errorf("str doctor as uid 65534, %s: the cgroup line does not say %q:\n%s", c.env, c.says, line)
		}
		checkDoctorCgroupAdvice(t, version, line+"\n"+fix)
	}
}

// checkDoctorCgroupAdvice: str doctor's cgroup line and fix for a user
// not delegated one name the hierarchy there is and blame no read-only
// mount.
func checkDoctorCgroupAdvice(t *testing.T, version, text string) {
	t.Helper()
	for _, want := range []string{"cgroup " + version, "uid 65534", "the mount", "read-write"} {
		if !strings.Contains(text, want) {
			t.Errorf("str doctor's cgroup lines lack %q:\n%s", want, text)
		}
	}
	for _, bad := range []string{"mounted read-only", "read-only mount"} {
		if strings.Contains(text, bad) {
			t.Errorf("str doctor blames a read-only mount (%q) on a read-write one:\n%s", bad, text)
		}
	}
	if version == "v1" && strings.Contains(text, "delegate a cgroup v2 subtree") {
		t.Errorf("str doctor on a v1 host offers v2 delegation as if it were there:\n%s", text)
	}
}
