package artifacts

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/internal/fscheck"
)

// Option configures a store.
type Option func(*options)

type options struct {
	audit        *auditLog
	memoryBudget int64
}

// WithMemoryBudget sets the in-memory store's byte budget (NewMemory);
// other stores ignore it. bytes <= 0 means DefaultMemoryBudget.
func WithMemoryBudget(bytes int64) Option {
	return func(o *options) { o.memoryBudget = bytes }
}

// WithAuditLog appends one JSON line per save and load (successful or
// refused), and per eviction from the in-memory store ("op":"evict"), to
// the file at path, created 0600 if missing and never truncated (spec
// §13). Open turns it on from ARTIFACT_AUDIT_LOG. A line reads
//
//	{"time":"2026-02-09T12:34:56.789Z","op":"save","scope":"ns","user":"u","session":"s",
//	 "requester":"verified:u","verified_by":"key:orders","filename":"a.txt","version":0,"size":5,"sha256":"…"}
//
// where requester is who the worker verified the call to be from
// ("verified:USER"), or "unverified:USER" when it runs without request
// signing or user tokens (WithRequester; absent for an eviction, which no
// requester asked for).
//
// with "error" in place of version/size/sha256 for a refused call. When a
// line cannot be written the operation reports an error (fail closed: an
// unaudited access is an error even though the data was stored or read).
func WithAuditLog(path string) Option {
	return func(o *options) { o.audit = &auditLog{path: path} }
}

type auditLog struct {
	path  string
	scope string
	mu    sync.Mutex
}

// AuditError is a failure to write the audit log: the store's operation
// itself may have succeeded (a save's version is stored), but it is
// reported failed (fail closed). Path is the log's.
type AuditError struct {
	Path string
	Op   string // "open", "append", "encode"
	Err  error
}

func (e *AuditError) Error() string { return fmt.Sprintf("audit log %s: %s: %v", e.Path, e.Op, e.Err) }
func (e *AuditError) Unwrap() error { return e.Err }

type auditLine struct {
	Time    string `json:"time"`
	Op      string `json:"op"`
	Scope   string `json:"scope"`
	User    string `json:"user"`
	Session string `json:"session"`
	// Requester and VerifiedBy: who the call is from, as the worker
	// verified it (WithRequester).
	Requester  string `json:"requester,omitempty"`
	VerifiedBy string `json:"verified_by,omitempty"`
	Filename   string `json:"filename"`
	Version    *int   `json:"version,omitempty"`
	Size       *int64 `json:"size,omitempty"`
	SHA256     string `json:"sha256,omitempty"`
	Error      string `json:"error,omitempty"`
}

// open opens the log file for appending (created 0600 if missing, never
// followed through a symlink). The log is opened for each line, not held
// open: a log rotated away (renamed, a new one created) is followed at
// the next line, and no descriptor open for writing keeps the store's
// filesystem from being remounted read-only, or repaired, while the
// worker runs.
func (a *auditLog) open() (*os.File, error) {
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, &AuditError{Path: a.path, Op: "open", Err: err}
	}
	return f, nil
}

// check reports whether a line could be appended now: the log opens for
// appending and its directory's filesystem has room for a line
// (fscheck.Writable), without writing to the log. A nil log is fine.
func (a *auditLog) check() error {
	if a == nil {
		return nil
	}
	f, err := a.open()
	if err != nil {
		return err
	}
	f.Close()
	if err := fscheck.Writable(filepath.Dir(a.path), 4096); err != nil {
		return &AuditError{Path: a.path, Op: "append", Err: err}
	}
	return nil
}

type requesterKey struct{}

type requesterValue struct{ key, via string }

// WithRequester returns ctx carrying who a store call is made for: key
// is the requester ("verified:USER" or "unverified:USER"), via what
// verified it ("" when nothing did). The audit log records both.
func WithRequester(ctx context.Context, key, via string) context.Context {
	return context.WithValue(ctx, requesterKey{}, requesterValue{key: key, via: via})
}

// record appends one line. A nil log records nothing. version < 0 means
// the call failed with err. ctx carries the requester (WithRequester).
func (a *auditLog) record(ctx context.Context, op, user, session, filename string, version int, data []byte, opErr error) error {
	if a == nil {
		return nil
	}
	return a.recordSum(ctx, op, user, session, filename, version, int64(len(data)), sha256.Sum256(data), opErr)
}

// recordSum is record for data already summed (a streamed save): size
// bytes whose SHA-256 is sum.
func (a *auditLog) recordSum(ctx context.Context, op, user, session, filename string, version int, size int64, sum [sha256.Size]byte, opErr error) error {
	if a == nil {
		return nil
	}
	r, _ := ctx.Value(requesterKey{}).(requesterValue)
	line := auditLine{
		Requester: r.key, VerifiedBy: r.via,
		Time:     time.Now().UTC().Format(time.RFC3339Nano),
		Op:       op,
		Scope:    a.scope,
		User:     user,
		Session:  session,
		Filename: filename,
	}
	if opErr != nil || version < 0 {
		if opErr != nil {
			line.Error = opErr.Error()
		}
	} else {
		v, n := version, size
		line.Version, line.Size, line.SHA256 = &v, &n, hex.EncodeToString(sum[:])
	}
	b, err := json.Marshal(&line)
	if err != nil {
		return &AuditError{Path: a.path, Op: "encode", Err: err}
	}
	b = append(b, '\n')

	a.mu.Lock()
	defer a.mu.Unlock()
	f, err := a.open()
	if err != nil {
		return err
	}
	// One write per line: O_APPEND makes each write land whole at the end
	// even with other processes appending to the same log.
	if _, err := f.Write(b); err != nil {
		f.Close()
		return &AuditError{Path: a.path, Op: "append", Err: err}
	}
	if err := f.Close(); err != nil {
		return &AuditError{Path: a.path, Op: "append", Err: err}
	}
	return nil
}
