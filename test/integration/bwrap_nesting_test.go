package integration

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// trySyscallC is a small program of this repository's own: it makes one
// system call with an argument the kernel refuses (a bad descriptor or
// pointer), so that it fails without side effects, and exits with the
// errno it got (0 if it succeeded). Where a seccomp filter answers first,
// the exit status is the filter's errno instead.
const trySyscallC = `#include <errno.h>
#include <string.h>
#include <unistd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#define BAD ((void *) 1)
int main(int argc, char **argv) {
	const char *c = argc > 1 ? argv[1] : "";
	long r = -1;
	errno = ENOENT;
	if (!strcmp(c, "chmod")) r = chmod(BAD, 0700);
	else if (!strcmp(c, "chroot")) r = chroot(BAD);
	else if (!strcmp(c, "clone3")) r = syscall(435, BAD, 88);
	else if (!strcmp(c, "ioctl-TIOCNOTTY")) r = ioctl(-1, TIOCNOTTY);
	else if (!strcmp(c, "ioctl-TIOCSTI")) r = ioctl(-1, TIOCSTI, BAD);
	else if (!strcmp(c, "listen")) r = listen(-1, 1);
	else if (!strcmp(c, "prctl")) r = prctl(37 /* PR_GET_CHILD_SUBREAPER */, BAD, 0, 0, 0);
	return r == 0 ? 0 : errno;
}
`

// trySyscalls are the calls trySyscallC knows.
var trySyscalls = []string{"chmod", "chroot", "clone3", "ioctl-TIOCNOTTY", "ioctl-TIOCSTI", "listen", "prctl"}

