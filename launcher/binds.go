package launcher

import (
	"errors"
	"os"

	"github.com/securetoolruntime/str/launcher/idmap"
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
// A tree marked IDMapOwner (the work dir of `str run`, a writable bind
// of `str bwrap` whose owner is not root) is then made id-mapped to the
// tool's host ids (idmap.MapOwner) while it is still detached, the only
// time the kernel allows it; with the plan's MapRoot (`str bwrap` run by
// root) every other bind tree is made id-mapped host root -> the
// sandbox's root (idmap.MapRoot, the same mapping code): device nodes
// are not, they are the sandbox's own /dev.
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
	var root *idmap.Mapping // host root -> the sandbox's (Plan.MapRoot), made at its first tree
	defer func() {
		if root != nil {
			root.Close()
		}
	}()
	for i, m := range ms {
		if !hasSource(m) || m.TreeFD <= 0 {
			continue
		}
		if m.Overlay != nil {
			fd, err := overlayTree(m, wd, owner)
			if err != nil {
				return fail(err)
			}
			trees = append(trees, os.NewFile(uintptr(fd), m.Target))
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
		switch {
		case m.IDMapOwner:
			err = idmap.MapOwner(fd, m.Source, owner.uid, owner.gid)
		case owner.rootUID > 0 && m.Kind == nsinit.MountBind:
			switch { // one mapping for every tree of the plan
			case root == nil && owner.joinedUserNS >= 0:
				root, err = idmap.JoinedMapping(owner.joinedUserNS)
			case root == nil:
				root, err = idmap.RootMapping(owner.rootUID, owner.rootGID)
			}
			if err == nil {
				_, err = idmap.MapRoot(fd, m.Source, root)
			}
		}
		if err != nil {
			unix.Close(fd)
			return fail(err)
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

// overlayTree is L3 for an overlay (str bwrap's --overlay, --tmp-overlay,
// --ro-overlay; root mode): each lower layer is cloned like a bind
// source (cloneSource: one resolution of the path, a detached private
// copy), then writeback.Layers makes the detached overlay of them, the
// tree the init attaches.
func overlayTree(m nsinit.Mount, wd profiles.WorkDir, owner ownerMap) (int, error) {
	var lowers []int
	defer func() {
		for _, fd := range lowers {
			unix.Close(fd) // the overlay holds its own references
		}
	}()
	for _, p := range m.Overlay.Lower {
		layer := m
		layer.Source = p
		fd, detail, err := cloneSource(layer)
		if err != nil {
			return -1, &StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: "clone overlay layer", Path: p,
				Detail: detail, Msg: err.Error(), Err: err}
		}
		lowers = append(lowers, fd)
	}
	return writeback.Layers(m, lowers, wd, owner.uid, owner.gid)
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// ownerMap is the tool's host ids a tree is id-mapped to (its owner made
// the tool: package launcher/idmap) and a capped work dir's copy back
// writes as, and the host ids host root is mapped to (Plan.MapRoot).
type ownerMap struct {
	uid, gid int // the tool's host ids (root mode: the leased block's)
	// rootUID, rootGID: the host ids of the sandbox's uid and gid 0 when
	// the plan maps host root to them, else 0 (no such mapping).
	rootUID, rootGID int
	// joinedUserNS: the descriptor of the user namespace the plan joins
	// (Plan.JoinNamespaces; -1 none), whose own map maps host root instead.
	joinedUserNS int
}

// owners is the ownerMap of a root-mode plan whose ids are assigned.
func (pl *Plan) owners() ownerMap {
	o := ownerMap{uid: pl.ToolUID, gid: pl.ToolGID, joinedUserNS: -1}
	if pl.Child.Join != nil {
		o.joinedUserNS = pl.Child.Join.UserNS
	}
	if pl.MapRoot && !pl.Rootless {
		o.rootUID, o.rootGID = pl.initHostIDs()
	}
	return o
}
