package worker

import (
	"os"
	"path/filepath"
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
