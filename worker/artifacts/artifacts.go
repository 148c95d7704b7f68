package artifacts

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Artifact is one stored version of a named artifact.
type Artifact struct {
	Filename string
	Version  int
	MimeType string
	Data     []byte
}

// Store is an artifact service scoped to one namespace (spec §9).
type Store interface {
	// Save stores data as the next version of filename (0 for the first)
	// and returns that version. An empty mimeType is taken from the
	// filename's extension (MimeByExtension).
	Save(ctx context.Context, userID, sessionID, filename string, data []byte, mimeType string) (version int, err error)
	// Load returns the given version, or the latest complete one when
	// version is nil. A missing artifact or version wraps ErrNotFound.
	Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error)
	// ListVersions returns the stored versions in ascending order (empty,
	// not an error, when there are none).
	ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error)
}

// ErrNotFound is wrapped by Load when the artifact or version does not exist.
var ErrNotFound = errors.New("artifact not found")

// ErrUnsafeName is wrapped when a user id, session id, filename or
// namespace cannot be used as a single path component.
var ErrUnsafeName = errors.New("unsafe name")

// UserPrefix marks a filename shared across the user's sessions.
const UserPrefix = "user:"

// userScopeDir is the directory that holds the user-scoped artifacts, in
// place of a session id (spec §9).
const userScopeDir = "user"

// MaxNameBytes bounds every path component (the common NAME_MAX).
const MaxNameBytes = 255

// CheckName reports whether s can be used as one path component: it must
// not be empty, "." or "..", contain "/", "\" or NUL, be absolute or be
// longer than MaxNameBytes bytes. The error wraps ErrUnsafeName.
func CheckName(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty", ErrUnsafeName)
	case s == "." || s == "..":
		return fmt.Errorf("%w: %q is a directory reference", ErrUnsafeName, s)
	case strings.ContainsRune(s, 0):
		return fmt.Errorf("%w: %q contains NUL", ErrUnsafeName, s)
	case filepath.IsAbs(s):
		return fmt.Errorf("%w: %q is absolute", ErrUnsafeName, s)
	case strings.ContainsAny(s, `/\`):
		return fmt.Errorf("%w: %q contains a path separator", ErrUnsafeName, s)
	case len(s) > MaxNameBytes:
		return fmt.Errorf("%w: %d bytes, more than %d", ErrUnsafeName, len(s), MaxNameBytes)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %q is not valid UTF-8", ErrUnsafeName, s)
	}
	return nil
}

// MimeByExtension returns the mime type for an output file by its
// extension, case-insensitively (spec §7.6).
func MimeByExtension(filename string) string {
	switch strings.ToLower(filepath.Ext(filename)) {
	case ".json":
		return "application/json"
	case ".txt":
		return "text/plain"
	case ".csv":
		return "text/csv"
	case ".png":
		return "image/png"
	case ".jpg", ".jpeg":
		return "image/jpeg"
	}
	return "application/octet-stream"
}

// Scope returns the store's top directory name for a namespace:
// basename(namespace.rstrip("/")), as the reference computes it.
func Scope(namespace string) (string, error) {
	trimmed := strings.TrimRight(namespace, "/")
	scope := trimmed
	if i := strings.LastIndexByte(trimmed, '/'); i >= 0 {
		scope = trimmed[i+1:]
	}
	if err := CheckName(scope); err != nil {
		return "", fmt.Errorf("artifacts: namespace %q: %w", namespace, err)
	}
	return scope, nil
}

// location is where one named artifact lives, relative to the scope dir.
type location struct {
	filename string   // NFKC-normalised, as given (with its "user:" prefix)
	rel      []string // {user}/{session}/{name} or {user}/user/{name}
}

// locate validates the ids and filename and returns the artifact's
// location. The filename is NFKC-normalised first (as the reference
// does), so that a fullwidth "／" cannot become a separator later.
// Components are rejected, never rewritten: the reference's basename()
// would silently turn "a/b" into "b".
func locate(userID, sessionID, filename string) (location, error) {
	if err := CheckName(userID); err != nil {
		return location{}, fmt.Errorf("user id: %w", err)
	}
	name := norm.NFKC.String(filename)
	if rest, ok := strings.CutPrefix(name, UserPrefix); ok {
		if err := CheckName(rest); err != nil {
			return location{}, fmt.Errorf("filename %q: %w", filename, err)
		}
		return location{filename: name, rel: []string{userID, userScopeDir, rest}}, nil
	}
	if err := CheckName(sessionID); err != nil {
		return location{}, fmt.Errorf("session id: %w", err)
	}
	if sessionID == userScopeDir {
		return location{}, fmt.Errorf("session id: %w: %q is reserved for user-scoped artifacts", ErrUnsafeName, sessionID)
	}
	if err := CheckName(name); err != nil {
		return location{}, fmt.Errorf("filename %q: %w", filename, err)
	}
	return location{filename: name, rel: []string{userID, sessionID, name}}, nil
}

func (l location) key() string { return strings.Join(l.rel, "/") }
