package fscheck

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// tmpfs mounts a tmpfs with opts on a new directory for the test; it
// needs root (skips without, fails with STR_MUST_WORK=1).
func tmpfs(t *testing.T, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		msg := "needs root: the checks are made on a real tmpfs mounted by the test"
		if os.Getenv("STR_MUST_WORK") == "1" {
			t.Fatal(msg + " (STR_MUST_WORK=1)")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	if err := unix.Mount("str-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		t.Fatalf("mount tmpfs (%s) on %s: %v", opts, dir, err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

func TestWritable(t *testing.T) {
	// bytes: filled, then freed.
	dir := tmpfs(t, "size=256k")
	if err := Writable(dir, 4096); err != nil {
		t.Fatalf("an empty tmpfs: %v", err)
	}
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = f.Write(make([]byte, 64<<10))
	}
	f.Close()
	err = Writable(dir, 4096)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "0 bytes free of 262144") {
		t.Errorf("a full tmpfs: %v", err)
	}
	os.Remove(filepath.Join(dir, "filler"))
	if err := Writable(dir, 4096); err != nil {
		t.Errorf("freed: %v", err)
	}
	// inodes: a tmpfs with nr_inodes, filled; one without an inode
	// count is not short of inodes.
	dir = tmpfs(t, "size=1m,nr_inodes=16")
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			break
		}
		f.Close()
	}
	if err := Writable(dir, 4096); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "no inode free of 16") {
		t.Errorf("no inode left: %v", err)
	}
	if err := Writable(tmpfs(t, "size=1m,nr_inodes=0"), 4096); err != nil {
		t.Errorf("a tmpfs without an inode count: %v", err)
	}
	// read-only.
	dir = tmpfs(t, "size=1m")
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	if err := Writable(dir, 4096); !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), dir) {
		t.Errorf("read-only: %v", err)
	}
	// missing.
	if err := Writable(filepath.Join(dir, "nope"), 0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("missing: %v", err)
	}
}
