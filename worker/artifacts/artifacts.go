package artifacts

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"unicode"
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
	// SaveReader is Save for data read from r, which must yield exactly
	// size bytes: fewer or more (read up to one byte past size) fail with
	// ErrSizeMismatch and store nothing. The filesystem store copies r
	// through a fixed buffer into its temporary file, so a save costs the
	// worker a bounded amount of memory whatever its size; the in-memory
	// store holds the data itself and refuses sizes beyond its budget
	// before reading anything.
	SaveReader(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (version int, err error)
	// Load returns the given version, or the latest complete one when
	// version is nil. A missing artifact or version wraps ErrNotFound.
	Load(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error)
	// ListVersions returns the stored versions in ascending order (empty,
	// not an error, when there are none).
	ListVersions(ctx context.Context, userID, sessionID, filename string) ([]int, error)
}

// Checker is implemented by stores whose saves need a filesystem (the
// filesystem store): it says, cheaply and without storing anything,
// whether a save could succeed now.
type Checker interface {
	// Check returns why a save would fail now because of the store's
	// filesystem (full, read-only, not writable), and separately because
	// of its audit log (an *AuditError); nil when it would not.
	Check() (store, audit error)
}

// ErrSizeMismatch is wrapped by SaveReader when its reader yields more or
// fewer bytes than the size given (a file that changed while it was saved).
var ErrSizeMismatch = errors.New("data size does not match")

// readExactly reads exactly size bytes from r into w, through io.Copy's
// fixed buffer, and then checks that r has nothing more; the error wraps
// ErrSizeMismatch when r is shorter or longer.
func readExactly(w io.Writer, r io.Reader, size int64) error {
	if size < 0 {
		return fmt.Errorf("%w: negative size %d", ErrSizeMismatch, size)
	}
	n, err := io.Copy(w, io.LimitReader(r, size))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%w: %d bytes read, %d expected", ErrSizeMismatch, n, size)
	}
	var extra [1]byte
	if m, _ := io.ReadFull(r, extra[:]); m > 0 {
		return fmt.Errorf("%w: more than the %d bytes expected", ErrSizeMismatch, size)
	}
	return nil
}

// ErrNotFound is wrapped by Load when the artifact or version does not exist.
var ErrNotFound = errors.New("artifact not found")

// ErrUnsafeName is wrapped when a user id, session id, filename or
// namespace cannot be used as a single path component.
var ErrUnsafeName = errors.New("unsafe name")

// UserPrefix marks a filename shared across the user's sessions.
const UserPrefix = "user:"

// IsUserScoped reports whether filename names a user-scoped artifact:
// it starts with UserPrefix as given or after NFKC normalisation (the
// form the store keeps, so a fullwidth "ｕｓｅｒ:" is user-scoped too).
func IsUserScoped(filename string) bool {
	return strings.HasPrefix(filename, UserPrefix) || strings.HasPrefix(norm.NFKC.String(filename), UserPrefix)
}

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

// FilenameError says why an artifact filename breaks the filename rule
// (CheckFilename). It wraps ErrUnsafeName.
type FilenameError struct {
	Name   string
	Reason string
}

func (e *FilenameError) Error() string {
	return fmt.Sprintf("unsafe filename %q: %s", e.Name, e.Reason)
}

func (e *FilenameError) Unwrap() error { return ErrUnsafeName }

// CheckFilename is str's one rule for artifact filenames: input names in
// a request, output files a tool leaves in output/, and every name the
// store saves or loads. A name may start with "user:" (a user-scoped
// artifact, spec §9); what follows must be, both as given and after NFKC
// normalisation (the form the store keeps):
//
//   - valid UTF-8,
//   - not empty, not "." or "..",
//   - without "/" or "\" (so never absolute, always one path component),
//   - without control characters (Unicode category Cc: U+0000–U+001F,
//     U+007F–U+009F; a tab or a newline in a shared store's file name
//     breaks listings and log lines),
//   - without bidirectional overrides and isolates (U+202A–U+202E,
//     U+2066–U+2069) or zero-width characters (U+200B–U+200D, U+2060,
//     U+FEFF): they make a name display as another ("invoice‮txt.exe"
//     shown as "invoiceexe.txt") or two different names look the same,
//     to the agent, the user and an operator reading the store,
//   - at most MaxNameBytes bytes.
//
// runner.py's _unsafe_filename_reason applies the same rule to
// ctx.save_artifact. The error is a *FilenameError (wrapping
// ErrUnsafeName).
func CheckFilename(name string) error {
	if why := filenameProblem(name); why != "" {
		return &FilenameError{Name: name, Reason: why}
	}
	return nil
}

