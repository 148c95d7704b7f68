package worker

import (
	"fmt"
	"sync"
)

// fairQueue holds the accepted calls until an executor takes them, fairly
// across requesters (task.who.key(), identity.go) and across the agent
// keys that verified them (task.who.Key: a key of STR_SIGNING_KEYS):
//
//   - admission: the global caps (SANDBOX_MAX_CONCURRENT running plus
//     SANDBOX_MAX_QUEUED waiting), each requester's own
//     (STR_USER_MAX_RUNNING running plus STR_USER_MAX_QUEUED waiting) and,
//     for a requester verified by an agent key, that key's over all the
//     users it claims (STR_KEY_MAX_RUNNING plus STR_KEY_MAX_QUEUED); a
//     call over any is refused (RESOURCE_EXHAUSTED), over a requester's
//     or a key's caps for that requester or key only. So a key allowed
//     many users (users: ["mallory*"]) cannot take every slot and every
//     place by spreading its calls over made-up users;
//   - order: round-robin over shares with calls waiting, where a share is
//     an agent key (all its users together) or a requester verified by no
//     key; within a key's share, round-robin over its users. A share at
//     its running cap (a user at STR_USER_MAX_RUNNING, a key at
//     STR_KEY_MAX_RUNNING) is skipped. So neither a requester with many
//     calls waiting nor a key with many users delays another share's
//     first call by more than one call per share.
//
// A call is waiting from admit until take (or remove, for one a cancel
// answers while it waits) and running from take until done.
type fairQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool

	maxRunning, maxWaiting int // global
	userCaps, keyCaps      shareCaps

	running, waiting int
	users            map[string]*fairUser  // by requester key
	shares           map[string]*fairShare // by shareOf
	ring             roundRobin            // shares with calls waiting
}

// shareCaps are the running and waiting caps of one requester or key.
type shareCaps struct{ running, waiting int }

// fairUser is one requester's calls.
type fairUser struct {
	queue   []*queuedTask
	running int
}

// fairShare is what the outer round-robin turns over: one agent key's
// requesters, or one requester verified by no key (then its counts are
// its fairUser's, and only the user caps apply).
type fairShare struct {
	keyID            string     // the agent key; "" for a requester's own share
	ring             roundRobin // its requesters with calls waiting
	running, waiting int
}

// shareOf is the share a requester's calls count in.
func shareOf(who requester) string {
	if who.Key != "" {
		return "agent-key:" + who.Key
	}
	return "requester:" + who.key()
}

