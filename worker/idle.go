package worker

import (
	"sync"
	"time"
)

// idleTrimAfter is how long the worker runs no call before it gives the
// memory of the calls before back (idleTrim).
const idleTrimAfter = 5 * time.Second

// idleTrim gives the memory a burst of calls used back to the kernel once
// the worker has run no call for `after`: one garbage collection and the
// release of the pages it freed (debug.FreeOSMemory). Without it the Go
// runtime returns them only after its next collection, which an idle
// worker may not run for minutes (nothing allocates), so between bursts
// its RSS stayed at the last burst's peak: in a pod, memory its request
// did not need, and in TestSoak a growth that was no leak.
type idleTrim struct {
	after time.Duration
	trim  func()

	mu      sync.Mutex
	running int
	timer   *time.Timer
}

func newIdleTrim(after time.Duration, trim func()) *idleTrim {
	return &idleTrim{after: after, trim: trim}
}

// begin: a call runs; a pending trim waits for the next idle period.
func (t *idleTrim) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.running++
	if t.timer != nil {
		t.timer.Stop()
	}
}

// end: a call is over; the last one arms the trim.
func (t *idleTrim) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.running--
	if t.running > 0 {
		return
	}
	if t.timer == nil {
		t.timer = time.AfterFunc(t.after, t.fire)
	} else {
		t.timer.Reset(t.after)
	}
}

// fire trims if no call began since the timer was armed.
func (t *idleTrim) fire() {
	t.mu.Lock()
	idle := t.running == 0
	t.mu.Unlock()
	if idle {
		t.trim()
	}
}

// stop cancels a pending trim (shutdown).
func (t *idleTrim) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
	}
}
