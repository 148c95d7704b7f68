package integration

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// machineBwrap is the machine's bubblewrap, which the side-by-side tests
// compare str bwrap with (skipped without it, failed under
// STR_MUST_WORK=1).
func machineBwrap(t *testing.T) string {
	t.Helper()
	const bubblewrap = "/usr/bin/bwrap"
	if _, err := os.Stat(bubblewrap); err != nil {
		mustwork.Skip(t, "needs the machine's bubblewrap (apt-get install bubblewrap) to compare with")
	}
	return bubblewrap
}

// runIn runs prog with args in dir and returns its stdout (failing the
// test on a non-zero exit).
func runIn(t *testing.T, dir, prog string, args ...string) string {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %q: %v\nstdout: %s\nstderr: %s", prog, args, err, out.String(), errb.String())
	}
	return out.String()
}

// As root, str bwrap's command is root of its own user namespace (a
// leased host uid), and every bind shows host root's files as its own
// (id-mapped): run from bubblewrap's kind of working directory, root's
// 0700 `mktemp -d`, with `--bind / /`, it stays there, lists it, reads
// root's 0600 file, writes a file that is root's on the host, and reads
// a file of another uid by its "other" bits only, as under bubblewrap.
// The one difference: that uid reads as the overflow id inside.
func TestBwrapRootFilesAreRoots(t *testing.T) {
	needRoot(t)
	bubblewrap := machineBwrap(t)
	dir, err := os.MkdirTemp("/var/tmp", "str-bwrap-root-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	files := []struct {
		name string
		mode os.FileMode
		uid  int
	}{{"secret", 0o600, 0}, {"others-closed", 0o640, 1000}, {"others-open", 0o644, 1000}}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, []byte(f.name+"\n"), f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, f.uid, f.uid); err != nil {
			t.Fatal(err)
		}
	}
	const script = `pwd; ls; id -u; cat secret others-open
cat others-closed 2>/dev/null || echo others-closed: closed
echo others >> others-open 2>/dev/null || echo others-open: read-only
echo new > created && echo created
echo "ids: $(stat -c %u:%g secret others-open | tr '\n' ' ')"`
	run := func(prog string, args ...string) (shown, ids string, created unix.Stat_t) {
		t.Helper()
		os.Remove(filepath.Join(dir, "created"))
		out := runIn(t, dir, prog, append(args, "--bind", "/", "/", "sh", "-c", script)...)
		shown, ids, _ = strings.Cut(out, "ids: ")
		if err := unix.Stat(filepath.Join(dir, "created"), &created); err != nil {
			t.Fatalf("%s: the file it wrote: %v\n%s", prog, err, out)
		}
		return shown, strings.TrimSpace(ids), created
	}
	want, wantIDs, bc := run(bubblewrap)
	got, gotIDs, sc := run(strBin, "bwrap")
	if got != want {
		t.Errorf("str bwrap shows\n%s\nbubblewrap shows\n%s", got, want)
	}
	for _, s := range []string{dir + "\n", "\nothers-closed\nothers-open\nsecret\n", "0\nsecret\nothers-open\n", "others-closed: closed", "others-open: read-only", "\ncreated\n"} {
		if !strings.Contains(got, s) {
			t.Errorf("both show\n%s\nwithout %q", got, s)
		}
	}
	if wantIDs != "0:0 1000:1000" || gotIDs != "0:0 65534:65534" {
		t.Errorf("owners seen: bubblewrap %q, str bwrap %q; want 0:0 1000:1000 and 0:0 65534:65534 (another uid is the overflow id inside)", wantIDs, gotIDs)
	}
	if sc.Uid != 0 || sc.Gid != 0 || bc.Uid != 0 || bc.Gid != 0 {
		t.Errorf("the file written is %d:%d on the host (bubblewrap's %d:%d), want root's", sc.Uid, sc.Gid, bc.Uid, bc.Gid)
	}
}

// capLines are a command's capability sets as /proc/self/status shows
// them.
const capLines = `grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status`

