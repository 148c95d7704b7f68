package launcher

import (
	"errors"
	"os"

	"github.com/securetoolruntime/str/nsinit"
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
// It returns the trees in plan order, and the mounts with their TreeFD
// renumbered when an optional source has gone missing since the plan
// (marked nsinit.SourceAbsent; the plan itself is not changed). A rootless
// plan has no launcher trees: the init clones its sources itself.
func cloneBindSources(ms []nsinit.Mount, first int) ([]*os.File, []nsinit.Mount, error) {
	var trees []*os.File
	fail := func(err error) ([]*os.File, []nsinit.Mount, error) {
		closeFiles(trees)
		return nil, nil, err
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
		trees = append(trees, os.NewFile(uintptr(fd), m.Source))
	}
	if copied {
		numberTrees(out, first)
	}
	return trees, out, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
