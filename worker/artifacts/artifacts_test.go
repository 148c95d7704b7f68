package artifacts

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

var bg = context.Background()

func intp(i int) *int { return &i }

func stores(t *testing.T) map[string]Store {
	t.Helper()
	fs, err := NewFilesystem(t.TempDir(), "myorg/dev/")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]Store{"memory": NewMemory("myorg/dev/"), "filesystem": fs}
}

func TestRoundTrip(t *testing.T) {
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			for i, content := range []string{"first", "second", "third"} {
				v, err := s.Save(bg, "user-42", "sess-1", "report.txt", []byte(content), "")
				if err != nil || v != i {
					t.Fatalf("save %d: version %d, %v", i, v, err)
				}
			}
			a, err := s.Load(bg, "user-42", "sess-1", "report.txt", nil)
			if err != nil {
				t.Fatal(err)
			}
			if a.Version != 2 || string(a.Data) != "third" || a.MimeType != "text/plain" || a.Filename != "report.txt" {
				t.Errorf("latest = %+v", a)
			}
			a, err = s.Load(bg, "user-42", "sess-1", "report.txt", intp(0))
			if err != nil || string(a.Data) != "first" || a.Version != 0 {
				t.Errorf("version 0 = %+v, %v", a, err)
			}
			vs, err := s.ListVersions(bg, "user-42", "sess-1", "report.txt")
			if err != nil || !reflect.DeepEqual(vs, []int{0, 1, 2}) {
				t.Errorf("versions = %v, %v", vs, err)
			}
			// explicit mime type kept; binary content intact
			bin := []byte{0, 1, 2, 255}
			if _, err := s.Save(bg, "user-42", "sess-1", "blob", bin, "application/x-thing"); err != nil {
				t.Fatal(err)
			}
			a, err = s.Load(bg, "user-42", "sess-1", "blob", nil)
			if err != nil || !reflect.DeepEqual(a.Data, bin) || a.MimeType != "application/x-thing" {
				t.Errorf("blob = %+v, %v", a, err)
			}
			// other session, other user: not found
			for _, c := range [][2]string{{"user-42", "sess-2"}, {"user-43", "sess-1"}} {
				if _, err := s.Load(bg, c[0], c[1], "report.txt", nil); !errors.Is(err, ErrNotFound) {
					t.Errorf("load as %v: %v, want ErrNotFound", c, err)
				}
			}
			if _, err := s.Load(bg, "user-42", "sess-1", "report.txt", intp(3)); !errors.Is(err, ErrNotFound) {
				t.Errorf("missing version: %v", err)
			}
			if vs, err := s.ListVersions(bg, "user-42", "sess-1", "nothing"); err != nil || len(vs) != 0 {
				t.Errorf("versions of nothing = %v, %v", vs, err)
			}
			// user-scoped names are shared across sessions
			if v, err := s.Save(bg, "user-42", "sess-1", "user:profile.json", []byte(`{}`), ""); err != nil || v != 0 {
				t.Fatal(v, err)
			}
			a, err = s.Load(bg, "user-42", "another-session", "user:profile.json", nil)
			if err != nil || string(a.Data) != `{}` || a.MimeType != "application/json" {
				t.Errorf("user-scoped load = %+v, %v", a, err)
			}
			if _, err := s.Load(bg, "user-43", "sess-1", "user:profile.json", nil); !errors.Is(err, ErrNotFound) {
				t.Errorf("other user's user-scoped artifact: %v", err)
			}
			// a cancelled context stops the call
			ctx, cancel := context.WithCancel(bg)
			cancel()
			if _, err := s.Save(ctx, "user-42", "sess-1", "x.txt", nil, ""); !errors.Is(err, context.Canceled) {
				t.Errorf("save with cancelled ctx: %v", err)
			}
		})
	}
}

