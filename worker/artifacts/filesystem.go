package artifacts

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf16"

	"github.com/securetoolruntime/str/internal/fscheck"
	"golang.org/x/sys/unix"
)

// MetaSuffix is appended to a version number to name its metadata file.
const MetaSuffix = ".meta"

// lockFileName is the per-artifact lock file (flock). The reference
// ignores it: it lists only all-digit file names as versions.
const lockFileName = ".lock"

// maxLinkRetries bounds how often Save moves to the next version when
// another writer (one that does not take our lock, such as the reference
// Python service) took the version number first.
const maxLinkRetries = 64

// DefaultBasePath is the reference's default artifact base path.
const DefaultBasePath = "/sam/artifacts"

type fsStore struct {
	base  string // absolute base path
	scope string // basename(namespace.rstrip("/"))
	root  string // base/scope
	audit *auditLog
	locks keyedMutex
}

// NewFilesystem returns a Store laid out exactly like the reference's
// filesystem artifact service (spec §9):
//
//	{basePath}/{scope}/{user_id}/{session_id}/{filename}/{N}
//	{basePath}/{scope}/{user_id}/{session_id}/{filename}/{N}.meta   {"mime_type": "<type>"}
//	{basePath}/{scope}/{user_id}/user/{name}/{N}                    for filename "user:{name}"
//
// where scope is basename(namespace.rstrip("/")). The scope directory is
// created if missing.
func NewFilesystem(basePath, namespace string, opts ...Option) (Store, error) {
	if basePath == "" {
		return nil, errors.New("artifacts: filesystem store: empty base path")
	}
	base, err := filepath.Abs(basePath)
	if err != nil {
		return nil, fmt.Errorf("artifacts: filesystem store: base path %s: %w", basePath, err)
	}
	scope, err := Scope(namespace)
	if err != nil {
		return nil, fmt.Errorf("artifacts: filesystem store: %w", err)
	}
	s := &fsStore{base: base, scope: scope, root: filepath.Join(base, scope)}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s.audit = o.audit
	if s.audit != nil {
		s.audit.scope = scope
	}
	if err := os.MkdirAll(s.root, 0o755); err != nil {
		return nil, fmt.Errorf("artifacts: filesystem store: create %s: %w", s.root, err)
	}
	return s, nil
}

func (s *fsStore) dir(loc location) string {
	return filepath.Join(append([]string{s.root}, loc.rel...)...)
}

// Save writes data and its metadata as the next version:
//
//  1. validate the ids and the (NFKC-normalised) filename;
//  2. create the artifact directory;
//  3. lock the name: an in-process mutex, then flock on {dir}/.lock so
//     that other processes using this store cannot collide either;
//  4. pick the version: max over existing {N} and {N}.meta, plus one, or 0;
//  5. copy the data to a temporary file in the directory (through a fixed
//     buffer: a large output is never held in memory whole), fsync, and
//     link it to {N} (link fails if {N} exists, so a writer that ignores
//     our lock is never overwritten: we move on to N+1);
//  6. write {N}.meta the same way and rename it into place; the data
//     file comes first, so a version is complete once its .meta exists;
//  7. fsync the directory, unlock, and append to the audit log.
func (s *fsStore) Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (int, error) {
	return s.SaveReader(ctx, userID, sessionID, filename, bytes.NewReader(data), int64(len(data)), mimeType)
}

// SaveReader is Save's steps with the data streamed from r (exactly size
// bytes) and hashed on the way for the audit log.
func (s *fsStore) SaveReader(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, error) {
	return auditedSave(ctx, s.audit, s.save, userID, sessionID, filename, r, size, mimeType)
}

