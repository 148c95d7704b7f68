package artifacts

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
)

// DefaultMemoryBudget is the in-memory store's byte budget when none is
// given (ARTIFACT_MEMORY_MAX_BYTES).
const DefaultMemoryBudget = 256 << 20

// maxMemoryTombstones bounds how many names whose every version was
// evicted are remembered (to keep numbering versions after the last one
// and to tell "evicted" from "never saved"). A name forgotten beyond that
// starts again at version 0.
const maxMemoryTombstones = 65536

// ErrEvicted is wrapped by Load when the in-memory store dropped the
// version asked for to stay within its byte budget.
var ErrEvicted = errors.New("artifact evicted from the in-memory store")

type memoryStore struct {
	scope  string
	audit  *auditLog
	budget int64

	mu     sync.Mutex
	byName map[string]*memoryName
	lru    *list.List // of *memoryVersion, most recently used at the front
	used   int64      // bytes of data held
	tombs  *list.List // of *memoryName with no versions left, newest at the front
}

// memoryName is one named artifact: its versions still held and the next
// version number (versions are never reused, evicted or not).
type memoryName struct {
	key      string
	filename string // as stored (NFKC), for the audit log
	user     string
	session  string
	versions map[int]*list.Element // -> *memoryVersion in lru
	next     int
	tomb     *list.Element // in tombs while versions is empty
}

type memoryVersion struct {
	name     *memoryName
	version  int
	data     []byte
	mimeType string
}

// NewMemory returns a Store that keeps artifacts in process memory,
// validated and versioned exactly like the filesystem store, within a
// byte budget (WithMemoryBudget, default DefaultMemoryBudget): saving
// beyond it evicts the least recently used versions (saved or loaded),
// whose later loads fail with ErrEvicted. The memory store is never
// shared with agents; the filesystem store is the one for deployments. An
// unusable namespace (one whose last level is empty or unsafe) makes every
// call fail with ErrUnsafeName.
func NewMemory(namespace string, opts ...Option) Store {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := &memoryStore{byName: map[string]*memoryName{}, lru: list.New(), tombs: list.New(),
		audit: o.audit, budget: o.memoryBudget}
	if s.budget <= 0 {
		s.budget = DefaultMemoryBudget
	}
	if scope, err := Scope(namespace); err == nil {
		s.scope = scope
	}
	if s.audit != nil {
		s.audit.scope = s.scope
	}
	return s
}

func (s *memoryStore) check(ctx context.Context, userID, sessionID, filename string) (location, error) {
	if err := ctx.Err(); err != nil {
		return location{}, err
	}
	if s.scope == "" {
		return location{}, fmt.Errorf("artifacts: memory store: namespace: %w: no usable scope", ErrUnsafeName)
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return location{}, fmt.Errorf("artifacts: memory store: %w", err)
	}
	return loc, nil
}

// Save stores a copy of data as the name's next version, evicting least
// recently used versions until it fits the budget. Data larger than the
// whole budget is refused.
func (s *memoryStore) Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (int, error) {
	return s.SaveReader(ctx, userID, sessionID, filename, bytes.NewReader(data), int64(len(data)), mimeType)
}

// SaveReader is Save for size bytes read from r. A size beyond the whole
// budget is refused before anything is read, so the buffer allocated is
// never larger than the budget.
func (s *memoryStore) SaveReader(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, error) {
	loc, err := s.check(ctx, userID, sessionID, filename)
	if err == nil && mimeType != "" {
		if merr := CheckMimeType(mimeType); merr != nil {
			err = fmt.Errorf("artifacts: memory store: save %s: %w", loc.filename, merr)
		}
	}
	if err == nil && size > s.budget {
		err = fmt.Errorf("artifacts: memory store: save %s: %d bytes exceed the store's whole budget of %d bytes (ARTIFACT_MEMORY_MAX_BYTES; or use ARTIFACT_SERVICE_TYPE=filesystem)", loc.key(), size, s.budget)
	}
	var data []byte
	if err == nil {
		// Exactly size bytes: a bytes.Buffer would grow past them.
		data = make([]byte, max(size, 0))
		if rerr := readExactly(&sliceWriter{b: data}, r, size); rerr != nil {
			err = fmt.Errorf("artifacts: memory store: save %s: %w", loc.key(), rerr)
		}
	}
	if err != nil {
		s.audit.record(ctx, "save", userID, sessionID, filename, -1, nil, err)
		return 0, err
	}
	if mimeType == "" {
		mimeType = MimeByExtension(loc.filename)
	}
	s.mu.Lock()
	n := s.byName[loc.key()]
	if n == nil {
		n = &memoryName{key: loc.key(), filename: loc.filename, user: userID, session: sessionID, versions: map[int]*list.Element{}}
		s.byName[n.key] = n
	}
	if n.tomb != nil {
		s.tombs.Remove(n.tomb)
		n.tomb = nil
	}
	v := n.next
	n.next++
	n.versions[v] = s.lru.PushFront(&memoryVersion{name: n, version: v, data: data, mimeType: mimeType})
	s.used += int64(len(data))
	evicted := s.evictLocked()
	s.mu.Unlock()
	for _, e := range evicted {
		s.audit.record(context.Background(), "evict", e.name.user, e.name.session, e.name.filename, e.version, e.data, nil)
	}
	if err := s.audit.record(ctx, "save", userID, sessionID, loc.filename, v, data, nil); err != nil {
		return 0, fmt.Errorf("artifacts: memory store: save %s version %d: %w", loc.key(), v, err)
	}
	return v, nil
}

