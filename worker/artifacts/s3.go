package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// The S3 store (ARTIFACT_SERVICE_TYPE=s3) keeps artifacts in one bucket of
// any S3-compatible store, in the layout and with the metadata of the
// reference's S3 artifact service, so that reference agents configured
// with the same bucket and namespace and str workers on any number of
// hosts see each other's artifacts:
//
//	{prefix}/{user_id}/{session_id}/{filename}/{N}
//	{prefix}/{user_id}/user/{name}/{N}     for a filename "user:{name}"
//
// where prefix is the namespace with leading and trailing "/" removed
// (the reference's app_name.strip("/"); the reference's default
// artifact_scope "namespace" passes the namespace as app_name). One object
// per version: its Content-Type is the mime type, and its user metadata is
// exactly the reference's: original_filename (the NFKC-normalised
// filename, "user:" prefix kept), user_id, session_id and version, each
// made ASCII as Python's str.encode("ascii", "backslashreplace") does.
// There is no .meta object.
//
// The client is the AWS SDK for Go v2 (github.com/aws/aws-sdk-go-v2, by
// AWS): it implements the standard AWS credential chain completely (the
// environment, shared config and credentials files with profiles, SSO and
// credential_process, web identity tokens, ECS and EC2 instance roles),
// which the deployments of the reference agents already configure; and
// its request types carry S3's conditional write (If-None-Match), which
// Save uses so that two writers never overwrite each other's version.

// S3Settings configure the S3 store.
type S3Settings struct {
	Bucket string // ARTIFACT_S3_BUCKET (the reference's examples: S3_BUCKET_NAME)
	// Endpoint is S3_ENDPOINT_URL (the reference's name): the store's
	// URL for an S3-compatible store; "" for AWS (the region's endpoint).
	Endpoint string
	// Region is ARTIFACT_S3_REGION (or S3_REGION); "" takes the AWS
	// chain's (AWS_REGION, AWS_DEFAULT_REGION, the profile), else
	// us-east-1.
	Region string
	// PathStyle is ARTIFACT_S3_PATH_STYLE: "true" addresses the bucket in
	// the path (http://host/bucket/key), "false" in the host name
	// (http://bucket.host/key), "auto" or "" path style exactly when
	// Endpoint is set (S3-compatible stores rarely have a wildcard DNS
	// name per bucket).
	PathStyle string
}

// s3DefaultRegion is the region when neither the settings nor the AWS
// chain give one (boto3's and the reference's for an S3-compatible
// endpoint; any region works with most of them).
const s3DefaultRegion = "us-east-1"

// s3PartSize is the size of one part of a multipart upload and the
// largest save sent as one PUT: a save holds at most this much of its
// data in memory (one buffer per save in flight), whatever its size.
// S3 wants parts of at least 5 MiB (but the last) and at most 10,000 of
// them: a larger save uses larger parts (size/10,000).
const (
	s3PartSize = 8 << 20
	s3MaxParts = 10000
)

// s3ResponseTimeout bounds how long the store may take to answer a
// request it has been sent whole (a hung store fails a save instead of
// holding it for the call's whole timeout); s3StartTimeout bounds the
// bucket check at start-up and in Check; s3AbortTimeout the clean-up of a
// failed multipart upload.
const (
	s3ResponseTimeout = 60 * time.Second
	s3StartTimeout    = 30 * time.Second
	s3CheckTimeout    = 10 * time.Second
	s3AbortTimeout    = 30 * time.Second
)

type s3Store struct {
	client   *s3.Client
	bucket   string
	prefix   string // the namespace without leading and trailing "/"
	audit    *auditLog
	locks    keyedMutex // per artifact, in this process
	partSize int64
	// unconditional is set once the store answered a conditional write
	// with NotImplemented (501): writes go on without the condition.
	unconditional atomic.Bool
}

// ifNoneMatch is a write's condition: "*" (only if the key does not
// exist), or none once the store said it does not implement it.
func (s *s3Store) ifNoneMatch() *string {
	if s.unconditional.Load() {
		return nil
	}
	return aws.String("*")
}