func filenameProblem(name string) string {
	if !utf8.ValidString(name) {
		return "not valid UTF-8"
	}
	for i, form := range []string{name, norm.NFKC.String(name)} {
		rest := strings.TrimPrefix(form, UserPrefix)
		after := ""
		if i == 1 && form != name {
			after = " after NFKC normalisation"
		}
		switch {
		case rest == "" && form != rest:
			return "empty after the " + UserPrefix + " prefix"
		case rest == "":
			return "empty"
		case rest == "." || rest == "..":
			return "a directory reference" + after
		case strings.HasPrefix(rest, "/"):
			return "an absolute path" + after
		case strings.ContainsAny(rest, `/\`):
			return "contains a path separator" + after
		case len(rest) > MaxNameBytes:
			return fmt.Sprintf("%d bytes%s, more than %d", len(rest), after, MaxNameBytes)
		}
		for _, r := range rest {
			if unicode.IsControl(r) {
				return fmt.Sprintf("contains the control character %U%s", r, after)
			}
			if why := invisibleRune(r); why != "" {
				return fmt.Sprintf("contains %U, %s%s", r, why, after)
			}
		}
	}
	return ""
}

// invisibleRune says what r is when it is a character that changes how a
// name displays without showing itself ("" for any other).
func invisibleRune(r rune) string {
	switch {
	case r >= 0x202A && r <= 0x202E:
		return "a bidirectional override (it reorders how the name displays)"
	case r >= 0x2066 && r <= 0x2069:
		return "a bidirectional isolate (it reorders how the name displays)"
	case r >= 0x200B && r <= 0x200D, r == 0x2060, r == 0xFEFF:
		return "a zero-width character (two different names would look the same)"
	}
	return ""
}

// MaxMimeTypeBytes bounds a stored mime type (the .meta file, every
// created_artifacts entry that repeats it).
const MaxMimeTypeBytes = 255

// ErrBadMimeType is wrapped by CheckMimeType's errors and by Save when it
// refuses a mime type.
var ErrBadMimeType = errors.New("bad mime type")

// CheckMimeType is the rule for a mime type the store keeps: at most
// MaxMimeTypeBytes bytes of printable ASCII shaped as RFC 6838's
// type "/" subtype (each a restricted-name: a letter or digit, then up to
// 126 of letters, digits and !#$&-^_.+), optionally followed by
// parameters "; name=value" (name a restricted-name; value printable
// ASCII without ';', or a quoted string). The error wraps ErrBadMimeType
// and says what is wrong (the value itself is not repeated when long).
func CheckMimeType(m string) error {
	bad := func(format string, a ...any) error {
		shown := m
		if len(shown) > 64 {
			shown = shown[:64] + "…"
		}
		return fmt.Errorf("%w %q: %s", ErrBadMimeType, strings.ToValidUTF8(shown, "\uFFFD"), fmt.Sprintf(format, a...))
	}
	if len(m) > MaxMimeTypeBytes {
		return bad("%d bytes, more than %d", len(m), MaxMimeTypeBytes)
	}
	for i := 0; i < len(m); i++ {
		if m[i] < 0x20 || m[i] > 0x7e {
			return bad("contains the byte 0x%02x (only printable ASCII)", m[i])
		}
	}
	main, params, _ := strings.Cut(m, ";")
	typ, sub, ok := strings.Cut(strings.TrimSpace(main), "/")
	if !ok {
		return bad("not of the form type/subtype")
	}
	if !restrictedName(typ) || !restrictedName(sub) {
		return bad("type and subtype must be RFC 6838 names (a letter or digit, then letters, digits and !#$&-^_.+, at most 127 each)")
	}
	if params == "" && strings.HasSuffix(m, ";") {
		return bad("empty parameter")
	}
	for _, p := range strings.Split(params, ";") {
		if params == "" {
			break
		}
		name, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		quoted := len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"'
		if !ok || !restrictedName(name) || value == "" || (!quoted && strings.ContainsAny(value, " \t\"")) {
			return bad("parameter %q is not name=value", strings.TrimSpace(p))
		}
	}
	return nil
}

// restrictedName is RFC 6838's restricted-name.
func restrictedName(s string) bool {
	if s == "" || len(s) > 127 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return false
		}
		if !alnum && !strings.ContainsRune("!#$&-^_.+", rune(c)) {
			return false
		}
	}
	return true
}

// IsActiveMimeType reports whether m (parameters ignored, any case) is a
// type a browser or viewer may run code from when it renders the
// artifact: HTML, XHTML, SVG and any other XML (XML can carry XHTML with
// script, or an XSLT stylesheet), and JavaScript. The worker decides by
// ARTIFACT_ACTIVE_MIME_TYPES what to store when a tool chooses one.
func IsActiveMimeType(m string) bool {
	main, _, _ := strings.Cut(m, ";")
	main = strings.ToLower(strings.TrimSpace(main))
	switch main {
	case "text/html", "application/xhtml+xml", "image/svg+xml", "text/xml", "application/xml",
		"application/javascript", "text/javascript", "application/x-javascript",
		"application/ecmascript", "text/ecmascript":
		return true
	}
	return strings.HasSuffix(main, "+xml")
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
// location. The filename must pass CheckFilename, which checks it as
// given and NFKC-normalised (the reference normalises, so a fullwidth
// "／" must not become a separator later); the normalised form is stored.
// Components are rejected, never rewritten: the reference's basename()
// would silently turn "a/b" into "b".
func locate(userID, sessionID, filename string) (location, error) {
	if err := CheckName(userID); err != nil {
		return location{}, fmt.Errorf("user id: %w", err)
	}
	if err := CheckFilename(filename); err != nil {
		return location{}, err
	}
	name := norm.NFKC.String(filename)
	if rest, ok := strings.CutPrefix(name, UserPrefix); ok {
		return location{filename: name, rel: []string{userID, userScopeDir, rest}}, nil
	}
	if err := CheckName(sessionID); err != nil {
		return location{}, fmt.Errorf("session id: %w", err)
	}
	if sessionID == userScopeDir {
		return location{}, fmt.Errorf("session id: %w: %q is reserved for user-scoped artifacts", ErrUnsafeName, sessionID)
	}
	return location{filename: name, rel: []string{userID, sessionID, name}}, nil
}

func (l location) key() string { return strings.Join(l.rel, "/") }

// auditedSave is every store's SaveReader: save (the store's own steps)
// gets r hashed on its way, and the save, or its failure, is recorded in
// the audit log with the data's SHA-256.
func auditedSave(ctx context.Context, audit *auditLog, save func(ctx context.Context, userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, string, error),
	userID, sessionID, filename string, r io.Reader, size int64, mimeType string) (int, error) {
	h := sha256.New()
	v, name, err := save(ctx, userID, sessionID, filename, io.TeeReader(r, h), size, mimeType)
	if err != nil {
		audit.record(ctx, "save", userID, sessionID, filename, -1, nil, err)
		return 0, err
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	if err := audit.recordSum(ctx, "save", userID, sessionID, name, v, size, sum, nil); err != nil {
		return 0, fmt.Errorf("artifacts: save %s version %d: %w", name, v, err)
	}
	return v, nil
}

// checkSave is every store's first save step: the context still live,
// the ids and the (NFKC-normalised) filename valid, the mime type (from
// the extension when empty) allowed, the size not negative. store ("s3
// store: ", or "" for the filesystem's) starts its error text.
func checkSave(ctx context.Context, store, userID, sessionID, filename, mimeType string, size int64) (location, string, error) {
	if err := ctx.Err(); err != nil {
		return location{}, "", err
	}
	loc, err := locate(userID, sessionID, filename)
	if err != nil {
		return location{}, "", fmt.Errorf("artifacts: %ssave: %w", store, err)
	}
	if mimeType == "" {
		mimeType = MimeByExtension(loc.filename)
	}
	if err := CheckMimeType(mimeType); err != nil {
		return location{}, "", fmt.Errorf("artifacts: %ssave %s: %w", store, loc.filename, err)
	}
	if size < 0 {
		return location{}, "", fmt.Errorf("artifacts: %ssave %s: %w: negative size %d", store, loc.filename, ErrSizeMismatch, size)
	}
	return loc, mimeType, nil
}

// auditedLoad is the filesystem and bucket stores' Load: load (the
// store's own steps), and the load, or its failure, recorded in the
// audit log.
func auditedLoad(ctx context.Context, audit *auditLog, load func(ctx context.Context, userID, sessionID, filename string, version *int) (*Artifact, error),
	userID, sessionID, filename string, version *int) (*Artifact, error) {
	a, err := load(ctx, userID, sessionID, filename, version)
	if err != nil {
		audit.record(ctx, "load", userID, sessionID, filename, -1, nil, err)
		return nil, err
	}
	if err := audit.record(ctx, "load", userID, sessionID, a.Filename, a.Version, a.Data, nil); err != nil {
		return nil, fmt.Errorf("artifacts: load %s version %d: %w", a.Filename, a.Version, err)
	}
	return a, nil
}
