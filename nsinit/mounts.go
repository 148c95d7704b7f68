package nsinit

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

const hintSearch = "rootless, the init clones a bind source as the caller's own host uid: the caller must be able to reach it " +
	"(search permission on every directory above it)"
const hintUserns = "user namespaces or mount namespaces unavailable? see str doctor"
const hintProc = "a fresh /proc cannot be mounted here, usually because the container runtime masks /proc " +
	"(docker: --security-opt systempaths=unconfined; Kubernetes: procMount: Unmasked); " +
	"or set best_effort: true in the profile to run without /proc"
const hintWorkdir = "the work dir itself must be searchable (and, to write in it, writable) by the tool's uid inside; " +
	"the directories above it on the host need nothing"

func (e *StepError) hint(h string) *StepError { e.Hint = h; return e }

// ErrSymlinkSource is the cause when a NoFollow source is a symlink.
var ErrSymlinkSource = errors.New("the source is a symlink (refused: it must be the directory itself)")

// errSymlinkOnPath: a path the init must not follow a symlink on has one.
var errSymlinkOnPath = errors.New("a symlink (refused: no symlink is followed here)")

// CloneSource clones the bind source of m as a detached, private mount
// tree and returns its descriptor (close-on-exec). It is the one sequence
// for both sides: the launcher runs it on the host for a root-mode plan
// (launcher step L3), the init in its own mount namespace when rootless
// (step 3). On failure detail names the call that failed, for the
// caller's StepError; an optional source that does not exist fails with
// ENOENT like any other, the caller skips it.
//
//  1. open the source O_PATH, with O_NOFOLLOW when m.NoFollow, and refuse
//     a symlink there: the tree is cloned from that descriptor, so the
//     path is resolved exactly once;
//  2. open_tree(OPEN_TREE_CLONE|AT_RECURSIVE) on the descriptor: a copy of
//     the mount and everything mounted below it, attached nowhere;
//  3. make the copy private, recursively: a clone of a shared host mount
//     is a peer of it, so without this a mount made in the sandbox under
//     the bind would appear on the host, and host mounts inside the
//     sandbox. Read-only and the other attributes are set by the init's
//     step 5 for every tree alike.
func CloneSource(m Mount) (tree int, detail string, err error) {
	// 1. one resolution of the path.
	flags := unix.O_PATH | unix.O_CLOEXEC
	detail = "open O_PATH"
	if m.NoFollow {
		flags |= unix.O_NOFOLLOW
		detail = "open O_PATH|O_NOFOLLOW"
	}
	src, err := unix.Open(m.Source, flags, 0)
	if err != nil {
		return -1, detail, err
	}
	defer unix.Close(src)
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return -1, "fstat", err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return -1, detail, ErrSymlinkSource
	}
	// 2. the detached copy.
	const cloneFlags = unix.OPEN_TREE_CLONE | unix.OPEN_TREE_CLOEXEC | unix.AT_RECURSIVE | unix.AT_EMPTY_PATH
	tree, err = unix.OpenTree(src, "", cloneFlags)
	if err != nil {
		return -1, "open_tree OPEN_TREE_CLONE|AT_RECURSIVE", err
	}
	// 3. private, so no mount event crosses between host and sandbox.
	attr := unix.MountAttr{Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(tree)
		return -1, "mount_setattr MS_PRIVATE AT_RECURSIVE", err
	}
	return tree, "", nil
}

// absentSource is step 3's check of a bind source the launcher found missing:
// only an optional one may be.
func absentSource(m Mount) error {
	if m.Optional {
		return nil
	}
	return stepErr(StepCloneSources, "take bind source", m.Source, "tree_fd -1", errors.New("the launcher skipped a source that is not optional"))
}

