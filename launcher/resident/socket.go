package resident

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/securetoolruntime/str/launcher/statedir"
	"golang.org/x/sys/unix"
)

// str serve's socket file (check 1 of server.go), made without one
// privileged operation by path. Root's chown and chmod of a socket it had
// just bound by name followed a symlink that a user who could write the
// socket's directory swapped in between: root gave any file that user
// chose mode 0666 (issue 29, item 2). Now, in seven parts (numbered as
// parts, not steps: the init's steps own that word):
//
//  1. the socket's directory is opened O_PATH|O_NOFOLLOW and checked on
//     that descriptor: root's, writable by no one else (statedir.OpenOwned);
//     anything else is refused, naming the directory, its owner and mode;
//  2. a file already at the name must be a socket nobody listens on (a
//     stale one, left to the rename of part 6 to replace), checked through
//     a descriptor of its own;
//  3. a private directory (0700, root's) is made in it, by mkdirat on the
//     checked descriptor;
//  4. the socket is bound inside the private directory through
//     /proc/self/fd/N (N: the private directory's descriptor);
//  5. its owner and mode are set relative to the private directory, where
//     no one but root can put or swap an entry, and it starts listening;
//  6. it is renamed into place (renameat, atomic: the name shows the
//     finished socket or the earlier file, never one being set up) and
//     the private directory removed;
//  7. at Close, the name is removed only if it is still this socket
//     (device and inode), relative to the checked descriptor.

// residentSocket is the published socket: its checked directory's
// descriptor, its name there, and its identity.
type residentSocket struct {
	path     string // as given, for messages
	dirfd    int
	name     string
	dev, ino uint64
}

// socketMode is check 1's owner and mode for opts: root:GROUP 0660 with
// --allow-group, 0666 with --allow-uid (SO_PEERCRED alone decides), else
// root 0600. The kernel's connect permission check uses the caller's real
// groups.
func socketMode(opts Options) (mode uint32, gid int) {
	switch {
	case len(opts.AllowUIDs) > 0:
		return 0o666, 0 // any local user reaches check 2; only the listed pass it
	case opts.AllowGID >= 0:
		return 0o660, opts.AllowGID
	}
	return 0o600, 0
}

// maxSocketPath is what sun_path holds with its NUL: a longer name could
// not be connected to.
const maxSocketPath = 107

// listenResident is check 1, parts 1-6 above.
func listenResident(opts Options) (ln *net.UnixListener, sock *residentSocket, err error) {
	path := opts.Socket
	fail := func(step string, err error) (*net.UnixListener, *residentSocket, error) {
		return nil, nil, fmt.Errorf("str serve: socket %s: %s: %w", path, step, err)
	}
	dir, name := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	if name == "" || name == "." || name == ".." {
		return fail("check the name", errors.New("not a file name"))
	}
	if len(path) > maxSocketPath {
		return fail("check the name", fmt.Errorf("%d bytes, a socket address holds %d", len(path), maxSocketPath))
	}

	// 1. The directory: root's, writable by no one else, held by an
	// O_PATH descriptor that every later step names things relative to.
	dirfd, err := statedir.OpenOwned(filepath.Clean(dir), 0)
	if err != nil {
		return fail("its directory", err)
	}
	sock = &residentSocket{path: path, dirfd: dirfd, name: name}
	defer func() {
		if err != nil {
			unix.Close(dirfd)
		}
	}()

	// 2. A file at the name: a stale socket is replaced by part 6; a
	// live one (another str serve) or anything else is refused.
	if err := checkStale(dirfd, name); err != nil {
		return fail("the file at its name", err)
	}

	// 3. The private directory. Its name is random only so that two
	// starts never meet; nobody but root can create entries here anyway.
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	priv := ".serve-setup-" + hex.EncodeToString(rnd[:])
	if err := unix.Mkdirat(dirfd, priv, 0o700); err != nil {
		return fail("mkdir "+priv, err)
	}
	defer unix.Unlinkat(dirfd, priv, unix.AT_REMOVEDIR) // empty once part 6 renamed the socket out (or part 4 failed)
	privfd, err := unix.Openat(dirfd, priv, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open "+priv, err)
	}
	defer unix.Close(privfd)

	// 4. Bind in the private directory. "s": the path through the
	// descriptor stays short whatever the socket's own name.
	const tmp = "s"
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fail("socket", err)
	}
	f := os.NewFile(uintptr(fd), path) // closes fd on every path below
	defer f.Close()
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(privfd) + "/" + tmp}); err != nil {
		return fail("bind in "+priv, err)
	}
	published := false
	defer func() {
		if !published {
			unix.Unlinkat(privfd, tmp, 0)
		}
	}()

	// 5. Owner and mode, relative to the private directory (no one else
	// can swap its entry, so fchmodat, which takes no NOFOLLOW flag on
	// older kernels, acts on the socket), then listen: connections queue
	// from the moment the name appears.
	mode, gid := socketMode(opts)
	if err := unix.Fchownat(privfd, tmp, 0, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail(fmt.Sprintf("chown root:%d", gid), err)
	}
	if err := unix.Fchmodat(privfd, tmp, mode, 0); err != nil {
		return fail(fmt.Sprintf("chmod %o", mode), err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		return fail("listen", err)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(privfd, tmp, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fail("stat", err)
	}
	sock.dev, sock.ino = st.Dev, st.Ino

	// 6. Publish: one rename, over a stale socket if part 2 found one.
	if err := unix.Renameat(privfd, tmp, dirfd, name); err != nil {
		return fail("rename into place", err)
	}
	published = true
	fl, err := net.FileListener(f) // a dup of fd; f's copy closes above
	if err != nil {
		sock.remove()
		return fail("listener", err)
	}
	ln = fl.(*net.UnixListener)
	// The listener's own name is /proc/self/fd/N/s: never unlinked by
	// path (FileListener's default; said again for the reader).
	ln.SetUnlinkOnClose(false)
	return ln, sock, nil
}

// checkStale is part 2: nothing at name, or a socket no one accepts on.
// The connect goes through the file's own O_PATH descriptor, so what is
// dialled is the inode that was checked.
func checkStale(dirfd int, name string) error {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return fmt.Errorf("exists and is not a socket (file type %#o)", st.Mode&unix.S_IFMT)
	}
	if c, err := net.Dial("unixpacket", "/proc/self/fd/"+strconv.Itoa(fd)); err == nil {
		c.Close()
		return errors.New("another str serve listens there")
	}
	return nil
}

// remove is part 7: the name goes only if it is still this socket.
func (s *residentSocket) remove() {
	var st unix.Stat_t
	if unix.Fstatat(s.dirfd, s.name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Dev == s.dev && st.Ino == s.ino {
		unix.Unlinkat(s.dirfd, s.name, 0)
	}
}

// close removes the socket (part 7) and lets its directory go.
func (s *residentSocket) close() {
	s.remove()
	unix.Close(s.dirfd)
}
