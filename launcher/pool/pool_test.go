package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The policy's tests, with items that are nothing but their state: the
// worker's tests (worker/pool_test.go) and str serve's
// (test/integration/serve_test.go) run it with real ones.

type item struct {
	id       int
	ready    chan struct{}
	ended    chan struct{}
	endOnce  sync.Once
	expired  atomic.Bool
	killed   atomic.Bool
	released atomic.Int32
}

func (i *item) Ready() <-chan struct{} { return i.ready }
func (i *item) Ended() <-chan struct{} { return i.ended }
func (i *item) EndReason() Reason {
	if i.expired.Load() {
		return Aged
	}
	return ""
}
func (i *item) Kill()     { i.killed.Store(true); i.end(false) }
func (i *item) Release()  { i.released.Add(1) }
func (i *item) setReady() { close(i.ready) }
func (i *item) end(expired bool) {
	i.endOnce.Do(func() { i.expired.Store(expired); close(i.ended) })
}

// counts is a Metrics that remembers.
type counts struct {
	mu                            sync.Mutex
	hits, misses, built, failures map[string]int
	retired                       map[Reason]int
	idle, ready                   map[string]int
	gone                          []string
	held                          int64
}

func newCounts() *counts {
	return &counts{hits: map[string]int{}, misses: map[string]int{}, built: map[string]int{}, failures: map[string]int{},
		retired: map[Reason]int{}, idle: map[string]int{}, ready: map[string]int{}}
}

func (c *counts) Hit(n string)                    { c.mu.Lock(); c.hits[n]++; c.mu.Unlock() }
func (c *counts) Miss(n string)                   { c.mu.Lock(); c.misses[n]++; c.mu.Unlock() }
func (c *counts) Built(n string, _ time.Duration) { c.mu.Lock(); c.built[n]++; c.mu.Unlock() }
func (c *counts) BuildFailed(n string)            { c.mu.Lock(); c.failures[n]++; c.mu.Unlock() }
func (c *counts) Retired(_ string, r Reason)      { c.mu.Lock(); c.retired[r]++; c.mu.Unlock() }
func (c *counts) Idle(n string, idle, ready int) {
	c.mu.Lock()
	c.idle[n], c.ready[n] = idle, ready
	c.mu.Unlock()
}
func (c *counts) Gone(n string)        { c.mu.Lock(); c.gone = append(c.gone, n); c.mu.Unlock() }
func (c *counts) Held(h int64)         { c.mu.Lock(); c.held = h; c.mu.Unlock() }
func (c *counts) read(f func(*counts)) { c.mu.Lock(); defer c.mu.Unlock(); f(c) }

// harness is a pool of items built by a counter; fail makes builds fail.
type harness struct {
	t     *testing.T
	p     *Pool[string, *item]
	m     *counts
	mu    sync.Mutex
	made  []*item
	fail  bool
	died  []*item
	fails int
}

func newHarness(t *testing.T, mod func(*Config[string, *item])) *harness {
	h := &harness{t: t, m: newCounts()}
	cfg := Config[string, *item]{
		Build: func(ctx context.Context, name string, spec Spec[string]) (*item, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.fail {
				return nil, errors.New("cannot")
			}
			it := &item{id: len(h.made), ready: make(chan struct{}), ended: make(chan struct{})}
			h.made = append(h.made, it)
			return it, nil
		},
		Metrics: h.m,
		Failed:  func(string, Spec[string], error, time.Duration) { h.mu.Lock(); h.fails++; h.mu.Unlock() },
		Died:    func(_ string, it *item, _ time.Duration) { h.mu.Lock(); h.died = append(h.died, it); h.mu.Unlock() },
	}
	if mod != nil {
		mod(&cfg)
	}
	h.p = New(context.Background(), cfg)
	t.Cleanup(func() {
		h.p.Stop()
		h.mu.Lock()
		for _, it := range h.made {
			it.end(false) // claimed ones, which are the test's
		}
		h.mu.Unlock()
		h.p.Wait()
	})
	return h
}

func (h *harness) items() []*item {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*item(nil), h.made...)
}

func (h *harness) state(name string) SetState {
	st, _ := h.p.State(name)
	return st
}

