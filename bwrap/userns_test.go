package bwrap

import (
	"testing"

	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

// TestUsernsFilter: the filter --disable-userns stacks refuses every way
// to make a user namespace (CheckUsernsDenied's own probes, through the
// compiled program, not the policy's meaning) and lets threads, fork and
// other namespaces through, which the profile's filter decides.
func TestUsernsFilter(t *testing.T) {
	arch := NativeAuditArch()
	if arch == 0 {
		t.Skip("no seccomp architecture for this build")
	}
	prog, err := noUserns.CompileStacked()
	if err != nil {
		t.Fatal(err)
	}
	if raw, err := UsernsFilter(); err != nil || len(raw) != 8*len(prog.Filter) {
		t.Fatalf("UsernsFilter: %d bytes, %v; want %d", len(raw), err, 8*len(prog.Filter))
	}
	eval := func(d seccomp.Data) (uint32, error) { return seccomp.Simulate(prog.Filter, d) }
	if err := CheckUsernsDenied(noUserns.Name, eval, arch); err != nil {
		t.Errorf("the filter lets a user namespace be made: %v", err)
	}
	for _, c := range []struct {
		call string
		nr   int32
		arg0 uint64
	}{
		{"clone(SIGCHLD)", unix.SYS_CLONE, uint64(unix.SIGCHLD)},
		{"clone(thread)", unix.SYS_CLONE, unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD},
		{"unshare(CLONE_NEWNS|CLONE_NEWPID)", unix.SYS_UNSHARE, unix.CLONE_NEWNS | unix.CLONE_NEWPID},
		{"prctl", unix.SYS_PRCTL, unix.PR_SET_SECCOMP},
		{"setns", unix.SYS_SETNS, 3},
	} {
		ret, err := eval(seccomp.Data{Nr: c.nr, Arch: arch, Args: [6]uint64{c.arg0}})
		if err != nil || ret&seccomp.RetActionFull != seccomp.RetAllow {
			t.Errorf("%s: %s, %v; want it allowed (left to the other filters)", c.call, seccomp.DescribeRet(ret), err)
		}
	}
}