// sliceWriter fills b and refuses to write past its end.
type sliceWriter struct {
	b []byte
	n int
}

func (w *sliceWriter) Write(p []byte) (int, error) {
	if len(p) > len(w.b)-w.n {
		return 0, io.ErrShortWrite
	}
	w.n += copy(w.b[w.n:], p)
	return len(p), nil
}

// evictLocked drops least recently used versions until the data held fits
// the budget and returns them. Called with s.mu held.
func (s *memoryStore) evictLocked() []*memoryVersion {
	var out []*memoryVersion
	for s.used > s.budget {
		back := s.lru.Back()
		if back == nil {
			break
		}
		mv := s.lru.Remove(back).(*memoryVersion)
		s.used -= int64(len(mv.data))
		n := mv.name
		delete(n.versions, mv.version)
		if len(n.versions) == 0 {
			n.tomb = s.tombs.PushFront(n)
			for s.tombs.Len() > maxMemoryTombstones {
				old := s.tombs.Remove(s.tombs.Back()).(*memoryName)
				delete(s.byName, old.key)
			}
		}
		out = append(out, mv)
	}
	return out
}

func (s *memoryStore) Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	loc, err := s.check(ctx, userID, sessionID, filename)
	if err != nil {
		s.audit.record(ctx, "load", userID, sessionID, filename, -1, nil, err)
		return nil, err
	}
	s.mu.Lock()
	n := s.byName[loc.key()]
	var (
		mv      *memoryVersion
		missing error
	)
	switch {
	case n == nil:
		missing = fmt.Errorf("artifacts: memory store: load %s: %w", describeVersion(loc.key(), version), ErrNotFound)
	case version == nil && n.next > 0:
		// The latest is the last saved; if it was evicted, an older one is
		// not silently handed out instead.
		if el, ok := n.versions[n.next-1]; ok {
			mv = el.Value.(*memoryVersion)
		} else {
			missing = fmt.Errorf("artifacts: memory store: load %s: the latest version %d was %w to stay within the store's budget of %d bytes", describeVersion(loc.key(), version), n.next-1, ErrEvicted, s.budget)
		}
	case version == nil || *version < 0 || *version >= n.next:
		missing = fmt.Errorf("artifacts: memory store: load %s: %w", describeVersion(loc.key(), version), ErrNotFound)
	default:
		if el, ok := n.versions[*version]; ok {
			mv = el.Value.(*memoryVersion)
		} else {
			missing = fmt.Errorf("artifacts: memory store: load %s: %w to stay within the store's budget of %d bytes", describeVersion(loc.key(), version), ErrEvicted, s.budget)
		}
	}
	if mv != nil {
		s.lru.MoveToFront(n.versions[mv.version])
	}
	s.mu.Unlock()
	if missing != nil {
		s.audit.record(ctx, "load", userID, sessionID, loc.filename, -1, nil, missing)
		return nil, missing
	}
	if err := s.audit.record(ctx, "load", userID, sessionID, loc.filename, mv.version, mv.data, nil); err != nil {
		return nil, fmt.Errorf("artifacts: memory store: load %s version %d: %w", loc.key(), mv.version, err)
	}
	return &Artifact{Filename: loc.filename, Version: mv.version, MimeType: mv.mimeType, Data: bytes.Clone(mv.data)}, nil
}

// ListVersions returns the versions still held (evicted ones are gone).
func (s *memoryStore) ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error) {
	loc, err := s.check(ctx, userID, sessionID, filename)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	out := []int{}
	if n := s.byName[loc.key()]; n != nil {
		for v := range n.versions {
			out = append(out, v)
		}
	}
	s.mu.Unlock()
	sort.Ints(out)
	return out, nil
}

func describeVersion(what string, version *int) string {
	if version == nil {
		return what + " (latest)"
	}
	return fmt.Sprintf("%s version %d", what, *version)
}
