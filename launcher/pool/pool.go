package pool

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Item is one thing made ahead of demand, used for one call (or, in a
// pool of shared items, Config.Uses calls).
type Item interface {
	// Ready is closed once the item can take its call at once; it never
	// closes for one that ends first.
	Ready() <-chan struct{}
	// Ended is closed once the item is gone.
	Ended() <-chan struct{}
	// EndReason says, once Ended, why the item ended on its own: Aged
	// or Calls at its own limits (no backoff); "" (Died) or any other
	// reason a death, retired under that reason with its set's backoff.
	EndReason() Reason
	// Kill ends the item without waiting; Ended follows.
	Kill()
	// Release frees what the caller holds for an item, once it has
	// ended. The pool calls it once for every item no claim took, and
	// for every shared item (whose uses in flight, if it ended on its
	// own, it must let finish); a claimer releases its own.
	Release()
}

// Reason says why an item left the pool unused (Metrics.Retired). A
// claimer's check may give reasons of its own.
type Reason string

const (
	Aged    Reason = "aged"         // older than MaxAge, or ended at its own idle limit
	Died    Reason = "died"         // ended before any claim (or cannot take one)
	Drained Reason = "drained"      // its set changed or went, or the pool stopped
	Calls   Reason = "calls"        // a shared item whose Config.Uses uses were taken
	Failed  Reason = "build_failed" // a build returned an error (SetState.Backoff only)
)

// The backoff of a set after a failed build or an idle item's death:
// BackoffFirst doubling per failure up to BackoffMax (unless Config
// says otherwise).
const (
	BackoffFirst = time.Second
	BackoffMax   = time.Minute
)

// Tick is how often the filler looks for aged items and ended backoffs
// without being woken.
const Tick = time.Second

// Backstop is how far beyond MaxAge an item's own idle limit should be,
// if it has one: the pool retires it first; the limit only matters when
// the pool cannot (a stuck filler, a lost process).
const Backstop = time.Minute

// Spec is what a set wants: items of Key (a claim must ask for the same
// key), Size of them, each counting Cost against the budget.
type Spec[K comparable] struct {
	Key  K
	Size int
	Cost int64
}

// Metrics receives every count of the pool, as it changes (under the
// pool's lock: idle and ready of a set are always consistent).
type Metrics interface {
	Hit(name string)                    // a claim took an item
	Miss(name string)                   // a claim of a set found none
	Built(name string, d time.Duration) // an item is ready, d after its build began
	BuildFailed(name string)            // a build returned an error
	Retired(name string, r Reason)      // an item left unused
	Idle(name string, idle, ready int)  // a set's idle items, and how many of them are ready
	Gone(name string)                   // a set is no more
	Held(cost int64)                    // the budget held by all sets
}

// Config is a pool's policy and the caller's part of it.
type Config[K comparable, I Item] struct {
	// Build makes one item of the set name (spec is its set's); it
	// returns once the item exists, not once it is ready. ctx is the
	// pool's: Wait cancels it.
	Build func(ctx context.Context, name string, spec Spec[K]) (I, error)
	// MaxAge: an idle item older than this is retired Aged (<= 0: never).
	MaxAge time.Duration
	// Budget bounds the cost of the items built and idle (<= 0: none).
	Budget int64
	// ReadyOnly: a claim takes only items already ready.
	ReadyOnly bool
	// Uses > 0 makes the items shared: a claim takes one use of an item,
	// which stays in its set for the next claims until its Uses-th use
	// is taken (then it is retired Calls). A shared item retired while
	// uses are in flight is killed once the last is Done (it drains).
	// 0: a claim takes the item.
	Uses int
	// BackoffFirst and BackoffMax replace the package's (0: theirs).
	BackoffFirst, BackoffMax time.Duration
	// Metrics gets every count (nil: none kept).
	Metrics Metrics
	// Failed and Died, when set, are told of a failed build and of an
	// idle item that died, with the set's backoff (for the caller's
	// log). They run without the pool's lock.
	Failed func(name string, spec Spec[K], err error, retryIn time.Duration)
	Died   func(name string, item I, retryIn time.Duration)
}

type state int

const (
	idle    state = iota // in its set's idle list
	claimed              // a claimer owns it (and releases it)
	retired              // killed unused; the pool releases it
)

// entry is one item the pool built.
type entry[K comparable, I Item] struct {
	item  I
	set   *set[K, I]
	built time.Time // when its build began: its age counts from there
	state state     // guarded by Pool.mu
	// A shared item's uses taken, and those in flight (not yet Done);
	// guarded by Pool.mu.
	uses, inflight int
}

// set is the pool of one name.
type set[K comparable, I Item] struct {
	name     string
	spec     Spec[K]
	idle     []*entry[K, I] // oldest first
	building int
	serving  int // claimed items whose claimer has not said Done
	failures int // since an item of the set was last ready
	retryAt  time.Time
	why      Reason // of the last failure
}

// Pool is a keyed set of items made ahead of demand (doc.go has the
// policy).
type Pool[K comparable, I Item] struct {
	cfg    Config[K, I]
	ctx    context.Context // every Build's; ends at Wait
	cancel context.CancelFunc

	mu       sync.Mutex
	sets     map[string]*set[K, I]
	held     int64
	started  bool
	stopped  bool
	kick     chan struct{}
	quit     chan struct{}
	loopDone chan struct{}
	wg       sync.WaitGroup // one per item until it is gone
}

// New makes a pool with no sets; Configure gives it some, Start fills
// them.
func New[K comparable, I Item](parent context.Context, cfg Config[K, I]) *Pool[K, I] {
	if cfg.Metrics == nil {
		cfg.Metrics = noMetrics{}
	}
	if cfg.BackoffFirst <= 0 {
		cfg.BackoffFirst = BackoffFirst
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = BackoffMax
	}
	ctx, cancel := context.WithCancel(parent)
	return &Pool[K, I]{cfg: cfg, ctx: ctx, cancel: cancel, sets: map[string]*set[K, I]{},
		kick: make(chan struct{}, 1), quit: make(chan struct{}), loopDone: make(chan struct{})}
}

// Start runs the filler.
func (p *Pool[K, I]) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.stopped {
		return
	}
	p.started = true
	go p.loop()
}

