package artifacts

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
)

type memoryStore struct {
	scope  string
	audit  *auditLog
	mu     sync.Mutex
	byName map[string]map[int]memoryVersion
}

type memoryVersion struct {
	data     []byte
	mimeType string
}

// NewMemory returns a Store that keeps artifacts in process memory,
// validated and versioned exactly like the filesystem store. An unusable
// namespace (one whose last level is empty or unsafe) makes every call
// fail with ErrUnsafeName.
func NewMemory(namespace string, opts ...Option) Store {
	s := &memoryStore{byName: map[string]map[int]memoryVersion{}}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s.audit = o.audit
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

func (s *memoryStore) Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (int, error) {
	loc, err := s.check(ctx, userID, sessionID, filename)
	if err != nil {
		s.audit.record("save", userID, sessionID, filename, -1, nil, err)
		return 0, err
	}
	if mimeType == "" {
		mimeType = MimeByExtension(loc.filename)
	}
	s.mu.Lock()
	versions := s.byName[loc.key()]
	if versions == nil {
		versions = map[int]memoryVersion{}
		s.byName[loc.key()] = versions
	}
	next := 0
	for v := range versions {
		if v >= next {
			next = v + 1
		}
	}
	versions[next] = memoryVersion{data: bytes.Clone(data), mimeType: mimeType}
	s.mu.Unlock()
	if err := s.audit.record("save", userID, sessionID, loc.filename, next, data, nil); err != nil {
		return 0, fmt.Errorf("artifacts: memory store: save %s version %d: %w", loc.key(), next, err)
	}
	return next, nil
}

func (s *memoryStore) Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error) {
	loc, err := s.check(ctx, userID, sessionID, filename)
	if err != nil {
		s.audit.record("load", userID, sessionID, filename, -1, nil, err)
		return nil, err
	}
	s.mu.Lock()
	versions := s.byName[loc.key()]
	v := -1
	if version != nil {
		v = *version
	} else {
		for n := range versions {
			if n > v {
				v = n
			}
		}
	}
	entry, ok := versions[v]
	s.mu.Unlock()
	if !ok {
		err := fmt.Errorf("artifacts: memory store: load %s: %w", describeVersion(loc.key(), version), ErrNotFound)
		s.audit.record("load", userID, sessionID, loc.filename, -1, nil, err)
		return nil, err
	}
	if err := s.audit.record("load", userID, sessionID, loc.filename, v, entry.data, nil); err != nil {
		return nil, fmt.Errorf("artifacts: memory store: load %s version %d: %w", loc.key(), v, err)
	}
	return &Artifact{Filename: loc.filename, Version: v, MimeType: entry.mimeType, Data: bytes.Clone(entry.data)}, nil
}

func (s *memoryStore) ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error) {
	loc, err := s.check(ctx, userID, sessionID, filename)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	out := make([]int, 0, len(s.byName[loc.key()]))
	for v := range s.byName[loc.key()] {
		out = append(out, v)
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