func (s *fsStore) save(ctx context.Context, userID, sessionID, filename string, data io.Reader, size int64, mimeType string) (int, string, error) {
	// 1. validate
	loc, mimeType, err := checkSave(ctx, "", userID, sessionID, filename, mimeType, size)
	if err != nil {
		return 0, "", err
	}
	dir := s.dir(loc)

	// 2. directory
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, "", fmt.Errorf("artifacts: save %s (step 2, mkdir): %w", dir, err)
	}

	// 3. lock
	unlock, err := s.lock(ctx, dir)
	if err != nil {
		return 0, "", err
	}
	defer unlock()

	// 4. version
	next, err := nextVersion(dir)
	if err != nil {
		return 0, "", err
	}

	// 5. data, never replacing an existing version
	tmpData, err := writeTemp(dir, data, size)
	if err != nil {
		return 0, "", fmt.Errorf("artifacts: save %s (step 5, data): %w", dir, err)
	}
	defer os.Remove(tmpData)
	for tries := 0; ; tries++ {
		err := os.Link(tmpData, filepath.Join(dir, strconv.Itoa(next)))
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrExist) || tries >= maxLinkRetries {
			return 0, "", fmt.Errorf("artifacts: save %s (step 5, link version %d): %w", dir, next, err)
		}
		next++
	}

	// 6. metadata, exactly as Python's json.dump({"mime_type": ...}) writes it
	// A failure here removes the data file just linked: a failed save
	// leaves no version behind, not even an incomplete one (which Load
	// skips but ListVersions, and the reference, would list).
	dataPath := filepath.Join(dir, strconv.Itoa(next))
	meta := metaJSON(mimeType)
	tmpMeta, err := writeTemp(dir, bytes.NewReader(meta), int64(len(meta)))
	if err != nil {
		os.Remove(dataPath)
		return 0, "", fmt.Errorf("artifacts: save %s (step 6, metadata): %w", dir, err)
	}
	metaPath := filepath.Join(dir, strconv.Itoa(next)+MetaSuffix)
	if err := os.Rename(tmpMeta, metaPath); err != nil {
		os.Remove(tmpMeta)
		os.Remove(dataPath)
		return 0, "", fmt.Errorf("artifacts: save %s (step 6, rename): %w", metaPath, err)
	}

	// 7. make both names durable
	if err := syncDir(dir); err != nil {
		return 0, "", fmt.Errorf("artifacts: save %s (step 7, fsync dir): %w", dir, err)
	}
	return next, loc.filename, nil
}

// Load reads a version (the highest complete one when version is nil; a
// version whose data or .meta file is missing is skipped).
func (s *fsStore) Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	return auditedLoad(ctx, s.audit, s.load, userID, sessionID, filename, version)
}

func (s *fsStore) load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return nil, fmt.Errorf("artifacts: load: %w", err)
	}
	dir := s.dir(loc)
	if version != nil {
		if *version < 0 {
			return nil, fmt.Errorf("artifacts: load %s version %d: %w", dir, *version, ErrNotFound)
		}
		return readVersion(dir, loc.filename, *version)
	}
	versions, err := listVersions(dir)
	if err != nil {
		return nil, err
	}
	for i := len(versions) - 1; i >= 0; i-- {
		a, err := readVersion(dir, loc.filename, versions[i])
		if errors.Is(err, ErrNotFound) {
			continue // incomplete (no .meta yet, or removed): try the previous one
		}
		return a, err
	}
	return nil, fmt.Errorf("artifacts: load %s (latest): %w", dir, ErrNotFound)
}

// ListVersions returns the versions that have a data file, ascending, as
// the reference lists them (a version still missing its .meta is listed).
func (s *fsStore) ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return nil, fmt.Errorf("artifacts: list versions: %w", err)
	}
	return listVersions(s.dir(loc))
}

// versionNumber parses a canonical non-negative decimal ("0", "17", not
// "007" or "+1"), the only names str reads or writes as versions.
func versionNumber(name string) (int, bool) {
	n, err := strconv.Atoi(name)
	if err != nil || n < 0 || strconv.Itoa(n) != name {
		return 0, false
	}
	return n, true
}

// listVersions returns the versions with a regular data file, ascending.
func listVersions(dir string) ([]int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return []int{}, nil
		}
		return nil, fmt.Errorf("artifacts: list %s: %w", dir, err)
	}
	out := []int{}
	for _, e := range entries {
		if n, ok := versionNumber(e.Name()); ok && e.Type().IsRegular() {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// nextVersion returns one more than the highest version named by a data
// or a .meta file (an orphaned .meta is not reused), or 0.
func nextVersion(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("artifacts: save %s (step 4, list versions): %w", dir, err)
	}
	next := 0
	for _, e := range entries {
		n, ok := versionNumber(strings.TrimSuffix(e.Name(), MetaSuffix))
		if ok && n >= next {
			next = n + 1
		}
	}
	return next, nil
}

// readVersion reads {dir}/{v}.meta and {dir}/{v}; either missing (or not
// a regular file) wraps ErrNotFound.
func readVersion(dir, filename string, v int) (*Artifact, error) {
	metaPath := filepath.Join(dir, strconv.Itoa(v)+MetaSuffix)
	meta, err := readRegular(metaPath, 64*1024)
	if err != nil {
		return nil, fmt.Errorf("artifacts: load %s: %w", metaPath, err)
	}
	mimeType, err := parseMeta(meta)
	if err != nil {
		return nil, fmt.Errorf("artifacts: load %s: %w", metaPath, err)
	}
	dataPath := filepath.Join(dir, strconv.Itoa(v))
	data, err := readRegular(dataPath, -1)
	if err != nil {
		return nil, fmt.Errorf("artifacts: load %s: %w", dataPath, err)
	}
	return &Artifact{Filename: filename, Version: v, MimeType: mimeType, Data: data}, nil
}

// readRegular reads a regular file without following a symlink. A missing
// file, a symlink or a non-regular file wraps ErrNotFound. limit < 0 means
// no limit.
func readRegular(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%w (%v)", ErrNotFound, err)
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: not a regular file (%s)", ErrNotFound, st.Mode().Type())
	}
	if limit >= 0 && st.Size() > limit {
		return nil, fmt.Errorf("%d bytes, more than the limit of %d", st.Size(), limit)
	}
	return io.ReadAll(f)
}

