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

// CheckUsernsDenied is --disable-userns and --assert-userns-disabled
// under str: the tool may not make a user namespace when its seccomp
// policy (eval: the policy's meaning, seccomp.Policy.Evaluate) refuses
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