// waitFor polls cond (what the pool's watchers do runs in their own
// goroutines).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestSizeCountsServing: a set holds Size items, idle, being built or
// serving; a claim takes the oldest and its replacement waits for Done.
// Hits and misses are counted for a set's name only.
func TestSizeCountsServing(t *testing.T) {
	h := newHarness(t, nil)
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 2}})
	h.p.Fill()
	if st := h.state("a"); st.Idle != 2 || len(h.items()) != 2 {
		t.Fatalf("after Fill: %+v, %d built", st, len(h.items()))
	}
	c := h.p.Claim("a", "k", nil)
	if c == nil || c.Item.id != 0 {
		t.Fatalf("claimed %v, want the oldest (0)", c)
	}
	h.p.Fill()
	if st := h.state("a"); st.Idle != 1 || st.Serving != 1 || len(h.items()) != 2 {
		t.Errorf("while serving: %+v, %d built; want no replacement yet", st, len(h.items()))
	}
	c.Item.end(false)
	c.Done()
	c.Done() // once only
	h.p.Fill()
	if st := h.state("a"); st.Idle != 2 || st.Serving != 0 || len(h.items()) != 3 {
		t.Errorf("after Done: %+v, %d built", st, len(h.items()))
	}
	if h.p.Claim("a", "other key", nil) != nil || h.p.Claim("none", "k", nil) != nil {
		t.Error("a claim of another key or name took an item")
	}
	h.m.read(func(m *counts) {
		if m.hits["a"] != 1 || m.misses["a"] != 1 || m.misses["none"] != 0 {
			t.Errorf("hits %v misses %v", m.hits, m.misses)
		}
	})
	if c.Item.released.Load() != 0 {
		t.Error("the pool released a claimed item")
	}
}

// TestClaimRetires: a claim retires, and kills, what it cannot use
// (ended: died; refused by the claimer: its reason; older than MaxAge:
// aged) and tries the next.
func TestClaimRetires(t *testing.T) {
	h := newHarness(t, nil)
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 3}})
	h.p.Fill()
	its := h.items()
	its[0].end(false)
	c := h.p.Claim("a", "k", func(it *item) Reason {
		if it.id == 1 {
			return "code_changed"
		}
		return ""
	})
	if c == nil || c.Item.id != 2 {
		t.Fatalf("claimed %v, want item 2", c)
	}
	if !its[1].killed.Load() {
		t.Error("the refused item was not killed")
	}
	h.m.read(func(m *counts) {
		if m.retired[Died] != 1 || m.retired["code_changed"] != 1 {
			t.Errorf("retired %v", m.retired)
		}
	})
	waitFor(t, "the retired items released", func() bool { return its[0].released.Load() == 1 && its[1].released.Load() == 1 })

	aged := newHarness(t, func(c *Config[string, *item]) { c.MaxAge = time.Nanosecond })
	aged.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	aged.p.Fill()
	time.Sleep(time.Millisecond) // older than MaxAge
	if aged.p.Claim("a", "k", nil) != nil {
		t.Error("an item older than MaxAge was claimed")
	}
	aged.m.read(func(m *counts) {
		if m.retired[Aged] != 1 || m.misses["a"] != 1 {
			t.Errorf("retired %v misses %v", m.retired, m.misses)
		}
	})
}

// TestAgedRetired: the filler's pass retires idle items older than
// MaxAge and replaces them.
func TestAgedRetired(t *testing.T) {
	h := newHarness(t, func(c *Config[string, *item]) { c.MaxAge = time.Nanosecond })
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	h.p.Fill()
	time.Sleep(time.Millisecond)
	h.p.retireAged()
	if !h.items()[0].killed.Load() {
		t.Fatal("an aged item was not killed")
	}
	h.p.Fill()
	if n := len(h.items()); n != 2 {
		t.Errorf("%d built, want the replacement", n)
	}
}

