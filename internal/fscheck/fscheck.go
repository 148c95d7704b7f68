// Package fscheck says, without writing anything, whether a directory's
// filesystem can take a write now: the worker's readiness checks of the
// work base, the artifact store and its audit log (a check that wrote a
// probe file would show, for an instant, in directories that agents and
// operators list).
//
// It protects against nothing; it reads access(2) and statfs(2) only, so
// it trusts the filesystem to report its free space and inodes (network
// filesystems may not) and sees only what those report: a quota
// (EDQUOT) or an I/O error shows when a write fails, not here.
package fscheck

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Writable returns nil when dir can be written by this process and its
// filesystem has at least minFree bytes and one inode free; else an
// error naming dir and what was seen, wrapping the errno a write would
// get: EROFS or EACCES (from access(2)), ENOSPC (no bytes, or no inodes,
// free). A filesystem that reports no inode count (f_files 0: tmpfs
// without nr_inodes, btrfs) is not short of inodes. Root may use the
// blocks reserved for it, so for root the free bytes are f_bfree, for
// others f_bavail.
func Writable(dir string, minFree uint64) error {
	// 1. permission and read-only, as a write would see them.
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return &os.PathError{Op: "access for writing", Path: dir, Err: err}
	}
	// 2. space and inodes.
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return &os.PathError{Op: "statfs", Path: dir, Err: err}
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		return &os.PathError{Op: "statfs", Path: dir, Err: syscall.EROFS}
	}
	bsize := uint64(st.Bsize)
	if st.Frsize > 0 {
		bsize = uint64(st.Frsize)
	}
	freeBlocks := st.Bavail
	if os.Geteuid() == 0 {
		freeBlocks = st.Bfree
	}
	if free := freeBlocks * bsize; free < minFree {
		return fmt.Errorf("%s: %w (%d bytes free of %d, at least %d needed)", dir, syscall.ENOSPC, free, st.Blocks*bsize, minFree)
	}
	if st.Files > 0 && st.Ffree == 0 {
		return fmt.Errorf("%s: %w (no inode free of %d)", dir, syscall.ENOSPC, st.Files)
	}
	return nil
}
