package launcher

import (
	"fmt"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/nsinit"
)

// SetMounts replaces the plan's filesystem with ms, in that order (a
// caller that describes the whole filesystem itself: str bwrap), with
// the same checks NewPlan applies to its own list: every target
// absolute and clean, the bind sources within checkBindSources' limit,
// and the root-mode trees numbered for step L3.
func (pl *Plan) SetMounts(ms []nsinit.Mount) error {
	sources := 0
	for _, m := range ms {
		if !isAbsClean(m.Target) {
			return fmt.Errorf("%w: mount target %q must be an absolute, clean path", ErrInvalidRequest, m.Target)
		}
		if hasSource(m) {
			sources++
		}
	}
	if err := checkBindSources(sources, pl.NoFile); err != nil {
		return err
	}
	pl.Child.Mounts = append([]nsinit.Mount(nil), ms...)
	if !pl.Rootless {
		numberTrees(pl.Child.Mounts, nsinit.FirstTreeFD(pl.Child.PassFDs))
	}
	return nil
}

// SetToolIDs makes uid and gid the tool's ids inside the sandbox; rootless
// they are also the ids the caller's own is mapped to (the one id an
// unprivileged user may map). Root mode maps them at Create (assignIDs).
func (pl *Plan) SetToolIDs(uid, gid uint32) {
	pl.Child.UID, pl.Child.GID = uid, gid
	if pl.Rootless {
		pl.UIDMappings = []IDMap{{Inside: int(uid), Outside: pl.ToolUID, Size: 1}}
		pl.GIDMappings = []IDMap{{Inside: int(gid), Outside: pl.ToolGID, Size: 1}}
	}
}

// Pid is the host pid of the sandbox's init (then its tool), 0 before
// Start has returned successfully.
func (s *Sandbox) Pid() int {
	select {
	case <-s.started:
	default:
		return 0
	}
	if s.startErr != nil {
		return 0
	}
	return s.pid
}

func isAbsClean(p string) bool { return filepath.IsAbs(p) && filepath.Clean(p) == p }

// namespaceNames are the /proc/PID/ns entries Request.RecordNamespaces reads.
var namespaceNames = []string{"cgroup", "ipc", "mnt", "net", "pid", "user", "uts"}

// NamespaceInodes is the inode of each of pid's namespaces by its
// /proc/PID/ns name (namespaceNames), and the first error of one that
// cannot be read (nil when all were): a per-tool template's supervisor
// compares its calls' with its own (package launcher/template, C3 and
// C9) and refuses on an error; Request.RecordNamespaces keeps what was
// read.
func NamespaceInodes(pid int) (map[string]uint64, error) {
	m := make(map[string]uint64, len(namespaceNames))
	var first error
	for _, n := range namespaceNames {
		var st unix.Stat_t
		err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, n), &st)
		if err == nil {
			m[n] = st.Ino
		} else if first == nil {
			first = err
		}
	}
	return m, first
}

// Namespaces returns the inode of each of the init's namespaces by its
// /proc/PID/ns name, as read at Start when Request.RecordNamespaces asked
// (nil otherwise, or before Start has returned).
func (s *Sandbox) Namespaces() map[string]uint64 {
	select {
	case <-s.started:
		return s.namespaces
	default:
		return nil
	}
}
