package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Requester-side tests of issue 16 §4 (a task id is a name, not a path)
// and §5 (fair shares between requesters, artifact quotas per user).

// fairTools: save_bytes saves one output of n bytes.
const fairTools = `
def save_bytes(ctx, n, name="out.bin"):
    ctx.save_artifact(name, b"x" * int(n))
    return {"saved": int(n)}
`

const fairManifest = `  save_bytes: {module: fair_tools, function: save_bytes}
`

func newFairEnv(t *testing.T, more string) *env {
	t.Helper()
	e := newFaultEnv(t, fairManifest+more)
	must(t, os.WriteFile(filepath.Join(e.tools, "fair_tools.py"), []byte(fairTools), 0o644))
	return e
}

const fairWait = 60 * time.Second

// TestTaskIDNamingWorkDirs: calls whose task_id names an operator's
// folder under SANDBOX_WORK_DIR, and every pooled sandbox's work area
// (one of them serving a call in flight), are served in work dirs of
// their own; the folder and its file are intact and the pooled call in
// flight completes. Before the fix the "already has a work dir" path
// unmounted and deleted whatever the task id named.
func TestTaskIDNamingWorkDirs(t *testing.T) {
	requireRoot(t)
	e := newFairEnv(t, warmHold)
	// 1. an operator's folder under the work base, before the worker
	// starts (the start-up sweep must leave it too).
	folder := filepath.Join(e.work, "operator-folder")
	must(t, os.MkdirAll(folder, 0o755))
	notes := filepath.Join(folder, "notes.txt")
	must(t, os.WriteFile(notes, []byte("keep me"), 0o644))
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	poolSize := func() float64 { return w.labelledMetric(`str_worker_warm_pool_size{tool="warm_hold"}`) }
	waitFor(t, "the warm pool full", fairWait, func() bool { return poolSize() == 2 })

	// 2. a pooled call in flight.
	pooled := a.invoke("warm_hold", map[string]any{"args": map[string]any{"gate": "pooled"}})
	waitFor(t, "the pooled call running", fairWait, func() bool { return len(a.status(pooled)) > 0 })
	if hits := w.labelledMetric(`str_worker_warm_hits_total{tool="warm_hold"}`); hits != 1 {
		t.Fatalf("warm hits = %v: the call was not served by a pooled sandbox", hits)
	}
	// 3. calls named after the folder and every work area there is now.
	names := []string{"operator-folder"}
	entries, err := os.ReadDir(e.work)
	must(t, err)
	for _, ent := range entries {
		if strings.HasPrefix(ent.Name(), ".warm-") {
			names = append(names, ent.Name())
		}
	}
	if len(names) < 2 {
		t.Fatalf("no pooled work area under %s: %v", e.work, entries)
	}
	for _, name := range names {
		id := a.invoke("echo_tool", map[string]any{"task_id": name, "args": map[string]any{"message": "named " + name}})
		if r := a.reply(id, fairWait); !isSuccess(r) {
			t.Errorf("task_id %q: %s", name, r)
		}
	}
	// 4. the folder is intact and the pooled call completes.
	if b, err := os.ReadFile(notes); err != nil || string(b) != "keep me" {
		t.Errorf("the operator's folder under the work base: %q %v", b, err)
	}
	e.release(t, "pooled")
	r := a.reply(pooled, fairWait)
	if res := toolResult(t, r); res["released"] != true {
		t.Errorf("the pooled call in flight: %s", r)
	}
}

// TestOneRequesterCannotStarveAnother: with 2 slots and 4 places to
// wait, one requester sends 6 long calls (enough to fill the worker
// before the fix): it gets its share (1 running, 1 waiting, the auto
// defaults) and its other calls are RESOURCE_EXHAUSTED naming the
// per-requester caps; another requester's call, sent after the flood, is
// served while the flood's calls still hold their slot.
func TestOneRequesterCannotStarveAnother(t *testing.T) {
	requireRoot(t)
	e := newFairEnv(t, "")
	w := startWorker(t, e, 0, map[string]string{"SANDBOX_MAX_CONCURRENT": "2", "SANDBOX_MAX_QUEUED": "4", "STR_WARM_DEFAULT": "0"})
	a := newAgent(t, w.port)
	var flood []string
	for i := 0; i < 6; i++ {
		flood = append(flood, a.invoke("hold", map[string]any{"user_id": "flood", "args": map[string]any{"gate": "flood"}}))
	}
	// Dispatched in order: the other requester's call comes after the flood.
	other := a.invoke("echo_tool", map[string]any{"user_id": "other", "args": map[string]any{"message": "served"}})
	if r := a.reply(other, fairWait); !isSuccess(r) {
		t.Fatalf("the other requester, after the flood: %s", r)
	}
	// The flood: 2 accepted, still holding (the first running); 4 refused.
	accepted := 0
	for _, id := range flood {
		select {
		case r := <-a.replyChan(id):
			code, msg := errorCode(t, r)
			if code != "RESOURCE_EXHAUSTED" || !strings.Contains(msg, `user "flood"`) ||
				!strings.Contains(msg, "STR_USER_MAX_RUNNING") || !strings.Contains(msg, "STR_USER_MAX_QUEUED") {
				t.Errorf("a flood call refused as %s %q, want RESOURCE_EXHAUSTED naming the per-requester caps", code, msg)
			}
		default:
			accepted++
		}
	}
	if accepted != 2 {
		t.Errorf("%d flood calls accepted, want 2 (1 running + 1 waiting)", accepted)
	}
	e.release(t, "flood")
	for _, id := range flood {
		if accepted == 0 {
			break
		}
		select {
		case r := <-a.replyChan(id):
			if isSuccess(r) {
				accepted--
			}
		case <-time.After(fairWait):
			t.Fatalf("no reply to the flood call %s after the release", id)
		}
	}
	if accepted != 0 {
		t.Errorf("%d accepted flood calls did not succeed", accepted)
	}
}

// TestArtifactQuotaPerUser: a user over ARTIFACT_USER_MAX_BYTES is
// refused RESOURCE_EXHAUSTED naming the quota, nothing of the call is
// stored, /readyz stays ready, and another user still saves.
func TestArtifactQuotaPerUser(t *testing.T) {
	requireRoot(t)
	e := newFairEnv(t, "")
	w := startWorker(t, e, 0, map[string]string{"ARTIFACT_USER_MAX_BYTES": "10000"})
	a := newAgent(t, w.port)
	save := func(user, session, name string) []byte {
		return a.reply(a.invoke("save_bytes", map[string]any{"user_id": user, "session_id": session,
			"args": map[string]any{"n": 6000, "name": name}}), fairWait)
	}
	if r := save("hog", "s-1", "first.bin"); !isSuccess(r) {
		t.Fatalf("the first save: %s", r)
	}
	r := save("hog", "s-2", "second.bin")
	code, msg := errorCode(t, r)
	if code != "RESOURCE_EXHAUSTED" || !strings.Contains(msg, "ARTIFACT_USER_MAX_BYTES") || !strings.Contains(msg, "nothing was saved") {
		t.Fatalf("over the user's quota: %s %q", code, msg)
	}
	if _, err := os.Lstat(filepath.Join(e.artifacts, "e2e", "hog", "s-2", "second.bin")); !os.IsNotExist(err) {
		t.Errorf("the refused output was stored: %v", err)
	}
	if c, body := w.get("/readyz"); c != 200 {
		t.Errorf("/readyz after a quota refusal: %d %s", c, body)
	}
	if r := save("fine", "s-1", "first.bin"); !isSuccess(r) {
		t.Fatalf("another user, after hog's refusal: %s", r)
	}
}