// noCondition reports whether err is the store refusing the condition
// itself (501 NotImplemented) on a conditional write, and if so stops
// sending it: the write is then retried without it.
func (s *s3Store) noCondition(err error) bool {
	if s.unconditional.Load() || (s3Code(err) != "NotImplemented" && s3Status(err) != http.StatusNotImplemented) {
		return false
	}
	s.unconditional.Store(true)
	return true
}

// NewS3 returns the S3 store for the bucket of set and the namespace,
// after checking that the bucket exists and the credentials may use it
// (HeadBucket, as the reference does at start-up): a missing bucket, a
// refused credential or an unreachable store is an error here, at
// start-up, naming the store's answer.
func NewS3(ctx context.Context, set S3Settings, namespace string, opts ...Option) (Store, error) {
	// 1. the settings.
	if set.Bucket == "" {
		return nil, errors.New("artifacts: s3 store: no bucket (ARTIFACT_S3_BUCKET)")
	}
	prefix, err := keyPrefix(namespace)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: %w", err)
	}
	pathStyle := set.Endpoint != ""
	switch set.PathStyle {
	case "", "auto":
	case "true":
		pathStyle = true
	case "false":
		pathStyle = false
	default:
		return nil, fmt.Errorf("artifacts: s3 store: path style %q: must be auto, true or false (ARTIFACT_S3_PATH_STYLE)", set.PathStyle)
	}
	if set.Endpoint != "" {
		u, err := url.Parse(set.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("artifacts: s3 store: endpoint %q: not an http or https URL (S3_ENDPOINT_URL)", set.Endpoint)
		}
	}

	// 2. the AWS chain: credentials and, unless set, the region.
	var loads []func(*awsconfig.LoadOptions) error
	if set.Region != "" {
		loads = append(loads, awsconfig.WithRegion(set.Region))
	}
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
		tr.ResponseHeaderTimeout = s3ResponseTimeout
	})
	loads = append(loads, awsconfig.WithHTTPClient(httpClient))
	cfg, err := awsconfig.LoadDefaultConfig(ctx, loads...)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		cfg.Region = s3DefaultRegion
	}

	// 3. the client. Checksums only where S3 requires them: the payload
	// is signed (SigV4 covers its SHA-256), and S3-compatible stores that
	// predate the SDK's default CRC trailers refuse them.
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if set.Endpoint != "" {
			o.BaseEndpoint = aws.String(set.Endpoint)
		}
		o.UsePathStyle = pathStyle
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	s := &s3Store{client: client, bucket: set.Bucket, prefix: prefix, partSize: s3PartSize}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s.audit = o.audit
	if s.audit != nil {
		s.audit.scope = prefix
	}

	// 4. the bucket, with these credentials.
	if err := s.headBucket(ctx, s3StartTimeout); err != nil {
		return nil, err
	}
	return s, nil
}

// keyPrefix is the reference's app_name.strip("/") for the namespace,
// each of its "/"-separated levels a safe name (CheckName).
func keyPrefix(namespace string) (string, error) {
	prefix := strings.Trim(namespace, "/")
	for _, level := range strings.Split(prefix, "/") {
		if err := CheckName(level); err != nil {
			return "", fmt.Errorf("namespace %q: %w", namespace, err)
		}
	}
	return prefix, nil
}

// headBucket checks the bucket with HeadBucket, within timeout.
func (s *s3Store) headBucket(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(s.bucket)})
	if err == nil {
		return nil
	}
	// A HEAD answer has no body, so no error code: a GET of one key of
	// the listing has ("NoSuchBucket", "InvalidAccessKeyId",
	// "SignatureDoesNotMatch"), and is what the message shows.
	if s3Status(err) != 0 {
		_, lerr := s.client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: aws.String(s.bucket), MaxKeys: aws.Int32(1)})
		if s3Code(lerr) != "" {
			err = lerr
		}
	}
	what := "cannot use it"
	switch code := s3Code(err); {
	case code == "NoSuchBucket" || (code == "NotFound" && s3Status(err) == http.StatusNotFound):
		what = "it does not exist"
	case code == "InvalidAccessKeyId", code == "SignatureDoesNotMatch", code == "AccessDenied",
		code == "XAdminUserNotFound", // versitygw's unknown access key
		s3Status(err) == http.StatusForbidden, s3Status(err) == http.StatusUnauthorized:
		what = "access denied (are the credentials right, and may they use this bucket?)"
	}
	return fmt.Errorf("artifacts: s3 store: bucket %q: %s: %w", s.bucket, what, err)
}

