package artifacts

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/testfs"
)

// leftovers lists every file under dir other than .lock files.
func leftovers(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != lockFileName {
			out = append(out, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	return out
}

// A full store: Save fails with ENOSPC wrapped (the worker answers
// RESOURCE_EXHAUSTED on it) and leaves no file behind, Check says so with
// the path and errno; freed, both work again.
func TestFilesystemStoreFull(t *testing.T) {
	base := testfs.Tmpfs(t, "", "size=1m,mode=0755")
	s, err := NewFilesystem(filepath.Join(base, "store"), "ns")
	if err != nil {
		t.Fatal(err)
	}
	c := s.(Checker)
	if serr, aerr := c.Check(); serr != nil || aerr != nil {
		t.Fatalf("Check of an empty store: %v, %v", serr, aerr)
	}
	testfs.FillBytes(t, filepath.Join(base, "filler"))
	_, err = s.Save(bg, "u", "s", "out.txt", []byte(strings.Repeat("x", 8192)), "")
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("Save on a full store: %v, want ENOSPC", err)
	}
	if l := leftovers(t, filepath.Join(base, "store")); len(l) != 0 {
		t.Errorf("a failed save left %q in the store", l)
	}
	serr, _ := c.Check()
	if !errors.Is(serr, syscall.ENOSPC) || !strings.Contains(serr.Error(), filepath.Join(base, "store", "ns")) {
		t.Errorf("Check of a full store: %v, want ENOSPC naming the scope dir", serr)
	}
	if err := os.Remove(filepath.Join(base, "filler")); err != nil {
		t.Fatal(err)
	}
	if serr, _ := c.Check(); serr != nil {
		t.Errorf("Check after freeing space: %v", serr)
	}
	if v, err := s.Save(bg, "u", "s", "out.txt", []byte("x"), ""); err != nil || v != 0 {
		t.Errorf("Save after freeing space: %d, %v, want version 0", v, err)
	}
	if l := leftovers(t, filepath.Join(base, "store")); len(l) != 2 {
		t.Errorf("store after one save: %q, want the version and its .meta", l)
	}
}

// A read-only store: Save fails with EROFS, Check says so; its audit
// log on a read-only filesystem of its own (the store writable) fails
// the save as an *AuditError and is Check's audit error; remounted
// read-write, both work again.
func TestFilesystemStoreReadOnly(t *testing.T) {
	base, logDir := testfs.Tmpfs(t, "", "size=1m,mode=0755"), testfs.Tmpfs(t, "", "size=1m,mode=0755")
	logPath := filepath.Join(logDir, "audit.jsonl")
	s, err := NewFilesystem(filepath.Join(base, "store"), "ns", WithAuditLog(logPath))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(bg, "u", "s", "a.txt", []byte("a"), ""); err != nil {
		t.Fatal(err)
	}
	c := s.(Checker)
	// the store read-only (the audit log open between lines does not
	// keep the remount from happening).
	testfs.Remount(t, base, true)
	_, err = s.Save(bg, "u", "s", "b.txt", []byte("b"), "")
	var ae *AuditError
	if !errors.Is(err, syscall.EROFS) || errors.As(err, &ae) {
		t.Errorf("Save on a read-only store: %v, want EROFS from the store", err)
	}
	if serr, aerr := c.Check(); !errors.Is(serr, syscall.EROFS) || aerr != nil {
		t.Errorf("Check of a read-only store: %v, %v", serr, aerr)
	}
	testfs.Remount(t, base, false)
	if serr, aerr := c.Check(); serr != nil || aerr != nil {
		t.Errorf("Check after remounting read-write: %v, %v", serr, aerr)
	}
	// the audit log read-only.
	testfs.Remount(t, logDir, true)
	_, err = s.Save(bg, "u", "s", "c.txt", []byte("c"), "")
	if !errors.As(err, &ae) || !errors.Is(err, syscall.EROFS) || ae.Path != logPath {
		t.Errorf("Save with a read-only audit log: %v, want an *AuditError with EROFS", err)
	}
	if serr, aerr := c.Check(); serr != nil || !errors.As(aerr, &ae) || !errors.Is(aerr, syscall.EROFS) {
		t.Errorf("Check with a read-only audit log: %v, %v", serr, aerr)
	}
	testfs.Remount(t, logDir, false)
	if _, err := s.Save(bg, "u", "s", "d.txt", []byte("d"), ""); err != nil {
		t.Errorf("Save after remounting the audit log read-write: %v", err)
	}
	if serr, aerr := c.Check(); serr != nil || aerr != nil {
		t.Errorf("Check after remounting the audit log read-write: %v, %v", serr, aerr)
	}
}
