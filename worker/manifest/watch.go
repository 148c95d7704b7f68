package manifest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// DefaultWatchInterval is the poll interval when none is given; a change
// is seen within two intervals (spec §5: within 2 s).
const DefaultWatchInterval = time.Second

// Watcher polls a manifest file and applies valid changes.
type Watcher struct {
	path     string
	interval time.Duration
	apply    func(*Manifest) error
	logf     func(msg string, args ...any)

	// OnProblem, when set (before Run), is called at each poll that
	// keeps the previous manifest because of the file (missing,
	// unreadable, invalid) or because apply failed, with why; and with
	// nil at each poll that finds the file's content applied (again, or
	// just now): a repaired file clears the problem. It runs
	// synchronously, with the watcher's lock held, and must not call the
	// watcher. A changed content seen at only one poll so far (see Run)
	// reports nothing yet.
	OnProblem func(error)

	mu      sync.Mutex
	applied [sha256.Size]byte // hash of the content last applied
	hasAppl bool
	seen    [sha256.Size]byte // hash of the content last looked at (for logging once)
	hasSeen bool
	missing bool
	// last is the hash read at the previous poll: a change is acted on
	// only once the same content has been read at two polls in a row.
	last    [sha256.Size]byte
	hasLast bool
}

// NewWatcher returns a Watcher; interval <= 0 means DefaultWatchInterval,
// a nil logf discards messages.
func NewWatcher(path string, interval time.Duration, apply func(*Manifest) error, logf func(msg string, args ...any)) *Watcher {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Watcher{path: path, interval: interval, apply: apply, logf: logf}
}

// Run polls the file every interval until ctx is done. The first poll reads
// the manifest as it is and calls apply with it (so a change made between
// the caller's own Load and the start of Run is never missed; apply must
// treat an unchanged manifest as a no-op, e.g. through Diff). Afterwards,
// apply is called, synchronously, each time the content changes and the
// new file is valid as a whole (entries with problems of their own are in
// its Unavailable; see Parse). An invalid or missing file keeps the
// previous manifest and is logged once per distinct content. If apply fails, the error is
// logged and the same content is applied again at the next poll.
//
// After the first poll a change is acted on only when two polls in a row
// read the same content: a file rewritten in place (truncated, then
// written) can be read half-written, and a half that parses would remove
// tools and announce their removal to every agent. So a change is applied
// within two intervals of being made (spec §5's 2 s at the default 1 s).
func (w *Watcher) Run(ctx context.Context) {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		w.Poll()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Poll checks the file once and applies a valid change. It reports
// whether apply was called successfully.
func (w *Watcher) Poll() bool {
	w.mu.Lock()
	defer w.mu.Unlock()

	// 1. stat: a missing file keeps the previous manifest (an editor may be
	// replacing it).
	if _, err := os.Stat(w.path); err != nil {
		problem := fmt.Errorf("manifest %s: %w; keeping the previous manifest", w.path, err)
		if errors.Is(err, os.ErrNotExist) {
			problem = fmt.Errorf("manifest %s is missing; keeping the previous manifest", w.path)
		}
		if !w.missing {
			w.missing = true
			w.logf("%v", problem)
		}
		w.report(problem)
		return false
	}
	w.missing = false

	// 2. read and hash on every poll: mtime and size alone miss a
	// same-size edit within the file system's timestamp granularity, and
	// a manifest is small.
	data, err := readLimited(w.path)
	if err != nil {
		w.logOnce(sha256.Sum256([]byte(err.Error())), "%v; keeping the previous manifest", err)
		w.report(fmt.Errorf("%w; keeping the previous manifest", err))
		return false
	}
	sum := sha256.Sum256(data)
	stable := w.hasLast && sum == w.last
	w.last, w.hasLast = sum, true
	if w.hasAppl && sum == w.applied {
		w.report(nil)
		return false
	}
	if w.hasAppl && !stable {
		return false // a change: acted on at the next poll if it stays
	}

	// 3. parse; an invalid manifest is logged once per content.
	m, err := Parse(data, w.path)
	if err != nil {
		w.logOnce(sum, "invalid manifest, keeping the previous one: %v", err)
		w.report(fmt.Errorf("invalid manifest, keeping the previous one: %w", err))
		return false
	}

	// 4. apply synchronously.
	if err := w.apply(m); err != nil {
		w.logf("manifest %s: applying the new manifest failed (will retry): %v", w.path, err)
		w.report(fmt.Errorf("manifest %s: applying the new manifest failed (will retry): %w", w.path, err))
		return false
	}
	w.applied, w.hasAppl = sum, true
	w.seen, w.hasSeen = sum, true
	w.report(nil)
	return true
}

// report passes a poll's problem (nil: none) to OnProblem, if set.
func (w *Watcher) report(problem error) {
	if w.OnProblem != nil {
		w.OnProblem(problem)
	}
}

func (w *Watcher) logOnce(key [sha256.Size]byte, format string, args ...any) {
	if w.hasSeen && key == w.seen {
		return
	}
	w.seen, w.hasSeen = key, true
	w.logf(format, args...)
}
