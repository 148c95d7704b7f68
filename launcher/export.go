package launcher

import (
	"fmt"
	"path/filepath"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
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
		if m.Overlay != nil && pl.Rootless {
			return fmt.Errorf("%w: overlay on %s: not supported rootless: an unprivileged caller's overlay must be mounted "+
				"inside the sandbox's user namespace, which only the init could do, and it has no step for it "+
				"(as root the launcher makes the overlay on the host)", ErrInvalidRequest, m.Target)
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

// SetCallerSeccomp gives the sandbox a caller's own classic-BPF programs
// (str bwrap's --seccomp, --add-seccomp-fd), loaded at step 19 in the
// order given, right before the rlimits and the execve. Under a profile
// whose caller_seccomp is replace (the default) they are the only
// filters, as under bubblewrap: the profile's policy leaves the plan, so
// nothing str adds changes what they decide (no_new_privs, step 18,
// stays). Under stack the profile's filter is loaded first and stays;
// the kernel then takes the strictest answer of all.
func (pl *Plan) SetCallerSeccomp(progs [][]byte) {
	pl.Child.ExtraSeccomp = progs
	if len(progs) > 0 && pl.CallerSeccomp != profiles.CallerSeccompStack {
		pl.Child.SeccompPolicy, pl.Child.Seccomp, pl.Seccomp, pl.SeccompDefault = "", nil, nil, ""
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