// takeSources (step 3) returns, for each mount, the descriptor of its
// detached source tree, or -1 for a mount with no source (or an optional
// one that is absent). A TreeFD from the plan is the launcher's clone,
// inherited at that number; it must lie in the trees' part of the layout.
// Without one, the init clones the source itself (rootless), while every
// host path is still reachable.
func takeSources(mounts []Mount, fds fdLayout) ([]int, error) {
	out := make([]int, len(mounts))
	for i, m := range mounts {
		out[i] = -1
		if m.Kind != MountBind && m.Kind != MountDevNode {
			continue
		}
		switch {
		case m.TreeFD == SourceAbsent:
			if err := absentSource(m); err != nil {
				return nil, err
			}
		case m.TreeFD > 0:
			if last := fds.trees + MaxBindSources - 1; m.TreeFD < fds.trees || m.TreeFD > last {
				return nil, stepErr(StepCloneSources, "take bind source", m.Source, fmt.Sprintf("tree_fd %d", m.TreeFD),
					fmt.Errorf("not a mount tree descriptor (trees are fds %d..%d)", fds.trees, last))
			}
			out[i] = m.TreeFD
		default:
			fd, detail, err := CloneSource(m)
			if err != nil {
				if m.Optional && errors.Is(err, unix.ENOENT) {
					continue
				}
				se := stepErr(StepCloneSources, "clone bind source", m.Source, detail, err)
				if errors.Is(err, unix.EACCES) {
					se = se.hint(hintSearch)
				}
				return nil, se
			}
			out[i] = fd
		}
	}
	return out, nil
}

