package artifacts

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/securetoolruntime/str/internal/objstoretest"
)

// The S3 store's tests run against a real S3 server: versitygw
// (internal/objstoretest), started by each test on loopback with a
// bucket directory of its own.

const (
	testS3Access = objstoretest.S3Access
	testS3Secret = objstoretest.S3Secret
	testS3Bucket = objstoretest.Bucket
)

// s3Server is the test's versitygw, with the clients the tests use.
type s3Server struct {
	*objstoretest.Server
	t *testing.T
}

func startS3(t *testing.T) *s3Server {
	t.Helper()
	return &s3Server{Server: objstoretest.S3(t), t: t}
}

func (s *s3Server) settings() S3Settings {
	return S3Settings{Bucket: testS3Bucket, Endpoint: s.Endpoint()}
}

// raw is a plain client of the server, the way another program (the
// reference's boto3 client) reaches the same bucket.
func (s *s3Server) raw() *s3.Client {
	return s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(s.Endpoint()), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(testS3Access, testS3Secret, ""),
	})
}

// keys lists every object key in the bucket.
func (s *s3Server) keys() []string {
	s.t.Helper()
	out, err := s.raw().ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(testS3Bucket)})
	if err != nil {
		s.t.Fatal(err)
	}
	keys := []string{}
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

func newS3(t *testing.T, srv *s3Server, namespace string, opts ...Option) Store {
	t.Helper()
	st, err := NewS3(context.Background(), srv.settings(), namespace, opts...)
	if err != nil {
		t.Fatalf("NewS3: %v", err)
	}
	return st
}

// Versions, scoping, mime types and name rules, as the filesystem store
// keeps them, in the reference's keys.
func TestS3RoundTrip(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	st := newS3(t, srv, "/myorg/dev/")
	for i, body := range []string{"a,b\n", "a,b\n1,2\n"} {
		v, err := st.Save(ctx, "alice", "s1", "data.csv", []byte(body), "")
		if err != nil || v != i {
			t.Fatalf("save %d: version %d, %v", i, v, err)
		}
	}
	a, err := st.Load(ctx, "alice", "s1", "data.csv", nil)
	if err != nil || a.Version != 1 || string(a.Data) != "a,b\n1,2\n" || a.MimeType != "text/csv" || a.Filename != "data.csv" {
		t.Fatalf("latest: %+v, %v", a, err)
	}
	a, err = st.Load(ctx, "alice", "s1", "data.csv", intp(0))
	if err != nil || string(a.Data) != "a,b\n" {
		t.Fatalf("version 0: %+v, %v", a, err)
	}
	if vs, err := st.ListVersions(ctx, "alice", "s1", "data.csv"); err != nil || !reflect.DeepEqual(vs, []int{0, 1}) {
		t.Fatalf("versions: %v, %v", vs, err)
	}
	// another session, another user: nothing.
	for _, who := range [][2]string{{"alice", "s2"}, {"bob", "s1"}} {
		if _, err := st.Load(ctx, who[0], who[1], "data.csv", nil); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%v: %v, want ErrNotFound", who, err)
		}
		if vs, err := st.ListVersions(ctx, who[0], who[1], "data.csv"); err != nil || len(vs) != 0 {
			t.Fatalf("%v versions: %v, %v", who, vs, err)
		}
	}
	if _, err := st.Load(ctx, "alice", "s1", "data.csv", intp(7)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("version 7: %v, want ErrNotFound", err)
	}
	// user-scoped: across sessions; an empty artifact; an explicit mime type.
	if _, err := st.Save(ctx, "alice", "s1", "user:prefs.json", nil, "application/json; charset=utf-8"); err != nil {
		t.Fatal(err)
	}
	a, err = st.Load(ctx, "alice", "s9", "user:prefs.json", nil)
	if err != nil || len(a.Data) != 0 || a.MimeType != "application/json; charset=utf-8" || a.Filename != "user:prefs.json" {
		t.Fatalf("user-scoped: %+v, %v", a, err)
	}
	want := []string{"myorg/dev/alice/s1/data.csv/0", "myorg/dev/alice/s1/data.csv/1", "myorg/dev/alice/user/prefs.json/0"}
	if got := srv.keys(); !reflect.DeepEqual(got, want) {
		t.Fatalf("keys %q, want %q", got, want)
	}
	// refused, before anything is stored.
	for _, c := range []struct{ user, session, name, mime string }{
		{"alice", "s1", "../x", ""}, {"alice", "s1", "a/b", ""}, {"al/ice", "s1", "x", ""},
		{"alice", "..", "x", ""}, {"alice", "user", "x", ""}, {"alice", "s1", "x\u202etxt", ""},
		{"alice", "s1", "x", "not a type"},
	} {
		_, err := st.Save(ctx, c.user, c.session, c.name, []byte("x"), c.mime)
		if !errors.Is(err, ErrUnsafeName) && !errors.Is(err, ErrBadMimeType) {
			t.Errorf("save %+v: %v, want a refusal", c, err)
		}
	}
	if got := srv.keys(); len(got) != 3 {
		t.Fatalf("a refused save stored something: %q", got)
	}
	if c, ok := st.(Checker); !ok {
		t.Fatal("the s3 store is not a Checker")
	} else if serr, aerr := c.Check(); serr != nil || aerr != nil {
		t.Fatalf("Check: %v, %v", serr, aerr)
	}
}

