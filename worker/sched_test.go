package worker

import (
	"fmt"
	"io"
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
	q := newFairQueue(1, 100, shareCaps{1, 100}, shareCaps{1, 100})
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
	if q.running != 0 || q.waiting != 0 || len(q.users) != 0 || len(q.shares) != 0 || len(q.ring.names) != 0 {
		t.Fatalf("left: running %d waiting %d users %v ring %v", q.running, q.waiting, q.users, q.ring)
	}
}

// TestFairQueueCaps: a requester over its caps is refused with a message
// naming them, while another is still admitted; the global cap refuses
// everyone; a requester at its running cap waits while another's call
// is taken; a removed (cancelled) call frees its share.
func TestFairQueueCaps(t *testing.T) {
	q := newFairQueue(2, 4, shareCaps{1, 2}, shareCaps{1, 2})
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

// TestFairShareConfig: the per-requester caps default to a share below
// the worker's (auto), explicit values are taken (the running cap at
// most SANDBOX_MAX_CONCURRENT), and the quota settings parse sizes; bad
// values are reported by name.
func TestFairShareConfig(t *testing.T) {
	base := map[string]string{"SAM_NAMESPACE": "demo/", "DEV_BROKER_HOST": "localhost"}
	load := func(extra map[string]string) (*Config, error) {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range extra {
			env[k] = v
		}
		return LoadConfig(nil, envOf(env), io.Discard)
	}
	c, err := load(nil)
	must(t, err)
	if c.userMaxRunning() != 3 || c.userMaxQueued() != 64 || c.ArtifactQuota.On() {
		t.Fatalf("defaults: running %d queued %d quota %+v", c.userMaxRunning(), c.userMaxQueued(), c.ArtifactQuota)
	}
	if c.keyMaxRunning() != 3 || c.keyMaxQueued() != 64 {
		t.Fatalf("key defaults: running %d queued %d", c.keyMaxRunning(), c.keyMaxQueued())
	}
	c, err = load(map[string]string{"STR_KEY_MAX_RUNNING": "9", "STR_KEY_MAX_QUEUED": "256"})
	must(t, err)
	if c.keyMaxRunning() != 4 || c.keyMaxQueued() != 256 || c.userMaxRunning() != 3 {
		t.Fatalf("explicit key caps: running %d queued %d (user running %d)", c.keyMaxRunning(), c.keyMaxQueued(), c.userMaxRunning())
	}
	c, err = load(map[string]string{"SANDBOX_MAX_CONCURRENT": "1", "SANDBOX_MAX_QUEUED": "2"})
	must(t, err)
	if c.userMaxRunning() != 1 || c.userMaxQueued() != 1 {
		t.Fatalf("small worker: running %d queued %d", c.userMaxRunning(), c.userMaxQueued())
	}
	c, err = load(map[string]string{"STR_USER_MAX_RUNNING": "9", "STR_USER_MAX_QUEUED": "0",
		"ARTIFACT_USER_MAX_BYTES": "1Gi", "ARTIFACT_SESSION_MAX_VERSIONS": "7"})
	must(t, err)
	if c.userMaxRunning() != 4 || c.userMaxQueued() != 0 || c.ArtifactQuota.UserBytes != 1<<30 || c.ArtifactQuota.SessionVersions != 7 {
		t.Fatalf("explicit: running %d queued %d quota %+v", c.userMaxRunning(), c.userMaxQueued(), c.ArtifactQuota)
	}
	_, err = load(map[string]string{"STR_USER_MAX_RUNNING": "0", "STR_USER_MAX_QUEUED": "many", "ARTIFACT_USER_MAX_BYTES": "lots",
		"STR_KEY_MAX_RUNNING": "0", "STR_KEY_MAX_QUEUED": "-2"})
	for _, name := range []string{"STR_USER_MAX_RUNNING", "STR_USER_MAX_QUEUED", "ARTIFACT_USER_MAX_BYTES", "STR_KEY_MAX_RUNNING", "STR_KEY_MAX_QUEUED"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("bad %s not reported: %v", name, err)
		}
	}
}

func keyedTask(key, user string) *queuedTask {
	return &queuedTask{task: &task{who: requester{UserID: user, Verified: true, Via: "key:" + key, Key: key}}}
}

// TestFairQueuePerKey: one agent key claiming many users (a fresh user
// per call, each under its own user caps) gets at most the key's running
// and waiting caps over all of them, refused with a message naming the
// key and the settings, while another key's calls are admitted and run;
// turns go round the keys, not round the users.
func TestFairQueuePerKey(t *testing.T) {
	q := newFairQueue(4, 16, shareCaps{3, 4}, shareCaps{3, 4})
	var mallory []*queuedTask
	for i := range 12 {
		x := keyedTask("mallory-key", fmt.Sprintf("mallory%d", i))
		e := q.admit(x)
		if i < 7 {
			if e != nil {
				t.Fatalf("mallory's call %d refused under the key's caps: %s", i, e.msg)
			}
			mallory = append(mallory, x)
			continue
		}
		if e == nil || !e.perRequester || !strings.Contains(e.msg, `agent key "mallory-key"`) ||
			!strings.Contains(e.msg, "STR_KEY_MAX_RUNNING") || !strings.Contains(e.msg, "STR_KEY_MAX_QUEUED") {
			t.Fatalf("mallory's call %d (as a new user) over the key's caps: %+v", i, e)
		}
	}
	alice := keyedTask("alice-key", "alice")
	if e := q.admit(alice); e != nil {
		t.Fatalf("another key's call refused: %s", e.msg)
	}
	// Turns go round the keys: mallory, alice, then mallory up to its
	// running cap; the fourth slot stays for others.
	want := []*queuedTask{mallory[0], alice, mallory[1], mallory[2]}
	for i, w := range want {
		if got := q.take(); got != w {
			t.Fatalf("take %d: %s, want %s", i, got.who.UserID, w.who.UserID)
		}
	}
	if n := q.shares["agent-key:mallory-key"].running; n != 3 {
		t.Fatalf("mallory's key runs %d calls, want its cap 3", n)
	}
	// alice's next call, waiting for the full worker, waits one turn of
	// mallory's key (served before alice's key joined the turn), not one
	// per user of mallory's: mallory has 4 waiting.
	alice2 := keyedTask("alice-key", "alice")
	if e := q.admit(alice2); e != nil {
		t.Fatalf("alice's second call: %s", e.msg)
	}
	q.done(mallory[0])
	if got := q.take(); got != mallory[3] {
		t.Fatalf("after one of mallory's ended, %s runs, want mallory's turn", got.who.UserID)
	}
	q.done(mallory[1])
	if got := q.take(); got != alice2 {
		t.Fatalf("after two of mallory's ended, %s runs, want alice", got.who.UserID)
	}
	// A requester verified by no key is a share of its own, as before.
	if e := q.admit(fairTask("carol")); e != nil {
		t.Fatalf("a requester without a key: %s", e.msg)
	}
	// Everything handed back and forgotten.
	for _, x := range []*queuedTask{alice, alice2, mallory[2], mallory[3]} {
		q.done(x)
	}
	if left := q.close(); len(left) != 4 {
		t.Fatalf("close left %d, want mallory's 3 waiting and carol's", len(left))
	}
	if q.running != 0 || q.waiting != 0 || len(q.users) != 0 || len(q.shares) != 0 || len(q.ring.names) != 0 {
		t.Fatalf("left: running %d waiting %d users %v shares %v ring %v", q.running, q.waiting, q.users, q.shares, q.ring)
	}
}