// doMount performs one planned mount (step 5) under the new root, whose fd
// is root. Targets are created inside our own fresh tmpfs with a walk that
// never follows a symlink, so no path we create can redirect a mount.
func doMount(rep *reporter, cfg *Config, root int, m Mount, tree int) error {
	const step = StepMounts
	if !filepath.IsAbs(m.Target) || filepath.Clean(m.Target) != m.Target {
		return stepErr(step, "check target", m.Target, "", errors.New("target must be absolute and clean"))
	}
	parent, name := filepath.Split(m.Target)
	switch m.Kind {
	case MountDir:
		dfd, err := mkdirAll(root, m.Target, m.Mode)
		if err != nil {
			return stepErr(step, "mkdir", m.Target, "", err)
		}
		return unix.Close(dfd)

	case MountSymlink:
		dfd, err := mkdirAll(root, parent, 0o755)
		if err != nil {
			return stepErr(step, "mkdir", parent, "", err)
		}
		defer unix.Close(dfd)
		if err := unix.Symlinkat(m.Source, dfd, name); err != nil {
			return stepErr(step, "symlink", m.Target, "-> "+m.Source, err)
		}
		return nil

	case MountFile:
		dfd, err := mkdirAll(root, parent, 0o755)
		if err != nil {
			return stepErr(step, "mkdir", parent, "", err)
		}
		defer unix.Close(dfd)
		mode := m.Mode
		if mode == 0 {
			mode = 0o644
		}
		// O_EXCL|O_NOFOLLOW: the file must be new; nothing is overwritten.
		fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		if err != nil {
			return stepErr(step, "create file", m.Target, "O_CREAT|O_EXCL", err)
		}
		// The planned mode exactly: the umask (022) applied at create.
		err = unix.Fchmod(fd, mode)
		if err == nil && cfg.RootToCommand {
			// The command's, as bubblewrap's data files; now, because a
			// read-only one is bound onto itself below and step 7's
			// handover does not reach through that bind.
			err = unix.Fchown(fd, int(cfg.UID), int(cfg.GID))
		}
		f := os.NewFile(uintptr(fd), m.Target)
		if err == nil {
			_, err = f.WriteString(m.Contents)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return stepErr(step, "write file", m.Target, fmt.Sprintf("mode %#o", mode), err)
		}
		if m.ReadOnly {
			// Read-only: the file bound onto itself with MOUNT_ATTR_RDONLY
			// (the tool may be root of the user namespace and own it).
			if err := bindSelfReadOnly(dfd, name); err != nil {
				return stepErr(step, "bind read-only", m.Target, "open_tree|mount_setattr MOUNT_ATTR_RDONLY|move_mount", err)
			}
		}
		return nil

	case MountRemountRO:
		fd, err := openNoFollow(root, m.Target)
		if err != nil {
			return stepErr(step, "open", m.Target, "O_PATH|O_NOFOLLOW", err)
		}
		defer unix.Close(fd)
		// The mount the path is on, by its descriptor; nosuid and nodev
		// stay (they are set with it: mount_setattr only adds).
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
			return stepErr(step, "remount read-only", m.Target, "mount_setattr MOUNT_ATTR_RDONLY", err)
		}
		return nil

	case MountChmod:
		fd, err := openNoFollow(root, m.Target)
		if err != nil {
			return stepErr(step, "open", m.Target, "O_PATH|O_NOFOLLOW", err)
		}
		defer unix.Close(fd)
		// chmod through the descriptor: the path is resolved once, with no
		// symlink on the way (an O_PATH descriptor has no fchmod).
		if err := unix.Chmod(fdPath(fd), m.Mode); err != nil {
			return stepErr(step, "chmod", m.Target, fmt.Sprintf("%#o", m.Mode), err)
		}
		return nil

	case MountBind, MountDevNode:
		if tree < 0 {
			return nil // optional and absent on the host
		}
		defer unix.Close(tree)
		target, err := mountpoint(root, m.Target, isDirFd(tree))
		if err != nil {
			return stepErr(step, "create mount point", m.Target, "", err)
		}
		defer unix.Close(target)
		// Recursive attributes on the detached tree before it is attached:
		// there is never a moment where the bind is visible writable.
		// Device nodes keep dev (they are devices) but get noexec.
		attr, what := bindAttr(m)
		if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
			return stepErr(step, "mount_setattr", m.Source, what+" AT_RECURSIVE", err)
		}
		// Attach. A launcher's tree was cloned in the host's mount
		// namespace and lives in an anonymous one of its own until now:
		// move_mount attaches a detached tree into whichever namespace the
		// caller may mount in (CAP_SYS_ADMIN over our user namespace), so
		// no host privilege is needed here. Unlike a tree cloned from our
		// inherited copy of the host's mounts, it carries no MNT_LOCKED
		// flags: a capability in our user namespace could unmount its
		// submounts or clear its read-only flag. The init does neither,
		// and the tool has no capability (steps 13-16) and no mount
		// syscalls (seccomp).
		if err := unix.MoveMount(tree, "", target, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
			return stepErr(step, "bind-mount", m.Source+" -> "+m.Target, "move_mount", err)
		}
		return nil

	case MountTmpfs:
		target, err := mountpoint(root, m.Target, true)
		if err != nil {
			return stepErr(step, "create mount point", m.Target, "", err)
		}
		defer unix.Close(target)
		flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
		if m.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("tmpfs", fdPath(target), "tmpfs", flags, m.Data); err != nil {
			return stepErr(step, "mount tmpfs", m.Target, m.Data, err)
		}
		return nil

	case MountDevpts:
		target, err := mountpoint(root, m.Target, true)
		if err != nil {
			return stepErr(step, "create mount point", m.Target, "", err)
		}
		defer unix.Close(target)
		// A private instance: the tool's ptys are not the host's.
		if err := unix.Mount("devpts", fdPath(target), "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, m.Data); err != nil {
			return stepErr(step, "mount devpts", m.Target, m.Data, err)
		}
		return nil

	case MountMqueue:
		target, err := mountpoint(root, m.Target, true)
		if err != nil {
			return stepErr(step, "create mount point", m.Target, "", err)
		}
		defer unix.Close(target)
		// The queues of the sandbox's own ipc namespace (made at clone),
		// never the host's.
		if err := unix.Mount("mqueue", fdPath(target), "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return stepErr(step, "mount mqueue", m.Target, "MS_NOSUID|MS_NODEV|MS_NOEXEC", err)
		}
		return nil

	case MountProc:
		target, err := mountpoint(root, m.Target, true)
		if err != nil {
			return stepErr(step, "create mount point", m.Target, "", err)
		}
		defer unix.Close(target)
		err = unix.Mount("proc", fdPath(target), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		if err != nil {
			if !cfg.BestEffort {
				return stepErr(step, "mount proc", m.Target, "fresh procfs for the new pid namespace", err).hint(hintProc)
			}
			// Best effort, loudly: no /proc at all rather than the host's.
			msg := fmt.Sprintf("best_effort: no fresh /proc (%v); the tool runs without /proc", err)
			rep.send(event{Type: "warning", Message: msg})
			fmt.Fprintln(os.Stderr, "nsinit: warning: "+msg)
		}
		return nil
	}
	return stepErr(step, "mount", m.Target, string(m.Kind), errors.New("unknown mount kind"))
}

// bindAttr is what a bind's (or device node's) detached tree gets,
// recursively, before it is attached, and its names for an error: nosuid
// always; nodev, but noexec for a device node (it is a device); rdonly
// when the plan says so.
func bindAttr(m Mount) (unix.MountAttr, string) {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID}
	what := "MOUNT_ATTR_NOSUID"
	if m.Kind == MountDevNode {
		attr.Attr_set |= unix.MOUNT_ATTR_NOEXEC
		what += "|MOUNT_ATTR_NOEXEC"
	} else {
		attr.Attr_set |= unix.MOUNT_ATTR_NODEV
		what += "|MOUNT_ATTR_NODEV"
	}
	if m.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		what += "|MOUNT_ATTR_RDONLY"
	}
	return attr, what
}

