package initbin

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Root mode does not write the init into a fresh memfd in every str
// process (2.4 MB written and sealed per one-shot `str run`: ~10 % of its
// CPU, perf). It executes one copy kept in the state directory instead,
// through a read-only mount of its own, which keeps CVE-2019-5736 closed
// by two locks of which either suffices:
//
//  1. the copy is a root-owned file, mode 0555, in a root-owned directory
//     no one else may write: a sandbox's ids (its user namespace maps no
//     host root) are "other" to it, and "other" may not write it;
//  2. the init is executed from a detached clone of that file's mount
//     (open_tree OPEN_TREE_CLONE) made read-only (mount_setattr
//     MOUNT_ATTR_RDONLY): /proc/PID/exe names the file on that mount, so
//     an open for writing through it fails with EROFS whoever asks, root
//     included. No namespace holds the mount; only the launcher's
//     descriptor and the executing init reach it.
//
// The copy is trusted by its name, its owner and its mode: its name
// carries the SHA-256 of the embedded init (HashHex, from go generate),
// it is created complete or not at all (O_TMPFILE, written, fsynced,
// then linked under its name), and only root can have created or changed
// a root-owned file in a directory only root may write. Anything else
// under that name (another owner, a writable mode, another size) is
// refused, and the launcher falls back to the memfd; so it does when the
// kernel refuses to execute the copy (an LSM denying a file on a detached
// mount): launcher.retryWithMemfd.

// hashFile is "SHA256  str-init" of Binary, as sha256sum writes it
// (go generate, after the build: see initbin.go).
//
//go:embed str-init.sha256
var hashFile string

// HashHex is the SHA-256 of Binary, hex.
func HashHex() string { f := strings.Fields(hashFile); return f[0] }

// CachedName is the copy's file name in its directory.
func CachedName() string { return "str-init-" + HashHex()[:32] }

var (
	cachedOnce sync.Once
	cached     *os.File
	cachedErr  error
)

// Cached returns the init as an O_PATH descriptor of a read-only detached
// mount of its copy in dir (root only), installing the copy on first use.
// One per str process, shared by every sandbox: never close it. It is
// named by ownerMap's stopped child (launcher/binds.go).
func Cached(dir string) (*os.File, error) {
	cachedOnce.Do(func() { cached, cachedErr = openCached(dir) })
	return cached, cachedErr
}

func openCached(dir string) (*os.File, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("initbin: the cached init is for root mode only")
	}
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("initbin: open %s: %w", dir, err)
	}
	defer unix.Close(dfd)
	var st unix.Stat_t
	if err := unix.Fstat(dfd, &st); err != nil {
		return nil, fmt.Errorf("initbin: fstat %s: %w", dir, err)
	}
	if st.Uid != 0 || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("initbin: %s is owned by uid %d, mode %o: only a root-owned directory no one else may write holds the init", dir, st.Uid, st.Mode&0o7777)
	}
	name := CachedName()
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := install(dfd, dir, name); err != nil {
			return nil, err
		}
		fd, err = unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return nil, fmt.Errorf("initbin: open %s/%s: %w", dir, name, err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("initbin: fstat %s/%s: %w", dir, name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Mode&0o7022 != 0 || st.Size != int64(len(Binary)) {
		return nil, fmt.Errorf("initbin: %s/%s is not str's copy of its init (mode %o, uid %d, %d bytes; want a regular file of root, mode 0555, %d bytes)",
			dir, name, st.Mode, st.Uid, st.Size, len(Binary))
	}
	// Lock 2: a detached read-only mount of the file alone.
	tree, err := unix.OpenTree(fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	if err != nil {
		return nil, fmt.Errorf("initbin: open_tree %s/%s (OPEN_TREE_CLONE): %w", dir, name, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(tree)
		return nil, fmt.Errorf("initbin: mount_setattr %s/%s (MOUNT_ATTR_RDONLY|MOUNT_ATTR_NOSUID|MOUNT_ATTR_NODEV): %w", dir, name, err)
	}
	return os.NewFile(uintptr(tree), "str-init"), nil
}

// install writes the copy: an unnamed file (O_TMPFILE, mode 0555) written
// and fsynced, then linked under its name, so that the name never shows
// a partial copy. Another str process linking it first is fine: the
// content is the same (the name is its hash).
func install(dfd int, dir, name string) error {
	fd, err := unix.Openat(dfd, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o555)
	if err != nil {
		return fmt.Errorf("initbin: create the init's copy in %s (O_TMPFILE): %w", dir, err)
	}
	defer unix.Close(fd)
	for off := 0; off < len(Binary); {
		n, err := unix.Write(fd, Binary[off:])
		if err != nil {
			return fmt.Errorf("initbin: write the init's copy in %s: %w", dir, err)
		}
		off += n
	}
	// The mode again, without the umask's say (O_TMPFILE applied it).
	if err := unix.Fchmod(fd, 0o555); err != nil {
		return fmt.Errorf("initbin: chmod 0555 the init's copy in %s: %w", dir, err)
	}
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("initbin: fsync the init's copy in %s: %w", dir, err)
	}
	err = unix.Linkat(fd, "", dfd, name, unix.AT_EMPTY_PATH)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("initbin: link the init's copy as %s/%s: %w", dir, name, err)
	}
	return nil
}