// s3Status is the HTTP status of the store's answer, 0 when there was
// none (the store unreachable).
func s3Status(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// s3Code is the store's error code ("NoSuchKey", "PreconditionFailed"), ""
// when it gave none.
func s3Code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func isS3NotFound(err error) bool {
	var nsk *s3types.NoSuchKey
	return errors.As(err, &nsk) || s3Code(err) == "NoSuchKey" || s3Status(err) == http.StatusNotFound
}

// isS3Taken reports whether a conditional write (If-None-Match: *) found
// the key already there: another writer saved that version first.
func isS3Taken(err error) bool {
	return s3Code(err) == "PreconditionFailed" || s3Status(err) == http.StatusPreconditionFailed
}

// artifactPrefix is the key of loc's versions without the number, with
// the trailing "/".
func (s *s3Store) artifactPrefix(loc location) string {
	return s.prefix + "/" + loc.key() + "/"
}

func (s *s3Store) url(key string) string { return "s3://" + s.bucket + "/" + key }

// Save stores data as the next version (SaveReader's steps).
func (s *s3Store) Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (int, error) {
	return s.SaveReader(ctx, userID, sessionID, filename, bytes.NewReader(data), int64(len(data)), mimeType)
}

// SaveReader streams exactly size bytes of r to the next version, hashing
// them for the audit log on the way.
func (s *s3Store) SaveReader(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, error) {
	return auditedSave(ctx, s.audit, s.save, userID, sessionID, filename, r, size, mimeType)
}

// save writes the next version:
//
//  1. validate the ids, the (NFKC-normalised) filename and the mime type;
//  2. lock the name in this process (other processes are kept apart by
//     step 4's condition);
//  3. pick the version: the highest listed plus one, or 0;
//  4. upload the object with If-None-Match: *, so that a version another
//     writer took meanwhile is never overwritten: a save of at most one
//     part is read into one buffer and PUT (on a collision, PUT again as
//     the next version); a larger one is a multipart upload, one part
//     buffer at a time, whose completion is conditional the same way (on
//     a collision the data read is gone: the save fails, nothing stored).
//     A failed upload is aborted: S3 shows an object only once its PUT or
//     its completion succeeded, so a failed save leaves no version. A
//     store that answers the condition NotImplemented (501) is written
//     without it from then on: the reference's own guarantee (a version
//     two hosts save at the same moment can be overwritten).
func (s *s3Store) save(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, string, error) {
	// 1. validate
	loc, mimeType, err := checkSave(ctx, "s3 store: ", userID, sessionID, filename, mimeType, size)
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
		return 0, "", fmt.Errorf("artifacts: s3 store: save %s (step 3, list versions): %w", s.url(prefix), err)
	}
	next := 0
	if len(versions) > 0 {
		next = versions[len(versions)-1] + 1
	}
	meta := func(v int) map[string]string {
		return map[string]string{
			"original_filename": asciiBackslashReplace(loc.filename),
			"user_id":           asciiBackslashReplace(userID),
			"session_id":        asciiBackslashReplace(sessionID),
			"version":           strconv.Itoa(v),
		}
	}

	// 4. upload
	if size > s.partSize {
		key := prefix + strconv.Itoa(next)
		if err := s.putMultipart(ctx, key, r, size, mimeType, meta(next)); err != nil {
			return 0, "", fmt.Errorf("artifacts: s3 store: save %s (step 4, multipart upload): %w", s.url(key), err)
		}
		return next, loc.filename, nil
	}
	buf := make([]byte, size)
	if err := readExactly(&sliceWriter{b: buf}, r, size); err != nil {
		return 0, "", fmt.Errorf("artifacts: s3 store: save %s (step 4, read): %w", loc.filename, err)
	}
	for tries := 0; ; tries++ {
		key := prefix + strconv.Itoa(next)
		_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String(s.bucket), Key: aws.String(key),
			Body: bytes.NewReader(buf), ContentLength: aws.Int64(size),
			ContentType: aws.String(mimeType), Metadata: meta(next),
			IfNoneMatch: s.ifNoneMatch(),
		})
		if err == nil {
			return next, loc.filename, nil
		}
		if s.noCondition(err) {
			continue
		}
		if !isS3Taken(err) || tries >= maxLinkRetries {
			return 0, "", fmt.Errorf("artifacts: s3 store: save %s (step 4, put): %w", s.url(key), err)
		}
		next++
	}
}

