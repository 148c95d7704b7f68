package artifacts

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"

	"github.com/securetoolruntime/str/internal/objstoretest"
)

// The GCS store's tests run against fake-gcs-server (a GCS emulator,
// internal/objstoretest), started by each test on loopback with a
// directory of its own; the client finds it through
// STORAGE_EMULATOR_HOST, as a deployment's would.

const testGCSBucket = objstoretest.Bucket

// gcsServer is the test's emulator, with the clients the tests use.
type gcsServer struct {
	*objstoretest.Server
	t *testing.T
}

func startGCS(t *testing.T) *gcsServer {
	t.Helper()
	return &gcsServer{Server: objstoretest.GCS(t), t: t}
}

// raw is a plain client of the emulator, the way another program (ADK's
// google-cloud-storage client) reaches the same bucket.
func (s *gcsServer) raw() *storage.Client {
	s.t.Helper()
	c, err := storage.NewClient(context.Background(), storage.WithJSONReads())
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { c.Close() })
	return c
}

// names lists every object name in the bucket, sorted.
func (s *gcsServer) names() []string {
	s.t.Helper()
	it := s.raw().Bucket(testGCSBucket).Objects(context.Background(), nil)
	out := []string{}
	for {
		o, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			s.t.Fatal(err)
		}
		out = append(out, o.Name)
	}
	sort.Strings(out)
	return out
}

func newGCS(t *testing.T, namespace string, opts ...Option) Store {
	t.Helper()
	st, err := NewGCS(context.Background(), GCSSettings{Bucket: testGCSBucket}, namespace, opts...)
	if err != nil {
		t.Fatalf("NewGCS: %v", err)
	}
	return st
}

// Versions, scoping and name rules in ADK's object names.
func TestGCSRoundTrip(t *testing.T) {
	srv := startGCS(t)
	ctx := context.Background()
	st := newGCS(t, "/myorg/dev/")
	for i, body := range []string{"a,b\n", "a,b\n1,2\n"} {
		if v, err := st.Save(ctx, "alice", "s1", "data.csv", []byte(body), ""); err != nil || v != i {
			t.Fatalf("save %d: version %d, %v", i, v, err)
		}
	}
	a, err := st.Load(ctx, "alice", "s1", "data.csv", nil)
	if err != nil || a.Version != 1 || string(a.Data) != "a,b\n1,2\n" || a.MimeType != "text/csv" {
		t.Fatalf("latest: %+v, %v", a, err)
	}
	if a, err = st.Load(ctx, "alice", "s1", "data.csv", intp(0)); err != nil || string(a.Data) != "a,b\n" {
		t.Fatalf("version 0: %+v, %v", a, err)
	}
	if _, err := st.Load(ctx, "alice", "s2", "data.csv", nil); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another session: %v", err)
	}
	if _, err := st.Save(ctx, "alice", "s1", "user:prefs.json", []byte("{}"), ""); err != nil {
		t.Fatal(err)
	}
	if a, err = st.Load(ctx, "alice", "s9", "user:prefs.json", nil); err != nil || string(a.Data) != "{}" || a.MimeType != "application/json" {
		t.Fatalf("user-scoped: %+v, %v", a, err)
	}
	want := []string{"myorg/dev/alice/s1/data.csv/0", "myorg/dev/alice/s1/data.csv/1", "myorg/dev/alice/user/user:prefs.json/0"}
	if got := srv.names(); !reflect.DeepEqual(got, want) {
		t.Fatalf("names %q, want %q", got, want)
	}
	for _, name := range []string{"../x", "a/b", "x\u202etxt"} {
		if _, err := st.Save(ctx, "alice", "s1", name, []byte("x"), ""); !errors.Is(err, ErrUnsafeName) {
			t.Errorf("save %q: %v", name, err)
		}
	}
	if serr, aerr := st.(Checker).Check(); serr != nil || aerr != nil {
		t.Fatalf("Check: %v, %v", serr, aerr)
	}
}