// referenceMeta is the user metadata the reference's S3 service writes
// (s3_artifact_service.py, save_artifact): original_filename, user_id and
// session_id through _sanitize_metadata_value (ASCII, backslashreplace),
// version as str(version).
func referenceMeta(filename, user, session string, version int) map[string]string {
	return map[string]string{
		"original_filename": asciiBackslashReplace(filename),
		"user_id":           asciiBackslashReplace(user),
		"session_id":        asciiBackslashReplace(session),
		"version":           strconv.Itoa(version),
	}
}

// referenceVersions is the reference's list_versions over a listing:
// every key under {app}/{user}/{session|user}/{name}/ whose fifth
// "/"-separated part is an integer.
func referenceVersions(keys []string, prefix string) []int {
	out := []int{}
	for _, k := range keys {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		parts := strings.Split(k, "/")
		if len(parts) < 5 {
			continue
		}
		if n, err := strconv.Atoi(parts[4]); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// Objects written as the reference writes them (its key, Content-Type and
// metadata, by a plain client) are read by str, and str's next save
// follows their versions.
func TestS3ReadsReferenceObjects(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	raw := srv.raw()
	for _, o := range []struct{ key, filename, session, mime, body string }{
		{"sam/u1/s1/report.csv/0", "report.csv", "s1", "text/csv", "v0"},
		{"sam/u1/s1/report.csv/1", "report.csv", "s1", "text/csv", "v1"},
		{"sam/u1/user/notes.txt/0", "user:notes.txt", "s1", "text/plain", "shared"},
		{"sam/u1/s1/r\u00e9sum\u00e9.pdf/0", "r\u00e9sum\u00e9.pdf", "s1", "application/pdf", "%PDF"},
	} {
		v, _ := strconv.Atoi(o.key[strings.LastIndexByte(o.key, '/')+1:])
		_, err := raw.PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String(testS3Bucket), Key: aws.String(o.key), Body: strings.NewReader(o.body),
			ContentType: aws.String(o.mime), Metadata: referenceMeta(o.filename, "u1", o.session, v),
		})
		if err != nil {
			t.Fatalf("put %s: %v", o.key, err)
		}
	}
	st := newS3(t, srv, "sam")
	for _, c := range []struct {
		session, name string
		version       int
		mime, body    string
	}{
		{"s1", "report.csv", 1, "text/csv", "v1"},
		{"s7", "user:notes.txt", 0, "text/plain", "shared"},
		{"s1", "r\u00e9sum\u00e9.pdf", 0, "application/pdf", "%PDF"},
	} {
		a, err := st.Load(ctx, "u1", c.session, c.name, nil)
		if err != nil || a.Version != c.version || a.MimeType != c.mime || string(a.Data) != c.body {
			t.Fatalf("load %s: %+v, %v", c.name, a, err)
		}
	}
	if v, err := st.Save(ctx, "u1", "s1", "report.csv", []byte("v2"), ""); err != nil || v != 2 {
		t.Fatalf("save after the reference's versions: %d, %v", v, err)
	}
}

