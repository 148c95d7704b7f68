package launcher

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/nsinit"
)

// ErrJoinNeedsPidNS: root mode, a sandbox that joins another's user
// namespace must join its pid namespace too (JoinNamespaces says why).
var ErrJoinNeedsPidNS = errors.New("as root, joining a user namespace (--userns) needs its sandbox's pid namespace too (--pidns): " +
	"the joined namespace's ids are that sandbox's leased host ids, which are leased again once it ends, " +
	"and only inside its pid namespace does the kernel end this sandbox's processes with it")

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
// Root mode it needs pidns: the joined namespace's ids are another
// sandbox's leased block (L1), released when that sandbox has ended; a
// process of this sandbox outside that sandbox's pid namespace could
// outlive it and share its ids with the block's next holder. Inside it,
// the kernel kills every process of this sandbox when that sandbox's
// init exits, and that exit completes only once they are reaped. The
// clone child, outside, keeps the launcher's own ids (it never takes
// the joined namespace's) and only waits.
func (pl *Plan) JoinNamespaces(userns, pidns int) error {
	if userns < 0 {
		return errors.New("no user namespace to join")
	}
	if !pl.Rootless && pidns < 0 {
		return ErrJoinNeedsPidNS
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