// buildTrySyscall compiles trySyscallC into a directory every uid may
// enter (str's tool is not host root).
func buildTrySyscall(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		mustwork.Skip(t, "needs a C compiler (cc) to build the syscall prober")
	}
	dir, err := os.MkdirTemp("", "str-try-syscall-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "try-syscall.c")
	if err := os.WriteFile(src, []byte(trySyscallC), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "try-syscall")
	if out, err := exec.Command("cc", "-O0", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	return bin
}

// bpfFilter is a classic-BPF seccomp program for x86_64 (another arch
// is allowed): each listed syscall gets its answer, ioctl(_, TIOCSTI)
// gets tiocsti when that is not 0, every other call def.
func bpfFilter(def uint32, answers map[uintptr]uint32, tiocsti uint32) []byte {
	const (
		ldW, jeqK, ret = 0x20, 0x15, 0x06
		archX8664      = 0xc000003e
	)
	type insn struct {
		code   uint16
		jt, jf uint8
		k      uint32
	}
	prog := []insn{
		{ldW, 0, 0, 4},          // arch
		{jeqK, 1, 0, archX8664}, // x86_64: go on
		{ret, 0, 0, 0x7fff0000}, // another arch: allow
		{ldW, 0, 0, 0},          // nr
	}
	for nr, r := range answers {
		prog = append(prog, insn{jeqK, 0, 1, uint32(nr)}, insn{ret, 0, 0, r})
	}
	if tiocsti != 0 {
		prog = append(prog,
			insn{jeqK, 0, 3, unix.SYS_IOCTL},
			insn{ldW, 0, 0, 24}, // args[1], low 32 bits
			insn{jeqK, 0, 1, unix.TIOCSTI},
			insn{ret, 0, 0, tiocsti})
	}
	prog = append(prog, insn{ret, 0, 0, def})
	var b []byte
	for _, in := range prog {
		b = binary.LittleEndian.AppendUint16(b, in.code)
		b = append(b, in.jt, in.jf)
		b = binary.LittleEndian.AppendUint32(b, in.k)
	}
	return b
}

// allowlist and denylist are the two kinds of filter bubblewrap's own
// test-seccomp.py stacks (a Flatpak-like pair): the allowlist answers
// ENOSYS to everything but what a dynamically linked C program and the
// probe need; the denylist allows everything but chmod, chroot, ioctl
// TIOCSTI and, when denyPrctl, prctl (ECONNREFUSED: no syscall here
// fails that way by itself).
func allowlist() []byte {
	allowed := map[uintptr]uint32{}
	for _, nr := range []uintptr{unix.SYS_BRK, unix.SYS_CLOCK_GETTIME, unix.SYS_EXECVE, unix.SYS_EXIT, unix.SYS_EXIT_GROUP,
		unix.SYS_FUTEX, unix.SYS_GETRANDOM, unix.SYS_GETPID, unix.SYS_GETTID, unix.SYS_MMAP, unix.SYS_MUNMAP, unix.SYS_MPROTECT,
		unix.SYS_PRLIMIT64, unix.SYS_RSEQ, unix.SYS_RT_SIGRETURN, unix.SYS_SET_ROBUST_LIST, unix.SYS_SET_TID_ADDRESS,
		unix.SYS_CLOSE, unix.SYS_READ, unix.SYS_WRITE, unix.SYS_PREAD64, unix.SYS_LSEEK, unix.SYS_ACCESS, unix.SYS_OPENAT,
		unix.SYS_OPEN, unix.SYS_FSTAT, unix.SYS_NEWFSTATAT, unix.SYS_STATX, unix.SYS_READLINK, unix.SYS_CHMOD,
		unix.SYS_ARCH_PRCTL, unix.SYS_IOCTL, unix.SYS_PRCTL, unix.SYS_MADVISE, unix.SYS_UMASK} {
		allowed[nr] = 0x7fff0000
	}
	return bpfFilter(0x00050000|uint32(unix.ENOSYS), allowed, 0)
}

func denylist(denyPrctl bool) []byte {
	refuse := uint32(0x00050000 | uint32(unix.ECONNREFUSED))
	denied := map[uintptr]uint32{unix.SYS_CHMOD: refuse, unix.SYS_CHROOT: refuse}
	if denyPrctl {
		denied[unix.SYS_PRCTL] = refuse
	}
	return bpfFilter(0x7fff0000, denied, refuse)
}

// runProbe runs `PROG [pre...] --ro-bind / / [filter options] try-syscall
// CALL` with each filter on its own descriptor (3, 4, ...) and returns the
// probe's exit status.
func runProbe(t *testing.T, prog string, pre []string, opt string, filters [][]byte, probe, call string) (int, string) {
	t.Helper()
	args := append(append([]string(nil), pre...), "--ro-bind", "/", "/")
	var files []*os.File
	for i, f := range filters {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(f); err != nil {
			t.Fatal(err)
		}
		w.Close()
		files = append(files, r)
		args = append(args, opt, fmt.Sprint(3+i))
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	cmd := exec.Command(prog, append(args, probe, call)...)
	cmd.ExtraFiles = files
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("%s: %v", prog, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// TestBwrapSeccompLikeBubblewrap: a str bwrap line that brings its own
// filters gets bubblewrap's behaviour, side by side with the machine's
// bubblewrap, for the cases of bubblewrap's test-seccomp.py: one
// --seccomp allowlist or denylist, and an allowlist and a denylist
// stacked with --add-seccomp-fd in either order (the later filter wins a
// tie; a filter before the last must allow prctl, not seccomp). With no
// filter of its own, the line gets the profile's: under nesting the
// probe's calls reach the kernel as under bubblewrap; under standard
// chroot stays EPERM (the default stays strict).
func TestBwrapSeccompLikeBubblewrap(t *testing.T) {
	needRoot(t)
	if runtime.GOARCH != "amd64" {
		mustwork.Skip(t, "the test's BPF programs are written for x86_64 (AUDIT_ARCH_X86_64, its syscall numbers)")
	}
	bubblewrap := "/usr/bin/bwrap"
	if _, err := os.Stat(bubblewrap); err != nil {
		mustwork.Skip(t, "needs the machine's bubblewrap (apt-get install bubblewrap) to compare with")
	}
	probe := buildTrySyscall(t)
	cases := []struct {
		name    string
		profile string
		opt     string
		filters [][]byte
		// want pins bubblewrap's documented answers for some calls
		// (errno numbers), beyond str = bubblewrap.
		want map[string]unix.Errno
	}{
		{"no filter, nesting profile", "nesting", "", nil,
			map[string]unix.Errno{"chroot": unix.EFAULT, "prctl": unix.EFAULT, "ioctl-TIOCSTI": unix.EBADF, "listen": unix.EBADF}},
		{"--seccomp allowlist", "standard", "--seccomp", [][]byte{allowlist()},
			map[string]unix.Errno{"chroot": unix.ENOSYS, "listen": unix.ENOSYS, "prctl": unix.EFAULT, "ioctl-TIOCSTI": unix.EBADF}},
		{"--seccomp denylist", "standard", "--seccomp", [][]byte{denylist(true)},
			map[string]unix.Errno{"chroot": unix.ECONNREFUSED, "prctl": unix.ECONNREFUSED, "ioctl-TIOCNOTTY": unix.EBADF}},
		{"stacked, denylist first", "standard", "--add-seccomp-fd", [][]byte{denylist(false), allowlist()},
			map[string]unix.Errno{"chroot": unix.ENOSYS, "prctl": unix.EFAULT, "chmod": unix.ECONNREFUSED, "listen": unix.ENOSYS}},
		{"stacked, allowlist first", "standard", "--add-seccomp-fd", [][]byte{allowlist(), denylist(true)},
			map[string]unix.Errno{"chroot": unix.ECONNREFUSED, "prctl": unix.ECONNREFUSED, "chmod": unix.ECONNREFUSED}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, call := range trySyscalls {
				want, wout := runProbe(t, bubblewrap, nil, c.opt, c.filters, probe, call)
				got, gout := runProbe(t, strBin, []string{"bwrap", "--str-profile", c.profile}, c.opt, c.filters, probe, call)
				// clone3's flags are in memory a filter cannot read: every
				// str policy answers ENOSYS (callers fall back to clone),
				// which bubblewrap's own test accepts as a kernel without it.
				if got != want && !(call == "clone3" && c.opt == "" && unix.Errno(got) == unix.ENOSYS) {
					t.Errorf("%s: str bwrap exits %d (%s), bubblewrap %d (%s)\nstr: %s\nbwrap: %s", call, got, unix.Errno(got), want, unix.Errno(want), gout, wout)
				}
				if e, ok := c.want[call]; ok && unix.Errno(want) != e {
					t.Errorf("%s: bubblewrap exits %d, this test expects %d (%s)", call, want, int(e), e)
				}
			}
		})
	}
	// The default profile keeps its filter when the line brings none.
	if got, out := runProbe(t, strBin, []string{"bwrap"}, "", nil, probe, "chroot"); unix.Errno(got) != unix.EPERM {
		t.Errorf("chroot under standard, no filter of the line's: exit %d, want EPERM (%d)\n%s", got, int(unix.EPERM), out)
	}
}

// nestedLine is a sandbox in the sandbox: the outer str bwrap line shows
// the host's root read-only with its own /proc and /dev, and runs the
// inner one as uid 1000. (As uid 0 without capabilities, which is what
// root is in a sandbox without --cap-add, the inner user namespace could
// not map it: the kernel maps a parent's uid 0 only for a creator that
// held CAP_SETFCAP, and bubblewrap inside bubblewrap fails the same way.)
func nestedLine(profile string, inner ...string) []string {
	return append([]string{"bwrap", "--str-profile", profile, "--unshare-user", "--uid", "1000", "--gid", "1000",
		"--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"}, inner...)
}

// TestBwrapNesting: under the nesting profile, bubblewrap runs inside
// str bwrap with every namespace, a fresh /proc and /dev (the outer
// sandbox's /proc is not masked, so the kernel lets the inner one mount
// its own), and so do str bwrap and str run; under the default profile the
// same nested bubblewrap fails with bubblewrap's own message, the
// sandbox's filter refusing its namespaces.
func TestBwrapNesting(t *testing.T) {
	needRoot(t)
	bubblewrap := "/usr/bin/bwrap"
	if _, err := os.Stat(bubblewrap); err != nil {
		mustwork.Skip(t, "needs the machine's bubblewrap (apt-get install bubblewrap)")
	}
	inner := []string{bubblewrap, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
		"sh", "-c", "test -r /proc/self/status && echo nested-ok"}
	out, err := exec.Command(strBin, nestedLine("nesting", inner...)...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "nested-ok") {
		t.Errorf("bubblewrap inside str bwrap under nesting: %v\n%s", err, out)
	}

	cmd := exec.Command(strBin, nestedLine("standard", inner...)...)
	out, _ = cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() == 0 || strings.Contains(string(out), "nested-ok") || !strings.Contains(string(out), "bwrap: No permissions to create new namespace") {
		t.Errorf("bubblewrap inside str bwrap under standard: exit %d, %q; want bubblewrap's own error", cmd.ProcessState.ExitCode(), out)
	}

	// str bwrap and str run inside str bwrap: the inner str is an
	// unprivileged user of the outer sandbox's user namespace, with no
	// cgroup to use, so its profile is an operator's best_effort copy of
	// standard (a directory every uid may read, outside the line's /tmp).
	dir, err := os.MkdirTemp("/var/tmp", "str-nesting-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	std, err := os.ReadFile("../../profiles/standard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	innerProfile := strings.Replace(strings.Replace(string(std), "name: standard\n", "name: innerbe\n", 1), "best_effort: false", "best_effort: true", 1)
	if !strings.Contains(innerProfile, "name: innerbe") || !strings.Contains(innerProfile, "best_effort: true") {
		t.Fatal("standard.yaml changed shape: update the test's inner profile")
	}
	if err := os.WriteFile(filepath.Join(dir, "innerbe.yaml"), []byte(innerProfile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, want string
		line       []string
	}{
		{"str bwrap", "nested-str-bwrap-ok", []string{strBin, "bwrap", "--str-profile", "innerbe", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
			"sh", "-c", "test -r /proc/self/status && echo nested-str-bwrap-ok"}},
		{"str run", "nested-str-run-ok", []string{strBin, "run", "--profile", "innerbe", "--", "/bin/sh", "-c", "echo nested-str-run-ok"}},
	} {
		line := append([]string{"--setenv", "STR_PROFILE_DIR", dir}, c.line...)
		out, err = exec.Command(strBin, nestedLine("nesting", line...)...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s inside str bwrap under nesting: %v\n%s", c.name, err, out)
		}
	}
}

// TestBwrapNestingRootless: the same nested bubblewrap under an
// unprivileged caller's str bwrap (uid 1000, in a cgroup v1 subtree
// delegated to it, as TestBwrapRootless): it works under nesting and
// fails with bubblewrap's own message under standard.
func TestBwrapNestingRootless(t *testing.T) {
	needRoot(t) // to set up the unprivileged user's delegated cgroup
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	if _, err := os.Stat("/usr/bin/bwrap"); err != nil {
		mustwork.Skip(t, "needs the machine's bubblewrap (apt-get install bubblewrap)")
	}
	dir, err := os.MkdirTemp("/var/tmp", "str-nesting-rootless-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	bin := strCopyIn(t, dir)
	const uid = 1000
	moves := delegatedCgroupMoves(t, uid)
	if len(moves) == 0 {
		mustwork.Skip(t, "no cgroup v1 controllers on this host (a v2 host runs the rootless tests in the VM)")
	}
	inner := `/usr/bin/bwrap --unshare-all --ro-bind / / --proc /proc --dev /dev sh -c 'test -r /proc/self/status && echo nested-ok'`
	for _, profile := range []string{"nesting", "standard"} {
		script := strings.Join(moves, " && ") + fmt.Sprintf(" && cd / && exec setpriv --reuid %d --regid %d --clear-groups %s bwrap --str-profile %s "+
			"--ro-bind / / --proc /proc --dev /dev --tmpfs /tmp %s", uid, uid, bin, profile, inner)
		out, err := exec.Command("/bin/sh", "-c", script).CombinedOutput()
		switch ok := err == nil && strings.Contains(string(out), "nested-ok"); {
		case profile == "nesting" && !ok:
			t.Errorf("bubblewrap inside a rootless str bwrap under nesting: %v\n%s", err, out)
		case profile == "standard" && (ok || !strings.Contains(string(out), "bwrap: No permissions to create new namespace")):
			t.Errorf("bubblewrap inside a rootless str bwrap under standard: %v\n%s; want bubblewrap's own refusal", err, out)
		}
	}
}
