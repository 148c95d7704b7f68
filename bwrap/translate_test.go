package bwrap

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/seccomp"
	"golang.org/x/sys/unix"
)

func testHost(t *testing.T, uid int) Host {
	t.Helper()
	return Host{
		UID: uid, GID: uid, Root: uid == 0, Hostname: "host", Environ: []string{"HOME=/home/u", "PATH=/bin", "SECRET=x", "PWD=/caller"}, Cwd: t.TempDir(),
		Lstat: os.Lstat, Stat: os.Stat, ReadDir: os.ReadDir, Readlink: os.Readlink,
		ReadFD: func(fd int) ([]byte, error) {
			if fd == 7 {
				return []byte("file contents\n"), nil
			}
			return nil, errors.New("bad file descriptor")
		},
	}
}

func translate(t *testing.T, h Host, line ...string) (*Sandbox, error) {
	t.Helper()
	c, err := Parse(line, noFD)
	if err != nil {
		t.Fatalf("Parse(%q): %v", line, err)
	}
	return Translate(c, h)
}

// Every refused option is an error that names it and says why; all of a
// line's refusals are reported together.
func TestTranslateRefusals(t *testing.T) {
	h := testHost(t, 1000)
	for _, o := range options {
		why, ok := refused[o.Name]
		if !ok {
			continue
		}
		line := []string{o.Name}
		for i, k := range o.Args {
			s, _ := sample(k, i)
			line = append(line, s)
		}
		if o.Name == "--overlay-src" {
			line = append(line, "--tmp-overlay", "/o")
		}
		_, err := translate(t, h, append(line, "true")...)
		var u *Unsupported
		if !errors.As(err, &u) || u.Option != o.Name || u.Why != why || !strings.Contains(err.Error(), o.Name+": not supported by str bwrap: ") {
			t.Errorf("%s: %v", o.Name, err)
		}
	}
	_, err := translate(t, h, "--userns2", "3", "--exec-label", "x", "true")
	if err == nil || !strings.Contains(err.Error(), "--userns2") || !strings.Contains(err.Error(), "--exec-label") {
		t.Errorf("two refusals: %v", err)
	}
}

// --userns and --pidns: the descriptors to join, bubblewrap's rules and
// words, and str's own refusals.
func TestTranslateJoinNamespaces(t *testing.T) {
	h := testHost(t, 1000)
	sb, err := translate(t, h, "--userns", "11", "--pidns", "12", "--uid", "5", "true")
	if err != nil || sb.UserNS != 11 || sb.PidNS != 12 || sb.UID != 5 {
		t.Fatalf("--userns 11 --pidns 12 --uid 5: %+v, %v", sb, err)
	}
	if sb, err := translate(t, h, "true"); err != nil || sb.UserNS != -1 || sb.PidNS != -1 {
		t.Fatalf("no join: %+v, %v", sb, err)
	}
	for _, c := range []struct {
		line []string
		want string
	}{
		{[]string{"--userns", "3", "--unshare-user"}, "--userns not compatible --unshare-user"},
		{[]string{"--unshare-user-try", "--userns", "3"}, "--userns not compatible --unshare-user-try"},
		{[]string{"--unshare-all", "--userns", "3"}, "--userns not compatible --unshare-user-try"},
		{[]string{"--pidns", "3"}, "--pidns: not supported by str bwrap: it needs --userns"},
		{[]string{"--userns", "3", "--pidns", "4", "--unshare-pid"}, "--pidns: not supported by str bwrap: with --unshare-pid"},
	} {
		if _, err := translate(t, h, append(c.line, "true")...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.line, err, c.want)
		}
	}
}