// What str saves is what the reference reads: its key, its Content-Type,
// exactly the reference's metadata, and versions its list_versions finds.
func TestS3WritesReferenceObjects(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	st := newS3(t, srv, "sam/")
	// NFKC: the fullwidth name is stored normalised, as the reference does.
	for _, c := range []struct{ session, name, stored, key string }{
		{"s1", "r\u00e9sum\u00e9.txt", "r\u00e9sum\u00e9.txt", "sam/u1/s1/r\u00e9sum\u00e9.txt/0"},
		{"s1", "\uff52eport.txt", "report.txt", "sam/u1/s1/report.txt/0"},
		{"s2", "user:\u5e74\u8868.csv", "user:\u5e74\u8868.csv", "sam/u1/user/\u5e74\u8868.csv/0"},
	} {
		if _, err := st.Save(ctx, "u1", c.session, c.name, []byte("x"), ""); err != nil {
			t.Fatal(err)
		}
		head, err := srv.raw().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(testS3Bucket), Key: aws.String(c.key)})
		if err != nil {
			t.Fatalf("head %s: %v", c.key, err)
		}
		if want := MimeByExtension(c.stored); aws.ToString(head.ContentType) != want {
			t.Errorf("%s: Content-Type %q, want %q", c.key, aws.ToString(head.ContentType), want)
		}
		if want := referenceMeta(c.stored, "u1", c.session, 0); !reflect.DeepEqual(head.Metadata, want) {
			t.Errorf("%s: metadata %q, want %q", c.key, head.Metadata, want)
		}
		prefix := c.key[:strings.LastIndexByte(c.key, '/')+1]
		if vs := referenceVersions(srv.keys(), prefix); !reflect.DeepEqual(vs, []int{0}) {
			t.Errorf("the reference's list_versions of %s: %v", prefix, vs)
		}
	}
	if got := asciiBackslashReplace("a\u00e9\u5e74\U0001F600"); got != `a\xe9\u5e74\U0001f600` {
		t.Fatalf("backslashreplace: %q", got)
	}
}

// patternReader yields n bytes of a repeating pattern without holding
// them, counting what it gave; after is called once when it has given
// at least afterBytes.
type patternReader struct {
	n, read    int64
	afterBytes int64
	after      func()
}

func (r *patternReader) Read(p []byte) (int, error) {
	if r.read >= r.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n-r.read)]
	for i := range p {
		p[i] = byte((r.read + int64(i)) % 251)
	}
	r.read += int64(len(p))
	if r.after != nil && r.read >= r.afterBytes {
		r.after()
		r.after = nil
	}
	return len(p), nil
}

// A 100 MiB output is streamed: the store reads it part by part and the
// process allocates a small fraction of it; the object is whole, and the
// audit line has its hash.
func TestS3Streams100MiB(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	audit := filepath.Join(t.TempDir(), "audit.jsonl")
	st := newS3(t, srv, "sam", WithAuditLog(audit))
	const size = 100 << 20
	src := &patternReader{n: size}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v, err := st.SaveReader(ctx, "u1", "s1", "big.bin", src, size, "")
	runtime.ReadMemStats(&after)
	if err != nil || v != 0 {
		t.Fatalf("save: %d, %v", v, err)
	}
	if src.read != size {
		t.Fatalf("read %d bytes of %d", src.read, size)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 40<<20 {
		t.Fatalf("a %d MiB save allocated %d MiB: not streamed", size>>20, alloc>>20)
	}
	// the object, read back as a stream.
	out, err := srv.raw().GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(testS3Bucket), Key: aws.String("sam/u1/s1/big.bin/0")})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Body.Close()
	got, want := sha256.New(), sha256.New()
	n, err := io.Copy(got, out.Body)
	if err != nil || n != size {
		t.Fatalf("read back %d bytes: %v", n, err)
	}
	io.Copy(want, &patternReader{n: size})
	if !bytes.Equal(got.Sum(nil), want.Sum(nil)) {
		t.Fatal("the stored object differs from what was saved")
	}
	if aws.ToString(out.ContentType) != "application/octet-stream" || out.Metadata["version"] != "0" || out.Metadata["original_filename"] != "big.bin" {
		t.Fatalf("object: %q %q", aws.ToString(out.ContentType), out.Metadata)
	}
	b, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	var line auditLine
	if err := json.Unmarshal(bytes.TrimSpace(b), &line); err != nil {
		t.Fatalf("audit log %q: %v", b, err)
	}
	if line.Op != "save" || line.Scope != "sam" || line.SHA256 != hex.EncodeToString(want.Sum(nil)) || line.Size == nil || *line.Size != size {
		t.Fatalf("audit line %+v", line)
	}
}

// A reader that yields fewer or more bytes than announced fails the save
// (ErrSizeMismatch), small or multipart, and nothing is stored.
func TestS3SizeMismatch(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	st := newS3(t, srv, "sam")
	for _, c := range []struct{ announced, given int64 }{{10, 9}, {10, 11}, {20 << 20, 20<<20 - 1}, {20 << 20, 20<<20 + 1}} {
		_, err := st.SaveReader(ctx, "u1", "s1", "x.bin", &patternReader{n: c.given}, c.announced, "")
		if !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("%+v: %v, want ErrSizeMismatch", c, err)
		}
	}
	if keys := srv.keys(); len(keys) != 0 {
		t.Fatalf("stored: %q", keys)
	}
}