// Objects written as ADK's GcsArtifactService writes them (its names and
// Content-Type) are read by str, and what str writes is found by ADK's
// list_versions (the last "/"-separated part of each name under
// {app}/{user}/{session or user}/{filename}/).
func TestGCSSharesADKObjects(t *testing.T) {
	srv := startGCS(t)
	ctx := context.Background()
	bkt := srv.raw().Bucket(testGCSBucket)
	for _, o := range []struct{ name, mime, body string }{
		{"sam/u1/s1/report.csv/0", "text/csv", "v0"},
		{"sam/u1/s1/report.csv/1", "text/csv", "v1"},
		{"sam/u1/user/user:notes.txt/0", "text/plain", "shared"},
	} {
		w := bkt.Object(o.name).NewWriter(ctx)
		w.ContentType = o.mime
		io.WriteString(w, o.body)
		if err := w.Close(); err != nil {
			t.Fatalf("write %s: %v", o.name, err)
		}
	}
	st := newGCS(t, "sam")
	if a, err := st.Load(ctx, "u1", "s1", "report.csv", nil); err != nil || a.Version != 1 || a.MimeType != "text/csv" || string(a.Data) != "v1" {
		t.Fatalf("report.csv: %+v, %v", a, err)
	}
	if a, err := st.Load(ctx, "u1", "s5", "user:notes.txt", nil); err != nil || a.MimeType != "text/plain" || string(a.Data) != "shared" {
		t.Fatalf("user:notes.txt: %+v, %v", a, err)
	}
	if v, err := st.Save(ctx, "u1", "s1", "report.csv", []byte("v2"), ""); err != nil || v != 2 {
		t.Fatalf("save after ADK's versions: %d, %v", v, err)
	}
	if v, err := st.Save(ctx, "u1", "s2", "user:notes.txt", []byte("more"), ""); err != nil || v != 1 {
		t.Fatalf("user-scoped save after ADK's: %d, %v", v, err)
	}
	for prefix, want := range map[string][]int{"sam/u1/s1/report.csv/": {0, 1, 2}, "sam/u1/user/user:notes.txt/": {0, 1}} {
		got := []int{}
		for _, n := range srv.names() {
			if rest, ok := strings.CutPrefix(n, prefix); ok {
				v, err := strconv.Atoi(rest[strings.LastIndexByte(rest, '/')+1:])
				if err != nil {
					t.Fatalf("ADK's list_versions would fail on %q", n)
				}
				got = append(got, v)
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: versions %v, want %v", prefix, got, want)
		}
	}
	attrs, err := bkt.Object("sam/u1/s1/report.csv/2").Attrs(ctx)
	if err != nil || attrs.ContentType != "text/csv" {
		t.Fatalf("str's object: %+v, %v", attrs, err)
	}
}

// A 100 MiB output is streamed, one chunk buffer at a time.
func TestGCSStreams100MiB(t *testing.T) {
	srv := startGCS(t)
	ctx := context.Background()
	st := newGCS(t, "sam")
	const size = 100 << 20
	src := &patternReader{n: size}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v, err := st.SaveReader(ctx, "u1", "s1", "big.bin", src, size, "")
	runtime.ReadMemStats(&after)
	if err != nil || v != 0 || src.read != size {
		t.Fatalf("save: %d, %v (read %d)", v, err, src.read)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 40<<20 {
		t.Fatalf("a %d MiB save allocated %d MiB: not streamed", size>>20, alloc>>20)
	}
	r, err := srv.raw().Bucket(testGCSBucket).Object("sam/u1/s1/big.bin/0").NewReader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	got, want := sha256.New(), sha256.New()
	if n, err := io.Copy(got, r); err != nil || n != size {
		t.Fatalf("read back %d bytes: %v", n, err)
	}
	io.Copy(want, &patternReader{n: size})
	if string(got.Sum(nil)) != string(want.Sum(nil)) {
		t.Fatal("the stored object differs from what was saved")
	}
}

// Short or long readers store nothing.
func TestGCSSizeMismatch(t *testing.T) {
	srv := startGCS(t)
	st := newGCS(t, "sam")
	for _, c := range []struct{ announced, given int64 }{{10, 9}, {10, 11}, {20 << 20, 20<<20 - 1}, {20 << 20, 20<<20 + 1}} {
		if _, err := st.SaveReader(context.Background(), "u1", "s1", "x.bin", &patternReader{n: c.given}, c.announced, ""); !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("%+v: %v, want ErrSizeMismatch", c, err)
		}
	}
	if names := srv.names(); len(names) != 0 {
		t.Fatalf("stored: %q", names)
	}
}

// The emulator stopped in the middle of an upload: the save fails naming
// the error, no version appears, and saves work once it is back.
func TestGCSStoreStoppedMidUpload(t *testing.T) {
	srv := startGCS(t)
	ctx := context.Background()
	st := newGCS(t, "sam")
	const size = 40 << 20
	_, err := st.SaveReader(ctx, "u1", "s1", "big.bin", &patternReader{n: size, afterBytes: 20 << 20, after: srv.Stop}, size, "")
	if err == nil || errors.Is(err, ErrSizeMismatch) || !strings.Contains(err.Error(), "gcs store") {
		t.Fatalf("save with the store stopped: %v", err)
	}
	t.Logf("the save's error: %v", err)
	if serr, _ := st.(Checker).Check(); serr == nil {
		t.Fatal("Check with the store down: nil")
	}
	srv.Start()
	if vs, err := st.ListVersions(ctx, "u1", "s1", "big.bin"); err != nil || len(vs) != 0 {
		t.Fatalf("versions after the failed save: %v, %v", vs, err)
	}
	if v, err := st.SaveReader(ctx, "u1", "s1", "big.bin", &patternReader{n: size}, size, ""); err != nil || v != 0 {
		t.Fatalf("save after the store is back: %d, %v", v, err)
	}
}

// A missing bucket fails at start-up, naming it.
func TestGCSMissingBucket(t *testing.T) {
	startGCS(t)
	_, err := NewGCS(context.Background(), GCSSettings{Bucket: "no-such-bucket"}, "sam")
	if err == nil || !strings.Contains(err.Error(), `bucket "no-such-bucket": it does not exist`) {
		t.Fatalf("NewGCS with a missing bucket: %v", err)
	}
}

// Two stores on one bucket saving one name at once get distinct versions.
func TestGCSConcurrentWriters(t *testing.T) {
	startGCS(t)
	ctx := context.Background()
	a, b := newGCS(t, "sam"), newGCS(t, "sam")
	// The service must refuse a write over an existing object under the
	// precondition "does not exist".
	if _, err := a.Save(ctx, "u0", "s0", "probe.txt", []byte("x"), ""); err != nil {
		t.Fatal(err)
	}
	err := a.(*gcsStore).put(ctx, "sam/u0/s0/probe.txt/0", strings.NewReader("y"), 1, "text/plain")
	if gcsStatus(err) != http.StatusPreconditionFailed {
		t.Fatalf("a conditional write over an existing object: %v, want 412", err)
	}
	const each = 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for w, st := range []Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if _, err := st.Save(ctx, "u1", "s1", "shared.txt", []byte(fmt.Sprintf("worker %d save %d", w, i)), ""); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	vs, err := a.ListVersions(ctx, "u1", "s1", "shared.txt")
	if err != nil || len(vs) != 2*each {
		t.Fatalf("versions %v, %v", vs, err)
	}
	seen := map[string]bool{}
	for _, v := range vs {
		art, err := b.Load(ctx, "u1", "s1", "shared.txt", intp(v))
		if err != nil {
			t.Fatal(err)
		}
		seen[string(art.Data)] = true
	}
	if len(seen) != 2*each {
		t.Fatalf("%d distinct contents in %d versions: a save was overwritten", len(seen), len(vs))
	}
}

// Quotas hold on the GCS store.
func TestGCSQuota(t *testing.T) {
	startGCS(t)
	ctx := context.Background()
	st := WithQuota(newGCS(t, "sam"), Quota{UserBytes: 10, SessionVersions: 2})
	for _, body := range []string{"12345", "1"} {
		if _, err := st.Save(ctx, "u1", "s1", "a.txt", []byte(body), ""); err != nil {
			t.Fatal(err)
		}
	}
	var qe *QuotaError
	if _, err := st.Save(ctx, "u1", "s1", "b.txt", []byte("1"), ""); !errors.As(err, &qe) || qe.Scope != "session" {
		t.Fatalf("session versions: %v", err)
	}
	if _, err := st.Save(ctx, "u1", "s2", "user:c.txt", []byte("12345"), ""); !errors.As(err, &qe) || qe.Scope != "user" || qe.Used != 6 {
		t.Fatalf("user bytes: %v", err)
	}
}