// --cap-add and --cap-drop, in the line's order, make the mask of the
// capabilities the command keeps (in its own user namespace); a line
// without --cap-add keeps none, whatever it drops.
func TestTranslateCaps(t *testing.T) {
	const netAdmin, sysAdmin = 1 << 12, 1 << 21
	all := uint64(1)<<41 - 1
	for _, c := range []struct {
		line []string
		want uint64
	}{
		{nil, 0},
		{[]string{"--cap-drop", "ALL"}, 0},
		{[]string{"--cap-add", "CAP_NET_ADMIN"}, netAdmin},
		{[]string{"--cap-add", "net_admin", "--cap-add", "CAP_SYS_ADMIN"}, netAdmin | sysAdmin},
		{[]string{"--cap-add", "ALL", "--cap-drop", "CAP_SYS_ADMIN"}, all &^ sysAdmin},
		{[]string{"--cap-drop", "CAP_SYS_ADMIN", "--cap-add", "ALL"}, all},
		{[]string{"--cap-add", "ALL", "--cap-drop", "ALL", "--cap-add", "CAP_NET_ADMIN"}, netAdmin},
	} {
		for _, uid := range []int{0, 1000} {
			sb, err := translate(t, testHost(t, uid), append(c.line, "true")...)
			if err != nil || sb.Caps != c.want {
				t.Errorf("uid %d, %q: caps %#x, %v; want %#x", uid, c.line, sb.Caps, err, c.want)
			}
		}
	}
}

// The reference runtime's Python worker's line (sandbox_runner.py,
// _build_bwrap_command), with a fixture root in place of /.
func TestTranslateWorkerLine(t *testing.T) {
	h := testHost(t, 0)
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "etc", "proc", "dev", "tmp", "var", "work/task"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/bin", filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "marker"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(root, "work/task")
	sb, err := translate(t, h, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
		"--ro-bind", root, "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", work, "/work/task",
		"--chdir", "/work/task", "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "HOME", "/tmp",
		"--setenv", "PYTHONPATH", "/tools", "--", "python3", "-m", "runner", "args.json")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range sb.Mounts {
		got = append(got, string(m.Kind)+" "+m.Target)
	}
	want := []string{
		"symlink /bin", "bind /etc", "bind /marker", "bind /usr", "bind /var", "bind /work", // the root's entries but those mounted over later
		"proc /proc",
		"tmpfs /dev", "devnode /dev/null", "devnode /dev/zero", "devnode /dev/full", "devnode /dev/random", "devnode /dev/urandom", "devnode /dev/tty",
		"symlink /dev/fd", "symlink /dev/stdin", "symlink /dev/stdout", "symlink /dev/stderr", "symlink /dev/core", "dir /dev/shm", "devpts /dev/pts", "symlink /dev/ptmx",
		"tmpfs /tmp", "bind /work/task",
	}
	if !slices.Equal(got, want) {
		t.Errorf("mounts\n got %q\nwant %q", got, want)
	}
	for _, m := range sb.Mounts {
		if m.Kind == nsinit.MountBind && m.ReadOnly != (m.Target != "/work/task") {
			t.Errorf("%s read-only %v", m.Target, m.ReadOnly)
		}
	}
	if sb.Mounts[0].Source != "usr/bin" {
		t.Errorf("/bin symlink -> %q", sb.Mounts[0].Source)
	}
	if !slices.Equal(sb.Argv, []string{"python3", "-m", "runner", "args.json"}) || sb.Workdir != "/work/task" || sb.ShareNet || !sb.DieWithParent {
		t.Errorf("sandbox %+v", sb)
	}
	wantEnv := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "PYTHONPATH=/tools", "PWD=/work/task"}
	if !slices.Equal(sb.Env, wantEnv) {
		t.Errorf("env %q, want %q (clearenv keeps only PWD, then PWD is the working directory)", sb.Env, wantEnv)
	}
	if sb.UID != 0 || sb.GID != 0 || sb.Hostname != "host" {
		t.Errorf("ids %d:%d hostname %q, want the caller's 0:0 and the host's name", sb.UID, sb.GID, sb.Hostname)
	}
}