// putMultipart uploads exactly size bytes of r to key in parts, reusing
// one part buffer, and completes the upload only if key does not exist;
// on any failure it aborts the upload (with its own deadline: ctx may be
// what failed).
func (s *s3Store) putMultipart(ctx context.Context, key string, r io.Reader, size int64, mimeType string, meta map[string]string) (err error) {
	created, err := s.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{
		Bucket: aws.String(s.bucket), Key: aws.String(key),
		ContentType: aws.String(mimeType), Metadata: meta,
	})
	if err != nil {
		return fmt.Errorf("create: %w", err)
	}
	uploadID := created.UploadId
	defer func() {
		if err == nil {
			return
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s3AbortTimeout)
		defer cancel()
		if _, aerr := s.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{
			Bucket: aws.String(s.bucket), Key: aws.String(key), UploadId: uploadID,
		}); aerr != nil {
			err = fmt.Errorf("%w (and aborting the upload failed, its parts stay until the bucket's lifecycle rule removes them: %v)", err, aerr)
		}
	}()
	partSize := max(s.partSize, (size+s3MaxParts-1)/s3MaxParts)
	buf := make([]byte, partSize)
	var parts []s3types.CompletedPart
	var sent int64
	for n := int32(1); sent < size; n++ {
		want := min(partSize, size-sent)
		got, rerr := io.ReadFull(r, buf[:want])
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: %d bytes read, %d expected", ErrSizeMismatch, sent+int64(got), size)
		}
		if rerr != nil {
			return fmt.Errorf("read part %d: %w", n, rerr)
		}
		out, err := s.client.UploadPart(ctx, &s3.UploadPartInput{
			Bucket: aws.String(s.bucket), Key: aws.String(key), UploadId: uploadID,
			PartNumber: aws.Int32(n), Body: bytes.NewReader(buf[:got]), ContentLength: aws.Int64(int64(got)),
		})
		if err != nil {
			return fmt.Errorf("part %d: %w", n, err)
		}
		parts = append(parts, s3types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n)})
		sent += int64(got)
	}
	var extra [1]byte
	if m, _ := io.ReadFull(r, extra[:]); m > 0 {
		return fmt.Errorf("%w: more than the %d bytes expected", ErrSizeMismatch, size)
	}
	complete := func() error {
		_, err := s.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket: aws.String(s.bucket), Key: aws.String(key), UploadId: uploadID,
			MultipartUpload: &s3types.CompletedMultipartUpload{Parts: parts},
			IfNoneMatch:     s.ifNoneMatch(),
		})
		return err
	}
	err = complete()
	if err != nil && s.noCondition(err) {
		err = complete()
	}
	if isS3Taken(err) {
		return fmt.Errorf("another writer saved this version during the upload; nothing was saved: %w", err)
	}
	if err != nil {
		return fmt.Errorf("complete: %w", err)
	}
	return nil
}

// asciiBackslashReplace is Python's s.encode("ascii",
// "backslashreplace").decode(): every character beyond ASCII becomes
// \xNN, \uNNNN or \UNNNNNNNN (lower-case hex), as the reference makes its
// S3 metadata values ASCII.
func asciiBackslashReplace(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r < 0x80:
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	return b.String()
}