// TestDeathBackoff: an idle item that dies is retired died, reported, and
// starts its set's backoff; one ended at its own idle limit is aged, with
// no backoff; a failed build backs off too; a ready item ends the
// backoff.
func TestDeathBackoff(t *testing.T) {
	h := newHarness(t, nil)
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	h.p.Fill()
	first := h.items()[0]
	first.end(true)
	waitFor(t, "the expired item retired", func() bool { return h.state("a").Idle == 0 && first.released.Load() == 1 })
	if f := h.p.sets["a"].failures; f != 0 {
		t.Errorf("an item ended at its idle limit: %d failures", f)
	}
	h.p.Fill()
	second := h.items()[1]
	t0 := time.Now()
	second.end(false)
	waitFor(t, "the dead item retired", func() bool { return h.state("a").Idle == 0 && second.released.Load() == 1 })
	h.mu.Lock()
	died := len(h.died)
	h.mu.Unlock()
	h.p.mu.Lock()
	failures, retryAt := h.p.sets["a"].failures, h.p.sets["a"].retryAt
	h.p.mu.Unlock()
	if died != 1 || failures != 1 || retryAt.Sub(t0) < BackoffFirst {
		t.Errorf("after a death: %d reported, %d failures, retry at %v", died, failures, retryAt)
	}
	h.m.read(func(m *counts) {
		if m.retired[Aged] != 1 || m.retired[Died] != 1 {
			t.Errorf("retired %v", m.retired)
		}
	})

	// A failed build: counted, reported, backed off (doubling).
	h.p.mu.Lock()
	h.p.sets["a"].retryAt = time.Time{}
	h.p.mu.Unlock()
	h.mu.Lock()
	h.fail = true
	h.mu.Unlock()
	t0 = time.Now()
	h.p.Fill()
	h.p.mu.Lock()
	failures, retryAt = h.p.sets["a"].failures, h.p.sets["a"].retryAt
	h.p.mu.Unlock()
	if failures < 2 || retryAt.Sub(t0) < 2*BackoffFirst {
		t.Errorf("after a failed build: %d failures, retry %v after it; want 2 and %v", failures, retryAt.Sub(t0), 2*BackoffFirst)
	}
	h.m.read(func(m *counts) {
		if m.failures["a"] < 1 {
			t.Errorf("build failures %v", m.failures)
		}
	})

	// A ready item resets the backoff.
	h.p.mu.Lock()
	h.p.sets["a"].retryAt = time.Time{}
	h.p.mu.Unlock()
	h.mu.Lock()
	h.fail = false
	h.mu.Unlock()
	h.p.Fill()
	h.items()[2].setReady()
	waitFor(t, "the backoff reset", func() bool {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		return h.p.sets["a"].failures == 0
	})
	h.m.read(func(m *counts) {
		if m.built["a"] != 1 || m.ready["a"] != 1 {
			t.Errorf("built %v ready %v", m.built, m.ready)
		}
	})
}

// TestBackoffDoubles: BackoffFirst doubling per failure, at most
// BackoffMax.
func TestBackoffDoubles(t *testing.T) {
	var got []string
	s := &set[string, *item]{}
	p := New(context.Background(), Config[string, *item]{})
	for range 9 {
		t0 := time.Now()
		p.backoffLocked(s, Died)
		got = append(got, s.retryAt.Sub(t0).Round(time.Second).String())
	}
	want := "[1s 2s 4s 8s 16s 32s 1m0s 1m0s 1m0s]"
	if fmt.Sprint(got) != want {
		t.Errorf("backoffs %v, want %s", got, want)
	}
}

// TestBudget: items count their cost from their build until claimed or
// gone; sets fill by name within the budget.
func TestBudget(t *testing.T) {
	h := newHarness(t, func(c *Config[string, *item]) { c.Budget = 3 })
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 2, Cost: 1}, "b": {Key: "k", Size: 2, Cost: 1}})
	h.p.Fill()
	if a, b := h.state("a"), h.state("b"); a.Idle != 2 || b.Idle != 1 {
		t.Fatalf("a %+v b %+v, want 2 and 1 within the budget", a, b)
	}
	c := h.p.Claim("a", "k", nil)
	h.p.Fill()
	if b := h.state("b"); b.Idle != 2 {
		t.Errorf("b %+v: the claimed item's cost was not freed", b)
	}
	h.m.read(func(m *counts) {
		if m.held != 3 {
			t.Errorf("held %d", m.held)
		}
	})
	c.Item.end(false)
	c.Done()
}

// TestReadyOnly: a claim of a ReadyOnly pool leaves items not yet ready.
func TestReadyOnly(t *testing.T) {
	h := newHarness(t, func(c *Config[string, *item]) { c.ReadyOnly = true })
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	h.p.Fill()
	if h.p.Claim("a", "k", nil) != nil || h.state("a").Idle != 1 {
		t.Fatal("an item not ready was claimed or dropped")
	}
	h.items()[0].setReady()
	c := h.p.Claim("a", "k", nil)
	if c == nil {
		t.Fatal("the ready item was not claimed")
	}
	c.Item.end(false)
	c.Done()
}

