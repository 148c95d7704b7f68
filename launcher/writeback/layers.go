package writeback

import (
	"errors"
	"strconv"
	"strings"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// Layers (part of L3, root mode: str bwrap's --overlay, --tmp-overlay and
// --ro-overlay) makes the detached overlay m.Overlay describes, with the
// same mechanism as a capped work dir's: lowers are this process's
// descriptors of the detached clones of its Lower dirs, top first. The
// upper and work dirs are its Upper and Work, opened here; with none and
// m writable, a tmpfs of its own capped like the profile's work dir (wd),
// gone with the sandbox, whose upper dir belongs to uid and gid (the
// tool's host ids, as bubblewrap's belongs to the command); with none and
// m read-only, no writable layer. Like bubblewrap's, the overlay uses
// user.overlay.* xattrs (userxattr), so an upper dir works under either.
// It returns the overlay's detached mount (nosuid,nodev; the init sets
// the bind attributes when it attaches it).
func Layers(m nsinit.Mount, lowers []int, wd profiles.WorkDir, uid, gid int) (int, error) {
	o := m.Overlay
	se := func(action, detail string, err error) *nsinit.StepError {
		return &nsinit.StepError{Who: "launcher", Step: nsinit.StepLBindSources, Action: action, Path: m.Target, Detail: detail, Msg: err.Error(), Err: err}
	}
	paths := make([]string, len(lowers))
	for i, fd := range lowers {
		paths[i] = fdPath(fd)
	}
	params := [][2]string{{"lowerdir", strings.Join(paths, ":")}}
	switch {
	case o.Upper != "":
		for _, d := range [][2]string{{"upperdir", o.Upper}, {"workdir", o.Work}} {
			fd, err := unix.Open(d[1], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, se("open overlay "+d[0], d[1], err)
			}
			defer unix.Close(fd)
			params = append(params, [2]string{d[0], fdPath(fd)})
		}
	case !m.ReadOnly:
		tmp := [][2]string{{"mode", "0755"}}
		if wd.Size > 0 {
			tmp = append(tmp, [2]string{"size", strconv.FormatInt(int64(wd.Size), 10)}, [2]string{"nr_inodes", strconv.FormatInt(wd.Inodes, 10)})
		}
		fs, err := mountDetached("tmpfs", tmp)
		if err != nil {
			return -1, se("mount overlay upper tmpfs", paramString(tmp), err)
		}
		defer unix.Close(fs) // the overlay holds its own reference
		if err := unix.Mkdirat(fs, upperName, 0o755); err != nil {
			return -1, se("mount overlay upper tmpfs", "mkdir "+upperName, err)
		}
		if err := unix.Fchownat(fs, upperName, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return -1, se("mount overlay upper tmpfs", "chown "+upperName, err)
		}
		if err := unix.Mkdirat(fs, ovlWork, 0o700); err != nil {
			return -1, se("mount overlay upper tmpfs", "mkdir "+ovlWork, err)
		}
		params = append(params, [2]string{"upperdir", fdPath(fs) + "/" + upperName}, [2]string{"workdir", fdPath(fs) + "/" + ovlWork})
	}
	params = append(params, [2]string{"userxattr", ""})
	ovl, err := mountDetached("overlay", params)
	if err != nil {
		e := se("mount overlay", strings.Join(o.Lower, ":"), err)
		if errors.Is(err, unix.ELOOP) {
			e.Hint = "overlay directories may not overlap"
		}
		return -1, e
	}
	return ovl, nil
}
