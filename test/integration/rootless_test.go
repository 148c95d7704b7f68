package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher/procfs"
)

// Rootless mode: str run as an unprivileged uid (65534) creates its own
// user namespace (the caller mapped to 65534 inside) and its sandbox
// cgroups below a subtree delegated to that uid, as a non-root deployment
// would set up (docs: delegate a cgroup subtree; systemd Delegate=yes).
func TestRootless(t *testing.T) {
	needRoot(t) // to set up the unprivileged user's delegated cgroup
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	// The binary must be reachable by uid 65534.
	dir, err := os.MkdirTemp("", "str-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	_ = os.Chmod(dir, 0o755)
	bin := strCopyIn(t, dir)

	// A delegated cgroup in each controller the launcher uses (v1 here;
	// on a v2 host the VM test covers delegation).
	moves := delegatedCgroupMoves(t, 65534)
	if len(moves) == 0 {
		mustwork.Skip(t, "no cgroup v1 controllers on this host (a v2 host runs the rootless test in the VM)")
	}
	script := strings.Join(moves, " && ") + " && exec setpriv --reuid 65534 --regid 65534 --clear-groups " + bin +
		` run --profile restrictive -- /bin/sh -c 'id -u; cat /proc/self/uid_map; grep -E "^(CapEff|NoNewPrivs|Seccomp):" /proc/self/status; /usr/bin/python3 -c "print(42)"'`
	out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("rootless str run: %v\n%s", err, out)
	}
	// Its cgroup applies the limits: no warning that they were not.
	if strings.Contains(string(out), "cgroup limits not applied") {
		t.Errorf("rootless str run in a delegated cgroup warns that the limits were not applied:\n%s", out)
	}
	fields := strings.Fields(string(out))
	want := []string{"65534", "65534", "65534", "1", "CapEff:", "0000000000000000", "NoNewPrivs:", "1", "Seccomp:", "2", "42"}
	if strings.Join(fields, " ") != strings.Join(want, " ") {
		t.Fatalf("rootless sandbox:\ngot  %q\nwant %q", fields, want)
	}
	// The caller (host uid 65534) is what 65534 inside maps to.
	if !strings.Contains(string(out), "65534      65534          1") {
		t.Fatalf("uid map: %s", out)
	}
}

// delegatedCgroupMoves makes a cgroup v1 subtree of each controller the
// launcher uses, owned by uid (named after the test, removed when it
// ends), and returns the shell commands that move a shell into them: a
// rootless str started from that shell runs its sandboxes below (nil: no
// v1 controllers here; a v2 host runs the rootless tests in the VM).
func delegatedCgroupMoves(t *testing.T, uid int) []string {
	t.Helper()
	deleg := fmt.Sprintf("str-%s-%d", strings.NewReplacer("/", "-", " ", "-").Replace(t.Name()), os.Getpid())
	var moves []string
	cgs, _ := procfs.Cgroups("self")
	for _, c := range []string{"memory", "pids", "cpu", "cpuacct", "freezer"} {
		own, ok := cgs[c]
		if !ok {
			continue
		}
		d := filepath.Join("/sys/fs/cgroup", c, own, deleg)
		if err := os.MkdirAll(d, 0o755); err != nil {
			mustwork.Skip(t, "cannot create a v1 cgroup to delegate: "+err.Error())
		}
		t.Cleanup(func() { os.Remove(d) })
		_ = filepath.Walk(d, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, uid, uid) })
		moves = append(moves, fmt.Sprintf("echo $$ > %s/cgroup.procs", d))
	}
	return moves
}

// strCopyIn copies the str under test into dir (mode 0755) and returns
// its path: a test that runs str as another uid needs a copy that uid may
// execute (the build's own directory may be closed to it).
func strCopyIn(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(strBin)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "str")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}
