package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
)

// The GCS store (ARTIFACT_SERVICE_TYPE=gcs) keeps artifacts in one Google
// Cloud Storage bucket in the layout of ADK's GcsArtifactService, which
// the reference's agents use for artifact_service type "gcs":
//
//	{prefix}/{user_id}/{session_id}/{filename}/{N}
//	{prefix}/{user_id}/user/user:{name}/{N}     for a filename "user:{name}"
//
// (ADK keeps the "user:" prefix in the object name, unlike the
// reference's S3 service), prefix being the namespace without leading
// and trailing "/". One object per version, its Content-Type the mime
// type; no custom metadata. The client is the official one
// (cloud.google.com/go/storage): Application Default Credentials
// (GOOGLE_APPLICATION_CREDENTIALS, the metadata server, workload
// identity), or the reference's GCS_CREDENTIALS_JSON (a service account
// key), and STORAGE_EMULATOR_HOST for an emulator.

// GCSSettings configure the GCS store.
type GCSSettings struct {
	Bucket string // ARTIFACT_GCS_BUCKET
	// CredentialsJSON is GCS_CREDENTIALS_JSON (the reference's name): a
	// service account key, in place of Application Default Credentials.
	CredentialsJSON string
}

// gcsMaxAttempts bounds the client's attempts of one request (its own
// default retries for minutes), gcsChunkRetryDeadline how long one chunk
// of an upload is retried (the client's default: 32 s).
const (
	gcsMaxAttempts        = 3
	gcsChunkRetryDeadline = 15 * time.Second
)

type gcsStore struct {
	client   *storage.Client
	bucket   *storage.BucketHandle
	name     string // the bucket's
	prefix   string
	audit    *auditLog
	locks    keyedMutex
	partSize int64
}

// NewGCS returns the GCS store for the bucket of set and the namespace,
// after checking that the bucket exists and the credentials may read it:
// a missing bucket, refused credentials or an unreachable service fail
// here, at start-up, naming the service's answer.
func NewGCS(ctx context.Context, set GCSSettings, namespace string, opts ...Option) (Store, error) {
	// 1. the settings.
	if set.Bucket == "" {
		return nil, errors.New("artifacts: gcs store: no bucket (ARTIFACT_GCS_BUCKET)")
	}
	prefix, err := keyPrefix(namespace)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: %w", err)
	}
	// 2. the client.
	var copts []option.ClientOption
	if set.CredentialsJSON != "" {
		copts = append(copts, option.WithAuthCredentialsJSON(option.ServiceAccount, []byte(set.CredentialsJSON)))
	}
	// Reads through the JSON API, as every other request (the default
	// XML API reads are not served by emulators such as fake-gcs-server).
	copts = append(copts, storage.WithJSONReads())
	client, err := storage.NewClient(ctx, copts...)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: client: %w", err)
	}
	client.SetRetry(storage.WithMaxAttempts(gcsMaxAttempts))
	s := &gcsStore{client: client, bucket: client.Bucket(set.Bucket), name: set.Bucket, prefix: prefix, partSize: s3PartSize}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s.audit = o.audit
	if s.audit != nil {
		s.audit.scope = prefix
	}
	// 3. the bucket.
	if err := s.checkBucket(ctx, s3StartTimeout); err != nil {
		client.Close()
		return nil, err
	}
	return s, nil
}

// checkBucket lists at most one object of the bucket (what the store
// needs: object access, not the bucket's own metadata), within timeout.
func (s *gcsStore) checkBucket(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	it := s.bucket.Objects(ctx, &storage.Query{Prefix: s.prefix + "/"})
	it.PageInfo().MaxSize = 1
	_, err := it.Next()
	if err == nil || errors.Is(err, iterator.Done) {
		return nil
	}
	what := "cannot use it"
	switch {
	case errors.Is(err, storage.ErrBucketNotExist) || gcsStatus(err) == http.StatusNotFound:
		what = "it does not exist"
	case gcsStatus(err) == http.StatusForbidden || gcsStatus(err) == http.StatusUnauthorized:
		what = "access denied (are the credentials right, and may they use this bucket?)"
	}
	return fmt.Errorf("artifacts: gcs store: bucket %q: %s: %w", s.name, what, err)
}