// mountpoint creates (or opens) the mount point for target, a directory or
// an empty regular file, and returns an O_PATH fd to it.
func mountpoint(root int, target string, dir bool) (int, error) {
	if dir {
		return mkdirAll(root, target, 0o755)
	}
	parent, name := filepath.Split(target)
	dfd, err := mkdirAll(root, parent, 0o755)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dfd)
	// 0444: a file mount point is never written through (the bind hides
	// it); one left on a bound host directory says so.
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
	if err != nil {
		return -1, err
	}
	unix.Close(fd)
	return unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// mkdirAll creates every component of path under root without following
// symlinks (O_NOFOLLOW on each step) and returns an O_PATH fd to the last.
// The last component, if created, gets mode exactly (the umask does not
// apply); a missing parent gets parentMode(mode); an existing directory
// keeps its own.
func mkdirAll(root int, path string, mode uint32) (int, error) {
	if mode == 0 {
		mode = 0o755
	}
	comps, err := components(path)
	if err != nil {
		return -1, err
	}
	cur, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	for i, c := range comps {
		last := i == len(comps)-1
		m := parentMode(mode)
		if last {
			m = mode
		}
		created := true
		if err := unix.Mkdirat(cur, c, m); err == unix.EEXIST {
			created = false
		} else if err != nil {
			unix.Close(cur)
			return -1, fmt.Errorf("mkdir %s: %w", c, err)
		}
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", c, err)
		}
		cur = next
		if created && last && m&^0o755 != 0 {
			// Bits the umask (022) removed, or a sticky/setgid bit: set
			// them through the descriptor just opened without following.
			if err := unix.Chmod(fdPath(cur), m); err != nil {
				unix.Close(cur)
				return -1, fmt.Errorf("chmod %s %#o: %w", c, m, err)
			}
		}
	}
	return cur, nil
}

// components are path's names, root first; "." and ".." are refused
// (no path the init makes or opens may climb or stand still): the one
// split of str-init's mkdirAll and openNoFollow and of a direct
// sandbox's program.
func components(path string) ([]string, error) {
	var out []string
	for _, c := range strings.Split(strings.Trim(path, "/"), "/") {
		if c == "" {
			continue
		}
		if c == ".." || c == "." {
			return nil, fmt.Errorf("path component %q refused", c)
		}
		out = append(out, c)
	}
	return out, nil
}

// parentMode is the mode of a directory created as the parent of one of
// mode: the owner may enter and write it, and the group and others may
// enter and list it when the directory itself gives them anything.
func parentMode(mode uint32) uint32 {
	m := uint32(0o700)
	if mode&0o070 != 0 {
		m |= 0o050
	}
	if mode&0o007 != 0 {
		m |= 0o005
	}
	return m
}

// openNoFollow opens path under root O_PATH without following a symlink
// in any component, the last one included, and creates nothing.
func openNoFollow(root int, path string) (int, error) {
	comps, err := components(path)
	if err != nil {
		return -1, err
	}
	cur, err := unix.Dup(root)
	if err != nil {
		return -1, err
	}
	for _, c := range comps {
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", c, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil || st.Mode&unix.S_IFMT == unix.S_IFLNK {
			unix.Close(next)
			return -1, fmt.Errorf("open %s: %w", c, errOr(err, errSymlinkOnPath))
		}
		cur = next
	}
	return cur, nil
}