// TestConfigureAndStop: a set whose spec changes or goes is drained
// (its idle items killed and released); Stop drains the rest and leaves
// claimed items to their claimers; Wait returns once every item is gone.
func TestConfigureAndStop(t *testing.T) {
	h := newHarness(t, nil)
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}, "b": {Key: "k", Size: 1}})
	h.p.Fill()
	old := h.items()
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k2", Size: 2}})
	waitFor(t, "drained items released", func() bool { return old[0].released.Load() == 1 && old[1].released.Load() == 1 })
	if _, ok := h.p.State("b"); ok {
		t.Error("b still has a set")
	}
	h.p.Fill()
	c := h.p.Claim("a", "k2", nil)
	if c == nil {
		t.Fatal("the new set's item was not claimed")
	}
	h.p.Stop()
	if !h.p.Stopped() || c.Item.killed.Load() {
		t.Fatalf("stopped %v; claimed item killed %v", h.p.Stopped(), c.Item.killed.Load())
	}
	idle := h.items()[3]
	if !idle.killed.Load() {
		t.Error("Stop did not kill an idle item")
	}
	waited := make(chan struct{})
	go func() { h.p.Wait(); close(waited) }()
	c.Item.end(false)
	<-waited
	if idle.released.Load() != 1 || c.Item.released.Load() != 0 {
		t.Errorf("released: idle %d, claimed %d", idle.released.Load(), c.Item.released.Load())
	}
	h.m.read(func(m *counts) {
		if m.retired[Drained] != 3 || len(m.gone) < 2 {
			t.Errorf("retired %v gone %v", m.retired, m.gone)
		}
	})
}

// TestSharedUses: with Config.Uses, a claim takes one use and the item
// stays in its set (no replacement); the Uses-th use retires it Calls,
// and it is killed (drained) only once that use is Done, not at the
// claim; its replacement is built at once.
func TestSharedUses(t *testing.T) {
	h := newHarness(t, func(c *Config[string, *item]) { c.Uses = 3 })
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	h.p.Fill()
	var cs []*Claimed[string, *item]
	for i := range 3 {
		c := h.p.Claim("a", "k", nil)
		if c == nil || c.Item.id != 0 {
			t.Fatalf("claim %d took %v, want item 0", i, c)
		}
		cs = append(cs, c)
	}
	it := h.items()[0]
	if st := h.state("a"); st.Idle != 0 || st.Serving != 0 {
		t.Errorf("after its last use: %+v, want it out of the set", st)
	}
	h.p.Fill()
	if len(h.items()) != 2 {
		t.Errorf("%d built, want the replacement at once", len(h.items()))
	}
	cs[0].Done()
	cs[2].Done()
	if it.killed.Load() {
		t.Fatal("killed while a use is in flight")
	}
	cs[1].Done()
	if !it.killed.Load() {
		t.Error("not killed once its last use was Done")
	}
	waitFor(t, "the pool released it", func() bool { return it.released.Load() == 1 })
	h.m.read(func(m *counts) {
		if m.retired[Calls] != 1 || m.hits["a"] != 3 {
			t.Errorf("retired %v hits %v", m.retired, m.hits)
		}
	})
}

// TestSharedDrains: a shared item retired while a use is in flight (its
// set changed, the pool stopped) is killed once the use is Done.
func TestSharedDrains(t *testing.T) {
	h := newHarness(t, func(c *Config[string, *item]) { c.Uses = 10 })
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	h.p.Fill()
	c := h.p.Claim("a", "k", nil)
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k2", Size: 1}})
	if c.Item.killed.Load() {
		t.Fatal("killed at the reconfiguration while its use runs")
	}
	h.m.read(func(m *counts) {
		if m.retired[Drained] != 1 {
			t.Errorf("retired %v", m.retired)
		}
	})
	c.Done()
	if !c.Item.killed.Load() {
		t.Error("not killed once its use was Done")
	}
}

// TestSetStateBackoff: a set in its backoff says what started it: an
// idle item's death under the item's own reason.
func TestSetStateBackoff(t *testing.T) {
	h := newHarness(t, func(c *Config[string, *item]) { c.BackoffFirst, c.BackoffMax = time.Hour, time.Hour })
	h.p.Configure(map[string]Spec[string]{"a": {Key: "k", Size: 1}})
	h.p.Fill()
	h.items()[0].end(false)
	waitFor(t, "the death", func() bool { return h.state("a").Backoff == Died })
	h.p.Fill()
	if len(h.items()) != 1 {
		t.Errorf("%d built during the backoff, want 1", len(h.items()))
	}
}