func TestFilesystemLayoutMatchesReference(t *testing.T) {
	base := t.TempDir()
	s, err := NewFilesystem(base, "myorg/prod/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(bg, "user-42", "web-session-abc", "summary.txt", []byte("Lines: 3"), "text/plain"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(bg, "user-42", "web-session-abc", "summary.txt", []byte("Lines: 4"), "text/plain"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Save(bg, "user-42", "web-session-abc", "user:notes.csv", []byte("a,b"), ""); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"prod/user-42/web-session-abc/summary.txt/0":      "Lines: 3",
		"prod/user-42/web-session-abc/summary.txt/0.meta": `{"mime_type": "text/plain"}`,
		"prod/user-42/web-session-abc/summary.txt/1":      "Lines: 4",
		"prod/user-42/web-session-abc/summary.txt/1.meta": `{"mime_type": "text/plain"}`,
		"prod/user-42/user/notes.csv/0":                   "a,b",
		"prod/user-42/user/notes.csv/0.meta":              `{"mime_type": "text/csv"}`,
	}
	got := map[string]string{}
	err = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == lockFileName {
			return err
		}
		rel, _ := filepath.Rel(base, p)
		b, err := os.ReadFile(p)
		got[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("store contents:\n got %q\nwant %q", got, want)
	}
	st, err := os.Stat(filepath.Join(base, "prod/user-42/web-session-abc/summary.txt/0"))
	if err != nil || st.Mode().Perm()&0o044 != 0o044 {
		t.Errorf("data file mode %v, %v: must be readable by the agents", st.Mode(), err)
	}
}

