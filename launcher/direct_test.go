package launcher

import (
	"bufio"
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/nsinit"
)

func hasPhase(ps []Phase, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// TestStepResolveFailure: a tool that cannot be found or executed fails
// at step 11, named with its argv[0] and errno, with str's exit code (127
// not found, 126 not executable); the child's setup is one timed phase.
func TestStepResolveFailure(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		argv  []string
		code  int
		errno unix.Errno
	}{
		{[]string{"no-such-tool-anywhere"}, nsinit.ExitNotFound, unix.ENOENT},
		{[]string{"/no/such/tool"}, nsinit.ExitNotFound, unix.ENOENT},
		{[]string{"/usr"}, nsinit.ExitCannotExec, unix.EACCES},
		{[]string{"/etc/passwd"}, nsinit.ExitCannotExec, unix.EACCES},
	} {
		res, err := l.Run(context.Background(), Request{Profile: "standard", Argv: c.argv})
		if err != nil {
			t.Fatalf("%q: %v", c.argv, err)
		}
		var se *nsinit.StepError
		if res.ExitCode != c.code || !errors.As(res.SetupError, &se) {
			t.Fatalf("%q: exit %d, setup error %v; want exit %d", c.argv, res.ExitCode, res.SetupError, c.code)
		}
		if se.Who != "nsinit" || se.Step != nsinit.StepResolveTool || se.Action != "resolve tool" || se.Path != c.argv[0] || !errors.Is(se, c.errno) {
			t.Errorf("%q: %q (errno %d), want step 11 resolve tool %s: %v", c.argv, se.Error(), se.Errno, c.argv[0], c.errno)
		}
		if !hasPhase(res.Timings, "nsinit_setup") {
			t.Errorf("%q: no nsinit_setup phase: %+v", c.argv, res.Timings)
		}
	}
}

