package worker

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/internal/fscheck"
	"github.com/securetoolruntime/str/internal/prom"
	"github.com/securetoolruntime/str/worker/artifacts"
)

// The readiness model (/readyz, issue 11). Beyond the broker connection,
// /readyz reports two kinds of trouble, each under a fixed name with the
// error actually seen (path and errno text):
//
//   - faults: a resource every call of some kind needs is unusable, so
//     the worker cannot do its job and /readyz answers 503 —
//     "artifact_store" (the store's filesystem full, read-only, not
//     writable), "artifact_audit_log" (the audit log cannot be appended
//     to: every save and load fails closed), "work_dir" (no work dir can
//     be made under SANDBOX_WORK_DIR);
//   - degraded: the worker serves, with a caveat, and /readyz stays 200 —
//     "manifest" (the manifest file is missing, unreadable or invalid:
//     the last good manifest keeps serving).
//
// A fault is set the moment a call fails on it, and every fault is
// re-checked by checkResources: on a timer (resourceCheckInterval) and
// when /readyz is asked (at most once per resourceCheckMinAge). A check
// is cheap and writes nothing (a probe file would show, for an instant,
// in directories agents and tests list): access(2) and statfs(2) of the
// work base, the store's scope dir and the audit log's dir (free bytes,
// free inodes, read-only), and the audit log opened for appending. A
// repaired resource clears its fault at the next check, without a
// restart. Each change is logged: a new fault as an error, a
// cleared one as info.

// Fault and degradation names, the keys of /readyz's "faults" and
// "degraded" objects.
const (
	faultArtifactStore = "artifact_store"
	faultAuditLog      = "artifact_audit_log"
	faultWorkDir       = "work_dir"
	degradedManifest   = "manifest"
)

const (
	// resourceCheckInterval is how often the resources are re-checked
	// while the worker serves.
	resourceCheckInterval = 5 * time.Second
	// resourceCheckMinAge: /readyz re-checks when the last check is older.
	resourceCheckMinAge = time.Second
)

// readiness holds the faults and degradations. The zero value is not
// usable; a nil *readiness reports nothing and records nothing.
type readiness struct {
	log   *slog.Logger
	gauge *prom.GaugeVec // str_worker_faults{kind,name}; nil: none

	mu       sync.Mutex
	faults   map[string]string
	degraded map[string]string
	checked  time.Time // the last checkResources

	checking sync.Mutex // one checkResources at a time
}

// Kinds, the str_worker_faults label kind.
const (
	kindFault    = "fault"
	kindDegraded = "degraded"
)

// newReadiness returns a readiness with nothing set. With a gauge, every
// fault and degradation name starts at 0, so each series exists before
// its first fault.
func newReadiness(log *slog.Logger, gauge *prom.GaugeVec) *readiness {
	if gauge != nil {
		for _, name := range []string{faultArtifactStore, faultAuditLog, faultWorkDir} {
			gauge.WithLabelValues(kindFault, name).Set(0)
		}
		gauge.WithLabelValues(kindDegraded, degradedManifest).Set(0)
	}
	return &readiness{log: log, gauge: gauge, faults: map[string]string{}, degraded: map[string]string{}}
}

// setFault sets (err != nil) or clears (nil) the fault name, logging a
// change.
func (r *readiness) setFault(name string, err error) {
	r.set(true, name, err)
}

// setDegraded sets or clears the degradation name, logging a change.
func (r *readiness) setDegraded(name string, err error) {
	r.set(false, name, err)
}

func (r *readiness) set(fault bool, name string, err error) {
	if r == nil {
		return
	}
	kind, label := "degradation", kindDegraded
	r.mu.Lock()
	m := r.degraded
	if fault {
		kind, label, m = "fault", kindFault, r.faults
	}
	old, had := m[name]
	value := 0.0
	if err == nil {
		delete(m, name)
	} else {
		m[name] = err.Error()
		value = 1
	}
	if r.gauge != nil { // under the lock: the gauge and the map agree
		r.gauge.WithLabelValues(label, name).Set(value)
	}
	r.mu.Unlock()
	switch {
	case err == nil && had:
		r.log.Info("worker "+kind+" cleared", kind, name, "was", old)
	case err != nil && (!had || old != err.Error()):
		r.log.Error("worker "+kind+" (see /readyz)", kind, name, "error", err.Error())
	}
}

