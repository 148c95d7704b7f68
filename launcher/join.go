package launcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/nsinit"
)

// JoinNamespaces makes the sandbox join the user namespace behind the
// launcher's descriptor userns (str bwrap's --userns) and, pidns >= 0,
// the pid namespace behind pidns (--pidns) instead of being cloned into
// namespaces of its own: the clone makes none and the launcher writes no
// id maps; the init joins at its sub-step 0a (nsinit.Join), where the
// kernel decides whether it may (CAP_SYS_ADMIN in the namespace: the
// caller's own, or root's), and makes the plan's other namespaces, owned
// by the joined one. The tool runs as the plan's uid and gid read in the
// joined namespace, which must map them.
//
// Root mode, the joined namespace's ids are another sandbox's leased
// block (L1): Create registers this sandbox as a second holder of that
// block (joinLease), so that it is not leased again while this sandbox
// lives, inside that sandbox's pid namespace or not. The clone child
// keeps the launcher's own ids (it never takes the joined namespace's)
// and only waits.
func (pl *Plan) JoinNamespaces(userns, pidns int) error {
	if userns < 0 {
		return errors.New("no user namespace to join")
	}
	unshare := pl.CloneFlags &^ unix.CLONE_NEWUSER
	if pidns >= 0 {
		unshare &^= unix.CLONE_NEWPID
	}
	pl.Child.Join = &nsinit.Join{UserNS: userns, PidNS: pidns, Unshare: uint64(unshare)}
	pl.CloneFlags = 0
	pl.CloneNames = []string{"none (the init joins at sub-step 0a)"}
	return nil
}

// joinLease makes this launcher a second holder of the id block whose
// sandbox made the user namespace userns (root mode, a sandbox that joins
// it): a marker <dir>/<base>.join/<pid of this launcher>, which leaseIDs
// honours while this launcher lives (joinersAlive), so the block's ids
// are never another sandbox's while this one runs as them. The block is
// found by its holder: the lease file whose recorded init runs in
// userns. The holder is checked again once the marker exists (its lock
// still held, its init still in userns): a block released in between,
// and perhaps leased again, is refused, never shared. A namespace that
// is no live root-mode str sandbox's (its ids may be a released block's)
// is refused. release removes the marker.
func joinLease(dir string, userns int) (release func(), err error) {
	var ns unix.Stat_t
	if err := unix.Fstat(userns, &ns); err != nil {
		return nil, fmt.Errorf("join user namespace (fd %d): %w", userns, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, &IDLeaseError{Dir: dir, Err: err}
	}
	held := func(base string) bool { // the holder's lock is taken and its init runs in userns
		fd, err := unix.Open(filepath.Join(dir, base), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return false
		}
		defer unix.Close(fd)
		var buf [16]byte
		n, _ := unix.Pread(fd, buf[:], 0)
		var st unix.Stat_t
		if unix.Stat("/proc/"+strings.TrimSpace(string(buf[:max(n, 0)]))+"/ns/user", &st) != nil || st.Ino != ns.Ino || st.Dev != ns.Dev {
			return false
		}
		if unix.Flock(fd, unix.LOCK_SH|unix.LOCK_NB) == nil { // not held: released
			return false
		}
		return true
	}
	for _, e := range ents {
		base := e.Name()
		if _, err := strconv.Atoi(base); err != nil || !held(base) {
			continue
		}
		marks := filepath.Join(dir, base+".join")
		mark := filepath.Join(marks, strconv.Itoa(os.Getpid()))
		if err := os.Mkdir(marks, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, &IDLeaseError{Dir: dir, Err: err}
		}
		if err := os.WriteFile(mark, nil, 0o600); err != nil {
			return nil, &IDLeaseError{Dir: dir, Err: err}
		}
		release = func() { _ = os.Remove(mark); _ = os.Remove(marks) }
		if !held(base) { // released meanwhile
			release()
			break
		}
		return release, nil
	}
	return nil, fmt.Errorf("%w: the user namespace to join (fd %d) is no live root-mode str sandbox's: its ids may be a released block's, which another sandbox may lease", ErrInvalidRequest, userns)
}

// joinersAlive: a live launcher holds the block as a joiner (joinLease's
// markers in marks); stale markers (their launcher gone) are removed.
func joinersAlive(marks string) bool {
	ents, err := os.ReadDir(marks)
	if err != nil {
		return false
	}
	alive := false
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && pid > 0 && unix.Kill(pid, 0) != unix.ESRCH {
			alive = true
			continue
		}
		_ = os.Remove(filepath.Join(marks, e.Name()))
	}
	if !alive {
		_ = os.Remove(marks)
	}
	return alive
}
