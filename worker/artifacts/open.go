package artifacts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// Settings choose and configure the store of `str worker` (the
// ARTIFACT_* settings).
type Settings struct {
	Type      string // "filesystem", "memory", "s3" or "gcs" (ARTIFACT_SERVICE_TYPE)
	BasePath  string // ARTIFACT_BASE_PATH (filesystem)
	S3        S3Settings
	GCS       GCSSettings
	Namespace string // SAM_NAMESPACE: the store's scope (spec §9)
	// AuditLog is ARTIFACT_AUDIT_LOG: the audit log's path, "" for the
	// default (DefaultAuditLog for the filesystem store, none for the
	// memory, s3 and gcs stores), AuditLogOff for none.
	AuditLog string
	// MemoryMaxBytes is ARTIFACT_MEMORY_MAX_BYTES, the memory store's
	// budget (<= 0: DefaultMemoryBudget).
	MemoryMaxBytes int64
}

// AuditLogOff as ARTIFACT_AUDIT_LOG turns the audit log off.
const AuditLogOff = "off"

// DefaultAuditLog is the filesystem store's audit log when
// ARTIFACT_AUDIT_LOG is not set: <base>/.audit/audit.jsonl, beside the
// scope directories (agents look only under {base}/{scope}).
func DefaultAuditLog(basePath string) string {
	return filepath.Join(basePath, ".audit", "audit.jsonl")
}

// Open builds the store the settings describe, with its audit log
// (WithAuditLog; its directory created 0700) checked by opening it, so
// that an unusable log path fails at start-up rather than at the first
// save. It returns the audit log's
// path ("" when off).
func Open(s Settings) (Store, string, error) {
	// 1. the audit log's path.
	auditPath := s.AuditLog
	switch {
	case auditPath == AuditLogOff:
		auditPath = ""
	case auditPath == "" && s.Type == "filesystem":
		auditPath = DefaultAuditLog(s.BasePath)
	}
	var opts []Option
	if auditPath != "" {
		abs, err := filepath.Abs(auditPath)
		if err != nil {
			return nil, "", fmt.Errorf("artifacts: audit log %s: %w", auditPath, err)
		}
		auditPath = abs
		if err := os.MkdirAll(filepath.Dir(auditPath), 0o700); err != nil {
			return nil, "", fmt.Errorf("artifacts: audit log %s: create its directory: %w", auditPath, err)
		}
		// Opened (created 0600, appended to, never truncated) once now,
		// so that an unusable path fails at start-up.
		probe, err := (&auditLog{path: auditPath}).open()
		if err != nil {
			return nil, "", fmt.Errorf("artifacts: %w", err)
		}
		probe.Close()
		opts = append(opts, WithAuditLog(auditPath))
	}
	opts = append(opts, WithMemoryBudget(s.MemoryMaxBytes))
	// 2. the store.
	var (
		st  Store
		err error
	)
	switch s.Type {
	case "filesystem":
		st, err = NewFilesystem(s.BasePath, s.Namespace, opts...)
		if err != nil {
			return nil, "", err
		}
	case "memory":
		st = NewMemory(s.Namespace, opts...)
	case "s3":
		st, err = NewS3(context.Background(), s.S3, s.Namespace, opts...)
		if err != nil {
			return nil, "", err
		}
	case "gcs":
		st, err = NewGCS(context.Background(), s.GCS, s.Namespace, opts...)
		if err != nil {
			return nil, "", err
		}
	default:
		return nil, "", fmt.Errorf("artifacts: unknown store type %q (memory, filesystem, s3 or gcs)", s.Type)
	}
	return st, auditPath, nil
}
