package nsinit

import (
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestStepErrorMessage(t *testing.T) {
	e := stepErr(StepMounts, "bind-mount", "/usr -> /newroot/usr", "MS_BIND|MS_REC", unix.EPERM)
	want := "nsinit: bind-mount /usr -> /newroot/usr (step 5, MS_BIND|MS_REC): operation not permitted"
	if e.Error() != want {
		t.Fatalf("%q\nwant %q", e.Error(), want)
	}
	e.Err = nil // as after a trip through JSON
	if e.Unwrap() != unix.EPERM {
		t.Fatalf("errno not recovered: %v", e.Unwrap())
	}
}

// The numbered list in SECURITY.md is DocList (the Step constants'
// descriptions), line for line: the steps and the threat model cannot
// drift.
func TestStepListsAgree(t *testing.T) {
	want := DocList()
	for _, f := range []struct{ path, prefix string }{{"../SECURITY.md", "    "}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, line := range strings.Split(string(data), "\n") {
			rest, ok := strings.CutPrefix(line, f.prefix)
			rest = strings.TrimLeft(rest, " ")
			if ok && len(rest) > 2 && rest[0] >= '0' && rest[0] <= '9' && strings.Contains(rest[:min(5, len(rest))], ". ") {
				got = append(got, rest)
			}
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: step list\n%s\nwant (nsinit.DocList)\n%s", f.path, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
	}
	if StepExec.String() != "21" || StepLCgroup.String() != "L1" || StepLTeardown.String() != "L8" || StepAwaitCall.String() != "10a" {
		t.Fatalf("step names: %s %s %s %s", StepExec, StepLCgroup, StepLTeardown, StepAwaitCall)
	}
}

// Step 3 takes a launcher's tree only from the trees it was given,
// skips an optional source the launcher found absent, and refuses an
// absent one that is not optional.
func TestStepCloneSourcesChecksTreeFDs(t *testing.T) {
	for _, bad := range []Mount{
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: FirstTreeFD(1) - 1}, // the report socket's place
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: FirstTreeFD(1) + 1}, // past the one tree
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: SourceAbsent},
	} {
		c := directConfig()
		c.Mounts[0] = bad
		_, err := CompileDirect(c, directFiles(t), 40, noLimit)
		var se *StepError
		if !errors.As(err, &se) || se.Step != StepCloneSources || se.Path != "/usr" {
			t.Errorf("tree_fd %d: %v", bad.TreeFD, err)
		}
	}
}

// Step 11 builds argv with the plan's Argv0 in place of the resolved
// path when one is set (bubblewrap's --argv0), and executes the path:
// argv[0] is the resolved path (stored by the child) or Argv0's.
func TestStepResolveToolArgv0(t *testing.T) {
	for _, argv0 := range []string{"", "my-name"} {
		c := directConfig()
		c.Argv0 = argv0
		p, err := CompileDirect(c, directFiles(t), 40, noLimit)
		if err != nil {
			t.Fatal(err)
		}
		stores := 0
		for i, o := range p.ops {
			if o.kind == opStorePtr && p.descs[i].step == StepResolveTool {
				stores++
			}
		}
		// execve's a[1] is the kept argv array; its [0] a kept C string.
		exec, got := p.ops[len(p.ops)-1], ""
		for _, k := range p.keep {
			if argv, ok := k.([]uintptr); ok && uintptr(unsafe.Pointer(&argv[0])) == exec.a[1] {
				for _, k := range p.keep {
					if b, ok := k.([]byte); ok && len(b) > 0 && uintptr(unsafe.Pointer(&b[0])) == argv[0] {
						got = string(b[:len(b)-1])
					}
				}
			}
		}
		switch {
		case argv0 == "" && stores != 1:
			t.Errorf("no Argv0: %d stores of the resolved path into argv[0], want 1", stores)
		case argv0 != "" && (stores != 0 || got != argv0):
			t.Errorf("Argv0 %q: argv[0] %q, %d stores of the resolved path", argv0, got, stores)
		}
		p.Release()
	}
}

// TestStep10aAwaitCall: step 10a takes exactly one call message with
// exactly the three stdio descriptors; fewer descriptors, a message that
// is not a call, or the launcher gone (EOF) are refused (the program
// then fails at step 10a, naming the report socket). The descriptors of
// the one that carries three are this process's own 0-2, so their dup3
// onto 0-2 changes nothing here (the success path runs in real
// sandboxes: test/integration TestServe*).
func TestStep10aAwaitCall(t *testing.T) {
	pair := func() (ours, init int) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
		return fds[0], fds[1]
	}
	call := new(callArea)
	call.init()
	for _, c := range []struct {
		name string
		msg  string
		fds  []int
		eof  bool
	}{
		{"two descriptors", "\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00a\x00/a\x00", []int{0, 1}, false},
		{"no descriptors", "\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00a\x00/a\x00", nil, false},
		{"not a call", `{"argv":["/bin/true"]}`, []int{0, 1, 2}, false},
		{"launcher gone", "", nil, true},
	} {
		ours, init := pair()
		if c.eof {
			unix.Close(ours)
		} else {
			var oob []byte
			if len(c.fds) > 0 {
				oob = unix.UnixRights(c.fds...)
			}
			if err := unix.Sendmsg(ours, []byte(c.msg), oob, nil, 0); err != nil {
				t.Fatal(err)
			}
		}
		before := countFDs(t)
		var n uintptr
		if errno, ok := awaitCallRaw(call, uintptr(init), &n); ok || errno != 0 {
			t.Errorf("%s: taken as a call (errno %d, ok %v)", c.name, errno, ok)
		}
		if after := countFDs(t); after > before+len(c.fds) {
			t.Errorf("%s: %d descriptors before, %d after", c.name, before, after)
		}
	}
	p, err := CompileDirect(func() *Config { c := directConfig(); c.AwaitCall = true; return c }(), directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	se, ok := failureOf(p, record(failureMagic, findOp(t, p, StepAwaitCall, "receive call"), 0))
	if !ok || se.Path != "report socket" || !strings.Contains(se.Error(), "(step 10a") {
		t.Errorf("a refused call: %v, want a step 10a error on the report socket", se)
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
