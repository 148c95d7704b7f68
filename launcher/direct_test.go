package launcher

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/nsinit"
)

// probeScript prints what a tool sees of its sandbox: identity,
// capabilities, seccomp, no_new_privs, blocked and ignored signals, descriptors, mounts, root, work
// dir, host name, umask, rlimits and environment.
const probeScript = `id; grep -E '^(Cap|Seccomp|NoNewPrivs|Sig(Blk|Ign))' /proc/self/status; ls -l /proc/self/fd | sed 1d | cut -c1-10,44-;
cut -d' ' -f4- /proc/self/mountinfo; ls -la / /dev /etc | sed 's/ [A-Z][a-z][a-z] [ 0-9][0-9] [0-9:]* / DATE /';
pwd; hostname; umask; ulimit -a; env | sort; cat /proc/self/uid_map /proc/self/gid_map; echo "pid $$ ppid $PPID"`

// perRun matches what differs between any two sandboxes: the leased host
// ids, pipe inodes, pids, and /proc's link count (the host's processes).
var perRun = regexp.MustCompile(`\b18[0-9]{8}\b|pipe:\[[0-9]+\]|/proc/[0-9]+/|(?m)^dr-xr-xr-x +[0-9]+ .*proc$`)

var spaces = regexp.MustCompile(` +`)

// runProbe runs probeScript in profile, through str-init (STR_INIT=exec)
// or direct, and returns its output with what differs per run blanked.
func runProbe(t *testing.T, l *Launcher, profile, init string) (string, *Result) {
	t.Helper()
	t.Setenv("STR_INIT", init)
	var out bytes.Buffer
	res, err := l.Run(context.Background(), Request{Profile: profile, Argv: []string{"/bin/sh", "-c", probeScript}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatalf("%s %s: %v", profile, init, err)
	}
	if res.SetupError != nil || res.ExitCode != 0 {
		t.Fatalf("%s %s: exit %d, setup error %v\n%s", profile, init, res.ExitCode, res.SetupError, out.String())
	}
	// Runs of spaces collapsed: ls pads its columns to the widest value
	// (/proc's link count, the host's process count, among them).
	return spaces.ReplaceAllString(perRun.ReplaceAllString(out.String(), "N"), " "), res
}

// TestDirectMatchesInit: a direct sandbox (the init's steps compiled into
// the launcher's clone child) gives the tool exactly what str-init gives
// it, in every built-in profile: the same identity, capabilities,
// seccomp, descriptors, mounts with their options, files, limits and
// environment. Its output reaches a non-file writer (a pipe this process
// copies), as a worker's stderr does.
func TestDirectMatchesInit(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, profile := range []string{"restrictive", "standard", "permissive"} {
		viaInit, _ := runProbe(t, l, profile, "exec")
		direct, res := runProbe(t, l, profile, "")
		if viaInit != direct {
			t.Errorf("%s: the tool's view differs\n--- str-init\n%s\n--- direct\n%s", profile, viaInit, direct)
		}
		if !hasPhase(res.Timings, "nsinit_setup") || hasPhase(res.Timings, "launcher_plan_sent") {
			t.Errorf("%s: a direct sandbox's timings are not the direct path's: %+v", profile, res.Timings)
		}
	}
}

func hasPhase(ps []Phase, name string) bool {
	for _, p := range ps {
		if p.Name == name {
			return true
		}
	}
	return false
}

// TestDirectFailureMatchesInit: a step that fails in a direct sandbox is
// reported as str-init reports it: the same step, action, object and
// errno, and the same exit code (127 not found, 126 not executable).
func TestDirectFailureMatchesInit(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		argv []string
		code int
		step nsinit.Step
	}{
		{[]string{"no-such-tool-anywhere"}, nsinit.ExitNotFound, nsinit.StepResolveTool},
		{[]string{"/no/such/tool"}, nsinit.ExitNotFound, nsinit.StepResolveTool},
		{[]string{"/usr"}, nsinit.ExitCannotExec, nsinit.StepResolveTool},
		{[]string{"/etc/passwd"}, nsinit.ExitCannotExec, nsinit.StepResolveTool},
	} {
		var got [2]*nsinit.StepError
		for i, init := range []string{"exec", ""} {
			t.Setenv("STR_INIT", init)
			res, err := l.Run(context.Background(), Request{Profile: "standard", Argv: c.argv})
			if err != nil {
				t.Fatalf("%q: %v", c.argv, err)
			}
			if res.ExitCode != c.code || res.SetupError == nil {
				t.Fatalf("%q (STR_INIT=%q): exit %d, setup error %v; want exit %d", c.argv, init, res.ExitCode, res.SetupError, c.code)
			}
			if !errors.As(res.SetupError, &got[i]) {
				t.Fatalf("%q: %T is not a StepError", c.argv, res.SetupError)
			}
		}
		a, b := got[0], got[1]
		if a.Who != b.Who || a.Step != c.step || b.Step != c.step || a.Action != b.Action || a.Path != b.Path || a.Errno != b.Errno || a.Msg != b.Msg {
			t.Errorf("%q: str-init says %q, direct says %q", c.argv, a.Error(), b.Error())
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