func TestTranslateMountsAndProcess(t *testing.T) {
	h := testHost(t, 1000)
	src := t.TempDir()
	sb, err := translate(t, h, "--unshare-all", "--share-net", "--uid", "0", "--gid", "5", "--hostname", "box",
		"--bind-try", "/nonexistent-bwrap-src", "/x", "--ro-bind-try", src, "/s",
		"--perms", "0700", "--size", "8192", "--tmpfs", "/t", "--perms", "0750", "--dir", "/t/d",
		"--symlink", "../t", "/l", "--perms", "0600", "--file", "7", "/t/f",
		"--unsetenv", "SECRET", "--setenv", "A", "1", "--info-fd", "3", "--json-status-fd", "4", "--sync-fd", "5", "--sync-fd", "6", "--block-fd", "7", "--block-fd", "8", "sh")
	if err != nil {
		t.Fatal(err)
	}
	want := []nsinit.Mount{
		{Kind: nsinit.MountBind, Source: src, Target: "/s", ReadOnly: true},
		{Kind: nsinit.MountTmpfs, Target: "/t", Data: "mode=0700,size=8192,uid=0,gid=5"},
		{Kind: nsinit.MountDir, Target: "/t/d", Mode: 0o750},
		{Kind: nsinit.MountSymlink, Source: "../t", Target: "/l"},
		{Kind: nsinit.MountFile, Target: "/t/f", Contents: "file contents\n", Mode: 0o600},
	}
	if !slices.Equal(sb.Mounts, want) {
		t.Errorf("mounts\n got %+v\nwant %+v", sb.Mounts, want)
	}
	if sb.UID != 0 || sb.GID != 5 || sb.Hostname != "box" || !sb.ShareNet || sb.InfoFD != 3 || sb.JSONStatusFD != 4 || !slices.Equal(sb.SyncFDs, []int{5, 6}) || sb.BlockFD != 8 {
		t.Errorf("sandbox %+v", sb)
	}
	// No --chdir and the caller's directory not shown: $HOME is not
	// either, so /; PWD says so.
	wantEnv := []string{"HOME=/home/u", "PATH=/bin", "A=1", "PWD=/"}
	if sb.Workdir != "/" || !slices.Equal(sb.Env, wantEnv) {
		t.Errorf("workdir %q env %q, want / %q", sb.Workdir, sb.Env, wantEnv)
	}
}

