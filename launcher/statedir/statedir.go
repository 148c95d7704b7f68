// Package statedir names the directory where str keeps its run-time
// state: the locks of live sandbox cgroups (cgroups/), str serve's default socket
// and the dev broker's connection token. The str processes that share one
// (a worker, the str run and str doctor beside it) coordinate through its
// locks; another str of the host may have a directory of its own
// (STR_STATE_DIR): its sandbox cgroups carry its own name prefix and no
// str touches another directory's (launcher.cgroupSpace). Root-mode id
// leases are the host's, not a state directory's: RootDefault/ids for
// every root str (launcher.IDLeaseDir).
//
// It is a leaf package so that the dev broker's token file follows the
// same setting without importing the launcher.
package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/launcher/procfs"
)

// Env is the setting that overrides the default directory.
const Env = "STR_STATE_DIR"

// RootDefault is the directory when STR_STATE_DIR is unset and str runs as
// root. Under a read-only root file system (Kubernetes
// readOnlyRootFilesystem) it must be a writable volume, e.g. an emptyDir
// mounted there.
const RootDefault = "/run/str"

// Hint is the fix named by an error about the state directory dir.
func Hint(dir string) string {
	return fmt.Sprintf("make %s writable or set %s to a writable directory (Kubernetes, readOnlyRootFilesystem: an emptyDir mounted at %s); see str doctor",
		dir, Env, dir)
}

// HintFor is the fix named by err, an error about the state directory
// dir: for a directory others could change (*UnsafeDirError), making it
// the euid's alone; else Hint's.
func HintFor(dir string, err error) string {
	if ue := (*UnsafeDirError)(nil); errors.As(err, &ue) {
		return fmt.Sprintf("give %s to uid %d alone (chown, chmod go-w) or set %s to a directory only that uid may write; see str doctor", ue.Dir, ue.Want, Env)
	}
	return Hint(dir)
}

// Dir is the state directory:
//
//	STR_STATE_DIR set:            $STR_STATE_DIR (an absolute path, see Check)
//	root mode (procfs.RootMode):  /run/str
//	others, XDG_RUNTIME_DIR set:  $XDG_RUNTIME_DIR/str
//	others, otherwise:            $TMPDIR/str-UID (uid 0 of a one-id
//	                              user namespace: $TMPDIR/str-0)
func Dir(getenv func(string) string) string {
	if d := getenv(Env); d != "" {
		return filepath.Clean(d)
	}
	uid := os.Geteuid()
	switch {
	case procfs.RootMode():
		return RootDefault
	case getenv("XDG_RUNTIME_DIR") != "":
		return filepath.Join(getenv("XDG_RUNTIME_DIR"), "str")
	default:
		return filepath.Join(os.TempDir(), "str-"+strconv.Itoa(uid))
	}
}

// Check refuses a relative STR_STATE_DIR: the locks in it must mean the
// same directory to every str process, whatever its working directory.
func Check(getenv func(string) string) error {
	if d := getenv(Env); d != "" && !filepath.IsAbs(d) {
		return &Error{Dir: d, Err: errors.New("not an absolute path")}
	}
	return nil
}

// Error is a failure to create or use the state directory (or a
// subdirectory of it): it names the directory and the setting.
type Error struct {
	Dir string // the directory that could not be created or written
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("state directory %s (%s): %v", e.Dir, Env, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Sub creates the subdirectory name of dir (mode 0700, and dir itself if
// missing) and returns its path; an error is an *Error. dir must be owned
// by the euid and writable by no one else (Secure): str names the files
// in it by path (lock files, the init's copy), so anyone who could rename
// entries there could point root's creates at files of their choice.
func Sub(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o700); err != nil {
		return "", &Error{Dir: p, Err: err}
	}
	tightened, err := secure(dir)
	if err != nil {
		return "", &Error{Dir: dir, Err: err}
	}
	if tightened {
		// Others could write dir until now: p may be theirs.
		if err := CheckOwned(p, os.Geteuid()); err != nil {
			return "", &Error{Dir: p, Err: err}
		}
	}
	return p, nil
}

// Secure creates dir (0700) if missing and checks it as Sub does.
func Secure(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return &Error{Dir: dir, Err: err}
	}
	if _, err := secure(dir); err != nil {
		return &Error{Dir: dir, Err: err}
	}
	return nil
}

// secure is the state directory's check, one lstat when it passes:
//
//  1. a directory (not a symlink) owned by the euid, no group or other
//     write bit: used as it is;
//  2. owned by the euid, not sticky, but group or others may write it (as
//     the kubelet makes an emptyDir: 0777): its owner is this uid, so the
//     write bits are dropped (fchmod on the directory opened O_NOFOLLOW
//     and checked again there, never by path) and tightened is true;
//  3. anything else is refused (*UnsafeDirError): another uid's directory,
//     or a sticky shared one (/tmp-like: shared on purpose, never
//     changed).
func secure(dir string) (tightened bool, err error) {
	uid := os.Geteuid()
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, &os.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if checkOwned(dir, &st, uid) == nil {
		return false, nil
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != uid || st.Mode&unix.S_ISVTX != 0 {
		return false, &UnsafeDirError{Dir: dir, Owner: st.Uid, Mode: st.Mode, Want: uid}
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		return false, &os.PathError{Op: "fstat", Path: dir, Err: err}
	}
	if fst.Dev != st.Dev || fst.Ino != st.Ino || int(fst.Uid) != uid || fst.Mode&unix.S_ISVTX != 0 {
		return false, &UnsafeDirError{Dir: dir, Owner: fst.Uid, Mode: fst.Mode, Want: uid}
	}
	if err := unix.Fchmod(fd, fst.Mode&0o7777&^0o022); err != nil {
		return false, &os.PathError{Op: "chmod go-w", Path: dir, Err: err}
	}
	return true, nil
}
