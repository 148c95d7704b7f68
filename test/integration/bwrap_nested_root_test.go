package integration

import (
	"os/exec"
	"strings"
	"testing"
)

// TestBwrapNestedStrAsUID0: bubblewrap's suite runs str inside str as
// uid 0 of a user namespace that maps one id (--unshare-user --uid 0
// --cap-add ALL, then /proc/self/exe). That str has no host ids to lease:
// it runs rootless (procfs.RootMode), with a rootless state directory,
// never the outer str's /run/str that the bind of / shows it, and it
// finds its sandbox's init in the caller's /proc the line bound (another
// pid namespace's procfs: procfs.PidInProc).
func TestBwrapNestedStrAsUID0(t *testing.T) {
	needRoot(t)
	outer := []string{"bwrap", "--str-profile", "nesting", "--unshare-user", "--uid", "0", "--gid", "0", "--cap-add", "ALL",
		"--bind", "/", "/", "--bind", "/proc", "/proc", "--"}
	out, err := exec.Command(strBin, append(outer, "/proc/self/exe", "--unshare-all", "--bind", "/", "/", "--bind", "/proc", "/proc",
		"echo", "nested-hello")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nested-hello") {
		t.Errorf("str bwrap inside str bwrap as uid 0 of a one-id namespace: %v\n%s", err, out)
	}
	out, err = exec.Command(strBin, append(outer, "/proc/self/exe", "doctor")...).CombinedOutput()
	if !strings.Contains(string(out), "uid 0 (rootless mode") || !strings.Contains(string(out), "state directory") || strings.Contains(string(out), "/run/str") {
		t.Errorf("str doctor inside: %v\n%s; want rootless mode, a state directory other than /run/str, no id leases", err, out)
	}
}

// TestBwrapDisableUsernsUnderNesting: --disable-userns under a profile
// whose policy lets the tool make user namespaces (nesting) stacks
// bwrap.UsernsFilter: a nested bubblewrap then fails to make its
// namespace, and without the option it succeeds; --assert-userns-disabled
// alone is refused there, since nothing disabled them.
func TestBwrapDisableUsernsUnderNesting(t *testing.T) {
	needRoot(t)
	bubblewrap := machineBwrap(t)
	inner := []string{bubblewrap, "--unshare-user", "--dev-bind", "/", "/", "--", "true"}
	line := func(opts ...string) []string {
		return append(append([]string{"bwrap", "--str-profile", "nesting", "--unshare-user", "--uid", "1000", "--gid", "1000"}, opts...),
			append([]string{"--dev-bind", "/", "/", "--"}, inner...)...)
	}
	if out, err := exec.Command(strBin, line()...).CombinedOutput(); err != nil {
		t.Errorf("nested bubblewrap under nesting: %v\n%s", err, out)
	}
	out, err := exec.Command(strBin, line("--disable-userns")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "bwrap: ") {
		t.Errorf("nested bubblewrap under --disable-userns: %v\n%s; want bubblewrap's own failure", err, out)
	}
	out, err = exec.Command(strBin, line("--assert-userns-disabled")...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--assert-userns-disabled") {
		t.Errorf("--assert-userns-disabled under nesting: %v\n%s; want it refused", err, out)
	}
}