// writeFixture writes files as the reference Python service lays them out.
func writeFixture(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(root, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadsReferenceFixtures(t *testing.T) {
	base := t.TempDir()
	writeFixture(t, base, map[string]string{
		"dev/u1/s1/data.csv/0":          "a,b\n1,2\n",
		"dev/u1/s1/data.csv/0.meta":     `{"mime_type": "text/csv"}`,
		"dev/u1/s1/data.csv/1":          "a,b\n3,4\n",
		"dev/u1/s1/data.csv/1.meta":     `{"mime_type": "text/csv", "extra": 1}`,
		"dev/u1/s1/data.csv/2":          "half-written: no .meta yet",
		"dev/u1/s1/data.csv/007":        "not a canonical version name",
		"dev/u1/s1/data.csv/notes":      "not a version",
		"dev/u1/s1/img/0":               "\x89PNG",
		"dev/u1/s1/img/0.meta":          `{"mime_type": null}`,
		"dev/u1/user/prefs.json/0":      `{"theme":"dark"}`,
		"dev/u1/user/prefs.json/0.meta": `{"mime_type": "application/json"}`,
	})
	s, err := NewFilesystem(base, "dev")
	if err != nil {
		t.Fatal(err)
	}
	// latest skips version 2, which has no .meta
	a, err := s.Load(bg, "u1", "s1", "data.csv", nil)
	if err != nil || a.Version != 1 || string(a.Data) != "a,b\n3,4\n" || a.MimeType != "text/csv" {
		t.Fatalf("latest = %+v, %v", a, err)
	}
	if _, err := s.Load(bg, "u1", "s1", "data.csv", intp(2)); !errors.Is(err, ErrNotFound) {
		t.Errorf("version without .meta: %v, want ErrNotFound", err)
	}
	vs, err := s.ListVersions(bg, "u1", "s1", "data.csv")
	if err != nil || !reflect.DeepEqual(vs, []int{0, 1, 2}) {
		t.Errorf("versions = %v, %v (the reference lists data files)", vs, err)
	}
	// a save after the half-written version does not reuse it
	v, err := s.Save(bg, "u1", "s1", "data.csv", []byte("new"), "text/csv")
	if err != nil || v != 3 {
		t.Errorf("save after fixtures = %d, %v, want 3", v, err)
	}
	// null mime_type reads as the reference's default
	a, err = s.Load(bg, "u1", "s1", "img", intp(0))
	if err != nil || a.MimeType != "application/octet-stream" {
		t.Errorf("img = %+v, %v", a, err)
	}
	a, err = s.Load(bg, "u1", "s9", "user:prefs.json", nil)
	if err != nil || string(a.Data) != `{"theme":"dark"}` || a.Filename != "user:prefs.json" {
		t.Errorf("user-scoped fixture = %+v, %v", a, err)
	}
	// an orphaned .meta (data lost) is not reused either
	writeFixture(t, base, map[string]string{"dev/u1/s1/o.txt/0": "x", "dev/u1/s1/o.txt/0.meta": `{"mime_type": "text/plain"}`, "dev/u1/s1/o.txt/1.meta": `{"mime_type": "text/plain"}`})
	if v, err := s.Save(bg, "u1", "s1", "o.txt", []byte("y"), ""); err != nil || v != 2 {
		t.Errorf("save next to orphaned meta = %d, %v, want 2", v, err)
	}
}

func TestSymlinksInStoreAreNotFollowed(t *testing.T) {
	base := t.TempDir()
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFixture(t, base, map[string]string{
		"dev/u1/s1/f/0":      "ok",
		"dev/u1/s1/f/0.meta": `{"mime_type": "text/plain"}`,
		"dev/u1/s1/f/1.meta": `{"mime_type": "text/plain"}`,
	})
	if err := os.Symlink(secret, filepath.Join(base, "dev/u1/s1/f/1")); err != nil {
		t.Fatal(err)
	}
	s, _ := NewFilesystem(base, "dev")
	a, err := s.Load(bg, "u1", "s1", "f", nil)
	if err != nil || string(a.Data) != "ok" {
		t.Errorf("latest = %+v, %v; the symlinked version must be skipped", a, err)
	}
	if _, err := s.Load(bg, "u1", "s1", "f", intp(1)); !errors.Is(err, ErrNotFound) {
		t.Errorf("symlinked version: %v", err)
	}
}

func TestMetaMatchesPythonJSONDumps(t *testing.T) {
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		mustwork.Skip(t, fmt.Sprintf("%s not available to compare with json.dumps: %v", py, err))
	}
	types := []string{"text/plain", "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
		`we"ird\type`, "tab\there", "caf\u00e9/x", "emoji/\U0001F600", "ctl/\x01\x7f", ""}
	in, _ := json.Marshal(types)
	cmd := exec.Command(py, "-c", `import json,sys
for t in json.loads(sys.stdin.read()):
    print(json.dumps({"mime_type": t}))`)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for i := 0; sc.Scan(); i++ {
		if got := string(metaJSON(types[i])); got != sc.Text() {
			t.Errorf("metaJSON(%q) = %s, python writes %s", types[i], got, sc.Text())
		}
	}
}

func TestNFKCFilenames(t *testing.T) {
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			// fullwidth letters and the "ﬁ" ligature normalise to ASCII
			if _, err := s.Save(bg, "u", "s", "ｒｅｐｏｒｔ.txt", []byte("a"), ""); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Save(bg, "u", "s", "report.txt", []byte("b"), ""); err != nil {
				t.Fatal(err)
			}
			a, err := s.Load(bg, "u", "s", "report.txt", nil)
			if err != nil || a.Version != 1 || a.Filename != "report.txt" {
				t.Errorf("load = %+v, %v", a, err)
			}
			if vs, _ := s.ListVersions(bg, "u", "s", "\ufb01le"); len(vs) != 0 {
				t.Errorf("ligature name has versions %v before any save", vs)
			}
			if _, err := s.Save(bg, "u", "s", "\ufb01le", []byte("c"), ""); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Load(bg, "u", "s", "file", intp(0)); err != nil {
				t.Errorf("ligature saved under another name: %v", err)
			}
			// non-ASCII names that NFKC keeps are fine
			if _, err := s.Save(bg, "u", "s", "résumé.pdf", []byte("d"), ""); err != nil {
				t.Errorf("résumé.pdf: %v", err)
			}
			// normalisation that produces a separator or ".." is rejected
			for _, bad := range []string{"a\uff0fb", "\uff0e\uff0e", "user:\uff0e\uff0e"} {
				if _, err := s.Save(bg, "u", "s", bad, []byte("x"), ""); !errors.Is(err, ErrUnsafeName) {
					t.Errorf("save %q: %v, want ErrUnsafeName", bad, err)
				}
			}
		})
	}
	base := t.TempDir()
	s, _ := NewFilesystem(base, "dev")
	if _, err := s.Save(bg, "u", "s", "ｒｅｐｏｒｔ.txt", []byte("a"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "dev/u/s/report.txt/0")); err != nil {
		t.Errorf("normalised directory: %v", err)
	}
}