// bindSelfReadOnly binds the file name in dir onto itself, read-only.
func bindSelfReadOnly(dir int, name string) error {
	tree, err := unix.OpenTree(dir, name, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return err
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return err
	}
	return unix.MoveMount(tree, "", dir, name, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

func isDirFd(fd int) bool {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return true
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// fdPath names an O_PATH fd for the path-based mount(2). The host /proc is
// still mounted at this point (before pivot_root).
func fdPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// loopbackUp sets IFF_UP on lo in the current network namespace.
func loopbackUp() error {
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(s)
	return LoopbackUp(s)
}

// LoopbackUp sets IFF_UP on lo through s, an AF_INET socket of lo's
// network namespace (step 10 here; a per-tool template's supervisor for
// each call, launcher/template_netns.go).
func LoopbackUp(s int) error {
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

// openListeners binds every planned listener in the current (the
// sandbox's) network namespace and returns their descriptors in order.
func openListeners(ls []Listener) ([]int, error) {
	var fds []int
	fail := func(err error) ([]int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, err
	}
	for _, l := range ls {
		typ, err := ListenerSocketType(l)
		if err != nil {
			return fail(err)
		}
		fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fail(fmt.Errorf("listener %s: socket: %w", l.Name, err))
		}
		fds = append(fds, fd)
		if err := BindListener(fd, l); err != nil {
			return fail(err)
		}
	}
	return fds, nil
}

// ListenerSocketType is the socket type of l: SOCK_STREAM for tcp,
// SOCK_DGRAM for udp.
func ListenerSocketType(l Listener) (int, error) {
	switch l.Network {
	case "tcp":
		return unix.SOCK_STREAM, nil
	case "udp":
		return unix.SOCK_DGRAM, nil
	}
	return 0, fmt.Errorf("listener %s: network %q is not tcp or udp", l.Name, l.Network)
}

// BindListener binds fd, an AF_INET socket of ListenerSocketType(l) in
// the network namespace l serves, to l's address and, for TCP, listens
// (step 10 here; a per-tool template's supervisor for each call).
func BindListener(fd int, l Listener) error {
	ap, err := listenerAddr(l)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fmt.Errorf("listener %s: bind %s: %w", l.Name, l.Addr, err)
	}
	if l.Network == "tcp" {
		if err := unix.Listen(fd, 128); err != nil {
			return fmt.Errorf("listener %s: listen %s: %w", l.Name, l.Addr, err)
		}
	}
	return nil
}

// listenerAddr is l's address, which must be IPv4 address:port.
func listenerAddr(l Listener) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(l.Addr)
	if err != nil || !ap.Addr().Is4() {
		return netip.AddrPort{}, fmt.Errorf("listener %s: %q is not an IPv4 address:port", l.Name, l.Addr)
	}
	return ap, nil
}

// giveRootEntries (step 7, a bubblewrap line's root, left writable) gives the root tmpfs
// and every entry on it to uid and gid, without following a symlink and
// without crossing into anything mounted on it (an entry on another
// device is a mount point: left as it is).
func giveRootEntries(uid, gid uint32) error {
	root, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return stepErr(StepRootReadOnly, "open root", "/", "O_RDONLY|O_DIRECTORY", err)
	}
	defer unix.Close(root)
	var st unix.Statx_t
	if err := unix.Statx(root, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &st); err != nil {
		return stepErr(StepRootReadOnly, "statx root", "/", "STATX_MNT_ID", err)
	}
	if err := unix.Fchown(root, int(uid), int(gid)); err != nil {
		return stepErr(StepRootReadOnly, "chown", "/", fmt.Sprintf("%d:%d", uid, gid), err)
	}
	return giveEntries(root, "/", st.Mnt_id, uid, gid)
}

// giveEntries gives the entries below dir that are on mount mnt (by mount
// id: a file bound onto itself, --ro-bind-data's, is on the same
// filesystem but another mount).
func giveEntries(dir int, path string, mnt uint64, uid, gid uint32) error {
	// Readdirnames through a duplicate: closing it leaves dir open.
	dup, err := unix.Dup(dir)
	if err != nil {
		return stepErr(StepRootReadOnly, "dup", path, "", err)
	}
	f := os.NewFile(uintptr(dup), path)
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return stepErr(StepRootReadOnly, "read directory", path, "", err)
	}
	for _, n := range names {
		p := filepath.Join(path, n)
		var st unix.Statx_t
		if err := unix.Statx(dir, n, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID|unix.STATX_TYPE, &st); err != nil {
			return stepErr(StepRootReadOnly, "statx", p, "AT_SYMLINK_NOFOLLOW STATX_MNT_ID", err)
		}
		if st.Mnt_id != mnt {
			continue // a mount point: what is mounted there is not the root's
		}
		if err := unix.Fchownat(dir, n, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return stepErr(StepRootReadOnly, "chown", p, fmt.Sprintf("%d:%d", uid, gid), err)
		}
		if uint32(st.Mode)&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		sub, err := unix.Openat(dir, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return stepErr(StepRootReadOnly, "open", p, "O_RDONLY|O_DIRECTORY|O_NOFOLLOW", err)
		}
		err = giveEntries(sub, p, mnt, uid, gid)
		unix.Close(sub)
		if err != nil {
			return err
		}
	}
	return nil
}
