package nsinit

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// mkdirAll never follows a symlink: a link planted in the tree is refused.
func TestMkdirAllRefusesSymlinks(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	if fd, err := mkdirAll(rfd, "/evil/sub", 0o755); err == nil {
		unix.Close(fd)
		t.Fatal("mkdirAll followed a symlink")
	}
	if _, err := os.Stat(filepath.Join(outside, "sub")); err == nil {
		t.Fatal("a directory was created through the symlink")
	}
	fd, err := mkdirAll(rfd, "/a/b/c", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st, err := os.Stat(filepath.Join(root, "a/b/c")); err != nil || !st.IsDir() {
		t.Fatalf("a/b/c not created: %v", err)
	}
	if _, err := mkdirAll(rfd, "/a/../x", 0o755); err == nil {
		t.Fatal(".. accepted")
	}
}

func TestLimitedArgv(t *testing.T) {
	if _, err := os.Stat(prlimitPath); err != nil {
		t.Skip("no " + prlimitPath + " on this host")
	}
	cfg := &Config{Rlimits: []Rlimit{{Name: "RLIMIT_AS", Resource: unix.RLIMIT_AS, Value: 1 << 20}, {Name: "RLIMIT_CORE", Resource: unix.RLIMIT_CORE}}}
	argv, err := limitedArgv(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{prlimitPath, "--as=1048576:1048576", "--core=0:0"}
	if len(argv) != len(want) || argv[1] != want[1] || argv[2] != want[2] {
		t.Fatalf("argv %q want %q", argv, want)
	}
}

func TestStepErrorMessage(t *testing.T) {
	e := stepErr(5, "bind-mount", "/usr -> /newroot/usr", "MS_BIND|MS_REC", unix.EPERM)
	want := "nsinit: bind-mount /usr -> /newroot/usr (step 5, MS_BIND|MS_REC): operation not permitted"
	if e.Error() != want {
		t.Fatalf("%q\nwant %q", e.Error(), want)
	}
	e.Err = nil // as after the report pipe
	if e.Unwrap() != unix.EPERM {
		t.Fatalf("errno not recovered: %v", e.Unwrap())
	}
}