// parseMeta reads the mime type from a .meta file. Other keys are allowed
// (the file is shared with other writers); a missing or null mime_type
// reads as application/octet-stream, as in the reference.
func parseMeta(b []byte) (string, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(b, &doc); err != nil || doc == nil {
		return "", fmt.Errorf("metadata is not a JSON object: %v", err)
	}
	raw, ok := doc["mime_type"]
	if !ok || string(raw) == "null" {
		return "application/octet-stream", nil
	}
	var mt string
	if err := json.Unmarshal(raw, &mt); err != nil {
		return "", fmt.Errorf("metadata mime_type is not a string: %w", err)
	}
	return mt, nil
}

// metaJSON encodes {"mime_type": mimeType} byte for byte as Python's
// json.dumps with default settings does (", " and ": " separators,
// ensure_ascii: everything outside ' '..'~' escaped).
func metaJSON(mimeType string) []byte {
	return []byte(`{"mime_type": ` + pyJSONString(mimeType) + `}`)
}

func pyJSONString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r >= ' ' && r <= '~':
				b.WriteRune(r)
			case r > 0xFFFF:
				r1, r2 := utf16.EncodeRune(r)
				fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
			default:
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		}
	}
	b.WriteByte('"')
	return b.String()
}

// writeTemp copies exactly size bytes of data to a new temporary file in
// dir (mode 0644), fsyncs it and returns its path.
func writeTemp(dir string, data io.Reader, size int64) (string, error) {
	f, err := os.CreateTemp(dir, ".tmp-")
	if err != nil {
		return "", err
	}
	name := f.Name()
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(name)
		return "", err
	}
	if err := readExactly(f, data, size); err != nil {
		return fail(err)
	}
	if err := f.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(name)
		return "", err
	}
	return name, nil
}

// checkMinFree is the free space below which Check reports the store
// full: less than this cannot hold a useful output.
const checkMinFree = 64 << 10

// Check is Checker's, without writing anything (fscheck.Writable): the
// scope directory writable, its filesystem with checkMinFree bytes and an
// inode free; the audit log openable for appending, its filesystem with
// room for a line.
func (s *fsStore) Check() (store, audit error) {
	if err := fscheck.Writable(s.root, checkMinFree); err != nil {
		store = fmt.Errorf("artifacts: store: %w", err)
	}
	return store, s.audit.check()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// lock takes the in-process mutex for dir, then an exclusive flock on
// {dir}/.lock, waiting until ctx is done. The returned func releases both.
func (s *fsStore) lock(ctx context.Context, dir string) (func(), error) {
	release := s.locks.lock(dir)
	lockPath := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(lockPath, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o644)
	if err != nil {
		release()
		return nil, fmt.Errorf("artifacts: save %s (step 3, open lock file): %w", lockPath, err)
	}
	wait := time.Millisecond
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			release()
			return nil, fmt.Errorf("artifacts: save %s (step 3, flock): %w", lockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			release()
			return nil, fmt.Errorf("artifacts: save %s (step 3, waiting for flock): %w", lockPath, ctx.Err())
		case <-time.After(wait):
		}
		if wait < 50*time.Millisecond {
			wait *= 2
		}
	}
	return func() {
		// Closing the descriptor releases the flock.
		f.Close()
		release()
	}, nil
}

// keyedMutex is a set of mutexes by key, dropped when unused.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

func (k *keyedMutex) lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*refMutex{}
	}
	rm := k.m[key]
	if rm == nil {
		rm = &refMutex{}
		k.m[key] = rm
	}
	rm.refs++
	k.mu.Unlock()
	rm.Lock()
	return func() {
		rm.Unlock()
		k.mu.Lock()
		rm.refs--
		if rm.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