// --cap-add (and ALL, and --cap-drop after it) keeps those capabilities
// in every set of the command, in its own user namespace: as bubblewrap's
// in the inheritable, permitted, effective and ambient sets; the
// bounding set is the kept ones too (bubblewrap run by root leaves the
// caller's: docs/bwrap.md). A line without --cap-add keeps every set
// empty (bubblewrap run by root leaves root's own: a difference, str
// never gives host root).
func TestBwrapCapAdd(t *testing.T) {
	needRoot(t)
	bubblewrap := machineBwrap(t)
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		t.Fatal(err)
	}
	last, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc", "--unshare-pid"}
	sets := func(out string) map[string]string {
		m := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			k, v, _ := strings.Cut(l, ":")
			m[k] = strings.TrimSpace(v)
		}
		return m
	}
	run := func(prog string, args ...string) map[string]string {
		return sets(runIn(t, "/", prog, append(append(append([]string(nil), args...), base...), "sh", "-c", capLines)...))
	}
	line := []string{"--cap-drop", "ALL", "--cap-add", "CAP_NET_ADMIN"}
	want, got := run(bubblewrap, line...), run(strBin, append([]string{"bwrap"}, line...)...)
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		if got[set] != want[set] || got[set] != "0000000000001000" {
			t.Errorf("%q: %s %s, bubblewrap's %s; want CAP_NET_ADMIN (1000) in both", line, set, got[set], want[set])
		}
	}
	if got["CapBnd"] != "0000000000001000" {
		t.Errorf("%q: CapBnd %s, want CAP_NET_ADMIN alone", line, got["CapBnd"])
	}
	all := fmt.Sprintf("%016x", (uint64(1)<<(last+1)-1)&^(1<<21))
	got = run(strBin, "bwrap", "--cap-add", "ALL", "--cap-drop", "CAP_SYS_ADMIN")
	for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if got[set] != all {
			t.Errorf("--cap-add ALL --cap-drop CAP_SYS_ADMIN: %s %s, want %s", set, got[set], all)
		}
	}
	for set, v := range run(strBin, "bwrap") {
		if v != "0000000000000000" {
			t.Errorf("a line without --cap-add (standard: root_capabilities deny): %s %s, want every set empty", set, v)
		}
	}
	// Under a profile with root_capabilities: allow (nesting), a root
	// caller's line keeps root's own capabilities (over its own user
	// namespace), as bubblewrap run by root does: the five sets equal
	// bubblewrap's without --cap-add/--cap-drop (effective and permitted
	// only) and with --cap-drop (then inheritable and ambient too; the
	// bounding set is the kept ones, bubblewrap leaves root's: the
	// difference docs/bwrap.md lists for --cap-add).
	for _, line := range [][]string{nil, {"--cap-drop", "CAP_KILL"}} {
		want, got := run(bubblewrap, line...), run(strBin, append([]string{"bwrap", "--str-profile", "nesting"}, line...)...)
		for _, set := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
			if set == "CapBnd" && line != nil {
				continue
			}
			if got[set] != want[set] || got[set] == "" {
				t.Errorf("nesting, %q: %s %s, bubblewrap's %s", line, set, got[set], want[set])
			}
		}
		if got["CapEff"] == "0000000000000000" {
			t.Errorf("nesting, %q: no capability kept: %v", line, got)
		}
	}
}

// Run by another user (uid 1000, in a v1 cgroup subtree delegated to
// it), --cap-add and --cap-drop give exactly bubblewrap's five sets, and
// a line without --cap-add every set empty, as bubblewrap's.
func TestBwrapCapAddRootless(t *testing.T) {
	needRoot(t) // to delegate the unprivileged user's cgroup
	bubblewrap := machineBwrap(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	dir := t.TempDir()
	_ = os.Chmod(dir, 0o755)
	bin := strCopyIn(t, dir) // a copy others may execute
	const uid = 1000
	moves := delegatedCgroupMoves(t, uid)
	if len(moves) == 0 {
		mustwork.Skip(t, "no cgroup v1 controllers on this host (a v2 host runs the rootless tests in the VM)")
	}
	const line = `--ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc --unshare-pid`
	for _, caps := range []string{"--cap-add CAP_NET_ADMIN", "--cap-add ALL --cap-drop CAP_SYS_ADMIN", ""} {
		outs := map[string]string{}
		for who, prog := range map[string]string{"bubblewrap": bubblewrap, "str bwrap": bin + " bwrap"} {
			script := strings.Join(moves, " && ") + fmt.Sprintf(" && cd / && exec setpriv --reuid %d --regid %d --clear-groups %s %s %s sh -c %q",
				uid, uid, prog, caps, line, capLines)
			out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput()
			if err != nil {
				t.Fatalf("%s %s: %v\n%s", who, caps, err, out)
			}
			outs[who] = string(out)
		}
		if outs["str bwrap"] != outs["bubblewrap"] {
			t.Errorf("rootless %q: str bwrap shows\n%s\nbubblewrap shows\n%s", caps, outs["str bwrap"], outs["bubblewrap"])
		}
		if caps == "" && strings.Contains(outs["str bwrap"], "1") {
			t.Errorf("rootless, no --cap-add: %s, want every set empty", outs["str bwrap"])
		}
	}
}
