package nsinit

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mkdirAll never follows a symlink: a link planted in the tree is refused.
func TestMkdirAllRefusesSymlinks(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	if fd, err := mkdirAll(rfd, "/evil/sub", 0o755); err == nil {
		unix.Close(fd)
		t.Fatal("mkdirAll followed a symlink")
	}
	if _, err := os.Stat(filepath.Join(outside, "sub")); err == nil {
		t.Fatal("a directory was created through the symlink")
	}
	fd, err := mkdirAll(rfd, "/a/b/c", 0o755)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st, err := os.Stat(filepath.Join(root, "a/b/c")); err != nil || !st.IsDir() {
		t.Fatalf("a/b/c not created: %v", err)
	}
	if _, err := mkdirAll(rfd, "/a/../x", 0o755); err == nil {
		t.Fatal(".. accepted")
	}
}

func TestStepErrorMessage(t *testing.T) {
	e := stepErr(StepMounts, "bind-mount", "/usr -> /newroot/usr", "MS_BIND|MS_REC", unix.EPERM)
	want := "nsinit: bind-mount /usr -> /newroot/usr (step 5, MS_BIND|MS_REC): operation not permitted"
	if e.Error() != want {
		t.Fatalf("%q\nwant %q", e.Error(), want)
	}
	e.Err = nil // as after the report pipe
	if e.Unwrap() != unix.EPERM {
		t.Fatalf("errno not recovered: %v", e.Unwrap())
	}
}

// The numbered list in run's doc comment and in SECURITY.md is DocList,
// line for line: the steps, the code and the threat model cannot drift.
func TestStepListsAgree(t *testing.T) {
	want := DocList()
	for _, f := range []struct{ path, prefix string }{{"nsinit.go", "//  "}, {"../SECURITY.md", "    "}} {
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

func TestLayoutFromArgs(t *testing.T) {
	l, err := layoutFromArgs([]string{"str-init", "2"})
	if err != nil || l != (fdLayout{pass: 2, config: 5, report: 6, trees: 7}) {
		t.Fatalf("%+v %v", l, err)
	}
	for _, bad := range []string{"-1", "x", "65"} {
		if _, err := layoutFromArgs([]string{"str-init", bad}); err == nil {
			t.Errorf("argv[1] %q accepted", bad)
		}
	}
}

// prepareExec puts RLIMIT_AS last and never raises a limit above the
// current hard one.
func TestPrepareExecOrder(t *testing.T) {
	var nofile unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &nofile); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{Argv: []string{"/bin/true", "a"}, Env: []string{"A=1"}, Rlimits: []Rlimit{
		{Name: "RLIMIT_AS", Resource: unix.RLIMIT_AS, Value: 1 << 29},
		{Name: "RLIMIT_NOFILE", Resource: unix.RLIMIT_NOFILE, Value: nofile.Max + 1},
		{Name: "RLIMIT_CORE", Resource: unix.RLIMIT_CORE},
	}}
	ex, err := prepareExec(cfg, "/bin/true")
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.limits) != 3 || ex.limits[2].name != "RLIMIT_AS" {
		t.Fatalf("limits %+v: RLIMIT_AS must be last", ex.limits)
	}
	if ex.limits[0].lim.Max != nofile.Max {
		t.Fatalf("RLIMIT_NOFILE %d raised above the hard limit %d", ex.limits[0].lim.Max, nofile.Max)
	}
	if len(ex.argv) != 3 || ex.argv[2] != nil || len(ex.envp) != 2 || ex.envp[1] != nil {
		t.Fatalf("argv/envp not NULL-terminated: %d %d", len(ex.argv), len(ex.envp))
	}
}

// Step 3 takes a launcher's tree only from the trees' part of the layout,
// skips an optional source the launcher found absent, and refuses an
// absent one that is not optional.
func TestTakeSourcesChecksTreeFDs(t *testing.T) {
	fds, err := layoutFromArgs([]string{"str-init", "1"})
	if err != nil {
		t.Fatal(err)
	}
	ok := []Mount{
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: 6},
		{Kind: MountFile, Target: "/etc/hosts"},
		{Kind: MountBind, Source: "/opt", Target: "/opt", Optional: true, TreeFD: SourceAbsent},
		{Kind: MountDevNode, Source: "/dev/null", Target: "/dev/null", TreeFD: 7},
	}
	got, err := takeSources(ok, fds)
	if err != nil || len(got) != 4 || got[0] != 6 || got[1] != -1 || got[2] != -1 || got[3] != 7 {
		t.Fatalf("takeSources: %v %v", got, err)
	}
	for _, bad := range []Mount{
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: 5},                  // the report socket
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: 6 + MaxBindSources}, // past the trees
		{Kind: MountBind, Source: "/usr", Target: "/usr", TreeFD: SourceAbsent},
	} {
		_, err := takeSources([]Mount{bad}, fds)
		var se *StepError
		if !errors.As(err, &se) || se.Step != StepCloneSources || se.Path != "/usr" {
			t.Errorf("tree_fd %d: %v", bad.TreeFD, err)
		}
	}
}