// gcsStatus is the HTTP status of the service's answer (0 when none).
func gcsStatus(err error) int {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}

// artifactPrefix is the name of loc's versions without the number, with
// the trailing "/": ADK's {app}/{user}/{session or "user"}/{filename}/.
func (s *gcsStore) artifactPrefix(loc location) string {
	return s.prefix + "/" + loc.rel[0] + "/" + loc.rel[1] + "/" + loc.filename + "/"
}

func (s *gcsStore) url(name string) string { return "gs://" + s.name + "/" + name }

// Save stores data as the next version (SaveReader's steps).
func (s *gcsStore) Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (int, error) {
	return s.SaveReader(ctx, userID, sessionID, filename, bytes.NewReader(data), int64(len(data)), mimeType)
}

// SaveReader streams exactly size bytes of r to the next version, hashing
// them for the audit log on the way.
func (s *gcsStore) SaveReader(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, error) {
	return auditedSave(ctx, s.audit, s.save, userID, sessionID, filename, r, size, mimeType)
}

// save writes the next version, in the S3 store's steps (s3Store.save):
// validate; lock the name in this process; list the versions; upload
// with the precondition "does not exist" (ifGenerationMatch=0), so that a
// version another writer took is never overwritten. A save of at most
// one chunk is read into one buffer and retried as the next version on a
// collision; a larger one is a resumable upload of one chunk buffer at a
// time, which GCS makes an object only when it is finished: a failed or
// cancelled one leaves no version.
func (s *gcsStore) save(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, string, error) {
	// 1. validate
	loc, mimeType, err := checkSave(ctx, "gcs store: ", userID, sessionID, filename, mimeType, size)
	if err != nil {
		return 0, "", err
	}
	prefix := s.artifactPrefix(loc)

	// 2. lock
	unlock := s.locks.lock(prefix)
	defer unlock()

	// 3. version
	versions, err := s.listVersions(ctx, prefix)
	if err != nil {
		return 0, "", fmt.Errorf("artifacts: gcs store: save %s (step 3, list versions): %w", s.url(prefix), err)
	}
	next := 0
	if len(versions) > 0 {
		next = versions[len(versions)-1] + 1
	}

	// 4. upload
	if size > s.partSize {
		name := prefix + strconv.Itoa(next)
		if err := s.put(ctx, name, r, size, mimeType); err != nil {
			return 0, "", fmt.Errorf("artifacts: gcs store: save %s (step 4, resumable upload): %w", s.url(name), err)
		}
		return next, loc.filename, nil
	}
	buf := make([]byte, size)
	if err := readExactly(&sliceWriter{b: buf}, r, size); err != nil {
		return 0, "", fmt.Errorf("artifacts: gcs store: save %s (step 4, read): %w", loc.filename, err)
	}
	for tries := 0; ; tries++ {
		name := prefix + strconv.Itoa(next)
		err := s.put(ctx, name, bytes.NewReader(buf), size, mimeType)
		if err == nil {
			return next, loc.filename, nil
		}
		if gcsStatus(err) != http.StatusPreconditionFailed || tries >= maxLinkRetries {
			return 0, "", fmt.Errorf("artifacts: gcs store: save %s (step 4, upload): %w", s.url(name), err)
		}
		next++
	}
}

// put writes exactly size bytes of r to the object name if it does not
// exist; on any failure the upload is cancelled, which stores nothing.
func (s *gcsStore) put(ctx context.Context, name string, r io.Reader, size int64, mimeType string) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.bucket.Object(name).If(storage.Conditions{DoesNotExist: true}).NewWriter(wctx)
	w.ContentType = mimeType
	w.ChunkSize = int(s.partSize)
	w.ChunkRetryDeadline = gcsChunkRetryDeadline
	if err := readExactly(w, r, size); err != nil {
		cancel() // before Close: the upload is abandoned, not finished
		w.Close()
		return err
	}
	return w.Close()
}

// listVersions returns the versions under prefix, ascending: the objects
// {prefix}{N} with N a canonical decimal; others are ignored.
func (s *gcsStore) listVersions(ctx context.Context, prefix string) ([]int, error) {
	out := []int{}
	err := s.list(ctx, prefix, func(o *storage.ObjectAttrs) {
		if n, ok := versionNumber(strings.TrimPrefix(o.Name, prefix)); ok {
			out = append(out, n)
		}
	})
	if err != nil {
		return nil, err
	}
	sort.Ints(out)
	return out, nil
}

