package nsinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// directConfig is a plan with every kind of step a Program compiles.
func directConfig() *Config {
	return &Config{
		Version: ConfigVersion,
		Mounts: []Mount{
			{Kind: MountBind, Source: "/usr", Target: "/usr", ReadOnly: true, TreeFD: FirstTreeFD(1)},
			{Kind: MountBind, Source: "/opt/gone", Target: "/opt", Optional: true, TreeFD: SourceAbsent},
			{Kind: MountSymlink, Source: "usr/bin", Target: "/bin"},
			{Kind: MountTmpfs, Target: "/tmp", Data: "size=1m"},
			{Kind: MountDir, Target: "/var/tmp", Mode: 0o1777},
			{Kind: MountFile, Target: "/etc/passwd", Contents: "root:x:0:0::/:/bin/sh\n", ReadOnly: true},
			{Kind: MountProc, Target: "/proc"},
			{Kind: MountMqueue, Target: "/dev/mqueue"},
			{Kind: MountDevpts, Target: "/dev/pts", Data: "newinstance"},
			{Kind: MountChmod, Target: "/tmp", Mode: 0o1777},
			{Kind: MountRemountRO, Target: "/etc"},
		},
		Hostname: "sandbox", LoopbackUp: true,
		Listen:  []Listener{{Name: "proxy", Network: "tcp", Addr: "127.0.0.1:3128"}, {Name: "dns-udp", Network: "udp", Addr: "127.0.0.1:53"}},
		Rlimits: []Rlimit{{Name: "RLIMIT_AS", Resource: unix.RLIMIT_AS, Value: 1 << 30}, {Name: "RLIMIT_NOFILE", Resource: unix.RLIMIT_NOFILE, Value: 128}},
		UID:     65534, GID: 65534, SetGroups: true,
		Argv: []string{"python3", "-c", "pass"}, Env: []string{"PATH=/usr/bin:/bin"}, Workdir: "/tmp",
		PassFDs: 1, CgroupTasks: []string{"/sys/fs/cgroup/memory/str/x/tasks"},
		SeccompPolicy: "test", Seccomp: make([]byte, 8*4), ExtraSeccomp: [][]byte{make([]byte, 8)},
	}
}

// directFiles are descriptor numbers for a Program; its one tree is a
// real directory (the compiler looks whether a tree is a directory).
func directFiles(t *testing.T) DirectFiles {
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dir.Close() })
	return DirectFiles{Stdio: [3]int{0, 1, 2}, Pass: []int{40}, Report: 41, Sync: [2]int{42, 43}, Trees: []int{int(dir.Fd())}}
}

func noLimit(int) (uint64, error) { return 1 << 62, nil }

