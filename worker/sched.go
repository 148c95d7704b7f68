package worker

import (
	"fmt"
	"sync"
)

// fairQueue holds the accepted calls until an executor takes them, fairly
// across requesters (task.who.key(), identity.go):
//
//   - admission: the global caps (SANDBOX_MAX_CONCURRENT running plus
//     SANDBOX_MAX_QUEUED waiting) and each requester's own
//     (STR_USER_MAX_RUNNING running plus STR_USER_MAX_QUEUED waiting); a
//     call over either is refused (RESOURCE_EXHAUSTED), over a
//     requester's caps for that requester only;
//   - order: a free executor takes the oldest call of the next requester,
//     round-robin over the requesters with calls waiting, skipping those
//     already running their STR_USER_MAX_RUNNING; so a requester with
//     many calls waiting does not delay another's first by more than one
//     call per requester.
//
// A call is waiting from admit until take (or remove, for one a cancel
// answers while it waits) and running from take until done.
type fairQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool

	maxRunning, maxWaiting         int // global
	userRunningCap, userWaitingCap int // per requester

	running, waiting int
	users            map[string]*fairUser
	ring             []string // requesters with calls waiting, in round-robin order
	next             int      // index in ring of the requester served next
}

// fairUser is one requester's share.
type fairUser struct {
	queue   []*queuedTask
	running int
}

func newFairQueue(maxRunning, maxWaiting, userRunning, userWaiting int) *fairQueue {
	q := &fairQueue{maxRunning: maxRunning, maxWaiting: maxWaiting,
		userRunningCap: userRunning, userWaitingCap: userWaiting, users: map[string]*fairUser{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// admitError is why admit refused a call; perRequester is set when the
// requester's own caps refused it (the global ones would have taken it).
type admitError struct {
	msg          string
	perRequester bool
}

// admit adds t as waiting, or says why not.
func (q *fairQueue) admit(t *queuedTask) *admitError {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := t.who.key()
	u := q.users[key]
	// 1. the worker's caps.
	if q.closed {
		return &admitError{msg: "worker is shutting down"}
	}
	if q.running+q.waiting >= q.maxRunning+q.maxWaiting {
		return &admitError{msg: fmt.Sprintf("worker queue is full (%d running, %d waiting)", q.maxRunning, q.maxWaiting)}
	}
	// 2. the requester's.
	if u != nil && u.running+len(u.queue) >= q.userRunningCap+q.userWaitingCap {
		return &admitError{perRequester: true, msg: fmt.Sprintf(
			"user %q has %d calls running and %d waiting on this worker, the most one requester may have: %d running (STR_USER_MAX_RUNNING) and %d waiting (STR_USER_MAX_QUEUED)",
			t.who.UserID, u.running, len(u.queue), q.userRunningCap, q.userWaitingCap)}
	}
	// 3. in.
	if u == nil {
		u = &fairUser{}
		q.users[key] = u
	}
	if len(u.queue) == 0 {
		q.ring = append(q.ring, key)
	}
	u.queue = append(u.queue, t)
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

// pickLocked takes the oldest call of the next requester in the ring that
// is below its running cap, if any.
func (q *fairQueue) pickLocked() *queuedTask {
	if q.running >= q.maxRunning {
		return nil
	}
	for i := 0; i < len(q.ring); i++ {
		idx := (q.next + i) % len(q.ring)
		key := q.ring[idx]
		u := q.users[key]
		if u.running >= q.userRunningCap {
			continue
		}
		t := u.queue[0]
		u.queue = u.queue[1:]
		u.running++
		q.running++
		q.waiting--
		if len(u.queue) == 0 {
			q.ring = append(q.ring[:idx], q.ring[idx+1:]...)
			q.next = idx // the requester after it moved into idx
		} else {
			q.next = idx + 1
		}
		if len(q.ring) > 0 {
			q.next %= len(q.ring)
		} else {
			q.next = 0
		}
		return t
	}
	return nil
}

// done ends a running call of take's.
func (q *fairQueue) done(t *queuedTask) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := t.who.key()
	u := q.users[key]
	u.running--
	q.running--
	q.dropIdleLocked(key, u)
	q.cond.Broadcast()
}

// remove takes t out if it is still waiting (a cancel answered it); it
// reports whether it was.
func (q *fairQueue) remove(t *queuedTask) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := t.who.key()
	u := q.users[key]
	if u == nil {
		return false
	}
	for i, w := range u.queue {
		if w != t {
			continue
		}
		u.queue = append(u.queue[:i], u.queue[i+1:]...)
		q.waiting--
		if len(u.queue) == 0 {
			for j, k := range q.ring {
				if k == key {
					q.ring = append(q.ring[:j], q.ring[j+1:]...)
					if q.next > j {
						q.next--
					}
					break
				}
			}
			if len(q.ring) > 0 {
				q.next %= len(q.ring)
			} else {
				q.next = 0
			}
		}
		q.dropIdleLocked(key, u)
		q.cond.Broadcast()
		return true
	}
	return false
}

// dropIdleLocked forgets a requester with nothing running or waiting.
func (q *fairQueue) dropIdleLocked(key string, u *fairUser) {
	if u.running == 0 && len(u.queue) == 0 {
		delete(q.users, key)
	}
}

// close refuses every later admit, wakes the executors (take returns
// nil) and returns the calls still waiting, oldest first per requester.
func (q *fairQueue) close() []*queuedTask {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	var left []*queuedTask
	for _, key := range q.ring {
		u := q.users[key]
		left = append(left, u.queue...)
		u.queue = nil
		q.dropIdleLocked(key, u)
	}
	q.waiting -= len(left)
	q.ring = nil
	q.cond.Broadcast()
	return left
}
