package launcher

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/securetoolruntime/str/launcher/writeback"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// cloneSource clones the bind source of m as a detached, private mount
// tree and returns its descriptor (close-on-exec): L3's clone on the host
// for a root-mode plan, the numbered sequence a rootless init runs as
// operations at its step 3 (nsinit's builder.cloneSource says why each
// part). On failure detail names the call that failed; an optional bind
// source that does not exist fails with ENOENT like any other, the caller
// skips it.
func cloneSource(m nsinit.Mount) (tree int, detail string, err error) {
	// 1. one resolution of the path, a symlink refused.
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
		return -1, detail, nsinit.ErrSymlinkSource
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

// hasSource reports whether m is a bind whose source is a host path.
func hasSource(m nsinit.Mount) bool {
	return m.Kind == nsinit.MountBind || m.Kind == nsinit.MountDevNode
}

// numberTrees gives every bind source the launcher clones (root mode) the
// init's descriptor it will arrive at: consecutive from first, in plan
// order, skipping sources marked absent. Those are exactly the files
// cloneBindSources returns, in the same order.
func numberTrees(ms []nsinit.Mount, first int) {
	fd := first
	for i := range ms {
		if !hasSource(ms[i]) || ms[i].TreeFD == nsinit.SourceAbsent {
			continue
		}
		ms[i].TreeFD = fd
		fd++
	}
}

// cloneBindSources is launcher step L3, right before the init is cloned
// (the worker mounts a task's capped tmpfs on its work dir between Create
// and Start, and the clone must be of that tmpfs): every bind source of
// a root-mode plan is cloned on the host, with the launcher's privileges,
// by cloneSource (one resolution of the path through an O_PATH
// descriptor, a symlink refused where the plan says no_follow, a detached
// private copy). The init attaches those trees by descriptor, so a bind
// needs no permission of the sandbox's host uids on the directories above
// its source (a work dir under a 0700 mktemp directory works).
//
// Why the launcher clones, not the init from a descriptor the launcher
// opened: open_tree(OPEN_TREE_CLONE) copies only a mount of the caller's
// own mount namespace (the init gets EINVAL for an O_PATH descriptor
// opened in the host's), and it needs CAP_SYS_ADMIN over that namespace,
// which only root holds over the host's. The detached clone, in an
// anonymous namespace of its own, may then be attached by move_mount in
// any namespace whose owner the caller is privileged over: the init's,
// owned by the sandbox's user namespace (checked on Linux 6.18). So root
// mode clones here, and rootless the init clones by path, as the
// caller's own uid.
//
// It returns the trees in plan order, and the mounts with their TreeFD
// renumbered when an optional source has gone missing since the plan
// (marked nsinit.SourceAbsent; the plan itself is not changed). A rootless
// plan has no launcher trees: the init clones its sources itself.
//
// A tree marked IDMapOwner (the work dir of `str run`) is then made
// id-mapped to the tool's host ids (owner.apply) while it is still
// detached, the only time the kernel allows it.
//
// A tree marked WriteBack (a capped `str run --workdir`) is then wrapped
// in an overlay whose upper layer is a tmpfs capped by wd, and passed in
// its place; the returned writeback.Dirs are what step L10 copies back.
func cloneBindSources(ms []nsinit.Mount, first int, owner ownerMap, wd profiles.WorkDir) ([]*os.File, []nsinit.Mount, []*writeback.Dir, error) {
	var trees []*os.File
	var wbs []*writeback.Dir
	fail := func(err error) ([]*os.File, []nsinit.Mount, []*writeback.Dir, error) {
		closeFiles(trees)
		for _, wb := range wbs {
			wb.Close()
		}
		return nil, nil, nil, err
	}
	out, copied := ms, false
	for i, m := range ms {
		if !hasSource(m) || m.TreeFD <= 0 {
			continue
		}
		fd, detail, err := cloneSource(m)
		if err != nil {
			if m.Optional && errors.Is(err, unix.ENOENT) {
				if !copied {
					out, copied = append([]nsinit.Mount(nil), ms...), true
				}
				out[i].TreeFD = nsinit.SourceAbsent
				continue
			}
			se := &StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: "clone bind source", Path: m.Source,
				Detail: detail, Msg: err.Error(), Err: err}
			switch {
			case errors.Is(err, nsinit.ErrSymlinkSource):
				se.Hint = "name the directory itself, not a symlink to it"
			case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
				se.Hint = "the launcher's own uid cannot reach this path (a network or FUSE filesystem refusing root?)"
			}
			return fail(se)
		}
		if m.IDMapOwner {
			if err := owner.apply(fd, m.Source); err != nil {
				unix.Close(fd)
				return fail(err)
			}
		}
		if m.WriteBack {
			ovl, wb, err := writeback.Overlay(fd, m, wd, owner.uid, owner.gid)
			unix.Close(fd) // the overlay holds the lower layer now
			if err != nil {
				return fail(err)
			}
			fd = ovl
			wbs = append(wbs, wb)
		}
		trees = append(trees, os.NewFile(uintptr(fd), m.Source))
	}
	if copied {
		numberTrees(out, first)
	}
	return trees, out, wbs, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// ownerMap makes a tree id-mapped so that its owner is the tool.
type ownerMap struct {
	uid, gid int // the tool's host ids (root mode: the leased block's)
}

// apply (step L3) maps the detached tree's owner to the tool:
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
func (o ownerMap) apply(tree int, src string) error {
	se := func(action, detail string, err error) *StepError {
		return &StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: action, Path: src, Detail: detail, Msg: err.Error(), Err: err}
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
	if o.uid <= 0 || o.gid <= 0 { // never host root
		return se("id-map work dir", "", errors.New("the tool's host ids are not leased (root mode only)"))
	}
	// 2. the namespace holding the mapping.
	detail := fmt.Sprintf("uid %d -> %d, gid %d -> %d", st.Uid, o.uid, st.Gid, o.gid)
	userns, action, err := idMapUserNS(int(st.Uid), o.uid, int(st.Gid), o.gid)
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
