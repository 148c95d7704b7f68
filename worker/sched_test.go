package worker

import (
	"strings"
	"testing"
)

func fairTask(user string) *queuedTask {
	return &queuedTask{task: &task{who: requester{UserID: user}}}
}

// TestFairQueueRoundRobin: with one slot, calls are taken alternately
// from the requesters that have calls waiting, whatever order they
// arrived in; a requester's own calls in arrival order.
func TestFairQueueRoundRobin(t *testing.T) {
	q := newFairQueue(1, 100, 1, 100)
	var order []*queuedTask
	for i := 0; i < 4; i++ {
		x := fairTask("flood")
		order = append(order, x)
		if e := q.admit(x); e != nil {
			t.Fatal(e.msg)
		}
	}
	b1, c1 := fairTask("bob"), fairTask("carol")
	for _, x := range []*queuedTask{b1, c1} {
		if e := q.admit(x); e != nil {
			t.Fatal(e.msg)
		}
	}
	want := []*queuedTask{order[0], b1, c1, order[1], order[2], order[3]}
	for i, w := range want {
		got := q.take()
		if got != w {
			t.Fatalf("take %d: %s, want %s", i, got.who.UserID, w.who.UserID)
		}
		q.done(got)
	}
	if q.running != 0 || q.waiting != 0 || len(q.users) != 0 || len(q.ring) != 0 {
		t.Fatalf("left: running %d waiting %d users %v ring %v", q.running, q.waiting, q.users, q.ring)
	}
}

// TestFairQueueCaps: a requester over its caps is refused with a message
// naming them, while another is still admitted; the global cap refuses
// everyone; a requester at its running cap waits while another's call
// is taken; a removed (cancelled) call frees its share.
func TestFairQueueCaps(t *testing.T) {
	q := newFairQueue(2, 4, 1, 2)
	a1, a2, a3 := fairTask("a"), fairTask("a"), fairTask("a")
	for _, x := range []*queuedTask{a1, a2, a3} {
		if e := q.admit(x); e != nil {
			t.Fatal(e.msg)
		}
	}
	e := q.admit(fairTask("a"))
	if e == nil || !e.perRequester || !strings.Contains(e.msg, "STR_USER_MAX_RUNNING") || !strings.Contains(e.msg, `user "a"`) {
		t.Fatalf("a's fourth call: %+v", e)
	}
	b := fairTask("b")
	if e := q.admit(b); e != nil {
		t.Fatalf("b refused: %s", e.msg)
	}
	// a runs one (its running cap); the second slot goes to b, not to a.
	if got := q.take(); got != a1 {
		t.Fatalf("first take: %s", got.who.UserID)
	}
	if got := q.take(); got != b {
		t.Fatalf("second take: %s, want b", got.who.UserID)
	}
	// The worker's cap: 2 running + 2 waiting of 2 + 4; two more fit.
	c1, c2 := fairTask("c"), fairTask("c")
	if e := q.admit(c1); e != nil {
		t.Fatal(e.msg)
	}
	if e := q.admit(c2); e != nil {
		t.Fatal(e.msg)
	}
	if e := q.admit(fairTask("d")); e == nil || e.perRequester || !strings.Contains(e.msg, "queue is full") {
		t.Fatalf("over the worker's cap: %+v", e)
	}
	// A cancelled waiting call frees its place.
	if !q.remove(c2) || q.remove(c2) {
		t.Fatal("remove")
	}
	if e := q.admit(fairTask("d")); e != nil {
		t.Fatalf("after a cancel: %s", e.msg)
	}
	// Close hands back what waits.
	q.done(a1)
	q.done(b)
	left := q.close()
	if len(left) != 4 || q.take() != nil {
		t.Fatalf("close left %d", len(left))
	}
}