// visibleFiles lists the regular files under the gateway's bucket
// directory (its own metadata directories left out).
func visibleFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.Type().IsRegular() {
			out = append(out, strings.TrimPrefix(p, dir))
		}
		return nil
	})
	return out
}

// The store stopped in the middle of a multipart upload: the save fails
// naming the store's error, no version is visible (not to str, not in
// the bucket's directory), and once the store is back the same store
// saves again.
func TestS3StoreStoppedMidUpload(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	st := newS3(t, srv, "sam")
	const size = 40 << 20
	src := &patternReader{n: size, afterBytes: 20 << 20, after: srv.Stop}
	_, err := st.SaveReader(ctx, "u1", "s1", "big.bin", src, size, "")
	if err == nil || errors.Is(err, ErrSizeMismatch) || !strings.Contains(err.Error(), "s3 store") {
		t.Fatalf("save with the store stopped: %v", err)
	}
	t.Logf("the save's error: %v", err)
	if _, err := st.Save(ctx, "u1", "s1", "small.txt", []byte("x"), ""); err == nil {
		t.Fatal("a save with the store down succeeded")
	}
	if c := st.(Checker); c != nil {
		if serr, _ := c.Check(); serr == nil {
			t.Fatal("Check with the store down: nil")
		}
	}
	srv.Start()
	if vs, err := st.ListVersions(ctx, "u1", "s1", "big.bin"); err != nil || len(vs) != 0 {
		t.Fatalf("versions after the failed save: %v, %v", vs, err)
	}
	if files := visibleFiles(t, filepath.Join(srv.Root, testS3Bucket)); len(files) != 0 {
		t.Fatalf("files in the bucket after the failed save: %q", files)
	}
	if v, err := st.SaveReader(ctx, "u1", "s1", "big.bin", &patternReader{n: size}, size, ""); err != nil || v != 0 {
		t.Fatalf("save after the store is back: %d, %v", v, err)
	}
	if serr, _ := st.(Checker).Check(); serr != nil {
		t.Fatalf("Check with the store back: %v", serr)
	}
}

// A bucket that does not exist fails at start-up, naming it; one removed
// while the worker runs fails saves with the store's error, and saves
// work again once it is back.
func TestS3MissingBucket(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	set := srv.settings()
	set.Bucket = "no-such-bucket"
	_, err := NewS3(ctx, set, "sam")
	if err == nil || !strings.Contains(err.Error(), `bucket "no-such-bucket": it does not exist`) {
		t.Fatalf("NewS3 with a missing bucket: %v", err)
	}
	st := newS3(t, srv, "sam")
	if err := os.RemoveAll(filepath.Join(srv.Root, testS3Bucket)); err != nil {
		t.Fatal(err)
	}
	_, err = st.Save(ctx, "u1", "s1", "a.txt", []byte("x"), "")
	if err == nil || !strings.Contains(err.Error(), "NoSuchBucket") {
		t.Fatalf("save into a removed bucket: %v", err)
	}
	if serr, _ := st.(Checker).Check(); serr == nil {
		t.Fatal("Check with the bucket removed: nil")
	}
	if _, err := srv.raw().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(testS3Bucket)}); err != nil {
		t.Fatal(err)
	}
	if v, err := st.Save(ctx, "u1", "s1", "a.txt", []byte("x"), ""); err != nil || v != 0 {
		t.Fatalf("save with the bucket back: %d, %v", v, err)
	}
}

// Wrong credentials fail at start-up, saying access was denied and
// naming the store's error code.
func TestS3WrongCredentials(t *testing.T) {
	srv := startS3(t)
	for _, c := range []struct{ access, secret string }{{testS3Access, "wrong-secret"}, {"no-such-key", testS3Secret}} {
		t.Setenv("AWS_ACCESS_KEY_ID", c.access)
		t.Setenv("AWS_SECRET_ACCESS_KEY", c.secret)
		_, err := NewS3(context.Background(), srv.settings(), "sam")
		if err == nil || !strings.Contains(err.Error(), "access denied") || (!strings.Contains(err.Error(), "SignatureDoesNotMatch") && !strings.Contains(err.Error(), "InvalidAccessKeyId") && !strings.Contains(err.Error(), "XAdminUserNotFound")) {
			t.Fatalf("%s/%s: %v", c.access, c.secret, err)
		}
		t.Logf("%s: %v", c.access, err)
	}
}

