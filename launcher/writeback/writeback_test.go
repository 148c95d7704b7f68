package writeback

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// TestWriteBackHostile drives step L10 on an upper layer made by hand
// (what a hostile tool could leave there, and what the host side of the
// work dir could have become meanwhile), into a DIR owned by an
// unprivileged owner:
//   - a whiteout removes a file, and a directory with what is below it;
//   - an opaque directory replaces DIR's, nothing of the old one stays;
//   - a name that became a symlink in DIR (to a directory outside) is
//     replaced, never followed: nothing is written outside;
//   - a file of mode 0000 (the tool's) is copied, and lands as the owner's
//     with its permission bits only (a setuid bit is dropped);
//   - a subdirectory of DIR the owner may not write (root's, 0755) gets
//     nothing, and is the reported error: the copy writes as the owner;
//     the other entries are still copied;
//   - a FIFO is skipped and named.
func TestWriteBackHostile(t *testing.T) {
	if os.Geteuid() != 0 {
		msg := "step L10 mounts a tmpfs and changes its thread's fsuid: needs root"
		mustwork.Skip(t, msg)
	}
	const owner, group, tool = 4242, 4343, 5151
	base := t.TempDir()
	dir, outside := filepath.Join(base, "dir"), filepath.Join(base, "outside")
	for _, d := range []string{dir, outside, filepath.Join(dir, "gone"), filepath.Join(dir, "old"), filepath.Join(dir, "rootonly")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, c string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "del.txt"), "d")
	write(filepath.Join(dir, "gone", "g.txt"), "g")
	write(filepath.Join(dir, "old", "stale.txt"), "s")
	if err := os.Symlink(outside, filepath.Join(dir, "swapped")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"", "del.txt", "gone", "gone/g.txt", "old", "old/stale.txt", "swapped"} {
		if err := os.Lchown(filepath.Join(dir, p), owner, group); err != nil {
			t.Fatal(err)
		}
	}

	// The upper layer, as the overlay would have left it.
	upperFS, err := mountDetached("tmpfs", [][2]string{{"size", "1048576"}, {"mode", "0700"}})
	if err != nil {
		t.Fatal(err)
	}
	up := func(p string) string { return fdPath(upperFS) + "/" + upperName + "/" + p }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.Mkdirat(upperFS, upperName, 0o755))
	must(unix.Mknod(up("del.txt"), unix.S_IFCHR, 0))
	must(unix.Mknod(up("gone"), unix.S_IFCHR, 0))
	must(os.Mkdir(up("old"), 0o755))
	must(unix.Setxattr(up("old"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(up("old/fresh.txt"), []byte("f"), 0o644))
	must(os.Mkdir(up("swapped"), 0o755))
	must(os.WriteFile(up("swapped/escape.txt"), []byte("e"), 0o644))
	must(os.WriteFile(up("secret.txt"), []byte("tool's"), 0o644))
	must(os.Chmod(up("secret.txt"), 0))
	must(os.WriteFile(up("suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chmod(up("suid"), 0o4755))
	must(os.Mkdir(up("rootonly"), 0o755))
	must(os.WriteFile(up("rootonly/x.txt"), []byte("x"), 0o644))
	must(unix.Mkfifo(up("pipe"), 0o644))
	filepath.Walk(fdPath(upperFS)+"/"+upperName, func(p string, _ os.FileInfo, _ error) error {
		return os.Lchown(p, tool, tool)
	})

	dirFD, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	must(err)
	wb := &Dir{dir: dir, dirFD: dirFD, upperFS: upperFS, uid: owner, gid: group}
	r := wb.CopyBack()

	if r.Error == nil || r.Error.Step != nsinit.StepLWriteBack || !strings.HasSuffix(r.Error.Path, "rootonly/x.txt") {
		t.Errorf("error %v: want step L10 refused at rootonly/x.txt (root's 0755 dir, written as the owner)", r.Error)
	}
	if _, err := os.Lstat(filepath.Join(dir, "rootonly", "x.txt")); !os.IsNotExist(err) {
		t.Errorf("rootonly/x.txt was written into a dir the owner may not write: %v", err)
	}
	for _, p := range []string{"del.txt", "gone", "old/stale.txt"} {
		if _, err := os.Lstat(filepath.Join(dir, p)); !os.IsNotExist(err) {
			t.Errorf("%s should be removed: %v", p, err)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("something was written through the swapped symlink: %v", ents)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "swapped")); err != nil || !fi.IsDir() {
		t.Errorf("swapped: %v %v, want a directory in place of the symlink", fi, err)
	}
	checks := []struct {
		path, content string
		mode          os.FileMode
	}{
		{"old/fresh.txt", "f", 0o644}, {"swapped/escape.txt", "e", 0o644}, {"secret.txt", "tool's", 0}, {"suid", "#!/bin/sh\n", 0o755},
	}
	for _, c := range checks {
		p := filepath.Join(dir, c.path)
		got, err := os.ReadFile(p)
		fi, serr := os.Lstat(p)
		if err != nil || string(got) != c.content || serr != nil {
			t.Errorf("%s: %q %v %v", c.path, got, err, serr)
			continue
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != owner || st.Gid != group || fi.Mode() != c.mode {
			t.Errorf("%s: %d:%d %v, want %d:%d %v", c.path, st.Uid, st.Gid, fi.Mode(), owner, group, c.mode)
		}
	}
	if len(r.Skipped) != 1 || r.Skipped[0] != "pipe" {
		t.Errorf("skipped %v, want [pipe]", r.Skipped)
	}
	if r.Removed != 2 {
		t.Errorf("removed %d, want 2 (del.txt, gone)", r.Removed)
	}
	// The copy's thread is gone with its identity: this one is root still.
	if fsuid, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); fsuid != 0 {
		t.Fatalf("the test's thread has fsuid %d", fsuid)
	}
	if wb.upperFS != -1 || wb.dirFD != -1 {
		t.Errorf("descriptors left open: %+v", wb)
	}
}
