// Package testfs gives tests real, small filesystems to break: a tmpfs
// mounted for the test, filled to ENOSPC by bytes or by inodes, and
// remounted read-only or read-write. The fault tests of the readiness
// checks (internal/fscheck), the artifact store, the worker and the e2e
// suite all use it, so a "full" or "read-only" filesystem means the same
// thing in each.
//
// It protects against nothing; it is test support. Mounting needs root:
// Tmpfs skips the test without it, and fails it with STR_MUST_WORK=1.
package testfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs with the mount options opts (e.g. "size=64k",
// "nr_inodes=16") on dir, made if missing, or on a new temporary
// directory when dir is "", and returns the mount point. The tmpfs is
// unmounted when the test ends; cleanups run last-registered first, so a
// process the test starts after Tmpfs is stopped before the unmount.
func Tmpfs(t testing.TB, dir, opts string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		msg := fmt.Sprintf("needs root: mounting a tmpfs (%s) to fill or remount", opts)
		mustwork.Skip(t, msg)
	}
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("str-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		t.Fatalf("mount tmpfs (%s) on %s: %v", opts, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Remount remounts the filesystem at dir read-only (readOnly) or
// read-write, keeping nosuid and nodev.
func Remount(t testing.TB, dir string, readOnly bool) {
	t.Helper()
	var flags uintptr = unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount("", dir, "", flags, ""); err != nil {
		t.Fatalf("remount %s (read-only %v): %v", dir, readOnly, err)
	}
}

// FillBytes creates path and writes it until its filesystem refuses with
// ENOSPC; any other error fails the test.
func FillBytes(t testing.TB, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling %s: %v", path, err)
			}
			return
		}
	}
}

// FillInodes creates empty files in dir (made if missing) until the
// filesystem has no inode left (ENOSPC); any other error fails the test.
func FillInodes(t testing.TB, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprint(i)))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the inodes of %s: %v", dir, err)
			}
			return
		}
		f.Close()
	}
}

// Names lists the entry names of dir, sorted; nil when dir is empty or
// cannot be read (a test asserting "nothing left" wants both as empty).
func Names(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