func (p *Pool[K, I]) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Configure makes the sets follow want: a set whose spec changed or that
// is not wanted has its idle items retired Drained; new and changed ones
// are filled in the background.
func (p *Pool[K, I]) Configure(want map[string]Spec[K]) {
	p.mu.Lock()
	var kill []*entry[K, I]
	for name, old := range p.sets {
		if spec, ok := want[name]; ok && spec == old.spec {
			continue
		}
		kill = append(kill, p.retireAllLocked(old, Drained)...)
		delete(p.sets, name)
		p.cfg.Metrics.Gone(name)
	}
	if !p.stopped {
		for name, spec := range want {
			if p.sets[name] == nil && spec.Size > 0 {
				s := &set[K, I]{name: name, spec: spec}
				p.sets[name] = s
				p.gaugeLocked(s)
			}
		}
	}
	p.mu.Unlock()
	for _, e := range kill {
		e.item.Kill()
	}
	p.wake()
}

// Claimed is an item a claim took: the claimer's until it says Done.
type Claimed[K comparable, I Item] struct {
	Item I
	p    *Pool[K, I]
	e    *entry[K, I]
	once sync.Once
}

// Done says the claimed item's call is over and the item gone (released
// by the claimer): its set may replace it now. For a shared item: the
// use is over; a retired item whose last use it was is killed.
func (c *Claimed[K, I]) Done() {
	c.once.Do(func() {
		c.p.mu.Lock()
		e := c.e
		if c.p.cfg.Uses <= 0 {
			e.set.serving--
		} else {
			e.inflight--
		}
		drained := c.p.cfg.Uses > 0 && e.state == retired && e.inflight == 0
		c.p.mu.Unlock()
		if drained {
			e.item.Kill()
		}
		c.p.wake()
	})
}

// Claim takes the oldest idle item of name's set if the set's key is key
// and the item is alive, younger than MaxAge and accepted: accept (nil:
// every one) is the claimer's own check, run under the pool's lock; it
// returns "" to take the item, else the reason to retire it. It returns
// nil when no item fits (a miss, when name has a set). Of a shared item
// it takes one use: the item stays idle for the next claims.
func (p *Pool[K, I]) Claim(name string, key K, accept func(I) Reason) *Claimed[K, I] {
	now := time.Now()
	p.mu.Lock()
	s := p.sets[name]
	if s == nil {
		p.mu.Unlock()
		return nil // no pool for this name: not a miss
	}
	var got *entry[K, I]
	var kill, deaths []*entry[K, I]
	if s.spec.Key == key {
		var keep []*entry[K, I]
		for i, e := range s.idle {
			if got != nil {
				keep = append(keep, s.idle[i:]...)
				break
			}
			ended := closed(e.item.Ended())
			if p.cfg.ReadyOnly && !ended && !closed(e.item.Ready()) {
				keep = append(keep, e)
				continue
			}
			if ended {
				if p.endedLocked(e) {
					deaths = append(deaths, e)
				}
				continue
			}
			var reason Reason
			switch {
			case p.cfg.MaxAge > 0 && now.Sub(e.built) > p.cfg.MaxAge:
				reason = Aged
			case accept != nil:
				reason = accept(e.item)
			}
			if reason != "" {
				kill = p.retireLocked(e, reason, kill)
				continue
			}
			got = e
			if p.cfg.Uses <= 0 {
				e.state = claimed
				p.held -= s.spec.Cost
				s.serving++
				continue
			}
			e.uses++
			e.inflight++
			if e.uses >= p.cfg.Uses {
				kill = p.retireLocked(e, Calls, kill) // killed once this use is Done
				continue
			}
			keep = append(keep, e)
		}
		s.idle = keep
		p.gaugeLocked(s)
		p.cfg.Metrics.Held(p.held)
	}
	if got == nil {
		p.cfg.Metrics.Miss(name)
	} else {
		p.cfg.Metrics.Hit(name)
	}
	retryIn := time.Until(s.retryAt)
	p.mu.Unlock()
	for _, e := range kill {
		e.item.Kill()
	}
	if p.cfg.Died != nil {
		for _, e := range deaths {
			p.cfg.Died(name, e.item, retryIn)
		}
	}
	p.wake()
	if got == nil {
		return nil
	}
	return &Claimed[K, I]{Item: got.item, p: p, e: got}
}

