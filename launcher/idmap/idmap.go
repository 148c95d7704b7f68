package idmap

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"unsafe"

	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// MapOwner (step L3) maps the detached tree's owner (tree, a clone of
// src) to the tool's host ids toolUID and toolGID:
//
//  1. the owner is read from the tree itself (no second path lookup) and
//     refused if it is root, uid or gid: `str run --workdir` must not let
//     a tool leave files owned by root on the host (a setuid-root
//     program, a cron file);
//  2. the Mapping owner -> tool is applied to every mount of the tree
//     whose filesystem allows it; the tree's own mount must be one of
//     them.
//
// Through the mount the tool's host uid is the owner's on disk: what the
// tool creates belongs to the owner, and the owner's files are the
// tool's. Other ids are unmapped there (read by their "other" bits).
func MapOwner(tree int, src string, toolUID, toolGID int) error {
	se := func(action, detail string, err error) *nsinit.StepError {
		return &nsinit.StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: action, Path: src, Detail: detail, Msg: err.Error(), Err: err}
	}
	// 1. the owner, from the tree.
	var st unix.Stat_t
	if err := unix.Fstat(tree, &st); err != nil {
		return se("id-map work dir", "fstat", err)
	}
	if st.Uid == 0 || st.Gid == 0 {
		e := se("id-map work dir", fmt.Sprintf("owner %d:%d", st.Uid, st.Gid), errors.New("owned by root: a tool may not create root's files on the host"))
		e.Hint = "chown the work dir to the unprivileged user and group the tool's files should belong to (e.g. chown \"$SUDO_USER:\" DIR), or run str run as that user (rootless)"
		return e
	}
	// 2. the mapping.
	m, err := newMapping(src, int(st.Uid), int(st.Gid), toolUID, toolGID)
	if err != nil {
		return err
	}
	defer m.Close()
	left, err := m.apply(tree, src, "id-map work dir")
	if err == nil && len(left) > 0 && left[0] == "." {
		e := se("id-map work dir", "mount_setattr MOUNT_ATTR_IDMAP, "+m.detail, unix.EINVAL)
		e.Hint = "the work dir's filesystem does not support id-mapped mounts (ext4, xfs, btrfs and tmpfs do)"
		return e
	}
	return err
}

// Mapping is one idmapping, uid -> hostUID and gid -> hostGID, as the
// kernel takes it: a user namespace with that one mapping, held open
// (the namespace's process is gone). One Mapping may map many trees
// (a `str bwrap` line's binds); Close releases it.
type Mapping struct {
	userns int
	detail string
}

// newMapping makes the Mapping uid -> hostUID, gid -> hostGID:
//
//  1. the host ids must be leased (never host root);
//  2. a user namespace whose only mapping is that one is made and opened
//     (idMapUserNS).
//
// what names the trees it is for in an error.
func newMapping(what string, uid, gid, hostUID, hostGID int) (*Mapping, error) {
	m := &Mapping{userns: -1, detail: fmt.Sprintf("uid %d -> %d, gid %d -> %d", uid, hostUID, gid, hostGID)}
	se := func(detail string, err error) *nsinit.StepError {
		return &nsinit.StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: "id-map", Path: what, Detail: detail, Msg: err.Error(), Err: err}
	}
	// 1.
	if hostUID <= 0 || hostGID <= 0 {
		return nil, se(m.detail, errors.New("the sandbox's host ids are not leased (root mode only)"))
	}
	// 2.
	userns, step, err := idMapUserNS(uid, hostUID, gid, hostGID)
	if err != nil {
		return nil, se(step+", "+m.detail, err)
	}
	m.userns = userns
	return m, nil
}

// Close releases the mapping's namespace (the mounts made with it keep
// it).
func (m *Mapping) Close() { unix.Close(m.userns) }

// RootMapping (a plan with MapRoot: `str bwrap` run by root) is the
// Mapping of host uid and gid 0 to rootUID and rootGID, the host ids of
// the sandbox's own uid and gid 0. MapRoot applies it to each bind tree.
func RootMapping(rootUID, rootGID int) (*Mapping, error) {
	return newMapping("host root", 0, 0, rootUID, rootGID)
}