// list calls each for every object under prefix.
func (s *gcsStore) list(ctx context.Context, prefix string, each func(*storage.ObjectAttrs)) error {
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name", "Size"}); err != nil {
		return err
	}
	it := s.bucket.Objects(ctx, q)
	for {
		o, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return nil
		}
		if err != nil {
			return err
		}
		each(o)
	}
}

// Load reads a version (the highest when version is nil; one removed
// between the listing and the read is skipped for the one before).
func (s *gcsStore) Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	return auditedLoad(ctx, s.audit, s.load, userID, sessionID, filename, version)
}

func (s *gcsStore) load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: load: %w", err)
	}
	prefix := s.artifactPrefix(loc)
	if version != nil {
		if *version < 0 {
			return nil, fmt.Errorf("artifacts: gcs store: load %s%d: %w", s.url(prefix), *version, ErrNotFound)
		}
		return s.get(ctx, prefix, loc.filename, *version)
	}
	versions, err := s.listVersions(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: load %s (list versions): %w", s.url(prefix), err)
	}
	for i := len(versions) - 1; i >= 0; i-- {
		a, err := s.get(ctx, prefix, loc.filename, versions[i])
		if errors.Is(err, ErrNotFound) {
			continue
		}
		return a, err
	}
	return nil, fmt.Errorf("artifacts: gcs store: load %s (latest): %w", s.url(prefix), ErrNotFound)
}

// get reads one version; a missing object wraps ErrNotFound.
func (s *gcsStore) get(ctx context.Context, prefix, filename string, v int) (*Artifact, error) {
	name := prefix + strconv.Itoa(v)
	r, err := s.bucket.Object(name).NewReader(ctx)
	if err != nil {
		if errors.Is(err, storage.ErrObjectNotExist) {
			return nil, fmt.Errorf("artifacts: gcs store: load %s: %w (%v)", s.url(name), ErrNotFound, err)
		}
		return nil, fmt.Errorf("artifacts: gcs store: load %s: %w", s.url(name), err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: load %s (read): %w", s.url(name), err)
	}
	mimeType := r.Attrs.ContentType
	if mimeType == "" {
		mimeType = "application/octet-stream"
	}
	return &Artifact{Filename: filename, Version: v, MimeType: mimeType, Data: data}, nil
}

// ListVersions returns the stored versions, ascending.
func (s *gcsStore) ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: list versions: %w", err)
	}
	prefix := s.artifactPrefix(loc)
	versions, err := s.listVersions(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("artifacts: gcs store: list versions %s: %w", s.url(prefix), err)
	}
	return versions, nil
}

// usage of the GCS store: the version objects under {prefix}/{user}/
// (every session and user/) and under {prefix}/{user}/{session}/.
func (s *gcsStore) usage(userID, sessionID string) (user, session Usage, err error) {
	if CheckName(userID) != nil {
		return Usage{}, Usage{}, nil // Save refuses the name itself
	}
	ctx, cancel := context.WithTimeout(context.Background(), s3ResponseTimeout)
	defer cancel()
	prefix := s.prefix + "/" + userID + "/"
	err = s.list(ctx, prefix, func(o *storage.ObjectAttrs) {
		parts := strings.Split(strings.TrimPrefix(o.Name, prefix), "/")
		if len(parts) != 3 {
			return
		}
		if _, ok := versionNumber(parts[2]); !ok {
			return
		}
		user.Bytes += o.Size
		user.Versions++
		if parts[0] == sessionID && sessionID != userScopeDir {
			session.Bytes += o.Size
			session.Versions++
		}
	})
	if err != nil {
		return Usage{}, Usage{}, fmt.Errorf("artifacts: gcs store: usage of user %q (list %s): %w", userID, s.url(prefix), err)
	}
	return user, session, nil
}

// Check is Checker's: the bucket answers a listing with these credentials
// (within s3CheckTimeout), and the audit log is writable.
func (s *gcsStore) Check() (store, audit error) {
	return s.checkBucket(context.Background(), s3CheckTimeout), s.audit.check()
}
