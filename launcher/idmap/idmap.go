package idmap

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// MapOwner (step L3) maps the detached tree's owner (tree, a clone of
// src) to the tool's host ids toolUID and toolGID:
//
//  1. the owner is read from the tree itself (no second path lookup) and
//     refused if it is root, uid or gid: a tool must not leave files
//     owned by root on the host (a setuid-root program, a cron file);
//  2. a user namespace whose only mapping is owner -> tool (uid and gid)
//     is made and opened (idMapUserNS): the kernel takes an idmapping as
//     a namespace;
//  3. mount_setattr(MOUNT_ATTR_IDMAP, AT_RECURSIVE) on the detached tree.
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
	if toolUID <= 0 || toolGID <= 0 { // never host root
		return se("id-map work dir", "", errors.New("the tool's host ids are not leased (root mode only)"))
	}
	// 2. the namespace holding the mapping.
	detail := fmt.Sprintf("uid %d -> %d, gid %d -> %d", st.Uid, toolUID, st.Gid, toolGID)
	userns, action, err := idMapUserNS(int(st.Uid), toolUID, int(st.Gid), toolGID)
	if err != nil {
		return se("id-map work dir", action+", "+detail, err)
	}
	defer unix.Close(userns)
	// 3. the mapping, on the detached tree.
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(userns)}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		e := se("id-map work dir", "mount_setattr MOUNT_ATTR_IDMAP AT_RECURSIVE, "+detail, err)
		if errors.Is(err, unix.EINVAL) {
			e.Hint = "the work dir's filesystem (or one mounted below it) does not support id-mapped mounts (ext4, xfs, btrfs and tmpfs do)"
		}
		return e
	}
	return nil
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
