package artifacts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestMemoryStoreBudget: the memory store keeps at most its byte budget;
// the least recently used versions go first, an evicted version is gone
// for reads with ErrEvicted (not silently replaced by another), and
// version numbers are never reused.
func TestMemoryStoreBudget(t *testing.T) {
	s := NewMemory("dev", WithMemoryBudget(100))
	data := func(c byte) []byte { return bytes.Repeat([]byte{c}, 40) }
	save := func(name string, c byte) int {
		t.Helper()
		v, err := s.Save(bg, "u", "s", name, data(c), "")
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	save("a", 'a')                                            // 40
	save("b", 'b')                                            // 80
	if _, err := s.Load(bg, "u", "s", "a", nil); err != nil { // a is now the most recent
		t.Fatal(err)
	}
	save("c", 'c') // 120 > 100: b (least recently used) goes
	if _, err := s.Load(bg, "u", "s", "b", nil); !errors.Is(err, ErrEvicted) || !strings.Contains(err.Error(), "budget of 100 bytes") {
		t.Fatalf("load of an evicted artifact: %v, want ErrEvicted naming the budget", err)
	}
	for _, name := range []string{"a", "c"} {
		if a, err := s.Load(bg, "u", "s", name, nil); err != nil || a.Data[0] != name[0] {
			t.Fatalf("load %s: %v", name, err)
		}
	}
	// b's numbering goes on after its eviction.
	if v := save("b", 'B'); v != 1 {
		t.Fatalf("b saved again as version %d, want 1", v)
	}
	if _, err := s.Load(bg, "u", "s", "b", intp(0)); !errors.Is(err, ErrEvicted) {
		t.Fatalf("evicted version 0: %v", err)
	}
	if _, err := s.Load(bg, "u", "s", "b", intp(7)); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrEvicted) {
		t.Fatalf("never saved version: %v, want ErrNotFound", err)
	}
	// The latest evicted while an older one stays: latest is an error.
	s2 := NewMemory("dev", WithMemoryBudget(130))
	s2.Save(bg, "u", "s", "x", data('0'), "")
	s2.Save(bg, "u", "s", "y", data('y'), "")
	s2.Save(bg, "u", "s", "x", data('1'), "") // x: v0, v1; y
	s2.Load(bg, "u", "s", "x", intp(0))       // x v0 recent; y and x v1 older
	s2.Load(bg, "u", "s", "y", nil)           // order now: y, x0, x1 (oldest)
	s2.Save(bg, "u", "s", "z", data('z'), "") // evicts x v1
	if _, err := s2.Load(bg, "u", "s", "x", nil); !errors.Is(err, ErrEvicted) || !strings.Contains(err.Error(), "latest version 1") {
		t.Fatalf("latest evicted: %v", err)
	}
	if vs, _ := s2.ListVersions(bg, "u", "s", "x"); len(vs) != 1 || vs[0] != 0 {
		t.Fatalf("ListVersions after eviction: %v", vs)
	}
	// One artifact larger than the whole budget is refused.
	if _, err := s.Save(bg, "u", "s", "huge", make([]byte, 101), ""); err == nil || !strings.Contains(err.Error(), "budget") {
		t.Fatalf("save over the budget: %v", err)
	}
}

// TestMemoryStoreIsFreed: 10 × 20 MB through a 64 MB store leave the
// process's heap near the budget (the unbounded store held all 200 MB).
func TestMemoryStoreIsFreed(t *testing.T) {
	s := NewMemory("dev", WithMemoryBudget(64<<20))
	blob := make([]byte, 20<<20)
	for i := 0; i < 10; i++ {
		blob[0] = byte(i)
		if _, err := s.Save(bg, "u", "s", "big.bin", blob, ""); err != nil {
			t.Fatal(err)
		}
	}
	blob = nil
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.HeapAlloc > 100<<20 {
		t.Fatalf("heap %d MB after 10 x 20 MB in a 64 MB store", ms.HeapAlloc>>20)
	}
	if vs, _ := s.ListVersions(bg, "u", "s", "big.bin"); len(vs) != 3 || vs[2] != 9 {
		t.Fatalf("versions held %v, want the last 3 (6 7 8 9 minus what does not fit)", vs)
	}
}

