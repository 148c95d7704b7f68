package fscheck

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/testfs"
)

func TestWritable(t *testing.T) {
	// bytes: filled, then freed.
	dir := testfs.Tmpfs(t, "", "size=256k")
	if err := Writable(dir, 4096); err != nil {
		t.Fatalf("an empty tmpfs: %v", err)
	}
	testfs.FillBytes(t, filepath.Join(dir, "filler"))
	err := Writable(dir, 4096)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "0 bytes free of 262144") {
		t.Errorf("a full tmpfs: %v", err)
	}
	os.Remove(filepath.Join(dir, "filler"))
	if err := Writable(dir, 4096); err != nil {
		t.Errorf("freed: %v", err)
	}
	// inodes: a tmpfs with nr_inodes, filled; one without an inode
	// count is not short of inodes.
	dir = testfs.Tmpfs(t, "", "size=1m,nr_inodes=16")
	testfs.FillInodes(t, dir)
	if err := Writable(dir, 4096); !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "no inode free of 16") {
		t.Errorf("no inode left: %v", err)
	}
	if err := Writable(testfs.Tmpfs(t, "", "size=1m,nr_inodes=0"), 4096); err != nil {
		t.Errorf("a tmpfs without an inode count: %v", err)
	}
	// read-only.
	dir = testfs.Tmpfs(t, "", "size=1m")
	testfs.Remount(t, dir, true)
	if err := Writable(dir, 4096); !errors.Is(err, syscall.EROFS) || !strings.Contains(err.Error(), dir) {
		t.Errorf("read-only: %v", err)
	}
	// missing.
	if err := Writable(filepath.Join(dir, "nope"), 0); !errors.Is(err, syscall.ENOENT) {
		t.Errorf("missing: %v", err)
	}
}