// snapshot returns copies of the faults and degradations (nil when none).
func (r *readiness) snapshot() (faults, degraded map[string]string) {
	if r == nil {
		return nil, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cp := func(m map[string]string) map[string]string {
		if len(m) == 0 {
			return nil
		}
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	return cp(r.faults), cp(r.degraded)
}

// checkResources re-checks every resource a fault can name and sets or
// clears each fault. With maxAge > 0 it does nothing when the last check
// is younger.
func (s *Server) checkResources(maxAge time.Duration) {
	r := s.ready
	if r == nil {
		return
	}
	r.checking.Lock()
	defer r.checking.Unlock()
	r.mu.Lock()
	fresh := maxAge > 0 && time.Since(r.checked) < maxAge
	r.mu.Unlock()
	if fresh {
		return
	}
	r.setFault(faultWorkDir, s.checkWorkDir())
	if c, ok := s.store.(artifacts.Checker); ok {
		store, audit := c.Check()
		r.setFault(faultArtifactStore, store)
		r.setFault(faultAuditLog, audit)
	}
	r.mu.Lock()
	r.checked = time.Now()
	r.mu.Unlock()
}

// workDirMinFree is the free space below which an uncapped work base is
// reported full.
const workDirMinFree = 64 << 10

// checkWorkDir says whether a call's work dir can be made now, without
// making anything (fscheck.Writable): the work base writable, with an
// inode free, and, when work dirs are not capped (rootless,
// SANDBOX_MODE=none: a call's files go to the work base's filesystem),
// workDirMinFree bytes free. Capped, a call's files go to its own tmpfs
// and the base only gives its directory, so free bytes do not matter.
func (s *Server) checkWorkDir() error {
	var minFree uint64
	if !s.sb.CapsWorkDirs() {
		minFree = workDirMinFree
	}
	if err := fscheck.Writable(s.cfg.WorkDir, minFree); err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	return nil
}

// runResourceChecks re-checks the resources every resourceCheckInterval
// until done is closed.
func (s *Server) runResourceChecks(done <-chan struct{}) {
	t := time.NewTicker(resourceCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			s.checkResources(0)
		}
	}
}

// isFilesystemFault reports whether err is the filesystem refusing a
// write for a reason of its own (full, quota, read-only, permissions, I/O
// error), as opposed to a bad name or a missing artifact.
func isFilesystemFault(err error) bool {
	for _, errno := range []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EACCES, syscall.EPERM, syscall.EIO} {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// isNoSpace reports whether err is a full filesystem or quota.
func isNoSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// storeErrorCode is the reply's code for an artifact store failure: a
// full store or audit log filesystem (ENOSPC, EDQUOT) or the user's
// artifact quota is RESOURCE_EXHAUSTED (the work cannot be taken now); anything
// else (read-only, permissions, I/O) ARTIFACT_ERROR. Both blame the
// worker's side, never the caller.
func storeErrorCode(err error) Code {
	if isNoSpace(err) || errors.Is(err, artifacts.ErrQuota) {
		return CodeResourceExhausted
	}
	return CodeArtifactError
}

// noteStoreFault sets the fault a store failure shows, if it is one of
// the filesystem's (an audit log failure is the audit log's fault). A
// quota refusal (artifacts.ErrQuota) is one user's limit, never a fault
// of the store: /readyz stays green for everyone else.
func (s *Server) noteStoreFault(err error) {
	if errors.Is(err, artifacts.ErrQuota) || !isFilesystemFault(err) {
		return
	}
	var ae *artifacts.AuditError
	if errors.As(err, &ae) {
		s.ready.setFault(faultAuditLog, err)
		return
	}
	s.ready.setFault(faultArtifactStore, err)
}

// noteWorkDirFault sets the work_dir fault for a work dir that could not
// be made, if the filesystem refused it.
func (s *Server) noteWorkDirFault(err error) {
	if isFilesystemFault(err) {
		s.ready.setFault(faultWorkDir, fmt.Errorf("work dir %s: %w", s.cfg.WorkDir, err))
	}
}

// noteWorkDirFileFault is noteWorkDirFault for a file written inside a
// call's work dir: that is the work base's filesystem only when work dirs
// are not capped; capped, it is the call's own tmpfs, full by the
// profile's work_dir cap (the call's own doing, no fault of the worker).
func (s *Server) noteWorkDirFileFault(err error) {
	if !s.sb.CapsWorkDirs() {
		s.noteWorkDirFault(err)
	}
}