func TestConcurrentSavesGetDistinctVersions(t *testing.T) {
	base := t.TempDir()
	// Two store instances on one base: their in-process mutexes are
	// separate, so only the flock keeps them apart.
	s1, _ := NewFilesystem(base, "dev")
	s2, _ := NewFilesystem(base, "dev")
	for name, pair := range map[string][2]Store{"memory": {NewMemory("dev"), nil}, "filesystem": {s1, s2}} {
		t.Run(name, func(t *testing.T) {
			const n = 20
			versions := make([]int, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					s := pair[0]
					if pair[1] != nil && i%2 == 1 {
						s = pair[1]
					}
					versions[i], errs[i] = s.Save(bg, "u", "s", "same.txt", []byte("content "+strconv.Itoa(i)), "")
				}(i)
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("save %d: %v", i, err)
				}
			}
			checkDistinct(t, pair[0], versions, n)
		})
	}
}

// checkDistinct checks versions are 0..n-1, each holding the content its
// saver wrote.
func checkDistinct(t *testing.T, s Store, versions []int, n int) {
	t.Helper()
	sorted := append([]int(nil), versions...)
	sort.Ints(sorted)
	for i, v := range sorted {
		if v != i {
			t.Fatalf("versions = %v, want 0..%d each once", sorted, n-1)
		}
	}
	for i, v := range versions {
		a, err := s.Load(bg, "u", "s", "same.txt", intp(v))
		if err != nil || string(a.Data) != "content "+strconv.Itoa(i) {
			t.Errorf("version %d = %+v, %v, want content %d", v, a, err, i)
		}
	}
}

// TestHelperSaver is run as a child process by TestConcurrentSavesAcrossProcesses.
func TestHelperSaver(t *testing.T) {
	base := os.Getenv("STR_ARTIFACTS_HELPER_BASE")
	if base == "" {
		t.Skip("helper process for TestConcurrentSavesAcrossProcesses")
	}
	s, err := NewFilesystem(base, "dev")
	if err != nil {
		t.Fatal(err)
	}
	first, _ := strconv.Atoi(os.Getenv("STR_ARTIFACTS_HELPER_FIRST"))
	var wg sync.WaitGroup
	for i := first; i < first+10; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			v, err := s.Save(bg, "u", "s", "same.txt", []byte("content "+strconv.Itoa(i)), "")
			if err != nil {
				t.Error(err)
				return
			}
			fmt.Printf("saved %d %d\n", i, v)
		}(i)
	}
	wg.Wait()
}

func TestConcurrentSavesAcrossProcesses(t *testing.T) {
	base := t.TempDir()
	var cmds []*exec.Cmd
	var outs []*strings.Builder
	for p := 0; p < 2; p++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperSaver$", "-test.count=1")
		cmd.Env = append(os.Environ(), "STR_ARTIFACTS_HELPER_BASE="+base, "STR_ARTIFACTS_HELPER_FIRST="+strconv.Itoa(p*10))
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
	}
	versions := make([]int, 20)
	seen := 0
	for p, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v\n%s", p, err, outs[p])
		}
		for _, line := range strings.Split(outs[p].String(), "\n") {
			var i, v int
			if _, err := fmt.Sscanf(line, "saved %d %d", &i, &v); err == nil {
				versions[i] = v
				seen++
			}
		}
	}
	if seen != 20 {
		t.Fatalf("helpers reported %d saves, want 20:\n%s\n%s", seen, outs[0], outs[1])
	}
	s, _ := NewFilesystem(base, "dev")
	checkDistinct(t, s, versions, 20)
}

