package workdir

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// TestWorkDirRemoveChecksIdentity: remove refuses a path that is no
// longer the directory made (replaced meanwhile), and names are
// generated, fresh and marked; the sweep takes only those.
func TestWorkDirRemoveChecksIdentity(t *testing.T) {
	base := t.TempDir()
	spec := Spec{Base: base, Prefix: "call-"}
	a, err := Make(spec, nil, -1, -1)
	must(t, err)
	b, err := Make(spec, nil, -1, -1)
	must(t, err)
	prefixes := []string{"call-"}
	if a.Path == b.Path || !generatedName(filepath.Base(a.Path), prefixes) {
		t.Fatalf("names %s %s", a.Path, b.Path)
	}
	if why := staleProblem(a.Path, prefixes); why != "" {
		t.Fatalf("a fresh work dir is not sweepable: %s", why)
	}
	if why := staleProblem(a.Path, []string{"other-"}); why == "" {
		t.Fatal("a work dir of another prefix is sweepable")
	}
	// a replaced by another directory: left alone.
	must(t, os.Rename(a.Path, a.Path+".moved"))
	must(t, os.Mkdir(a.Path, 0o700))
	if err := a.Remove(); err == nil || !strings.Contains(err.Error(), "not the work dir the launcher made") {
		t.Fatalf("remove of a replaced dir: %v", err)
	}
	if _, err := os.Stat(a.Path); err != nil {
		t.Fatalf("the replacement was removed: %v", err)
	}
	must(t, b.Remove())
	if _, err := os.Lstat(b.Path); !os.IsNotExist(err) {
		t.Fatalf("b left: %v", err)
	}
	// A marker copied into a dir of another name does not make it sweepable.
	c := filepath.Join(base, "call-00000000000000aa")
	must(t, os.Mkdir(c, 0o700))
	m, _ := os.ReadFile(filepath.Join(a.Path+".moved", Marker))
	must(t, os.WriteFile(filepath.Join(c, Marker), m, 0o444))
	if why := staleProblem(c, prefixes); why == "" {
		t.Fatal("a copied marker made another dir sweepable")
	}
	// Prefixes that could leave the base are refused.
	for _, p := range []string{"", "call", "../x-", "a/b-", "CALL-"} {
		if _, err := Make(Spec{Base: base, Prefix: p}, nil, -1, -1); !errors.Is(err, launcher.ErrInvalidRequest) {
			t.Errorf("prefix %q: %v", p, err)
		}
	}
}

// TestWorkDirLayout: the layout every provider's work dir has, with the
// runner's files in their own directory, modes set whatever the umask.
func TestWorkDirLayout(t *testing.T) {
	w, err := Make(Spec{Base: t.TempDir(), Prefix: "call-"}, nil, -1, -1)
	must(t, err)
	defer w.Remove()
	for p, want := range map[string]os.FileMode{w.Path: modeWorkDir, w.Input: modeInputDir, w.Output: modeOutputDir,
		w.Runner: modeRunnerDir, w.StatusPipe: modeFIFO | os.ModeNamedPipe, filepath.Join(w.Path, Marker): modeMarker} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() &^ os.ModeDir; got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
	}
	if w.Args != filepath.Join(w.Path, RunnerDirName, RunnerArgsName) || w.Result != filepath.Join(w.Runner, RunnerResultName) {
		t.Errorf("runner files %s %s", w.Args, w.Result)
	}
}

// TestWorkDirTmpfs makes a capped work dir as root mode does (L9), fills
// it, sweeps and removes it, in a child process with a mount namespace
// of its own (nothing is mounted in the test process or on the host).
func TestWorkDirTmpfs(t *testing.T) {
	if os.Getenv("STR_TEST_TMPFS_CHILD") == "1" {
		tmpfsChild(t)
		return
	}
	if os.Geteuid() != 0 {
		msg := "mounting a tmpfs needs root (CAP_SYS_ADMIN)"
		mustwork.Skip(t, msg)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkDirTmpfs$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "STR_TEST_TMPFS_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestWorkDirTmpfs") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func tmpfsChild(t *testing.T) {
	// The child's mount namespace must not propagate anything back.
	must(t, unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""))
	base := t.TempDir()
	const owner = 4242
	w, err := Make(Spec{Base: base, Prefix: "call-"}, &profiles.WorkDir{Size: 1 << 20, Inodes: 64}, owner, owner+1)
	must(t, err)
	dir := w.Path
	// Owners: the dir, output/, the runner dir and the FIFO are the
	// tool's; input/ and the marker the caller's.
	for p, want := range map[string]uint32{dir: owner, w.Output: owner, w.Runner: owner, w.StatusPipe: owner,
		w.Input: uint32(os.Geteuid()), filepath.Join(dir, Marker): uint32(os.Geteuid())} {
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		if st.Uid != want {
			t.Errorf("%s owned by %d, want %d", p, st.Uid, want)
		}
	}
	// Bytes: the cap is ENOSPC.
	err = os.WriteFile(filepath.Join(dir, "big"), make([]byte, 2<<20), 0o600)
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing past the size cap: %v", err)
	}
	// The work dir full, the runner's files still have their room (issue
	// 18: a tool filling its work dir could not return its result).
	must(t, os.WriteFile(w.Result, make([]byte, 512<<10), 0o644))
	must(t, os.Remove(filepath.Join(dir, "big")))
	// Inodes: the cap is ENOSPC too.
	var ierr error
	for i := 0; i < 100 && ierr == nil; i++ {
		ierr = os.WriteFile(filepath.Join(dir, "f"+strconv.Itoa(i)), nil, 0o600)
	}
	if !errors.Is(ierr, syscall.ENOSPC) {
		t.Fatalf("creating past the inode cap: %v", ierr)
	}
	// The start-up sweep finds and detaches both mounts (a SIGKILLed
	// worker's); the marker underneath is visible again, and the dir is
	// removed.
	other := filepath.Join(t.TempDir(), "x")
	must(t, os.Mkdir(other, 0o700))
	must(t, unix.Mount(Source, other, "tmpfs", 0, "size=4k")) // not under the base: left alone
	sw, err := SweepStale(base, "call-")
	must(t, err)
	if len(sw.Unmounted) != 2 || sw.Unmounted[0] != w.Runner || sw.Unmounted[1] != dir {
		t.Fatalf("swept %q, want the runner dir's then the work dir's", sw.Unmounted)
	}
	if len(sw.Removed) != 1 || sw.Removed[0] != dir {
		t.Fatalf("removed %q", sw.Removed)
	}
	if sw, _ := SweepStale(filepath.Dir(other), "call-"); len(sw.Unmounted) != 0 {
		t.Fatalf("an operator's tmpfs was swept: %q", sw.Unmounted)
	}
	unix.Unmount(other, 0)
	// remove unmounts before removing.
	w, err = Make(Spec{Base: base, Prefix: "call-"}, &profiles.WorkDir{Size: 1 << 20, Inodes: 64}, owner, owner)
	must(t, err)
	must(t, w.Remove())
	if _, err := os.Lstat(w.Path); !os.IsNotExist(err) {
		t.Fatalf("work dir left: %v", err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), " "+w.Path) {
		t.Fatalf("a work dir tmpfs is still mounted:\n%s", mi)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