// TestDirectChildMemory: a direct sandbox's child shares the launcher's
// address space (CLONE_VM, linux/amd64) while it runs the steps and waits
// for its call, and the tool it executes has its own: nothing of the
// launcher's memory reaches the tool (kcmp KCMP_VM: 0 is the same mm).
func TestDirectChildMemory(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Create(context.Background(), Request{Profile: "restrictive", AwaitCall: true, Idle: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Kill()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	<-s.AwaitingCall()
	sameMM := func() bool {
		r, _, e := unix.Syscall6(unix.SYS_KCMP, uintptr(os.Getpid()), uintptr(s.Pid()), kcmpVM, 0, 0, 0)
		if e != 0 {
			t.Fatalf("kcmp %d %d KCMP_VM: %v", os.Getpid(), s.Pid(), e)
		}
		return r == 0
	}
	if got := sameMM(); got != nsinit.CloneSharesMemory {
		t.Fatalf("the waiting child shares the launcher's memory: %v, want %v (CLONE_VM on this architecture)", got, nsinit.CloneSharesMemory)
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer inW.Close()
	defer outR.Close()
	if err := s.Call([]string{"/bin/sh", "-c", "echo executed; read x"}, nil, [nsinit.CallFDs]*os.File{inR, outW, outW}, time.Minute); err != nil {
		t.Fatal(err)
	}
	inR.Close()
	outW.Close()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil || line != "executed\n" {
		t.Fatalf("the tool said %q, %v", line, err)
	}
	if sameMM() {
		t.Fatal("the tool shares the launcher's memory after its execve")
	}
	inW.Write([]byte("\n"))
	res, err := s.Wait()
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exit %v, %v", res, err)
	}
}

// kcmpVM is the kernel's KCMP_VM (include/uapi/linux/kcmp.h).
const kcmpVM = 1

// TestDirectSandboxesHoldNoThread: running direct sandboxes hold no
// thread of the launcher each. Their clones come from nsinit's one
// cloner thread (the parent-death signal follows that thread, which
// lives as long as the process), and the report socket and the child's
// pidfd are waited on by the runtime's poller: a worker or str serve
// with many sandboxes does not grow a locked thread per sandbox.
func TestDirectSandboxesHoldNoThread(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	threads := func() int {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`(?m)^Threads:\s+(\d+)`).FindSubmatch(b)
		n, _ := strconv.Atoi(string(m[1]))
		return n
	}
	var boxes []*Sandbox
	defer func() {
		for _, s := range boxes {
			s.Kill()
			s.Wait()
		}
	}()
	start := func() {
		s, err := l.Create(context.Background(), Request{Profile: "restrictive", Argv: []string{"/bin/sleep", "60"}})
		if err != nil {
			t.Fatal(err)
		}
		boxes = append(boxes, s)
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	// One sandbox first: the cloner's thread, and any other a setup
	// needs, exist before the count starts.
	start()
	before := threads()
	const n = 16
	for range n {
		start()
	}
	if grew := threads() - before; grew >= n/2 {
		t.Fatalf("%d running sandboxes added %d threads to the launcher (a locked thread each would add %d)", n, grew, n)
	}
}

// runPlan runs req with mounts added to its plan, the tool as uid and gid
// 0 of its namespace (the owner of what the init makes).
func runPlan(t *testing.T, l *Launcher, req Request, mounts ...nsinit.Mount) (*Result, string) {
	t.Helper()
	pl, err := l.Plan(req)
	if err != nil {
		t.Fatal(err)
	}
	pl.Child.Mounts = append(pl.Child.Mounts, mounts...)
	pl.Child.UID, pl.Child.GID = 0, 0
	var out strings.Builder
	req.Stdout, req.Stderr = &out, &out
	s, err := l.CreateFromPlan(context.Background(), pl, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return res, out.String()
}

// TestStepMountsModes: step 5's files, directories and chmods get their
// planned modes exactly (the child's umask 022 would strip group and
// other write bits), missing parents get parentMode, and a chmod never
// follows a symlink on its path (step 5 fails, naming it).
func TestStepMountsModes(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	paths := []string{"/m/f666", "/m/fdefault", "/m/sticky", "/m/p0640", "/m/p0640/dir", "/m/p0604", "/m/p0604/dir", "/m/pdefault", "/m/pdefault/dir", "/m/c"}
	res, out := runPlan(t, l, Request{Profile: "restrictive", Argv: append([]string{"/usr/bin/stat", "-c", "%a %n"}, paths...)},
		nsinit.Mount{Kind: nsinit.MountFile, Target: "/m/f666", Mode: 0o666, Contents: "x"},
		nsinit.Mount{Kind: nsinit.MountFile, Target: "/m/fdefault"},
		nsinit.Mount{Kind: nsinit.MountDir, Target: "/m/sticky", Mode: 0o1777},
		nsinit.Mount{Kind: nsinit.MountDir, Target: "/m/p0640/dir", Mode: 0o640},
		nsinit.Mount{Kind: nsinit.MountDir, Target: "/m/p0604/dir", Mode: 0o604},
		nsinit.Mount{Kind: nsinit.MountDir, Target: "/m/pdefault/dir"}, // mode 0: the default, 0755
		nsinit.Mount{Kind: nsinit.MountDir, Target: "/m/c"},
		nsinit.Mount{Kind: nsinit.MountChmod, Target: "/m/c", Mode: 0o1755},
	)
	want := "666 /m/f666\n644 /m/fdefault\n1777 /m/sticky\n750 /m/p0640\n640 /m/p0640/dir\n705 /m/p0604\n604 /m/p0604/dir\n755 /m/pdefault\n755 /m/pdefault/dir\n1755 /m/c\n"
	if out != want {
		t.Errorf("modes:\n%s\nwant\n%s(exit %d, %v)", out, want, res.ExitCode, res.SetupError)
	}
	// Neither a chmod nor a new directory goes through a symlink: a
	// chmod names it, mkdir's open of the link O_NOFOLLOW fails.
	for _, m := range []nsinit.Mount{
		{Kind: nsinit.MountChmod, Target: "/link/etc", Mode: 0o777},
		{Kind: nsinit.MountDir, Target: "/link/sub"},
	} {
		res, out = runPlan(t, l, Request{Profile: "restrictive", Argv: []string{"/bin/true"}},
			nsinit.Mount{Kind: nsinit.MountSymlink, Source: "/tmp", Target: "/link"}, m)
		var se *nsinit.StepError
		if !errors.As(res.SetupError, &se) || se.Step != nsinit.StepMounts || se.Path != m.Target || res.ExitCode != nsinit.ExitSetupFailed {
			t.Errorf("%s through a symlink: %v (%s), want a step 5 error", m.Kind, res.SetupError, out)
		}
		if m.Kind == nsinit.MountChmod && !strings.Contains(se.Msg, "symlink") {
			t.Errorf("chmod through a symlink: %v, want the symlink named", se)
		}
	}
}