// TestOpenAuditLog: ARTIFACT_AUDIT_LOG as Open applies it: by default the
// filesystem store logs to <base>/.audit/audit.jsonl, the memory store to
// nothing unless a path is given, "off" turns it off; reads and writes
// (and memory evictions) appear in it.
func TestOpenAuditLog(t *testing.T) {
	base := t.TempDir()
	st, path, err := Open(Settings{Type: "filesystem", BasePath: base, Namespace: "ns/dev"})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(base, ".audit", "audit.jsonl"); path != want {
		t.Fatalf("default audit log %q, want %q", path, want)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("audit log not created at start: %v", err)
	}
	st.Save(bg, "u", "s", "a.txt", []byte("hello"), "")
	st.Load(bg, "u", "s", "a.txt", nil)
	st.Load(bg, "u", "s", "missing.txt", nil)
	checkAudit(t, path, []string{"save a.txt 0", "load a.txt 0", "load missing.txt error"})

	memLog := filepath.Join(t.TempDir(), "sub", "mem.jsonl")
	mem, path, err := Open(Settings{Type: "memory", Namespace: "dev", AuditLog: memLog, MemoryMaxBytes: 8})
	if err != nil || path != memLog {
		t.Fatalf("memory store with an audit log: %q %v", path, err)
	}
	mem.Save(bg, "u", "s", "x", []byte("12345678"), "")
	mem.Save(bg, "u", "s", "y", []byte("1234"), "")
	mem.Load(bg, "u", "s", "y", nil)
	checkAudit(t, memLog, []string{"save x 0", "evict x 0", "save y 0", "load y 0"})

	if _, path, err := Open(Settings{Type: "memory", Namespace: "dev"}); err != nil || path != "" {
		t.Fatalf("memory store default: %q %v, want no audit log", path, err)
	}
	if _, path, err := Open(Settings{Type: "filesystem", BasePath: t.TempDir(), Namespace: "dev", AuditLog: AuditLogOff}); err != nil || path != "" {
		t.Fatalf("off: %q %v", path, err)
	}
	// An unusable path fails at Open, not at the first save.
	blocker := filepath.Join(t.TempDir(), "file")
	os.WriteFile(blocker, nil, 0o644)
	if _, _, err := Open(Settings{Type: "filesystem", BasePath: t.TempDir(), Namespace: "dev", AuditLog: filepath.Join(blocker, "a.jsonl")}); err == nil {
		t.Fatal("an audit log under a regular file was accepted")
	}
}

func checkAudit(t *testing.T, path string, want []string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m struct {
			Op, Filename, Error string
			Version             *int
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		s := m.Op + " " + m.Filename
		if m.Error != "" {
			s += " error"
		} else if m.Version != nil {
			s += " " + string(rune('0'+*m.Version))
		}
		got = append(got, s)
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("audit log %s:\n got %q\nwant %q", path, got, want)
	}
}

// TestFilenameRule: the one rule, as given and NFKC-normalised.
func TestFilenameRule(t *testing.T) {
	for name, why := range map[string]string{
		"report.txt": "", "a..b": "", "user:shared.json": "", "ﬁle": "", "名前.txt": "", "sp ace": "",
		"": "empty", "user:": "empty after", ".": "directory reference", "..": "directory reference",
		"user:..": "directory reference", "/etc/passwd": "absolute", "a/b": "separator", `a\b`: "separator",
		"a\uff0fb": "separator", // fullwidth solidus: a separator once normalised
		"tab\t":    "control character", "nl\n": "control character", "nul\x00": "control character",
		"del\x7f": "control character", "c1\u0085": "control character", "bad\xff": "not valid UTF-8",
		strings.Repeat("n", 256): "more than 255",
	} {
		err := CheckFilename(name)
		var fe *FilenameError
		switch {
		case why == "" && err != nil:
			t.Errorf("%q refused: %v", name, err)
		case why != "" && (!errors.As(err, &fe) || !strings.Contains(fe.Reason, why) || !errors.Is(err, ErrUnsafeName)):
			t.Errorf("%q: %v, want a FilenameError (ErrUnsafeName) saying %q", name, err, why)
		}
	}
}

// TestSaveReaderExactSize: both stores store exactly the size given and
// refuse a reader that yields fewer or more bytes, storing nothing; the
// quota wrapper checks the size given before reading.
func TestSaveReaderExactSize(t *testing.T) {
	fs, err := NewFilesystem(t.TempDir(), "ns")
	if err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]Store{"filesystem": fs, "memory": NewMemory("ns"),
		"quota": WithQuota(NewMemory("ns"), Quota{UserBytes: 10})} {
		ctx := context.Background()
		if v, err := st.SaveReader(ctx, "u", "s", "ok.txt", strings.NewReader("hello"), 5, ""); err != nil || v != 0 {
			t.Fatalf("%s: exact size: version %d, %v", name, v, err)
		}
		a, err := st.Load(ctx, "u", "s", "ok.txt", nil)
		if err != nil || string(a.Data) != "hello" {
			t.Fatalf("%s: load %v %v", name, a, err)
		}
		for _, c := range []struct{ data string }{{"hell"}, {"hello!"}} {
			_, err := st.SaveReader(ctx, "u", "s", "bad.txt", strings.NewReader(c.data), 5, "")
			if !errors.Is(err, ErrSizeMismatch) {
				t.Errorf("%s: %q as 5 bytes: %v, want ErrSizeMismatch", name, c.data, err)
			}
		}
		if vs, _ := st.ListVersions(ctx, "u", "s", "bad.txt"); len(vs) != 0 {
			t.Errorf("%s: a mismatched save left versions %v", name, vs)
		}
	}
	q := WithQuota(NewMemory("ns"), Quota{UserBytes: 10})
	if _, err := q.SaveReader(context.Background(), "u", "s", "big", strings.NewReader("x"), 11, ""); !errors.Is(err, ErrQuota) {
		t.Fatalf("11 bytes under a 10-byte quota: %v", err)
	}
}
