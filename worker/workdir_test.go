package worker

import (
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

// TestWorkDirRemoveChecksIdentity: remove refuses a path that is no
// longer the directory newWorkDir made (replaced meanwhile), and names
// are generated, fresh and marked.
func TestWorkDirRemoveChecksIdentity(t *testing.T) {
	base := t.TempDir()
	a, err := newWorkDir(base, callDirPrefix)
	must(t, err)
	b, err := newWorkDir(base, callDirPrefix)
	must(t, err)
	if a.path == b.path || !generatedWorkDirName(filepath.Base(a.path)) {
		t.Fatalf("names %s %s", a.path, b.path)
	}
	if why := staleWorkDirProblem(a.path); why != "" {
		t.Fatalf("a fresh work dir is not sweepable: %s", why)
	}
	// a replaced by another directory: left alone.
	must(t, os.Rename(a.path, a.path+".moved"))
	must(t, os.Mkdir(a.path, 0o700))
	if err := a.remove(); err == nil || !strings.Contains(err.Error(), "not the work dir this worker made") {
		t.Fatalf("remove of a replaced dir: %v", err)
	}
	if _, err := os.Stat(a.path); err != nil {
		t.Fatalf("the replacement was removed: %v", err)
	}
	must(t, b.remove())
	if _, err := os.Lstat(b.path); !os.IsNotExist(err) {
		t.Fatalf("b left: %v", err)
	}
	// A marker copied into a dir of another name does not make it sweepable.
	c := filepath.Join(base, callDirPrefix+"00000000000000aa")
	must(t, os.Mkdir(c, 0o700))
	m, _ := os.ReadFile(filepath.Join(a.path+".moved", WorkDirMarker))
	must(t, os.WriteFile(filepath.Join(c, WorkDirMarker), m, 0o444))
	if why := staleWorkDirProblem(c); why == "" {
		t.Fatal("a copied marker made another dir sweepable")
	}
}