func newFairQueue(maxRunning, maxWaiting int, user, key shareCaps) *fairQueue {
	q := &fairQueue{maxRunning: maxRunning, maxWaiting: maxWaiting, userCaps: user, keyCaps: key,
		users: map[string]*fairUser{}, shares: map[string]*fairShare{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// admitError is why admit refused a call; perRequester is set when the
// requester's own caps, or its agent key's, refused it (the global ones
// would have taken it).
type admitError struct {
	msg          string
	perRequester bool
}

// admit adds t as waiting, or says why not.
func (q *fairQueue) admit(t *queuedTask) *admitError {
	q.mu.Lock()
	defer q.mu.Unlock()
	key, shareKey := t.who.key(), shareOf(t.who)
	u, sh := q.users[key], q.shares[shareKey]
	// 1. the worker's caps.
	if q.closed {
		return &admitError{msg: "worker is shutting down"}
	}
	if q.running+q.waiting >= q.maxRunning+q.maxWaiting {
		return &admitError{msg: fmt.Sprintf("worker queue is full (%d running, %d waiting)", q.maxRunning, q.maxWaiting)}
	}
	// 2. the requester's.
	if u != nil && u.running+len(u.queue) >= q.userCaps.running+q.userCaps.waiting {
		return &admitError{perRequester: true, msg: fmt.Sprintf(
			"user %q has %d calls running and %d waiting on this worker, the most one requester may have: %d running (STR_USER_MAX_RUNNING) and %d waiting (STR_USER_MAX_QUEUED)",
			t.who.UserID, u.running, len(u.queue), q.userCaps.running, q.userCaps.waiting)}
	}
	// 3. its agent key's, over all the users the key claims.
	if sh != nil && sh.keyID != "" && sh.running+sh.waiting >= q.keyCaps.running+q.keyCaps.waiting {
		return &admitError{perRequester: true, msg: fmt.Sprintf(
			"agent key %q has %d calls running and %d waiting on this worker (over all its users), the most one key may have: %d running (STR_KEY_MAX_RUNNING) and %d waiting (STR_KEY_MAX_QUEUED)",
			sh.keyID, sh.running, sh.waiting, q.keyCaps.running, q.keyCaps.waiting)}
	}
	// 4. in.
	if u == nil {
		u = &fairUser{}
		q.users[key] = u
	}
	if sh == nil {
		sh = &fairShare{keyID: t.who.Key}
		q.shares[shareKey] = sh
	}
	if len(u.queue) == 0 {
		sh.ring.add(key)
	}
	if sh.waiting == 0 {
		q.ring.add(shareKey)
	}
	u.queue = append(u.queue, t)
	sh.waiting++
	q.waiting++
	q.cond.Broadcast()
	return nil
}

// take waits for a call an executor may run now and marks it running; nil
// once the queue is closed.
func (q *fairQueue) take() *queuedTask {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.closed {
			return nil
		}
		if t := q.pickLocked(); t != nil {
			return t
		}
		q.cond.Wait()
	}
}

// pickLocked takes the oldest call of the next requester, in the next
// share, that is below its running caps, if any.
func (q *fairQueue) pickLocked() *queuedTask {
	if q.running >= q.maxRunning {
		return nil
	}
	for i := range q.ring.names {
		si := q.ring.at(i)
		sh := q.shares[q.ring.names[si]]
		if sh.keyID != "" && sh.running >= q.keyCaps.running {
			continue
		}
		for j := range sh.ring.names {
			ui := sh.ring.at(j)
			u := q.users[sh.ring.names[ui]]
			if u.running >= q.userCaps.running {
				continue
			}
			t := u.queue[0]
			u.queue = u.queue[1:]
			u.running++
			sh.running++
			q.running++
			sh.waiting--
			q.waiting--
			sh.ring.served(ui, len(u.queue) == 0)
			q.ring.served(si, sh.waiting == 0)
			return t
		}
	}
	return nil
}

// done ends a running call of take's.
func (q *fairQueue) done(t *queuedTask) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key, shareKey := t.who.key(), shareOf(t.who)
	u, sh := q.users[key], q.shares[shareKey]
	u.running--
	sh.running--
	q.running--
	q.dropIdleLocked(key, u, shareKey, sh)
	q.cond.Broadcast()
}

// remove takes t out if it is still waiting (a cancel answered it); it
// reports whether it was.
func (q *fairQueue) remove(t *queuedTask) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	key, shareKey := t.who.key(), shareOf(t.who)
	u, sh := q.users[key], q.shares[shareKey]
	if u == nil {
		return false
	}
	for i, w := range u.queue {
		if w != t {
			continue
		}
		u.queue = append(u.queue[:i], u.queue[i+1:]...)
		sh.waiting--
		q.waiting--
		if len(u.queue) == 0 {
			sh.ring.remove(key)
		}
		if sh.waiting == 0 {
			q.ring.remove(shareKey)
		}
		q.dropIdleLocked(key, u, shareKey, sh)
		q.cond.Broadcast()
		return true
	}
	return false
}

// dropIdleLocked forgets a requester, and a share, with nothing running
// or waiting.
func (q *fairQueue) dropIdleLocked(key string, u *fairUser, shareKey string, sh *fairShare) {
	if u.running == 0 && len(u.queue) == 0 {
		delete(q.users, key)
	}
	if sh.running == 0 && sh.waiting == 0 {
		delete(q.shares, shareKey)
	}
}

// close refuses every later admit, wakes the executors (take returns
// nil) and returns the calls still waiting, oldest first per requester.
func (q *fairQueue) close() []*queuedTask {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	var left []*queuedTask
	for _, shareKey := range q.ring.names {
		sh := q.shares[shareKey]
		for _, key := range sh.ring.names {
			u := q.users[key]
			left = append(left, u.queue...)
			sh.waiting -= len(u.queue)
			u.queue = nil
			q.dropIdleLocked(key, u, shareKey, sh)
		}
		sh.ring = roundRobin{}
	}
	q.waiting -= len(left)
	q.ring = roundRobin{}
	q.cond.Broadcast()
	return left
}

// roundRobin is a turn over names: names[next] is served next.
type roundRobin struct {
	names []string
	next  int
}

// at is the index of the i-th name from next.
func (r *roundRobin) at(i int) int { return (r.next + i) % len(r.names) }

func (r *roundRobin) add(name string) { r.names = append(r.names, name) }

// served moves the turn past the name at idx, which was just served;
// drop removes it (it has nothing more waiting): the name after it moves
// into idx and is next.
func (r *roundRobin) served(idx int, drop bool) {
	if drop {
		r.names = append(r.names[:idx], r.names[idx+1:]...)
		r.next = idx
	} else {
		r.next = idx + 1
	}
	r.wrap()
}

// remove takes name out of the turn, keeping whoever was next.
func (r *roundRobin) remove(name string) {
	for j, n := range r.names {
		if n == name {
			r.names = append(r.names[:j], r.names[j+1:]...)
			if r.next > j {
				r.next--
			}
			break
		}
	}
	r.wrap()
}

func (r *roundRobin) wrap() {
	if len(r.names) > 0 {
		r.next %= len(r.names)
	} else {
		r.next = 0
	}
}