func TestUnsafeNames(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", `a\b`, "/abs", "nul\x00", strings.Repeat("x", 256), "\xff\xfe"} {
		if err := CheckName(bad); !errors.Is(err, ErrUnsafeName) {
			t.Errorf("CheckName(%q) = %v", bad, err)
		}
	}
	for _, good := range []string{"a", "report.txt", "..hidden", "a..b", "user:x", strings.Repeat("x", 255), "résumé"} {
		if err := CheckName(good); err != nil {
			t.Errorf("CheckName(%q) = %v", good, err)
		}
	}
	for name, s := range stores(t) {
		t.Run(name, func(t *testing.T) {
			cases := [][3]string{
				{"../u", "s", "f"}, {"u", "../s", "f"}, {"u", "s", "../f"}, {"u", "s", "a/b"},
				{"", "s", "f"}, {"u", "", "f"}, {"u", "s", ""}, {"u", "s", "user:"}, {"u", "s", "user:a/b"},
				{"u", "s", ".."}, {"u", "user", "f"}, {"u", "s", "/etc/passwd"}, {"u", "s", `..\x`},
			}
			for _, c := range cases {
				if _, err := s.Save(bg, c[0], c[1], c[2], []byte("x"), ""); !errors.Is(err, ErrUnsafeName) {
					t.Errorf("Save%q = %v, want ErrUnsafeName", c, err)
				}
				if _, err := s.Load(bg, c[0], c[1], c[2], nil); !errors.Is(err, ErrUnsafeName) {
					t.Errorf("Load%q = %v, want ErrUnsafeName", c, err)
				}
				if _, err := s.ListVersions(bg, c[0], c[1], c[2]); !errors.Is(err, ErrUnsafeName) {
					t.Errorf("ListVersions%q = %v, want ErrUnsafeName", c, err)
				}
			}
		})
	}
	for _, ns := range []string{"", "/", "//", "a/..", "a/."} {
		if _, err := NewFilesystem(t.TempDir(), ns); !errors.Is(err, ErrUnsafeName) {
			t.Errorf("NewFilesystem namespace %q: %v", ns, err)
		}
		if _, err := NewMemory(ns).Save(bg, "u", "s", "f", nil, ""); !errors.Is(err, ErrUnsafeName) {
			t.Errorf("NewMemory namespace %q: %v", ns, err)
		}
	}
	if sc, err := Scope("org/team/app//"); err != nil || sc != "app" {
		t.Errorf("Scope = %q, %v", sc, err)
	}
	if _, err := NewFilesystem("", "ns"); err == nil {
		t.Error("empty base path accepted")
	}
}

func TestMimeByExtension(t *testing.T) {
	for name, want := range map[string]string{
		"a.json": "application/json", "a.txt": "text/plain", "a.csv": "text/csv", "a.png": "image/png",
		"a.jpg": "image/jpeg", "a.jpeg": "image/jpeg", "A.JPG": "image/jpeg", "a.bin": "application/octet-stream",
		"noext": "application/octet-stream", "a.txt.gz": "application/octet-stream", ".txt": "text/plain",
	} {
		if got := MimeByExtension(name); got != want {
			t.Errorf("MimeByExtension(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestAuditLog(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "audit.jsonl")
	fs, err := NewFilesystem(t.TempDir(), "ns/dev", WithAuditLog(logPath))
	if err != nil {
		t.Fatal(err)
	}
	mem := NewMemory("ns/dev", WithAuditLog(logPath))
	for _, s := range []Store{fs, mem} {
		if _, err := s.Save(bg, "u", "s", "a.txt", []byte("hello"), ""); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(bg, "u", "s", "a.txt", nil); err != nil {
			t.Fatal(err)
		}
		s.Load(bg, "u", "s", "../etc", nil)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 6 {
		t.Fatalf("audit log has %d lines, want 6:\n%s", len(lines), b)
	}
	sum := sha256.Sum256([]byte("hello"))
	for i, line := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		wantOp := []string{"save", "load", "load"}[i%3]
		if m["op"] != wantOp || m["scope"] != "dev" || m["user"] != "u" || m["session"] != "s" || m["time"] == "" {
			t.Errorf("line %d = %s", i, line)
		}
		if i%3 == 2 {
			if m["error"] == nil || m["version"] != nil {
				t.Errorf("refused load line %d = %s", i, line)
			}
			continue
		}
		if m["filename"] != "a.txt" || m["version"] != float64(0) || m["size"] != float64(5) || m["sha256"] != hex.EncodeToString(sum[:]) {
			t.Errorf("line %d = %s", i, line)
		}
	}
	st, _ := os.Stat(logPath)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode %v", st.Mode())
	}
	// fail closed: an unwritable audit log fails the save
	bad, _ := NewFilesystem(t.TempDir(), "dev", WithAuditLog(filepath.Join(t.TempDir(), "missing-dir", "audit.jsonl")))
	if _, err := bad.Save(bg, "u", "s", "a.txt", []byte("x"), ""); err == nil || !strings.Contains(err.Error(), "audit log") {
		t.Errorf("save with unwritable audit log: %v", err)
	}
}
