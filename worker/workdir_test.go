package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTaskIDNamesNoDir: a call whose task_id names a directory under the
// work base (an operator's, one of the worker's own generated form) runs
// in a work dir of its own and leaves that directory as it was.
func TestTaskIDNamesNoDir(t *testing.T) {
	h := newHarness(t, nil)
	must(t, os.MkdirAll(h.cfg.WorkDir, 0o711))
	var dirs []string
	for _, name := range []string{"operator-folder", callDirPrefix + "0123456789abcdef", warmDirPrefix + "0123456789abcdef"} {
		p := filepath.Join(h.cfg.WorkDir, name)
		must(t, os.MkdirAll(p, 0o755))
		must(t, os.WriteFile(filepath.Join(p, "keep.txt"), []byte(name), 0o644))
		dirs = append(dirs, p)
	}
	h.start()
	for _, p := range dirs {
		r := h.reply(h.send("echo", map[string]any{"task_id": filepath.Base(p)}))
		if _, ok := shapeResult(r); !ok {
			t.Errorf("task_id %q: %s", filepath.Base(p), r)
		}
		if b, err := os.ReadFile(filepath.Join(p, "keep.txt")); err != nil || string(b) != filepath.Base(p) {
			t.Errorf("%s after a call named after it: %q %v", p, b, err)
		}
	}
}

// TestEnsureDirRefusesRenamableDir: issue 29, item 2's audit of the work
// base (and the runner and site dirs). The worker mounts, chowns and
// removes what it makes there by path, so a base where group or others
// could rename its entries (writable by them without the sticky bit) is
// refused, naming the directory, its owner and mode. A sticky shared one
// (/tmp) and the worker's own are used.
func TestEnsureDirRefusesRenamableDir(t *testing.T) {
	mk := func(perm os.FileMode) string {
		d := filepath.Join(t.TempDir(), "base")
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, perm); err != nil {
			t.Fatal(err)
		}
		return d
	}
	for _, perm := range []os.FileMode{0o777, 0o770, 0o733} {
		d := mk(perm)
		want := fmt.Sprintf("directory %s is owned by uid %d with mode %04o: group or others may write it", d, os.Geteuid(), perm)
		if err := ensureDir(d, 0o711); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("a %o base: %v, want %q", perm, err, want)
		}
		if fi, _ := os.Lstat(d); fi.Mode().Perm() != perm {
			t.Errorf("a refused %o base was changed to %o", perm, fi.Mode().Perm())
		}
	}
	if err := ensureDir(mk(0o777|os.ModeSticky), 0o711); err != nil {
		t.Errorf("a sticky 1777 base: %v", err)
	}
	if err := ensureDir(filepath.Join(mk(0o755), "work"), 0o711); err != nil {
		t.Errorf("a fresh base: %v", err)
	}
}