// Step 5's mounts of files, directories and chmods get their planned modes exactly
// (the init's umask 022 would strip group and other write bits), missing
// parents get parentMode, an existing directory keeps its own, and a
// chmod never follows a symlink. A plain directory stands in for the new
// root: none of these needs a privilege.
func TestStepMountsModes(t *testing.T) {
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "existing"), 0o710); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/", filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rfd)
	cfg := &Config{}
	for _, m := range []Mount{
		{Kind: MountFile, Target: "/f666", Mode: 0o666, Contents: "x"},
		{Kind: MountFile, Target: "/fdefault"},
		{Kind: MountDir, Target: "/sticky", Mode: 0o1777},
		{Kind: MountDir, Target: "/existing", Mode: 0o755},
		{Kind: MountDir, Target: "/p0640/dir", Mode: 0o640},
		{Kind: MountDir, Target: "/p0604/dir", Mode: 0o604},
		{Kind: MountDir, Target: "/pdefault/dir"}, // mode 0: the default, 0755
		{Kind: MountDir, Target: "/c"},
		{Kind: MountChmod, Target: "/c", Mode: 0o1755},
	} {
		if err := doMount(nil, cfg, rfd, m, -1); err != nil {
			t.Fatalf("%s %s: %v", m.Kind, m.Target, err)
		}
	}
	for path, want := range map[string]os.FileMode{
		"f666": 0o666, "fdefault": 0o644, "sticky": 0o777 | os.ModeSticky, "existing": 0o710,
		"p0640": 0o750, "p0640/dir": 0o640, "p0604": 0o705, "pdefault": 0o755, "pdefault/dir": 0o755, "c": 0o755 | os.ModeSticky,
	} {
		fi, err := os.Lstat(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode() & (os.ModePerm | os.ModeSticky); got != want {
			t.Errorf("%s: mode %v, want %v", path, got, want)
		}
	}
	err = doMount(nil, cfg, rfd, Mount{Kind: MountChmod, Target: "/link/etc", Mode: 0o777}, -1)
	var se *StepError
	if !errors.As(err, &se) || se.Step != StepMounts || !errors.Is(err, errSymlinkOnPath) {
		t.Fatalf("chmod through a symlink: %v, want a step 5 error naming the symlink", err)
	}
	if err := doMount(nil, cfg, rfd, Mount{Kind: MountChmod, Target: "/missing", Mode: 0o700}, -1); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("chmod of a missing path: %v, want ENOENT", err)
	}
}

// Step 11 builds argv with the plan's Argv0 in place of the resolved
// path when one is set (bubblewrap's --argv0), and executes the path.
func TestStepResolveToolArgv0(t *testing.T) {
	for _, tc := range []struct{ argv0, want string }{{"", "/bin/true"}, {"my-name", "my-name"}} {
		ex, err := prepareExec(&Config{Argv: []string{"true", "a"}, Argv0: tc.argv0}, "/bin/true")
		if err != nil {
			t.Fatal(err)
		}
		got := unix.BytePtrToString(ex.argv[0])
		if got != tc.want || unix.BytePtrToString(ex.path) != "/bin/true" || unix.BytePtrToString(ex.argv[1]) != "a" {
			t.Fatalf("argv0 %q: argv[0] %q path %q, want %q and /bin/true", tc.argv0, got, unix.BytePtrToString(ex.path), tc.want)
		}
	}
}

// TestStep10aAwaitCall: step 10a takes exactly one call message with
// exactly the three stdio descriptors; fewer descriptors, a message that
// is not a Call, or the launcher gone (EOF) fail at step 10a, naming the
// report socket, before anything is dup3'd onto 0-2 (the success path,
// which replaces this process's stdio, runs in real sandboxes:
// test/integration TestServe*).
func TestStep10aAwaitCall(t *testing.T) {
	pair := func() (ours, init int) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
		return fds[0], fds[1]
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	nul := int(devnull.Fd())
	for _, c := range []struct {
		name string
		msg  string
		fds  []int
		eof  bool
	}{
		{"two descriptors", `{"argv":["/bin/true"]}`, []int{nul, nul}, false},
		{"no descriptors", `{"argv":["/bin/true"]}`, nil, false},
		{"not JSON", `argv`, []int{nul, nul, nul}, false},
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
		_, err := awaitCall(init)
		var se *StepError
		if !errors.As(err, &se) || se.Step != StepAwaitCall || se.Path != "report socket" || !strings.Contains(se.Error(), "(step 10a") {
			t.Errorf("%s: %v, want a step 10a error on the report socket", c.name, err)
		}
		if after := countFDs(t); after > before+len(c.fds) {
			t.Errorf("%s: %d descriptors before, %d after", c.name, before, after)
		}
	}
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}