// Two stores on one bucket (two workers) saving the same name at once get
// distinct versions, none overwritten: the conditional PUT moves a save
// whose version the other took to the next.
func TestS3ConcurrentWriters(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	a, b := newS3(t, srv, "sam"), newS3(t, srv, "sam")
	// The store must refuse a conditional PUT over an existing key (S3
	// and most compatible stores do since 2024).
	if _, err := a.Save(ctx, "u0", "s0", "probe.txt", []byte("x"), ""); err != nil {
		t.Fatal(err)
	}
	_, err := srv.raw().PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(testS3Bucket), Key: aws.String("sam/u0/s0/probe.txt/0"),
		Body: strings.NewReader("y"), IfNoneMatch: aws.String("*")})
	if !isS3Taken(err) {
		t.Fatalf("a conditional PUT over an existing key: %v, want PreconditionFailed", err)
	}
	const each = 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*each)
	for w, st := range []Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				body := fmt.Sprintf("worker %d save %d", w, i)
				if _, err := st.Save(ctx, "u1", "s1", "shared.txt", []byte(body), ""); err != nil {
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
	if err != nil || len(vs) != 2*each || vs[len(vs)-1] != 2*each-1 {
		t.Fatalf("versions %v, %v: want 0..%d", vs, err, 2*each-1)
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

// Quotas per user and per session hold on the S3 store.
func TestS3Quota(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	st := WithQuota(newS3(t, srv, "sam"), Quota{UserBytes: 10, SessionVersions: 2})
	if _, err := st.Save(ctx, "u1", "s1", "a.txt", []byte("12345"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Save(ctx, "u1", "s1", "a.txt", []byte("1"), ""); err != nil {
		t.Fatal(err)
	}
	var qe *QuotaError
	if _, err := st.Save(ctx, "u1", "s1", "b.txt", []byte("1"), ""); !errors.As(err, &qe) || qe.Scope != "session" || qe.What != "versions" {
		t.Fatalf("third version in the session: %v", err)
	}
	if _, err := st.Save(ctx, "u1", "s2", "user:c.txt", []byte("12345"), ""); !errors.As(err, &qe) || qe.Scope != "user" || qe.What != "bytes" || qe.Used != 6 {
		t.Fatalf("user bytes: %v", err)
	}
	if _, err := st.Save(ctx, "u2", "s1", "a.txt", []byte("12345"), ""); err != nil {
		t.Fatalf("another user: %v", err)
	}
	if err := st.(QuotaChecker).CheckQuota(ctx, "u1", "s2", []string{"d.txt"}, []int64{4}); err != nil {
		t.Fatalf("CheckQuota within: %v", err)
	}
}

// A store that does not implement conditional writes (it answers a
// request with If-None-Match 501 NotImplemented, as some S3-compatible
// stores do): saves, small and multipart, go on without the condition.
// The store here is versitygw behind a proxy that refuses the header.
func TestS3StoreWithoutConditionalWrites(t *testing.T) {
	srv := startS3(t)
	ctx := context.Background()
	target, err := url.Parse(srv.Endpoint())
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int32
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("If-None-Match") != "" {
			refused.Add(1)
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/xml")
			w.WriteHeader(http.StatusNotImplemented)
			io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>NotImplemented</Code><Message>A header you provided implies functionality that is not implemented</Message></Error>`)
			return
		}
		proxy.ServeHTTP(w, r) // the Host header stays the proxy's, which the request was signed for
	}))
	defer front.Close()
	// A new store for each: the first conditional write it sends is a PUT
	// (a.bin) or a multipart completion (b.bin).
	for _, c := range []struct {
		name  string
		sizes []int64
	}{{"a.bin", []int64{5, 9 << 20, 5}}, {"b.bin", []int64{9 << 20, 5, 9 << 20}}} {
		refused.Store(0)
		st, err := NewS3(ctx, S3Settings{Bucket: testS3Bucket, Endpoint: front.URL}, "sam")
		if err != nil {
			t.Fatal(err)
		}
		for i, size := range c.sizes {
			v, err := st.SaveReader(ctx, "u1", "s1", c.name, &patternReader{n: size}, size, "")
			if err != nil || v != i {
				t.Fatalf("%s: save %d (%d bytes): %d, %v", c.name, i, size, v, err)
			}
		}
		if n := refused.Load(); n != 1 {
			t.Fatalf("%s: %d conditional writes refused, want 1 (the first, then none sent)", c.name, n)
		}
	}
	want := []string{"sam/u1/s1/a.bin/0", "sam/u1/s1/a.bin/1", "sam/u1/s1/a.bin/2", "sam/u1/s1/b.bin/0", "sam/u1/s1/b.bin/1", "sam/u1/s1/b.bin/2"}
	if got := srv.keys(); !reflect.DeepEqual(got, want) {
		t.Fatalf("keys %q", got)
	}
}