// listVersions returns the versions under prefix (an artifact's, with
// the trailing "/"), ascending: the keys {prefix}{N} with N a canonical
// decimal; other keys are ignored.
func (s *s3Store) listVersions(ctx context.Context, prefix string) ([]int, error) {
	out := []int{}
	err := s.list(ctx, prefix, func(o s3types.Object) {
		if n, ok := versionNumber(strings.TrimPrefix(aws.ToString(o.Key), prefix)); ok {
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
func (s *s3Store) list(ctx context.Context, prefix string, each func(s3types.Object)) error {
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket), Prefix: aws.String(prefix),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return err
		}
		for _, o := range page.Contents {
			each(o)
		}
	}
	return nil
}

// Load reads a version (the highest when version is nil; one removed
// between the listing and the read is skipped for the one before).
func (s *s3Store) Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	return auditedLoad(ctx, s.audit, s.load, userID, sessionID, filename, version)
}

func (s *s3Store) load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: load: %w", err)
	}
	prefix := s.artifactPrefix(loc)
	if version != nil {
		if *version < 0 {
			return nil, fmt.Errorf("artifacts: s3 store: load %s%d: %w", s.url(prefix), *version, ErrNotFound)
		}
		return s.get(ctx, prefix, loc.filename, *version)
	}
	versions, err := s.listVersions(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: load %s (list versions): %w", s.url(prefix), err)
	}
	for i := len(versions) - 1; i >= 0; i-- {
		a, err := s.get(ctx, prefix, loc.filename, versions[i])
		if errors.Is(err, ErrNotFound) {
			continue
		}
		return a, err
	}
	return nil, fmt.Errorf("artifacts: s3 store: load %s (latest): %w", s.url(prefix), ErrNotFound)
}

// get reads one version; a missing object wraps ErrNotFound. The mime
// type is the object's Content-Type (application/octet-stream when it
// has none, as the reference reads it).
func (s *s3Store) get(ctx context.Context, prefix, filename string, v int) (*Artifact, error) {
	key := prefix + strconv.Itoa(v)
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(key)})
	if err != nil {
		if isS3NotFound(err) {
			return nil, fmt.Errorf("artifacts: s3 store: load %s: %w (%v)", s.url(key), ErrNotFound, err)
		}
		return nil, fmt.Errorf("artifacts: s3 store: load %s: %w", s.url(key), err)
	}
	defer out.Body.Close()
	data, err := io.ReadAll(out.Body)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: load %s (read): %w", s.url(key), err)
	}
	mimeType := aws.ToString(out.ContentType)
	if mimeType == "" {
		mimeType = "application/octet-stream"
	}
	return &Artifact{Filename: filename, Version: v, MimeType: mimeType, Data: data}, nil
}

// ListVersions returns the stored versions, ascending.
func (s *s3Store) ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: list versions: %w", err)
	}
	prefix := s.artifactPrefix(loc)
	versions, err := s.listVersions(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("artifacts: s3 store: list versions %s: %w", s.url(prefix), err)
	}
	return versions, nil
}

// usage of the S3 store: the version objects under {prefix}/{user}/
// (every session and user/) and under {prefix}/{user}/{session}/.
func (s *s3Store) usage(userID, sessionID string) (user, session Usage, err error) {
	if CheckName(userID) != nil {
		return Usage{}, Usage{}, nil // Save refuses the name itself
	}
	ctx, cancel := context.WithTimeout(context.Background(), s3ResponseTimeout)
	defer cancel()
	prefix := s.prefix + "/" + userID + "/"
	err = s.list(ctx, prefix, func(o s3types.Object) {
		parts := strings.Split(strings.TrimPrefix(aws.ToString(o.Key), prefix), "/")
		if len(parts) != 3 {
			return
		}
		if _, ok := versionNumber(parts[2]); !ok {
			return
		}
		size := aws.ToInt64(o.Size)
		user.Bytes += size
		user.Versions++
		if parts[0] == sessionID && sessionID != userScopeDir {
			session.Bytes += size
			session.Versions++
		}
	})
	if err != nil {
		return Usage{}, Usage{}, fmt.Errorf("artifacts: s3 store: usage of user %q (list %s): %w", userID, s.url(prefix), err)
	}
	return user, session, nil
}

// Check is Checker's: the bucket answers HeadBucket with these
// credentials (within s3CheckTimeout), and the audit log is writable.
func (s *s3Store) Check() (store, audit error) {
	return s.headBucket(context.Background(), s3CheckTimeout), s.audit.check()
}
