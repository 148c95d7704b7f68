package bwrap

import (
	"fmt"
	"runtime"

	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// usernsProbe is one way a process makes a user namespace, as the
// seccomp data the kernel would check.
type usernsProbe struct {
	call string
	nr   int32
	arg0 uint64
}

// usernsProbes: unshare and clone with CLONE_NEWUSER; clone3 with any
// argument, its flags being in memory seccomp cannot read.
var usernsProbes = []usernsProbe{
	{"unshare(CLONE_NEWUSER)", unix.SYS_UNSHARE, unix.CLONE_NEWUSER},
	{"clone(CLONE_NEWUSER|SIGCHLD)", unix.SYS_CLONE, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)},
	{"clone3", unix.SYS_CLONE3, 0},
}

// NativeAuditArch is the seccomp architecture of this build (0 where
// str's seccomp has none).
func NativeAuditArch() uint32 {
	switch runtime.GOARCH {
	case "amd64":
		return seccomp.AuditArchX86_64
	case "arm64":
		return seccomp.AuditArchAArch64
	}
	return 0
}

// newUser is CLONE_NEWUSER, as a seccomp argument mask and value.
var newUser uint64 = unix.CLONE_NEWUSER

// noUserns is what --disable-userns stacks on the sandbox's filters when
// the profile's policy lets the tool make user namespaces (nesting) or the
// line's own filters replace it: every probe above refused, every other
// call left to the other filters (the kernel takes the strictest answer).
// clone3 is ENOSYS so that libc falls back to clone, whose flags the
// filter reads, as in every embedded policy. The tool cannot lift it: a
// seccomp filter stays for the process and its children.
var noUserns = seccomp.Policy{
	Version: seccomp.SchemaVersion, Name: "disable-userns",
	Description:   "str bwrap --disable-userns: no new user namespaces, everything else left to the other filters",
	DefaultAction: seccomp.Action{Kind: seccomp.ActionAllow},
	Rules: []seccomp.Rule{
		{Names: []string{"clone", "unshare"}, Action: seccomp.Action{Kind: seccomp.ActionErrno, Errno: "EPERM"},
			Args:   []seccomp.Arg{{Index: 0, Op: seccomp.OpMaskedEq, Mask: &newUser, Value: &newUser}},
			Reason: "CLONE_NEWUSER makes a user namespace (bubblewrap's --disable-userns)"},
		{Names: []string{"clone3"}, Action: seccomp.Action{Kind: seccomp.ActionErrno, Errno: "ENOSYS"},
			Reason: "clone3's flags are in memory seccomp cannot read: ENOSYS, so that callers fall back to clone"},
	},
}

// UsernsFilter is noUserns compiled for this machine, as the classic BPF
// program the init loads (nsinit.Config.ExtraSeccomp).
func UsernsFilter() ([]byte, error) {
	prog, err := noUserns.CompileStacked()
	if err != nil {
		return nil, fmt.Errorf("seccomp filter %s: %w", noUserns.Name, err)
	}
	return seccomp.EncodeFilter(prog.Filter), nil
}

// CheckUsernsDenied is --assert-userns-disabled under str (and says
// whether --disable-userns needs UsernsFilter): the tool may not make a
// user namespace when its seccomp policy (eval: the policy's meaning, seccomp.Policy.Evaluate) refuses
// every probe above. The error names the policy and the call it lets
// through.
func CheckUsernsDenied(policy string, eval func(seccomp.Data) (uint32, error), arch uint32) error {
	for _, p := range usernsProbes {
		ret, err := eval(seccomp.Data{Nr: p.nr, Arch: arch, Args: [6]uint64{p.arg0}})
		if err != nil {
			return fmt.Errorf("seccomp policy %s: %s: %w", policy, p.call, err)
		}
		switch ret & seccomp.RetActionFull {
		case seccomp.RetErrno, seccomp.RetKillProcess, seccomp.RetKillThread, seccomp.RetTrap:
			continue
		}
		return fmt.Errorf("the seccomp policy %s lets %s through (%s); choose a profile whose policy refuses it (--str-profile)", policy, p.call, seccomp.DescribeRet(ret))
	}
	return nil
}