// Without --chdir the caller's directory is kept when a bind shows it.
func TestTranslateKeepsVisibleCwd(t *testing.T) {
	h := testHost(t, 1000)
	sb, err := translate(t, h, "--bind", h.Cwd, h.Cwd, "pwd")
	if err != nil || sb.Workdir != h.Cwd {
		t.Fatalf("workdir %q, %v; want %s", sb.Workdir, err, h.Cwd)
	}
	// As root, root's files are the sandbox's root's through every bind
	// (MapRoot): a 0700 directory of root's is kept, read-only too; one
	// of another uid is entered by its "other" bits only, so not kept.
	if err := os.Chmod(h.Cwd, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		hr := h
		hr.UID, hr.GID, hr.Root = 0, 0, true
		if sb, err := translate(t, hr, "--ro-bind", h.Cwd, h.Cwd, "pwd"); err != nil || sb.Workdir != h.Cwd || !sb.MapRoot {
			t.Errorf("root mode, a 0700 root-owned cwd: workdir %q, map root %v, %v; want %s, true", sb.Workdir, sb.MapRoot, err, h.Cwd)
		}
		if err := os.Chown(h.Cwd, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		if sb, err := translate(t, hr, "--ro-bind", h.Cwd, h.Cwd, "pwd"); err != nil || sb.Workdir != "/" {
			t.Errorf("root mode, a 0700 cwd of uid 1000, read-only: workdir %q, %v; want /", sb.Workdir, err)
		}
		if err := os.Chown(h.Cwd, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if sb, err := translate(t, h, "pwd"); err != nil || sb.MapRoot {
		t.Errorf("rootless: map root %v, %v; want false", sb.MapRoot, err)
	}
	sb, err = translate(t, h, "--bind", h.Cwd, h.Cwd, "--tmpfs", filepath.Dir(h.Cwd), "pwd")
	if err != nil || sb.Workdir != "/" {
		t.Fatalf("a tmpfs over the bind's parent hides it: workdir %q, %v; want /", sb.Workdir, err)
	}
}

func TestTranslateErrors(t *testing.T) {
	for _, tc := range []struct {
		uid  int
		line []string
		want string
	}{
		{0, []string{"--uid", "5", "id"}, "Specifying --uid requires --unshare-user or --userns"},
		{0, []string{"--gid", "5", "id"}, "Specifying --gid requires --unshare-user or --userns"},
		{1000, []string{"--hostname", "h", "id"}, "Specifying --hostname requires --unshare-uts"},
		{1000, []string{"--as-pid-1", "id"}, "Specifying --as-pid-1 requires --unshare-pid"},
		{1000, []string{"--bind", "/nonexistent-bwrap-src", "/x", "id"}, "Can't find source path /nonexistent-bwrap-src: no such file or directory (--bind /nonexistent-bwrap-src)"},
		{1000, []string{"--file", "9", "/f", "id"}, "--file 9 /f: Can't read from fd 9: bad file descriptor"},
		{1000, []string{"--perms", "0", "--file", "7", "/f", "id"}, "--perms: not supported by str bwrap: mode 0 for --file /f"},
		{1000, []string{"--ro-bind", "/etc/hostname", "/", "id"}, "the source of a bind over / must be a directory"},
	} {
		_, err := translate(t, testHost(t, tc.uid), tc.line...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.line, err, tc.want)
		}
	}
	// A non-root caller's bubblewrap implies a user namespace: --uid is fine.
	if _, err := translate(t, testHost(t, 1000), "--uid", "0", "id"); err != nil {
		t.Errorf("--uid as non-root: %v", err)
	}
}

func TestInfoDoc(t *testing.T) {
	d := Info(42, func(pid int, ns string) uint64 {
		if ns == "net" {
			return 0
		}
		return uint64(len(ns)) * 100
	})
	if got, want := d.Line(), "{ \"child-pid\": 42, \"cgroup-namespace\": 600, \"ipc-namespace\": 300, \"mnt-namespace\": 300, \"pid-namespace\": 300, \"uts-namespace\": 300 }\n"; got != want {
		t.Errorf("Line %q, want %q", got, want)
	}
	if got := d.Pretty(); !strings.HasPrefix(got, "{\n    \"child-pid\": 42,\n    \"cgroup-namespace\": 600,") || !strings.HasSuffix(got, "300\n}\n") {
		t.Errorf("Pretty %q", got)
	}
}

// A bind that shows a secrets directory gets an empty read-only tmpfs
// over it; one reached through a symlink (/var/run -> /run) is covered
// by its real path only.
func TestTranslateHidesSecrets(t *testing.T) {
	h := testHost(t, 0)
	root := t.TempDir()
	for _, d := range []string{"run/secrets/kubernetes.io", "var", "usr"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../run", filepath.Join(root, "var/run")); err != nil {
		t.Fatal(err)
	}
	sb, err := translate(t, h, "--ro-bind", root, "/", "true")
	if err != nil {
		t.Fatal(err)
	}
	last := sb.Mounts[len(sb.Mounts)-1]
	if want := (nsinit.Mount{Kind: nsinit.MountTmpfs, Target: "/run/secrets", ReadOnly: true, Data: "size=4k,mode=0755"}); last != want {
		t.Errorf("last mount %+v, want %+v", last, want)
	}
	for _, m := range sb.Mounts[:len(sb.Mounts)-1] {
		if strings.Contains(m.Target, "secrets") {
			t.Errorf("also %+v", m)
		}
	}
	// Nothing bound shows them: nothing added.
	sb, err = translate(t, h, "--ro-bind", filepath.Join(root, "usr"), "/usr", "true")
	if err != nil || len(sb.Mounts) != 1 {
		t.Errorf("mounts %+v, %v", sb.Mounts, err)
	}
}

// --disable-userns is honoured by the seccomp policy: every embedded one
// but nesting refuses every way of making a user namespace; a policy that
// lets one through (nesting, which exists for that) is named with the call.
func TestUsernsDenied(t *testing.T) {
	if NativeAuditArch() == 0 {
		t.Skip("str's seccomp has no architecture for " + runtime.GOARCH)
	}
	for _, name := range seccomp.Names() {
		p, err := seccomp.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		err = CheckUsernsDenied(name, p.Evaluate, NativeAuditArch())
		if name == "nesting" {
			if err == nil || !strings.Contains(err.Error(), "the seccomp policy nesting lets unshare(CLONE_NEWUSER) through") {
				t.Errorf("nesting: %v, want it named as letting unshare through", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	allowClone3 := func(d seccomp.Data) (uint32, error) {
		if d.Nr == unix.SYS_CLONE3 {
			return seccomp.RetAllow, nil
		}
		return seccomp.RetErrno | 1, nil
	}
	if err := CheckUsernsDenied("lax", allowClone3, NativeAuditArch()); err == nil || !strings.Contains(err.Error(), "the seccomp policy lax lets clone3 through") {
		t.Errorf("a policy allowing clone3: %v", err)
	}
	sb, err := translate(t, testHost(t, 1000), "--disable-userns", "--assert-userns-disabled", "true")
	if err != nil || !sb.UsernsDisabled {
		t.Errorf("--disable-userns: %+v, %v", sb, err)
	}
}

// The data options, --chmod and --perms 0 --dir become the init's file,
// chmod and directory steps with bubblewrap's default modes.
func TestTranslateDataAndModes(t *testing.T) {
	sb, err := translate(t, testHost(t, 1000), "--tmpfs", "/t",
		"--file", "7", "/t/f", "--bind-data", "7", "/t/b", "--perms", "0640", "--ro-bind-data", "7", "/t/r",
		"--perms", "0", "--dir", "/t/z", "--perms", "01777", "--dir", "/t/s", "--chmod", "0700", "/t/s", "sh")
	if err != nil {
		t.Fatal(err)
	}
	c := "file contents\n"
	want := []nsinit.Mount{
		{Kind: nsinit.MountTmpfs, Target: "/t", Data: "mode=0755,uid=1000,gid=1000"},
		{Kind: nsinit.MountFile, Target: "/t/f", Contents: c, Mode: 0o666},
		{Kind: nsinit.MountFile, Target: "/t/b", Contents: c, Mode: 0o600},
		{Kind: nsinit.MountFile, Target: "/t/r", Contents: c, Mode: 0o640, ReadOnly: true},
		{Kind: nsinit.MountDir, Target: "/t/z", Mode: 0o700},
		{Kind: nsinit.MountChmod, Target: "/t/z", Mode: 0},
		{Kind: nsinit.MountDir, Target: "/t/s", Mode: 0o1777},
		{Kind: nsinit.MountChmod, Target: "/t/s", Mode: 0o700},
	}
	if !slices.Equal(sb.Mounts, want) {
		t.Errorf("mounts\n got %+v\nwant %+v", sb.Mounts, want)
	}
}

// A destination through a symlink the line made lands where the link
// points, as bubblewrap's mount follows it inside the new root; a later
// bind over / hides (drops) everything the line made before it.
func TestTranslateLinksAndLaterRootBind(t *testing.T) {
	h := testHost(t, 1000)
	src := t.TempDir()
	sb, err := translate(t, h, "--dir", "/tmp/dir", "--symlink", "dir", "/tmp/link", "--bind", src, "/tmp/link",
		"--symlink", "/tmp/dir", "/abs", "--tmpfs", "/abs/sub/x", "sh")
	if err != nil {
		t.Fatal(err)
	}
	want := []nsinit.Mount{
		{Kind: nsinit.MountDir, Target: "/tmp/dir", Mode: 0o755},
		{Kind: nsinit.MountSymlink, Source: "dir", Target: "/tmp/link"},
		{Kind: nsinit.MountBind, Source: src, Target: "/tmp/dir"},
		{Kind: nsinit.MountSymlink, Source: "/tmp/dir", Target: "/abs"},
		{Kind: nsinit.MountTmpfs, Target: "/tmp/dir/sub/x", Data: "mode=0755,uid=1000,gid=1000"},
	}
	if !slices.Equal(sb.Mounts, want) {
		t.Errorf("mounts\n got %+v\nwant %+v", sb.Mounts, want)
	}

	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "usr"), 0o755); err != nil {
		t.Fatal(err)
	}
	sb, err = translate(t, h, "--tmpfs", "/t", "--bind", root, "/", "--tmpfs", "/tmp", "sh")
	if err != nil {
		t.Fatal(err)
	}
	want = []nsinit.Mount{
		{Kind: nsinit.MountBind, Source: filepath.Join(root, "usr"), Target: "/usr"},
		{Kind: nsinit.MountTmpfs, Target: "/tmp", Data: "mode=0755,uid=1000,gid=1000"},
	}
	if !slices.Equal(sb.Mounts, want) {
		t.Errorf("after a later bind over /: mounts\n got %+v\nwant %+v", sb.Mounts, want)
	}
}

// --lock-file names a path inside: str locks the host file a bind shows
// there, and refuses a path no bind shows (and --as-pid-1 with it, as
// bubblewrap does).
func TestTranslateLockFile(t *testing.T) {
	h := testHost(t, 1000)
	src := t.TempDir()
	sb, err := translate(t, h, "--bind", src, "/b", "--lock-file", "/b/lock", "sh")
	if err != nil || !slices.Equal(sb.LockFiles, []string{filepath.Join(src, "lock")}) {
		t.Fatalf("lock files %v, %v; want [%s/lock]", sb, err, src)
	}
	_, err = translate(t, h, "--bind", src, "/b", "--tmpfs", "/b/t", "--lock-file", "/b/t/lock", "sh")
	var u *Unsupported
	if !errors.As(err, &u) || u.Option != "--lock-file" || !strings.Contains(u.Why, "/b/t/lock is not under a bind") {
		t.Fatalf("lock on a tmpfs: %v", err)
	}
	_, err = translate(t, h, "--unshare-pid", "--as-pid-1", "--bind", src, "/b", "--lock-file", "/b/lock", "sh")
	if err == nil || !strings.Contains(err.Error(), "Specifying --as-pid-1 and --lock-file is not permitted") {
		t.Fatalf("--as-pid-1 with --lock-file: %v", err)
	}
}

// --bind-fd and --ro-bind-fd bind what the descriptor holds, named as
// bubblewrap names it (/proc/self/fd/N, opened by the launcher in the
// process holding the descriptor).
func TestTranslateBindFD(t *testing.T) {
	dir, err := os.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	fd := strconv.Itoa(int(dir.Fd()))
	sb, err := translate(t, testHost(t, 1000), "--ro-bind-fd", fd, "/d", "sh")
	if err != nil {
		t.Fatal(err)
	}
	want := []nsinit.Mount{{Kind: nsinit.MountBind, Source: "/proc/self/fd/" + fd, Target: "/d", ReadOnly: true}}
	if !slices.Equal(sb.Mounts, want) {
		t.Errorf("mounts\n got %+v\nwant %+v", sb.Mounts, want)
	}
}

// --seccomp and --add-seccomp-fd read a program of 8-byte records from
// the descriptor, for the init to install after the profile's filter;
// anything else is bubblewrap's usage error, as is combining the two.
func TestTranslateSeccomp(t *testing.T) {
	h := testHost(t, 1000)
	progs := map[int][]byte{8: make([]byte, 16), 9: make([]byte, 12), 10: make([]byte, 8), 12: {}}
	h.ReadFD = func(fd int) ([]byte, error) {
		if p, ok := progs[fd]; ok {
			return p, nil
		}
		return nil, errors.New("bad file descriptor")
	}
	sb, err := translate(t, h, "--add-seccomp-fd", "8", "--add-seccomp-fd", "10", "sh")
	if err != nil || len(sb.Seccomp) != 2 || len(sb.Seccomp[0]) != 16 || len(sb.Seccomp[1]) != 8 {
		t.Fatalf("two programs: %v, %v", sb, err)
	}
	for _, tc := range []struct {
		line []string
		want string
	}{
		{[]string{"--seccomp", "9", "sh"}, "Invalid seccomp data, must be multiple of 8"},
		{[]string{"--seccomp", "12", "sh"}, "Invalid seccomp data from --seccomp 12: 0 instructions, must be 1 to 4096"},
		{[]string{"--seccomp", "8", "--add-seccomp-fd", "12", "sh"}, "--add-seccomp-fd cannot be combined with --seccomp"},
		{[]string{"--add-seccomp-fd", "12", "--seccomp", "8", "sh"}, "--seccomp cannot be combined with --add-seccomp-fd"},
		{[]string{"--seccomp", "11", "sh"}, "Can't read seccomp data: bad file descriptor (--seccomp 11)"},
	} {
		if _, err := translate(t, h, tc.line...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.line, err, tc.want)
		}
	}
}

// --dev-bind and --dev-bind-try are binds without nodev (Devices), the
// whole-root form's entries too; every other bind keeps nodev.
func TestTranslateDevBind(t *testing.T) {
	h := testHost(t, 1000)
	src := t.TempDir()
	if err := os.Mkdir(filepath.Join(src, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	sb, err := translate(t, h, "--dev-bind", src, "/x", "--dev-bind-try", "/nonexistent-str-test", "/y", "--bind", src, "/z", "true")
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Mounts) != 2 || !sb.Mounts[0].Devices || sb.Mounts[0].Target != "/x" || sb.Mounts[1].Devices {
		t.Errorf("mounts %+v", sb.Mounts)
	}
	sb, err = translate(t, h, "--dev-bind", src, "/", "true")
	if err != nil || !sb.RootBound || len(sb.Mounts) != 1 || !sb.Mounts[0].Devices || sb.Mounts[0].Target != "/d" {
		t.Errorf("--dev-bind over /: %v %+v", err, sb)
	}
}

// An overlay is a bind whose tree the launcher makes: its lower layers in
// overlayfs's order (the last --overlay-src on top), --overlay's upper and
// work dirs relative to the caller's directory, none for the others;
// --ro-overlay read-only. A missing layer is bubblewrap's error.
func TestTranslateOverlays(t *testing.T) {
	h := testHost(t, 0)
	for _, d := range []string{"l1", "l2", "up", "wk"} {
		if err := os.Mkdir(filepath.Join(h.Cwd, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	p := func(d string) string { return filepath.Join(h.Cwd, d) }
	sb, err := translate(t, h, "--overlay-src", "l1", "--overlay-src", "l2", "--overlay", "up", "wk", "/a",
		"--overlay-src", "l1", "--tmp-overlay", "/b", "--overlay-src", "l1", "--overlay-src", "l2", "--ro-overlay", "/c", "true")
	if err != nil {
		t.Fatal(err)
	}
	want := []nsinit.Mount{
		{Kind: nsinit.MountBind, Source: p("l2"), Target: "/a", Overlay: &nsinit.Overlay{Lower: []string{p("l2"), p("l1")}, Upper: p("up"), Work: p("wk")}},
		{Kind: nsinit.MountBind, Source: p("l1"), Target: "/b", Overlay: &nsinit.Overlay{Lower: []string{p("l1")}}},
		{Kind: nsinit.MountBind, Source: p("l2"), Target: "/c", ReadOnly: true, Overlay: &nsinit.Overlay{Lower: []string{p("l2"), p("l1")}}},
	}
	if !reflect.DeepEqual(sb.Mounts, want) {
		t.Errorf("mounts\n got %+v\nwant %+v", sb.Mounts, want)
	}
	_, err = translate(t, h, "--overlay-src", "gone", "--tmp-overlay", "/b", "true")
	var se *SourceError
	if !errors.As(err, &se) || se.Path != p("gone") || !strings.HasPrefix(err.Error(), "Can't find source path") {
		t.Errorf("missing layer: %v", err)
	}
}

// --userns-block-fd: bubblewrap's rules (an explicit --unshare-user, an
// --info-fd, not with --disable-userns), with its words.
func TestTranslateUsernsBlockFD(t *testing.T) {
	h := testHost(t, 1000)
	sb, err := translate(t, h, "--unshare-user", "--info-fd", "3", "--userns-block-fd", "4", "true")
	if err != nil || sb.UsernsBlockFD != 4 || sb.BlockFD != -1 {
		t.Fatalf("%v %+v", err, sb)
	}
	for _, tc := range []struct {
		line []string
		msg  string
	}{
		{[]string{"--info-fd", "3", "--userns-block-fd", "4", "true"}, "--userns-block-fd requires --unshare-user"},
		{[]string{"--unshare-all", "--info-fd", "3", "--userns-block-fd", "4", "true"}, "--userns-block-fd requires --unshare-user"},
		{[]string{"--unshare-user", "--userns-block-fd", "4", "true"}, "--userns-block-fd requires --info-fd"},
		{[]string{"--unshare-user", "--info-fd", "3", "--disable-userns", "--userns-block-fd", "4", "true"}, "--disable-userns is not compatible with  --userns-block-fd"},
	} {
		_, err := translate(t, h, tc.line...)
		var ue *UsageError
		if !errors.As(err, &ue) || ue.Msg != tc.msg {
			t.Errorf("%q: %v, want %q", tc.line, err, tc.msg)
		}
	}
}