// JoinedMapping (a root-mode plan that joins a user namespace: str
// bwrap's --userns) is that namespace's own map as a Mapping (userns, the
// launcher's descriptor, is duplicated): through it host root's files are
// that namespace's root's, whose ids the sandbox runs as, as RootMapping
// makes them a namespace of its own's root's.
func JoinedMapping(userns int) (*Mapping, error) {
	fd, err := unix.FcntlInt(uintptr(userns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, &nsinit.StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: "id-map", Path: "host root",
			Detail: fmt.Sprintf("the joined user namespace (fd %d)", userns), Msg: err.Error(), Err: err}
	}
	return &Mapping{userns: fd, detail: "the joined user namespace's map"}, nil
}

// MapRoot (step L3) makes every mount of the detached tree (tree, a
// clone of src) whose filesystem allows it id-mapped with root, a
// RootMapping. Through it root's files are the sandbox's root's, as they
// are host root's under bubblewrap run by root: the command reads and
// writes them as their owner (what it creates there is root's on the
// host), never with a capability on the host, and every other id reads
// as the overflow id (their files open to it only by their "other"
// bits).
//
// A mount whose filesystem refuses id-mapped mounts (proc, sysfs, the
// cgroup and other kernel interfaces, one already id-mapped) is left as
// it is: the command is a stranger there (the leased uid it is on the
// host), as it was before any mapping. Those mounts are returned, as
// paths relative to the tree ("." the tree's own).
func MapRoot(tree int, src string, root *Mapping) ([]string, error) {
	return root.apply(tree, src, "id-map root")
}

// apply makes every mount of the detached tree (tree, a clone of src)
// whose filesystem allows it id-mapped with m, and returns the mounts it
// left as they are ("." first if the tree's own):
//
//  1. mount_setattr(MOUNT_ATTR_IDMAP, AT_RECURSIVE) on the whole tree:
//     done, if every mount allows it (the kernel applies all or none);
//  2. else one mount at a time: the tree's own, then each mount point
//     below src in the launcher's /proc/self/mountinfo, opened beneath
//     the tree without following a symlink. A mount refused with EINVAL
//     (its filesystem has no id-mapped mounts) or EPERM (id-mapped
//     already) is left as it is; one gone since the clone (ENOENT) too.
//
// The tree is still detached: the only time the kernel allows the
// mapping, and why the mounts below it are found by path (the kernel
// lists a detached tree's mounts nowhere); a mount point the list
// misses is left as it is, which only takes the mapping away.
func (m *Mapping) apply(tree int, src, action string) ([]string, error) {
	se := func(detail string, err error) *nsinit.StepError {
		return &nsinit.StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: action, Path: src, Detail: detail + ", " + m.detail, Msg: err.Error(), Err: err}
	}
	// 1.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(m.userns)}
	err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EPERM) {
		return nil, se("mount_setattr MOUNT_ATTR_IDMAP AT_RECURSIVE", err)
	}
	// 2.
	points, err := mountPointsBelow(src)
	if err != nil {
		return nil, se("read /proc/self/mountinfo", err)
	}
	var left []string
	for _, rel := range append([]string{"."}, points...) {
		fd := tree
		if rel != "." {
			how := unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}
			if fd, err = unix.Openat2(tree, rel, &how); err != nil {
				left = append(left, rel)
				continue
			}
		}
		err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr)
		if fd != tree {
			unix.Close(fd)
		}
		switch {
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EPERM):
			left = append(left, rel)
		case err != nil:
			return nil, se("mount_setattr MOUNT_ATTR_IDMAP "+rel, err)
		}
	}
	return left, nil
}

// mountPointsBelow lists the mount points strictly below dir (its path
// with symlinks resolved, else as given) in the launcher's mount namespace, relative to
// dir, shallowest first.
func mountPointsBelow(dir string) ([]string, error) {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		real = dir // gone meanwhile: a mount point not found is left as it is
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		rel, err := filepath.Rel(real, procfs.UnescapeMountinfo(f[4]))
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") || seen[rel] {
			continue
		}
		seen[rel] = true
		out = append(out, rel)
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") < strings.Count(out[j], "/") })
	return out, nil
}

