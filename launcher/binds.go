package launcher

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

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
// by nsinit.CloneSource (one resolution of the path through an O_PATH
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
// its place; the returned writeBacks are what step L10 copies back.
func cloneBindSources(ms []nsinit.Mount, first int, owner ownerMap, wd profiles.WorkDir) ([]*os.File, []nsinit.Mount, []*writeBack, error) {
	var trees []*os.File
	var wbs []*writeBack
	fail := func(err error) ([]*os.File, []nsinit.Mount, []*writeBack, error) {
		closeFiles(trees)
		for _, wb := range wbs {
			wb.close()
		}
		return nil, nil, nil, err
	}
	out, copied := ms, false
	for i, m := range ms {
		if !hasSource(m) || m.TreeFD <= 0 {
			continue
		}
		fd, detail, err := nsinit.CloneSource(m)
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
			ovl, wb, err := overlayWorkDir(fd, m, wd, owner.uid, owner.gid)
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

// ownerMap makes a tree id-mapped so that its owner is the tool: the
// tool's host ids and the init's executable (initExe), the one program the
// launcher has at hand (it is never run here).
type ownerMap struct {
	uid, gid int      // the tool's host ids (root mode: the leased block's)
	exe      *os.File // initExe's
}

// apply (step L3) maps the detached tree's owner to the tool:
//
//  1. the owner is read from the tree itself (no second path lookup) and
//     refused if it is root, uid or gid: a tool must not leave files
//     owned by root on the host (a setuid-root program, a cron file);
//  2. a user namespace whose only mapping is owner -> tool (uid and gid)
//     is made by a child started in it, stopped at its execve before it
//     runs one instruction (PTRACE_TRACEME), and killed once its
//     namespace is open: the kernel takes an idmapping as a namespace;
//  3. mount_setattr(MOUNT_ATTR_IDMAP, AT_RECURSIVE) on the detached tree.
//
// Through the mount the tool's host uid is the owner's on disk: what the
// tool creates belongs to the owner, and the owner's files are the
// tool's. Other ids are unmapped there (read by their "other" bits).
// The caller's goroutine is on a locked OS thread (the stopped child's
// tracer), as Sandbox.run is.
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
	if o.uid < 0 || o.gid < 0 || o.exe == nil {
		return se("id-map work dir", "", errors.New("the tool's host ids are not leased (root mode only)"))
	}
	// 2. the namespace holding the mapping.
	detail := fmt.Sprintf("uid %d -> %d, gid %d -> %d", st.Uid, o.uid, st.Gid, o.gid)
	p, err := os.StartProcess("/proc/self/fd/3", []string{"str-idmap"}, &os.ProcAttr{
		Files: []*os.File{nil, nil, nil, o.exe},
		Sys: &syscall.SysProcAttr{
			Cloneflags:  unix.CLONE_NEWUSER,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: int(st.Uid), HostID: o.uid, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: int(st.Gid), HostID: o.gid, Size: 1}},
			Ptrace:      true, // stopped at its execve: the program never runs
			Pdeathsig:   syscall.SIGKILL,
		},
	})
	if err != nil {
		return se("id-map work dir", "user namespace "+detail, err)
	}
	userns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", p.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	_ = p.Kill()
	_, _ = p.Wait()
	if err != nil {
		return se("id-map work dir", "open the user namespace "+detail, err)
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