// TestProgramFollowsTheStepList: a compiled program is the init's step
// list in order (after L4's child half): every step of the list is there,
// none goes back to an earlier one, and it ends in the tool's execve.
func TestProgramFollowsTheStepList(t *testing.T) {
	p, err := CompileDirect(directConfig(), directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[Step]bool{}
	last := Step(-1)
	for i, d := range p.descs {
		if d.step == StepLClone {
			if last != -1 {
				t.Fatalf("op %d (%s) of L4 after the init's step %s", i, d.action, last)
			}
			continue
		}
		if d.step < last {
			t.Fatalf("op %d (%s) is step %s after step %s", i, d.action, d.step, last)
		}
		last = d.step
		seen[d.step] = true
	}
	for s := StepCloseFDs; s < numInitSteps; s++ {
		if !seen[s] {
			t.Errorf("no operation performs step %s (%s)", s, stepTitles[s])
		}
	}
	if seen[StepReadPlan] {
		t.Errorf("a program has no plan to read (step 0)")
	}
	if o := p.ops[len(p.ops)-1]; o.nr != unix.SYS_EXECVE || o.exit != exitExec {
		t.Errorf("the last operation is syscall %d, not the execve", o.nr)
	}
	// RLIMIT_AS is set last (after it, the child could not even map a page).
	var limits []uintptr
	for _, o := range p.ops {
		if o.nr == unix.SYS_PRLIMIT64 {
			limits = append(limits, o.a[1])
		}
	}
	if len(limits) != 2 || limits[1] != unix.RLIMIT_AS {
		t.Errorf("rlimits set in the order %v, want RLIMIT_AS last", limits)
	}
}

// order is where a step comes in the list: a sub-step right after the
// step it follows.
func order(s Step) float64 {
	if sub, ok := subSteps[s]; ok {
		return float64(sub.after) + 0.5
	}
	return float64(s)
}

// TestPrebuiltProgram: a pre-built sandbox's program (str serve) waits
// for its call at 10a, after the network and before the tool is
// resolved, and takes argv, environment and paths from it.
func TestPrebuiltProgram(t *testing.T) {
	c := directConfig()
	c.AwaitCall, c.Argv, c.Env = true, nil, nil
	p, err := CompileDirect(c, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	last, await := -1.0, -1
	for i, d := range p.descs {
		if d.step == StepLClone {
			continue
		}
		if order(d.step) < last {
			t.Fatalf("op %d (%s) is step %s after a later one", i, d.action, d.step)
		}
		last = order(d.step)
		if p.ops[i].kind == opAwaitCall {
			await = i
		}
	}
	if await < 0 || p.descs[await].step != StepAwaitCall || p.ops[await].mem != unsafe.Pointer(p.mem.call) {
		t.Fatalf("no call awaited at 10a")
	}
}

// TestEncodeCall: the call's message is the three counts and the
// strings; what it cannot carry is refused, not cut.
func TestEncodeCall(t *testing.T) {
	b, err := EncodeCall([]string{"sh", "-c", "x"}, []string{"PATH=/a:/b", "A=1"})
	if err != nil {
		t.Fatal(err)
	}
	want := "sh\x00-c\x00x\x00PATH=/a:/b\x00A=1\x00/a/sh\x00/b/sh\x00"
	if binary.LittleEndian.Uint32(b) != 3 || binary.LittleEndian.Uint32(b[4:]) != 2 || binary.LittleEndian.Uint32(b[8:]) != 2 || string(b[12:]) != want {
		t.Errorf("message %q", b)
	}
	for name, c := range map[string][2][]string{
		"empty argv":     {nil, nil},
		"NUL":            {{"a\x00b"}, nil},
		"too many args":  {make([]string, MaxCallArgs+1), nil},
		"too many paths": {{"x"}, {"PATH=" + strings.Repeat("/d:", MaxCallPaths+1)}},
		"too large":      {{"x", strings.Repeat("y", MaxCallBytes)}, nil},
	} {
		if _, err := EncodeCall(c[0], c[1]); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

// failureOf is the StepError of a failure record of p.
func failureOf(p *Program, msg []byte) (*StepError, bool) {
	ev, ok := p.Event(msg)
	if !ok || ev.Type != "error" {
		return nil, false
	}
	return ev.Error, true
}

// listenersOf names the listeners of a listeners record of p.
func listenersOf(p *Program, msg []byte) ([]Listener, bool) {
	ev, ok := p.Event(msg)
	if !ok || ev.Type != "listeners" {
		return nil, false
	}
	return ev.Listeners, true
}

// record is a failure or warning record of operation i.
func record(magic [8]byte, i int, errno syscall.Errno) []byte {
	b := append(magic[:], make([]byte, 8)...)
	binary.LittleEndian.PutUint32(b[8:], uint32(i))
	binary.LittleEndian.PutUint32(b[12:], uint32(errno))
	return b
}

// findOp is the index of p's first operation of step with action.
func findOp(t *testing.T, p *Program, step Step, action string) int {
	t.Helper()
	for i, d := range p.descs {
		if d.step == step && d.action == action {
			return i
		}
	}
	t.Fatalf("no %q operation in step %s", action, step)
	return -1
}

// TestRootlessProgram: a rootless plan (no launcher trees; setgroups
// denied) clones each bind source in the child at step 3 (open O_PATH,
// the symlink check, open_tree, private), changes no id in L4's child
// half, and skips an optional source the launcher finds missing, mount
// point and all; a clone that fails names the source with the search
// hint for EACCES.
func TestRootlessProgram(t *testing.T) {
	c := directConfig()
	c.SetGroups = false
	c.Mounts[0].TreeFD = 0
	c.Mounts[1] = Mount{Kind: MountBind, Source: "/no/such/source", Target: "/gone", Optional: true}
	f := directFiles(t)
	f.Trees = nil
	p, err := CompileDirect(c, f, 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var clone []string
	for i, d := range p.descs {
		switch {
		case d.step == StepLClone && (d.action == "clone child: setresuid" || d.action == "clone child: setgroups"):
			t.Errorf("rootless L4 changes an id: %s", d.action)
		case d.step == StepCloneSources && d.action == "clone bind source":
			if d.path != "/usr" || d.hint != hintSearch || d.hintErrno != unix.EACCES {
				t.Errorf("op %d clones %q, hint %q for %v", i, d.path, d.hint, d.hintErrno)
			}
			clone = append(clone, d.detail)
		case strings.Contains(d.path, "/gone") || strings.Contains(d.path, "/no/such"):
			t.Errorf("op %d (%s %s) for the absent optional source", i, d.action, d.path)
		}
	}
	want := "open O_PATH,open O_PATH,open_tree OPEN_TREE_CLONE|AT_RECURSIVE,close,mount_setattr MS_PRIVATE AT_RECURSIVE"
	if strings.Join(clone, ",") != want {
		t.Errorf("step 3 clones /usr by %q, want %q", clone, want)
	}
	se, ok := failureOf(p, record(failureMagic, findOp(t, p, StepCloneSources, "clone bind source"), unix.EACCES))
	if !ok || se.Hint != hintSearch || !strings.Contains(se.Error(), "clone bind source /usr (step 3, open O_PATH)") {
		t.Errorf("clone EACCES: %v", se)
	}
}

// TestBestEffortProgram: a best-effort plan's /proc is a warning when its
// mount fails (the program goes on), named with the errno; a plan that
// is not best effort fails there, with the hint.
func TestBestEffortProgram(t *testing.T) {
	c := directConfig()
	c.BestEffort = true
	p, err := CompileDirect(c, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	i := findOp(t, p, StepMounts, "mount proc")
	for ; p.ops[i].kind == opFdPath; i++ {
	}
	if p.ops[i].kind != opSysWarn || p.ops[i].nr != unix.SYS_MOUNT {
		t.Fatalf("the proc mount is op kind %d, want a warning on failure", p.ops[i].kind)
	}
	ev, ok := p.Event(record(warningMagic, i, unix.EPERM))
	if !ok || ev.Type != "warning" || ev.Message != "best_effort: no fresh /proc (operation not permitted); the tool runs without /proc" {
		t.Errorf("warning: %+v %v", ev, ok)
	}
	if _, ok := p.Event(record(warningMagic, i-1, unix.EPERM)); ok {
		t.Error("a warning record of an operation that warns of nothing is an event")
	}
}

// TestTemplateProgram: a per-tool template's filter is loaded with
// seccomp(2) and SECCOMP_FILTER_FLAG_NEW_LISTENER (the profile's, before
// the caller's own, loaded through prctl), and sub-step 19a sends its listener on the report socket and
// closes it before the rlimits; a template plan without a filter is
// refused at step 19.
func TestTemplateProgram(t *testing.T) {
	c := directConfig()
	c.SeccompListener = true
	p, err := CompileDirect(c, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var loads []uintptr
	hand := -1
	for i, o := range p.ops {
		if o.nr == unix.SYS_SECCOMP {
			loads = append(loads, o.a[1])
			if o.a[1] != 0 && o.out == noSlot {
				t.Error("the listener is not kept")
			}
		}
		if o.nr == unix.SYS_PRCTL && o.a[0] == unix.PR_SET_SECCOMP {
			loads = append(loads, 0)
		}
		if o.nr == unix.SYS_SENDMSG && p.descs[i].step == StepHandListener {
			hand = i
		}
	}
	if len(loads) != 2 || loads[0] != unix.SECCOMP_FILTER_FLAG_NEW_LISTENER || loads[1] != 0 {
		t.Errorf("filters loaded with flags %v, want the listener's first", loads)
	}
	if hand < 0 || p.descs[hand+1].action != "close" || p.descs[hand+2].step != StepRlimits {
		t.Errorf("no hand-over at 19a followed by its close (op %d)", hand)
	}
	if ev, ok := p.Event(seccompLstRecord[:]); !ok || ev.Type != "seccomp_listener" {
		t.Errorf("the listener record: %+v %v", ev, ok)
	}
	c.Seccomp = nil
	_, err = CompileDirect(c, directFiles(t), 40, noLimit)
	var se *StepError
	if !errors.As(err, &se) || se.Step != StepSeccomp {
		t.Errorf("a template without a filter: %v", err)
	}
}

// TestStepSeccompRefusesMalformedProgram: step 19 takes 1 to
// BPF_MAXINSNS whole sock_filter records, the profile's and the
// caller's alike, and names the filter it refuses.
func TestStepSeccompRefusesMalformedProgram(t *testing.T) {
	for _, f := range [][]byte{make([]byte, 7), make([]byte, 8*4097)} {
		for _, extra := range []bool{false, true} {
			c := directConfig()
			name := c.SeccompPolicy
			if extra {
				c.ExtraSeccomp[0], name = f, "the caller's filter 1"
			} else {
				c.Seccomp = f
			}
			_, err := CompileDirect(c, directFiles(t), 40, noLimit)
			var se *StepError
			if !errors.As(err, &se) || se.Step != StepSeccomp || se.Path != name || !strings.Contains(se.Msg, "sock_filter records") {
				t.Errorf("%d bytes (extra %v): %v", len(f), extra, err)
			}
		}
	}
}

// TestProgramFailure: a failure record names its operation's step,
// action and object, with the errno (or the check's text for 0), as
// stepErr would; anything else on the report socket is not one.
func TestProgramFailure(t *testing.T) {
	p, err := CompileDirect(directConfig(), directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	se, ok := failureOf(p, record(failureMagic, findOp(t, p, StepMounts, "mount proc"), unix.EPERM))
	if !ok || se.Who != "nsinit" || se.Step != StepMounts || se.Path != "/proc" || !errors.Is(se, unix.EPERM) || se.Hint != hintProc {
		t.Errorf("mount proc EPERM: %+v", se)
	}
	se, ok = failureOf(p, record(failureMagic, findOp(t, p, StepChdir, "getcwd after chdir"), 0))
	if !ok || se.Msg != "working directory is not the planned one" || se.Errno != 0 {
		t.Errorf("getcwd check: %+v", se)
	}
	se, ok = failureOf(p, record(failureMagic, findOp(t, p, StepChdir, "chdir"), unix.EACCES))
	if !ok || se.Hint != hintWorkdir {
		t.Errorf("chdir EACCES: %+v", se)
	}
	se, ok = failureOf(p, record(failureMagic, findOp(t, p, StepLClone, "clone child: setresuid"), unix.EINVAL))
	if !ok || se.Who != "launcher" || !strings.Contains(se.Error(), "step L4") {
		t.Errorf("L4's child half: %+v", se)
	}
	for _, bad := range [][]byte{[]byte(`{"type":"error"}`), record(failureMagic, len(p.ops), unix.EPERM), record(failureMagic, 0, 0)[:12]} {
		if se, ok := failureOf(p, bad); ok {
			t.Errorf("%q taken as a failure record: %v", bad, se)
		}
	}
}

// BenchmarkCompileDirect: what compiling a plan costs the launcher per
// sandbox (issue 19: the per-sandbox work that is not isolation).
func BenchmarkCompileDirect(b *testing.B) {
	cfg := directConfig()
	dir, err := os.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer dir.Close()
	f := DirectFiles{Stdio: [3]int{0, 1, 2}, Pass: []int{40}, Report: 41, Sync: [2]int{42, 43}, Trees: []int{int(dir.Fd())}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := CompileDirect(cfg, f, 40, noLimit); err != nil {
			b.Fatal(err)
		}
	}
}

// TestRootEntries: a bubblewrap line's root hands the command exactly
// the entries made on the root tmpfs: not a mount point, not what lies
// under one (made before or after its mount), not a file bound onto
// itself, not an absent bind's mount point.
func TestRootEntries(t *testing.T) {
	got := rootEntries([]Mount{
		{Kind: MountDir, Target: "/a/b"},
		{Kind: MountTmpfs, Target: "/tmp"},
		{Kind: MountDir, Target: "/tmp/x"},
		{Kind: MountDir, Target: "/m/under"},
		{Kind: MountBind, Target: "/m", TreeFD: 7},
		{Kind: MountBind, Target: "/gone/dir", TreeFD: SourceAbsent},
		{Kind: MountSymlink, Source: "usr/bin", Target: "/bin"},
		{Kind: MountFile, Target: "/etc/ro", ReadOnly: true},
		{Kind: MountFile, Target: "/etc/rw"},
		{Kind: MountChmod, Target: "/a", Mode: 0o700},
	})
	want := "/ /a /a/b /bin /etc /etc/rw"
	if strings.Join(got, " ") != want {
		t.Errorf("root entries %q, want %q", got, want)
	}
}

// TestProgramListeners: a direct child hands its egress listeners over as
// one fixed record (sent by the program's sendmsg, its descriptors in the
// plan's order), which only that program's Listeners names; JSON events
// and failure records are not it.
func TestProgramListeners(t *testing.T) {
	cfg := directConfig()
	p, err := CompileDirect(cfg, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	sends := 0
	for i, o := range p.ops {
		if o.kind == opSys && o.nr == unix.SYS_SENDMSG {
			sends++
			if p.descs[i].step != StepLoopback {
				t.Errorf("operation %d sends at step %v, want %v", i, p.descs[i].step, StepLoopback)
			}
		}
	}
	var msgs []string
	for _, k := range p.keep {
		if m, ok := k.(*unix.Msghdr); ok {
			msgs = append(msgs, string(unsafe.Slice(m.Iov.Base, m.Iov.Len)))
		}
	}
	if sends != 1 || len(msgs) != 1 || msgs[0] != string(listenersRecord[:]) {
		t.Fatalf("%d sendmsg operations sending %q, want one sending the listeners record", sends, msgs)
	}
	ls, ok := listenersOf(p, listenersRecord[:])
	if !ok || len(ls) != len(cfg.Listen) || ls[0] != cfg.Listen[0] || ls[1] != cfg.Listen[1] {
		t.Fatalf("Listeners = %+v, %v; want %+v", ls, ok, cfg.Listen)
	}
	for _, msg := range [][]byte{[]byte(`{"type":"listeners","listeners":[]}`), failureMagic[:], append(listenersRecord[:], 0)} {
		if _, ok := listenersOf(p, msg); ok {
			t.Errorf("Listeners(%q) names listeners", msg)
		}
	}
	c := directConfig()
	c.Listen = nil
	q, err := CompileDirect(c, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Release()
	if _, ok := listenersOf(q, listenersRecord[:]); ok {
		t.Error("a program without listeners names some")
	}
}

// TestCallerFiltersOnly: a plan whose caller's filters replace the
// profile's (str bwrap, caller_seccomp: replace) loads exactly those, in
// their order, each through prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER)
// as bubblewrap does (an earlier filter then needs to allow prctl, not
// seccomp), after no_new_privs and before the rlimits.
func TestCallerFiltersOnly(t *testing.T) {
	c := directConfig()
	first, second := c.Seccomp, append([]byte(nil), c.Seccomp...)
	c.Seccomp, c.SeccompPolicy, c.ExtraSeccomp = nil, "", [][]byte{first, second}
	p, err := CompileDirect(c, directFiles(t), 40, noLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release()
	var names []string
	nnp := -1
	for i, o := range p.ops {
		if o.nr == unix.SYS_SECCOMP {
			t.Errorf("op %d: seccomp(2) load %q: the profile's filter is still loaded", i, p.descs[i].path)
		}
		if o.nr == unix.SYS_PRCTL && o.a[0] == unix.PR_SET_NO_NEW_PRIVS {
			nnp = i
		}
		if o.nr == unix.SYS_PRCTL && o.a[0] == unix.PR_SET_SECCOMP {
			if o.a[1] != unix.SECCOMP_MODE_FILTER || nnp < 0 || p.descs[i].step != StepSeccomp {
				t.Errorf("op %d: %+v (no_new_privs at op %d)", i, o.a, nnp)
			}
			names = append(names, p.descs[i].path)
		}
	}
	if !slices.Equal(names, []string{"the caller's filter 1", "the caller's filter 2"}) {
		t.Errorf("loaded %q, want the caller's two filters in order", names)
	}
}

// TestProgramManyBindSources: bubblewrap has no low limit on binds, nor
// does a plan: MaxBindSources sources compile in both modes (each holds
// a slot until step 5: the launcher's tree, or the child's own clone).
// More sources than the slots hold fail with the compiler's own error
// (the launcher's plan refuses them before: launcher.checkBindSources).
func TestProgramManyBindSources(t *testing.T) {
	for _, rootless := range []bool{false, true} {
		for _, n := range []int{MaxBindSources, maxSlots} {
			c := directConfig()
			f := directFiles(t)
			tree := f.Trees[0]
			c.Mounts, f.Trees = nil, nil
			for i := 0; i < n; i++ {
				m := Mount{Kind: MountBind, Source: "/usr", Target: fmt.Sprintf("/b/%d", i), ReadOnly: true}
				if !rootless {
					m.TreeFD = FirstTreeFD(1) + i
					f.Trees = append(f.Trees, tree)
				}
				c.Mounts = append(c.Mounts, m)
			}
			if rootless {
				c.SetGroups = false
			}
			p, err := CompileDirect(c, f, 40, noLimit)
			switch {
			case n == MaxBindSources && err != nil:
				t.Errorf("rootless %v: %d bind sources: %v", rootless, n, err)
			case n > MaxBindSources && (err == nil || !strings.Contains(err.Error(), "too many descriptors")):
				t.Errorf("rootless %v: %d bind sources compiled (%v), want too many descriptors", rootless, n, err)
			}
			if err == nil {
				p.Release()
			}
		}
	}
}
