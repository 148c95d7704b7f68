package artifacts

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
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
//	 "filename":"a.txt","version":0,"size":5,"sha256":"…"}
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
	f     *os.File
}

type auditLine struct {
	Time     string `json:"time"`
	Op       string `json:"op"`
	Scope    string `json:"scope"`
	User     string `json:"user"`
	Session  string `json:"session"`
	Filename string `json:"filename"`
	Version  *int   `json:"version,omitempty"`
	Size     *int   `json:"size,omitempty"`
	SHA256   string `json:"sha256,omitempty"`
	Error    string `json:"error,omitempty"`
}

// open opens the log file if it is not open yet.
func (a *auditLog) open() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.openLocked()
}

func (a *auditLog) openLocked() error {
	if a.f != nil {
		return nil
	}
	f, err := os.OpenFile(a.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("audit log %s: open: %w", a.path, err)
	}
	a.f = f
	return nil
}

// record appends one line. A nil log records nothing. version < 0 means
// the call failed with err.
func (a *auditLog) record(op, user, session, filename string, version int, data []byte, opErr error) error {
	if a == nil {
		return nil
	}
	line := auditLine{
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
		v, n := version, len(data)
		sum := sha256.Sum256(data)
		line.Version, line.Size, line.SHA256 = &v, &n, hex.EncodeToString(sum[:])
	}
	b, err := json.Marshal(&line)
	if err != nil {
		return fmt.Errorf("audit log %s: encode: %w", a.path, err)
	}
	b = append(b, '\n')

	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.openLocked(); err != nil {
		return err
	}
	// One write per line: O_APPEND makes each write land whole at the end
	// even with other processes appending to the same log.
	if _, err := a.f.Write(b); err != nil {
		return fmt.Errorf("audit log %s: append: %w", a.path, err)
	}
	return nil
}