// idMapUserNS returns, open, a user namespace whose only mappings are
// uid -> hostUID and gid -> hostGID. A namespace needs a process: here a
// raw clone of the launcher into a new user namespace that runs no
// program and nothing but raw system calls (holdUserNS) and lives only
// until the launcher has opened its namespace. In order:
//
//  1. a close-on-exec pipe, whose read end the child keeps;
//  2. the clone: clone(CLONE_NEWUSER|SIGCHLD), sharing no memory, on a
//     locked thread with every signal blocked (WithSignalsBlocked); the
//     child closes every other descriptor and blocks reading the pipe;
//  3. its uid_map and gid_map written from here: the launcher is root
//     with CAP_SETUID and CAP_SETGID over the parent namespace, so a
//     mapping of one id is allowed and setgroups need not be denied;
//  4. its /proc/PID/ns/user opened: the namespace lives by that
//     descriptor from now on;
//  5. the child killed (SIGKILL) and reaped, on success or failure. Until
//     reaped its pid is not reused, so every /proc path above and the
//     kill are the child's. Were the launcher to die first, the child
//     reads EOF on its pipe and exits. (EOF is not how the launcher ends
//     it: another child cloned meanwhile may hold a copy of the write
//     end until its own execve.)
//
// Why no program started in the namespace (os.StartProcess, stopped at
// its execve): that needs an executable at hand; this child needs none.
// On failure it returns what it was doing.
func idMapUserNS(uid, hostUID, gid, hostGID int) (userns int, action string, err error) {
	// 1.
	var hold [2]int
	if err := unix.Pipe2(hold[:], unix.O_CLOEXEC); err != nil {
		return -1, "pipe2", err
	}
	// 2.
	var pid uintptr
	var errno syscall.Errno
	WithSignalsBlocked(func() { pid, errno = forkUserNS(hold[0]) })
	unix.Close(hold[0])
	if errno != 0 {
		unix.Close(hold[1])
		return -1, "clone(CLONE_NEWUSER)", errno
	}
	// 5. (deferred: also on a failure of 3 or 4)
	defer func() {
		_ = unix.Kill(int(pid), unix.SIGKILL)
		unix.Close(hold[1])
		var ws unix.WaitStatus
		_, _ = unix.Wait4(int(pid), &ws, 0, nil)
	}()
	// 3.
	for _, m := range [...]struct {
		file    string
		in, out int
	}{{"uid_map", uid, hostUID}, {"gid_map", gid, hostGID}} {
		line := fmt.Sprintf("%d %d 1", m.in, m.out)
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/%s", pid, m.file), []byte(line+"\n"), 0); err != nil {
			return -1, fmt.Sprintf("map %q", line), err
		}
	}
	// 4.
	path := fmt.Sprintf("/proc/%d/ns/user", pid)
	if userns, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return -1, "open " + path, err
	}
	return userns, "", nil
}

// WithSignalsBlocked runs clone, which forks a raw child that never
// returns from it (forkUserNS; the template mapper's forkMapper, package
// launcher/template), on one locked OS thread with every signal blocked:
// the child inherits the mask, so no Go signal handler ever runs in it.
func WithSignalsBlocked(clone func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	_ = unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old)
	defer func() { _ = unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil) }()
	clone()
}

// forkUserNS clones a child in a new user namespace; the child never
// returns from holdUserNS. nosplit and norace: the child runs on a copy
// of this goroutine's stack without a Go runtime (no stack growth, no
// race-detector calls), as Go's own forkAndExecInChild1 does.
//
//go:nosplit
//go:norace
func forkUserNS(hold int) (uintptr, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, unix.CLONE_NEWUSER|uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r != 0 {
		return r, e
	}
	holdUserNS(hold)
	return 0, 0
}

// holdUserNS is idMapUserNS's child, in order:
//
//  1. every descriptor but hold is closed: it keeps none of the
//     launcher's (no other sandbox's pipe waits for it);
//  2. it blocks reading hold until the launcher kills it, or until EOF
//     (or any other answer): the launcher died;
//  3. it exits.
//
//go:nosplit
//go:norace
func holdUserNS(hold int) {
	// 1.
	if hold > 0 {
		syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 0, uintptr(hold-1), 0)
	}
	syscall.RawSyscall(unix.SYS_CLOSE_RANGE, uintptr(hold+1), uintptr(^uint32(0)), 0)
	// 2.
	var b [1]byte
	syscall.RawSyscall(syscall.SYS_READ, uintptr(hold), uintptr(unsafe.Pointer(&b[0])), 1)
	// 3.
	syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
}