// loop fills and retires aged items until Stop.
func (p *Pool[K, I]) loop() {
	defer close(p.loopDone)
	tick := time.NewTicker(Tick)
	defer tick.Stop()
	for {
		p.retireAged()
		p.Fill()
		select {
		case <-p.quit:
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// retireAged retires the idle items older than MaxAge (Fill replaces
// them).
func (p *Pool[K, I]) retireAged() {
	if p.cfg.MaxAge <= 0 {
		return
	}
	now := time.Now()
	var kill []*entry[K, I]
	p.mu.Lock()
	for _, s := range p.sets {
		n := len(kill)
		s.idle = slices.DeleteFunc(s.idle, func(e *entry[K, I]) bool {
			if now.Sub(e.built) <= p.cfg.MaxAge {
				return false
			}
			kill = p.retireLocked(e, Aged, kill)
			return true
		})
		if len(kill) != n {
			p.gaugeLocked(s)
		}
	}
	p.mu.Unlock()
	for _, e := range kill {
		e.item.Kill()
	}
}

// Fill builds items, one at a time, while a set wants one, its backoff
// is over and the budget has room. The filler runs it; so may a test.
func (p *Pool[K, I]) Fill() {
	for {
		p.mu.Lock()
		s := p.nextLocked(time.Now())
		if s == nil {
			p.mu.Unlock()
			return
		}
		s.building++
		p.held += s.spec.Cost
		p.cfg.Metrics.Held(p.held)
		p.mu.Unlock()

		t0 := time.Now()
		item, err := p.cfg.Build(p.ctx, s.name, s.spec)

		p.mu.Lock()
		s.building--
		if err != nil {
			p.held -= s.spec.Cost
			p.cfg.Metrics.Held(p.held)
			p.cfg.Metrics.BuildFailed(s.name)
			p.backoffLocked(s, Failed)
			retryIn := time.Until(s.retryAt)
			p.mu.Unlock()
			if p.cfg.Failed != nil {
				p.cfg.Failed(s.name, s.spec, err, retryIn)
			}
			continue
		}
		e := &entry[K, I]{item: item, set: s, built: t0}
		if p.stopped || p.sets[s.name] != s {
			p.retireLocked(e, Drained, nil)
		} else {
			s.idle = append(s.idle, e)
			p.gaugeLocked(s)
		}
		gone := e.state == retired
		p.wg.Add(1)
		p.mu.Unlock()
		if gone {
			item.Kill()
		}
		go p.watch(e)
	}
}

// nextLocked is the first set (by name) that wants an item now and fits
// the budget.
func (p *Pool[K, I]) nextLocked(now time.Time) *set[K, I] {
	if p.stopped {
		return nil
	}
	names := make([]string, 0, len(p.sets))
	for name := range p.sets {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		s := p.sets[name]
		if len(s.idle)+s.building+s.serving >= s.spec.Size || now.Before(s.retryAt) {
			continue
		}
		if p.cfg.Budget > 0 && p.held+s.spec.Cost > p.cfg.Budget {
			continue
		}
		return s
	}
	return nil
}

func (p *Pool[K, I]) backoffLocked(s *set[K, I], why Reason) {
	s.failures++
	s.why = why
	d := p.cfg.BackoffFirst << min(s.failures-1, 10)
	s.retryAt = time.Now().Add(min(d, p.cfg.BackoffMax))
}

// watch follows one item until it is gone: its readiness (the build
// time; a ready item ends its set's backoff), then its end: an idle item
// that ends leaves the pool, under its EndReason (a death: with the
// backoff). A claimed item is its claimer's to release.
func (p *Pool[K, I]) watch(e *entry[K, I]) {
	defer p.wg.Done()
	s := e.set
	select {
	case <-e.item.Ready():
		p.mu.Lock()
		p.cfg.Metrics.Built(s.name, time.Since(e.built))
		s.failures = 0
		if p.sets[s.name] == s {
			p.gaugeLocked(s)
		}
		p.mu.Unlock()
	case <-e.item.Ended():
	}
	<-e.item.Ended()
	p.mu.Lock()
	st := e.state
	died := false
	if st == idle {
		s.idle = slices.DeleteFunc(s.idle, func(x *entry[K, I]) bool { return x == e })
		died = p.endedLocked(e)
		p.gaugeLocked(s)
	}
	retryIn := time.Until(s.retryAt)
	p.mu.Unlock()
	if died && p.cfg.Died != nil {
		p.cfg.Died(s.name, e.item, retryIn)
	}
	if st != claimed {
		e.item.Release()
		p.wake()
	}
}

// endedLocked retires e, an idle item that ended (out of its idle list
// now), under its EndReason; a death starts its set's backoff (true).
func (p *Pool[K, I]) endedLocked(e *entry[K, I]) bool {
	reason := e.item.EndReason()
	died := reason != Aged && reason != Calls
	if died {
		if reason == "" {
			reason = Died
		}
		p.backoffLocked(e.set, reason)
	}
	p.retireLocked(e, reason, nil)
	return died
}

// gaugeLocked reports s's idle and ready items.
func (p *Pool[K, I]) gaugeLocked(s *set[K, I]) {
	ready := 0
	for _, e := range s.idle {
		if closed(e.item.Ready()) {
			ready++
		}
	}
	p.cfg.Metrics.Idle(s.name, len(s.idle), ready)
}

// retireAllLocked retires every idle item of s and returns those to be
// killed without the lock.
func (p *Pool[K, I]) retireAllLocked(s *set[K, I], r Reason) []*entry[K, I] {
	var kill []*entry[K, I]
	for _, e := range s.idle {
		kill = p.retireLocked(e, r, kill)
	}
	s.idle = nil
	return kill
}

// retireLocked marks e (already out of its idle list, or leaving it)
// retired and returns kill with e appended if it is to be killed now: a
// shared item with uses in flight is killed at the last one's Done.
func (p *Pool[K, I]) retireLocked(e *entry[K, I], r Reason, kill []*entry[K, I]) []*entry[K, I] {
	e.state = retired
	p.held -= e.set.spec.Cost
	p.cfg.Metrics.Retired(e.set.name, r)
	p.cfg.Metrics.Held(p.held)
	if e.inflight > 0 {
		return kill
	}
	return append(kill, e)
}

// Stop ends building and retires every idle item Drained; Wait then
// returns once every item is gone and released. Claimed items stay their
// claimers': Stop does not end them (a call runs on through a shutdown's
// grace; test/fleet's docker stop), nor the uses in flight of a shared
// item (it drains).
func (p *Pool[K, I]) Stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	started := p.started
	var kill []*entry[K, I]
	for name, s := range p.sets {
		kill = append(kill, p.retireAllLocked(s, Drained)...)
		p.cfg.Metrics.Gone(name)
	}
	p.mu.Unlock()
	close(p.quit)
	if started {
		<-p.loopDone // an item being built is retired by Fill
	}
	for _, e := range kill {
		e.item.Kill()
	}
}

// Wait cancels the pool's context (every Build's) and waits for every
// item to be gone. It runs after Stop, once the claimers are done: the
// cancellation then only stops what is left.
func (p *Pool[K, I]) Wait() {
	p.cancel()
	p.wg.Wait()
}

// SetState is what a set holds: items idle, being built and serving;
// and, while its backoff runs, the reason of the failure that started
// it (Failed for a build, else an item's death).
type SetState struct {
	Idle, Building, Serving int
	Backoff                 Reason
}

// State is name's set's (false: no set).
func (p *Pool[K, I]) State(name string) (SetState, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.sets[name]
	if s == nil {
		return SetState{}, false
	}
	st := SetState{Idle: len(s.idle), Building: s.building, Serving: s.serving}
	if time.Now().Before(s.retryAt) {
		st.Backoff = s.why
	}
	return st, true
}

// Stopped reports whether Stop has run.
func (p *Pool[K, I]) Stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

type noMetrics struct{}

func (noMetrics) Hit(string)                  {}
func (noMetrics) Miss(string)                 {}
func (noMetrics) Built(string, time.Duration) {}
func (noMetrics) BuildFailed(string)          {}
func (noMetrics) Retired(string, Reason)      {}
func (noMetrics) Idle(string, int, int)       {}
func (noMetrics) Gone(string)                 {}
func (noMetrics) Held(int64)                  {}
