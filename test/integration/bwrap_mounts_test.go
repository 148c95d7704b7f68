package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// usrOnly is a line's minimal system: /usr and the usual symlinks.
var usrOnly = []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64"}

// bwrapOut runs a bubblewrap line with prog (str bwrap when prog is
// strBin) from dir: its stdout and stderr, and its exit status.
func bwrapOut(t *testing.T, prog, dir string, line ...string) (string, string, int) {
	t.Helper()
	if prog == strBin {
		line = append([]string{"bwrap"}, line...)
	}
	cmd := exec.Command(prog, line...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatal(err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// --dev-bind is a bind whose device nodes the command may open; --bind's
// are nodev (opening one fails), under bubblewrap and str bwrap alike, as
// root and as an unprivileged user. bubblewrap's suite's own line
// (--dev-bind / /) runs too.
func TestBwrapDevBind(t *testing.T) {
	needRoot(t)
	probe := `echo x > /dev/null && echo dev-bind usable; (echo x > /nodev/null) 2>/dev/null && echo bind usable || echo bind nodev; head -c 3 /dev/zero | wc -c`
	line := append(append([]string(nil), usrOnly...), "--dev-bind", "/dev", "/dev", "--bind", "/dev", "/nodev", "sh", "-c", probe)
	want := "dev-bind usable\nbind nodev\n3\n"
	progs := map[string]string{"str bwrap": strBin}
	if bw, err := exec.LookPath("bwrap"); err == nil {
		progs["bubblewrap"] = bw
	}
	for who, prog := range progs {
		out, errs, code := bwrapOut(t, prog, "/", line...)
		if out != want || code != 0 {
			t.Errorf("%s: exit %d, stdout %q, want %q; stderr %s", who, code, out, want, errs)
		}
		if _, errs, code := bwrapOut(t, prog, "/", "--dev-bind", "/", "/", "--", "true"); code != 0 {
			t.Errorf("%s --dev-bind / / true: exit %d; stderr %s", who, code, errs)
		}
	}
	quoted := strings.Join(usrOnly, " ") + " --dev-bind /dev /dev --bind /dev /nodev sh -c '" + probe + "'"
	for who, r := range rootlessBwrap(t, quoted) {
		if r.err != nil || r.out != want {
			t.Errorf("%s rootless: %v, output %q, want %q", who, r.err, r.out, want)
		}
	}
}

// The overlays of bubblewrap 0.10 (--overlay-src, --overlay, --tmp-overlay,
// --ro-overlay) give what bubblewrap's own test-run.sh expects of them:
// the layers' order, writes landing in --overlay's upper dir and nowhere
// for --tmp-overlay, none through --ro-overlay, paths with ":,\ in them,
// and its usage errors. As root (str makes the overlay on the host);
// rootless str refuses overlays with its reason. The files are writable
// by others: the command is a leased uid under str, not host root.
func TestBwrapOverlays(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(rel, data string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o666); err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(p, 0o666)
		_ = os.Chmod(filepath.Dir(p), 0o777)
	}
	read := func(rel string) string {
		b, _ := os.ReadFile(filepath.Join(dir, rel))
		return string(b)
	}
	reset := func() {
		for _, d := range []string{"lower1", "lower2", "upper", "work", `lower ":,\`, `upper ":,\`, `work ":,\`} {
			os.RemoveAll(filepath.Join(dir, d))
			if err := os.Mkdir(filepath.Join(dir, d), 0o777); err != nil {
				t.Fatal(err)
			}
			_ = os.Chmod(filepath.Join(dir, d), 0o777)
		}
		write("lower1/a", "1")
		write("lower1/b", "2")
		write("lower2/b", "3")
		write("upper/a", "4")
		write(`lower ":,\/a`, "1")
	}
	run := func(args ...string) (string, string, int) {
		line := append(append(append([]string(nil), usrOnly...), "--tmpfs", "/tmp"), args...)
		return bwrapOut(t, strBin, dir, line...)
	}
	reset()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--overlay-src", "lower1", "--overlay", "upper", "work", "/tmp/x/y/z", "cat", "/tmp/x/y/z/a"}, "4"},
		{[]string{"--overlay-src", "lower1", "--overlay", "upper", "work", "/tmp/x/y/z", "cat", "/tmp/x/y/z/b"}, "2"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--overlay", "upper", "work", "/tmp/x/y/z", "cat", "/tmp/x/y/z/a"}, "4"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--overlay", "upper", "work", "/tmp/x/y/z", "cat", "/tmp/x/y/z/b"}, "3"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--overlay", "upper", "work", "/tmp/x/y/z", "sh", "-c", "printf 5 > /tmp/x/y/z/b; cat /tmp/x/y/z/b"}, "5"},
		{[]string{"--overlay-src", `lower ":,\`, "--overlay", `upper ":,\`, `work ":,\`, "/tmp/x", "sh", "-c", "cat /tmp/x/a; printf 2 > /tmp/x/a; cat /tmp/x/a"}, "12"},
	} {
		if out, errs, code := run(tc.args...); out != tc.want || code != 0 {
			t.Errorf("--overlay %q: exit %d, %q, want %q; stderr %s", tc.args, code, out, tc.want, errs)
		}
	}
	if read("upper/b") != "5" || read(`lower ":,\/a`) != "1" || read(`upper ":,\/a`) != "2" || read("lower2/b") != "3" {
		t.Errorf("--overlay's writes: upper/b %q, lower/a %q, upper/a %q, lower2/b %q; want 5 1 2 3", read("upper/b"), read(`lower ":,\/a`), read(`upper ":,\/a`), read("lower2/b"))
	}

	reset()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--overlay-src", "lower1", "--tmp-overlay", "/tmp/x/y/z", "cat", "/tmp/x/y/z/a"}, "1"},
		{[]string{"--overlay-src", "lower1", "--tmp-overlay", "/tmp/x/y/z", "cat", "/tmp/x/y/z/b"}, "2"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--tmp-overlay", "/tmp/x/y/z", "cat", "/tmp/x/y/z/b"}, "3"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--tmp-overlay", "/tmp/x/y/z", "sh", "-c", "printf 4 > /tmp/x/y/z/b; cat /tmp/x/y/z/b"}, "4"},
		{[]string{"--overlay-src", "lower1", "--tmp-overlay", "/tmp/x", "--overlay-src", "lower2", "--tmp-overlay", "/tmp/y", "sh", "-c", "cat /tmp/x/b; printf 4 > /tmp/x/b; cat /tmp/x/b; cat /tmp/y/b"}, "243"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--ro-overlay", "/tmp/x/y/z", "cat", "/tmp/x/y/z/a"}, "1"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--ro-overlay", "/tmp/x/y/z", "cat", "/tmp/x/y/z/b"}, "3"},
		{[]string{"--overlay-src", "lower1", "--overlay-src", "lower2", "--ro-overlay", "/tmp/x/y/z", "sh", "-c", "printf 4 > /tmp/x/y/z/b; cat /tmp/x/y/z/b"}, "3"},
	} {
		if out, errs, _ := run(tc.args...); out != tc.want {
			t.Errorf("%q: %q, want %q; stderr %s", tc.args, out, tc.want, errs)
		}
	}
	if read("lower1/b") != "2" || read("lower2/b") != "3" {
		t.Errorf("--tmp-overlay or --ro-overlay wrote a layer: lower1/b %q, lower2/b %q", read("lower1/b"), read("lower2/b"))
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--overlay", "upper", "work", "/tmp", "true"}, "str bwrap: --overlay requires at least one --overlay-src"},
		{[]string{"--tmp-overlay", "/tmp", "true"}, "str bwrap: --tmp-overlay requires at least one --overlay-src"},
		{[]string{"--overlay-src", "lower1", "--ro-overlay", "/tmp", "true"}, "str bwrap: --ro-overlay requires at least two --overlay-src"},
		{[]string{"--overlay-src", "/tmp", "--chdir", "/", "true"}, "str bwrap: --overlay-src must be followed by another --overlay-src or one of --overlay, --tmp-overlay, or --ro-overlay"},
		{[]string{"--overlay-src", "missing", "--tmp-overlay", "/tmp/x", "true"}, "Can't find source path " + filepath.Join(dir, "missing")},
	} {
		if _, errs, code := run(tc.args...); code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stderr %q; want 1 and %q", tc.args, code, errs, tc.want)
		}
	}

	quoted := strings.Join(usrOnly, " ") + " --overlay-src /usr --tmp-overlay /o true"
	if r, ok := rootlessBwrap(t, quoted)["str bwrap"]; !ok || r.err == nil || !strings.Contains(r.out, "not supported rootless") {
		t.Errorf("str bwrap rootless overlay: %v, %q; want a refusal that says why", r.err, r.out)
	}
}

// --userns-block-fd: the command does not start before the descriptor
// has data (or is closed), and --info-fd is written before the wait, as
// bubblewrap's order; the caller writes no maps (str wrote them).
func TestBwrapUsernsBlockFD(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	blockR, blockW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	infoR, infoW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{"bwrap"}, usrOnly...), "--bind", dir, "/d", "--unshare-user", "--userns-block-fd", "3", "--info-fd", "4",
		"--", "/bin/sh", "-c", "echo ran > /d/marker")
	cmd := exec.Command(strBin, args...)
	cmd.ExtraFiles = []*os.File{blockR, infoW}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	blockR.Close()
	infoW.Close()
	info, err := readAllClose(infoR)
	if err != nil || !strings.Contains(info, "child-pid") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("--info-fd: %q %v; stderr %s", info, err, errb.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "marker")); !os.IsNotExist(err) {
		t.Errorf("the command ran before --userns-block-fd had data: %v", err)
	}
	blockW.Close() // closed without data: the setup goes on too
	if err := cmd.Wait(); err != nil {
		t.Fatalf("exit: %v; stderr %s", err, errb.String())
	}
	if got, err := os.ReadFile(filepath.Join(dir, "marker")); err != nil || string(got) != "ran\n" {
		t.Fatalf("marker: %q %v", got, err)
	}
	out, errs, code := bwrapOut(t, strBin, "/", "--userns-block-fd", "3", "--info-fd", "4", "true")
	if code != 1 || !strings.Contains(errs, "--userns-block-fd requires --unshare-user") {
		t.Errorf("without --unshare-user: exit %d %q %q", code, out, errs)
	}
}
