package worker

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestIdleTrim: the memory is given back once the last call of a burst
// is over and no other began, not while a call runs.
func TestIdleTrim(t *testing.T) {
	var trims atomic.Int32
	done := make(chan struct{}, 4)
	it := newIdleTrim(time.Millisecond, func() { trims.Add(1); done <- struct{}{} })

	it.begin()
	it.begin()
	it.end() // one call still runs: nothing armed
	it.mu.Lock()
	armed := it.timer != nil
	it.mu.Unlock()
	if armed {
		t.Fatal("a trim was armed while a call runs")
	}
	it.end() // the burst is over
	select {
	case <-done:
	case <-time.After(time.Minute): // a failure guard, not a measure
		t.Fatal("no trim after the burst")
	}

	// A call that begins before the timer fires keeps it from trimming.
	long := newIdleTrim(time.Hour, func() { t.Error("trimmed while a call ran") })
	long.begin()
	long.end()
	long.begin()
	long.fire() // as if the timer had fired late, after the call began
	long.end()
	long.stop()
	if n := trims.Load(); n != 1 {
		t.Fatalf("%d trims, want 1", n)
	}
}
