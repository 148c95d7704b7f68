package statedir

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// A directory where a privileged str puts something others must not
// replace (the state directory, str serve's socket directory, the dev
// broker's token directory) must be owned by the process's euid and
// writable by no one else: anyone who may create or rename entries in it
// (group or others write, sticky or not) can swap a name str just made
// for a symlink and have str act on the symlink's target. These helpers
// check exactly that, on a descriptor or one stat.

// UnsafeDirError is a directory that is not owned by the expected uid,
// or that its group or others may write, or that is not a directory.
type UnsafeDirError struct {
	Dir   string // the directory as named
	Owner uint32 // its owner
	Mode  uint32 // its type and mode bits (st_mode)
	Want  int    // the uid that must own it
}

func (e *UnsafeDirError) Error() string {
	if e.Mode&unix.S_IFMT != unix.S_IFDIR {
		return fmt.Sprintf("%s is not a directory (file type %#o; a symlink is not followed): name the directory itself", e.Dir, e.Mode&unix.S_IFMT)
	}
	return fmt.Sprintf("directory %s is owned by uid %d with mode %04o: it must be owned by uid %d and writable by no one else (group or others could replace what str puts there)",
		e.Dir, e.Owner, e.Mode&0o7777, e.Want)
}

// checkOwned is the check: a directory, owned by uid, no group or other
// write bit.
func checkOwned(dir string, st *unix.Stat_t, uid int) error {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != uid || st.Mode&0o022 != 0 {
		return &UnsafeDirError{Dir: dir, Owner: st.Uid, Mode: st.Mode, Want: uid}
	}
	return nil
}

// OpenOwned opens dir as an O_PATH descriptor (its last component not
// followed if a symlink) and checks, on that descriptor, that it is a
// directory owned by uid that no one else may write. The caller then
// names everything in it relative to the descriptor (openat, mkdirat,
// renameat, unlinkat): a rename of dir or of a directory above it after
// the check changes nothing the caller acts on. An error is an
// *UnsafeDirError, or the open's or the fstat's, naming dir.
func OpenOwned(dir string, uid int) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		// Not a directory, or a symlink: say what it is.
		var st unix.Stat_t
		if errors.Is(err, unix.ENOTDIR) && unix.Lstat(dir, &st) == nil {
			return -1, &UnsafeDirError{Dir: dir, Owner: st.Uid, Mode: st.Mode, Want: uid}
		}
		return -1, &os.PathError{Op: "open directory", Path: dir, Err: err}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, &os.PathError{Op: "fstat directory", Path: dir, Err: err}
	}
	if err := checkOwned(dir, &st, uid); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// CheckOwned is OpenOwned's check by one lstat, for a directory whose
// entries are then named by path: it refuses a directory where others
// could swap those entries.
func CheckOwned(dir string, uid int) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	return checkOwned(dir, &st, uid)
}
