package artifacts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Quota bounds what one store user (the userID of Save: params.user_id,
// the verified one when the worker verifies identities) and one session
// of a user may keep: bytes of data over all stored versions, and the
// number of versions. Zero is no limit. The user's count covers every
// session and the user: scope; a session's, its own session-scoped
// artifacts.
type Quota struct {
	UserBytes, SessionBytes       int64
	UserVersions, SessionVersions int
}

// On reports whether any limit is set.
func (q Quota) On() bool {
	return q.UserBytes > 0 || q.SessionBytes > 0 || q.UserVersions > 0 || q.SessionVersions > 0
}

// ErrQuota is wrapped by a save refused by a quota (a *QuotaError): the
// user's own limit, not a fault of the store.
var ErrQuota = errors.New("artifact quota exceeded")

// QuotaError says which limit a save would pass.
type QuotaError struct {
	Scope   string // "user" or "session"
	ID      string // the user id, or "user/session"
	What    string // "bytes" or "versions"
	Used    int64  // stored now
	Adding  int64  // what the refused save(s) would add
	Limit   int64
	Setting string // the worker setting that sets Limit
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("%v: %s %q has %d %s stored, %d more would pass its quota of %d (%s)",
		ErrQuota, e.Scope, e.ID, e.Used, e.What, e.Adding, e.Limit, e.Setting)
}

func (e *QuotaError) Unwrap() error { return ErrQuota }

// Usage is what a user or a session keeps in a store.
type Usage struct {
	Bytes    int64
	Versions int
}

// usager is implemented by the stores: what a user keeps (every session
// and the user: scope) and what one of their sessions keeps.
type usager interface {
	usage(userID, sessionID string) (user, session Usage, err error)
}

// QuotaChecker is implemented by the store WithQuota returns.
type QuotaChecker interface {
	// CheckQuota reports, without storing anything, whether saves of
	// the given sizes (each one version) by userID in sessionID, of the
	// given filenames, would stay within the quota: nil, or an error
	// wrapping ErrQuota (or the store's own, reading its usage).
	CheckQuota(ctx context.Context, userID, sessionID string, filenames []string, sizes []int64) error
}

// WithQuota returns st with q enforced on Save (a refused save wraps
// ErrQuota and stores nothing), or st itself when q sets no limit. Saves
// of one user are serialised in this process, so that two calls of the
// user cannot both pass a check that only one fits.
func WithQuota(st Store, q Quota) Store {
	if !q.On() {
		return st
	}
	u, ok := st.(usager)
	if !ok {
		return st
	}
	return &quotaStore{Store: st, u: u, q: q}
}

type quotaStore struct {
	Store
	u     usager
	q     Quota
	users keyedMutex
}

// Check passes through the store's filesystem check (readiness).
func (s *quotaStore) Check() (store, audit error) {
	if c, ok := s.Store.(Checker); ok {
		return c.Check()
	}
	return nil, nil
}

func (s *quotaStore) Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (int, error) {
	return s.SaveReader(ctx, userID, sessionID, filename, bytes.NewReader(data), int64(len(data)), mimeType)
}

// SaveReader checks size against the quota before anything is read (the
// store then reads exactly size bytes, no more).
func (s *quotaStore) SaveReader(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, error) {
	unlock := s.users.lock(userID)
	defer unlock()
	if err := s.check(userID, sessionID, []string{filename}, []int64{size}); err != nil {
		return 0, fmt.Errorf("artifacts: save %s: %w", filename, err)
	}
	return s.Store.SaveReader(ctx, userID, sessionID, filename, r, size, mimeType)
}

func (s *quotaStore) CheckQuota(ctx context.Context, userID, sessionID string, filenames []string, sizes []int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	unlock := s.users.lock(userID)
	defer unlock()
	return s.check(userID, sessionID, filenames, sizes)
}

// check compares the usage now plus the saves asked for with the quota.
// Names that do not locate are left to the store (it refuses them).
func (s *quotaStore) check(userID, sessionID string, filenames []string, sizes []int64) error {
	var addUser, addSession Usage
	for i, name := range filenames {
		if _, err := locate(userID, sessionID, name); err != nil {
			continue
		}
		addUser.Bytes += sizes[i]
		addUser.Versions++
		if !IsUserScoped(name) {
			addSession.Bytes += sizes[i]
			addSession.Versions++
		}
	}
	if addUser.Versions == 0 {
		return nil
	}
	user, session, err := s.u.usage(userID, sessionID)
	if err != nil {
		return err
	}
	sessionID = userID + "/" + sessionID
	for _, c := range []struct {
		scope, id, what string
		used, add       int64
		limit           int64
		setting         string
	}{
		{"user", userID, "bytes", user.Bytes, addUser.Bytes, s.q.UserBytes, "ARTIFACT_USER_MAX_BYTES"},
		{"user", userID, "versions", int64(user.Versions), int64(addUser.Versions), int64(s.q.UserVersions), "ARTIFACT_USER_MAX_VERSIONS"},
		{"session", sessionID, "bytes", session.Bytes, addSession.Bytes, s.q.SessionBytes, "ARTIFACT_SESSION_MAX_BYTES"},
		{"session", sessionID, "versions", int64(session.Versions), int64(addSession.Versions), int64(s.q.SessionVersions), "ARTIFACT_SESSION_MAX_VERSIONS"},
	} {
		if c.limit > 0 && c.add > 0 && c.used+c.add > c.limit {
			return &QuotaError{Scope: c.scope, ID: c.id, What: c.what, Used: c.used, Adding: c.add, Limit: c.limit, Setting: c.setting}
		}
	}
	return nil
}

// usage of the filesystem store: the regular version files under
// {root}/{user}/ (every session and user/) and under {root}/{user}/{session}/.
func (s *fsStore) usage(userID, sessionID string) (user, session Usage, err error) {
	if CheckName(userID) != nil {
		return Usage{}, Usage{}, nil // Save refuses the name itself
	}
	udir := filepath.Join(s.root, userID)
	scopes, err := os.ReadDir(udir)
	if errors.Is(err, os.ErrNotExist) {
		return Usage{}, Usage{}, nil
	}
	if err != nil {
		return Usage{}, Usage{}, fmt.Errorf("artifacts: usage of user %q: %w", userID, err)
	}
	for _, sc := range scopes {
		if !sc.IsDir() {
			continue
		}
		u, err := dirUsage(filepath.Join(udir, sc.Name()))
		if err != nil {
			return Usage{}, Usage{}, err
		}
		user.Bytes += u.Bytes
		user.Versions += u.Versions
		if sc.Name() == sessionID && sessionID != userScopeDir {
			session = u
		}
	}
	return user, session, nil
}

// dirUsage sums the regular version files of every artifact in dir.
func dirUsage(dir string) (Usage, error) {
	var u Usage
	names, err := os.ReadDir(dir)
	if err != nil {
		return u, fmt.Errorf("artifacts: usage of %s: %w", dir, err)
	}
	for _, n := range names {
		if !n.IsDir() {
			continue
		}
		adir := filepath.Join(dir, n.Name())
		entries, err := os.ReadDir(adir)
		if err != nil {
			return u, fmt.Errorf("artifacts: usage of %s: %w", adir, err)
		}
		for _, e := range entries {
			if _, ok := versionNumber(e.Name()); !ok || !e.Type().IsRegular() {
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			u.Bytes += fi.Size()
			u.Versions++
		}
	}
	return u, nil
}

// usage of the memory store: the versions it still holds.
func (s *memoryStore) usage(userID, sessionID string) (user, session Usage, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, n := range s.byName {
		parts := strings.SplitN(key, "/", 3)
		if len(parts) != 3 || parts[0] != userID {
			continue
		}
		for _, el := range n.versions {
			size := int64(len(el.Value.(*memoryVersion).data))
			user.Bytes += size
			user.Versions++
			if parts[1] == sessionID && sessionID != userScopeDir {
				session.Bytes += size
				session.Versions++
			}
		}
	}
	return user, session, nil
}
