package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// The load tests drive one worker through its embedded broker from
// several agents, each on its own broker connection, and check every
// reply, the concurrency limit (sampled from the process table, not
// taken from the worker's own gauge) and the worker's resources (read
// from /proc/<pid> and /metrics) before and after.

const (
	loadAgents      = 8
	loadConcurrency = 4
	// loadWarmup calls run before the baselines are taken: the first calls
	// grow the worker's heap, its broker sessions and its buffers to their
	// working size, which is not a leak.
	loadWarmup = 24
	// soakWarmup of the soak runs before its start sample.
	soakWarmup = 5 * time.Second
)

// TestLoad: 1,000 calls of echo_tool (STR_LOAD_CALLS overrides, for a
// quick local run) from 8 agents on 8 broker connections, 2 in flight
// each, to a worker with SANDBOX_MAX_CONCURRENT=4 and the default queue
// (no call is refused). Every call gets exactly one reply, on its own
// reply topic, carrying its id and the unique message the call sent.
// The sandboxes running at once, sampled from the process table every
// 20 ms, never exceed 4 and do reach more than 1 (the sampling sees
// them). The worker's RSS after the load and a settle period is within
// 10% of its RSS after a warm-up of 24 calls (not at bare start: see
// loadWarmup). Afterwards the worker has no child process, work dir or
// work dir mount left, and it logged no error. The throughput is logged,
// not asserted.
func TestLoad(t *testing.T) {
	requireRoot(t)
	calls := envInt(t, "STR_LOAD_CALLS", 1000)
	e := newEnv(t)
	w := startWorker(t, e, 0, map[string]string{
		"SANDBOX_MAX_CONCURRENT": strconv.Itoa(loadConcurrency), "STR_WARM_DEFAULT": "0", "STR_LOG_LEVEL": "info",
	})
	agents := newLoadAgents(t, w.port, loadAgents)

	// 1. warm-up, then the baseline.
	runLoad(t, agents, loadWarmup/loadAgents, 2)
	before := sampleWorker(t, w)
	t.Logf("after the warm-up of %d calls: %s", loadWarmup, before)

	// 2. the load, with the process table sampled meanwhile.
	sampler := startSandboxSampler(t, w.cmd.Process.Pid, 20*time.Millisecond)
	start := time.Now()
	runLoad(t, agents, calls/loadAgents, 2)
	elapsed := time.Since(start)
	maxSeen, samples, procs := sampler.stop()
	total := calls / loadAgents * loadAgents
	t.Logf("%d calls in %v: %.1f calls/s; at most %d sandboxes at once in %d samples (%v)",
		total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), maxSeen, samples, procs)

	// 3. every reply.
	for _, a := range agents {
		a.check(t, false)
	}
	// 4. the limit held, and the sampling could see it.
	if maxSeen > loadConcurrency {
		t.Errorf("%d sandboxes ran at once (%v), SANDBOX_MAX_CONCURRENT=%d", maxSeen, procs, loadConcurrency)
	}
	if maxSeen <= 1 {
		t.Errorf("at most %d sandbox seen at once in %d samples: the sampling does not see the load", maxSeen, samples)
	}
	if m := w.metric("str_worker_running_executions_max"); m > loadConcurrency {
		t.Errorf("the worker's own gauge: running max %v, limit %d", m, loadConcurrency)
	}
	// 5. the memory came back (an idle worker returns the pages its calls
	// freed after 5 s, worker/idle.go; a leak never does).
	var after workerSample
	settled := waitUntil(30*time.Second, func() bool {
		after = sampleWorker(t, w)
		return after.rssKB <= before.rssKB*110/100
	})
	t.Logf("after the load and %s: %s", settled, after)
	if after.rssKB > before.rssKB*110/100 {
		t.Errorf("worker RSS %d kB after the load, %d kB after the warm-up: more than 10%% growth", after.rssKB, before.rssKB)
	}
	checkNoLeftovers(t, w, e)
	checkNoErrorLogs(t, w)
}

// TestSoak: STR_SOAK_SECONDS (default 60) of echo_tool calls at the queue
// limit: SANDBOX_MAX_CONCURRENT=4, SANDBOX_MAX_QUEUED=4, and 8 agents
// keeping 2 calls in flight each (16 > 4 + 4; a refused call's slot
// waits 250 ms before the agent calls again). Every reply is either the
// call's echo or the documented overload answer, RESOURCE_EXHAUSTED for
// a full queue (spec §4), and both occur; every call gets exactly one
// reply; the sandboxes running at once never exceed 4. The worker's open
// fds, goroutines and RSS at the end (after a settle period) have not
// grown from the start (after 5 s of the same load as a warm-up): fds
// +5, goroutines +10% or +10, RSS +10%. The samples are printed. Nothing
// is left (as in TestLoad) and the worker logged no error.
func TestSoak(t *testing.T) {
	requireRoot(t)
	seconds := envInt(t, "STR_SOAK_SECONDS", 60)
	const queued = 4
	e := newEnv(t)
	w := startWorker(t, e, 0, map[string]string{
		"SANDBOX_MAX_CONCURRENT": strconv.Itoa(loadConcurrency), "SANDBOX_MAX_QUEUED": strconv.Itoa(queued),
		// One user: the worker's own queue limit is under test, not the
		// per-requester share (TestOneRequesterCannotStarveAnother).
		"STR_USER_MAX_RUNNING": strconv.Itoa(loadConcurrency), "STR_USER_MAX_QUEUED": strconv.Itoa(queued),
		"STR_WARM_DEFAULT": "0", "STR_LOG_LEVEL": "info",
	})
	agents := newLoadAgents(t, w.port, loadAgents)
	// A refused call's slot waits before the agent calls again, as an
	// agent backing off would: the queue stays at its limit without the
	// agents spinning on refusals.
	for _, a := range agents {
		a.backoff = 250 * time.Millisecond
	}

	// 1. warm-up: soakWarmup of the soak itself (a few calls at a lower
	// load leave the heap below its size at the queue limit), then the
	// start sample.
	soakFor(t, agents, soakWarmup)
	for _, a := range agents {
		a.check(t, true)
		a.reset()
	}
	start := sampleWorker(t, w)
	t.Logf("start (after a warm-up of %v at the queue limit): %s", soakWarmup, start)

	// 2. the soak: every agent calls until the time is up; a sample every
	// 10 s for the log.
	sampler := startSandboxSampler(t, w.cmd.Process.Pid, 20*time.Millisecond)
	deadline := time.Now().Add(time.Duration(seconds) * time.Second)
	stopLog := make(chan struct{})
	logDone := make(chan struct{})
	go func() {
		defer close(logDone)
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stopLog:
				return
			case <-tick.C:
				s, err := readWorkerSample(w)
				if err != nil {
					t.Logf("during the soak: %v", err)
				} else {
					t.Logf("during the soak: %s", s)
				}
			}
		}
	}()
	began := time.Now()
	soakFor(t, agents, time.Until(deadline))
	elapsed := time.Since(began)
	close(stopLog)
	<-logDone
	maxSeen, samples, procs := sampler.stop()

	// 3. every reply: the echo, or RESOURCE_EXHAUSTED for the full queue.
	var ok, refused int
	for _, a := range agents {
		o, r := a.check(t, true)
		ok, refused = ok+o, refused+r
	}
	t.Logf("%v: %d calls answered (%d echoed, %d refused RESOURCE_EXHAUSTED: queue full), %.1f echoed/s; at most %d sandboxes at once in %d samples",
		elapsed.Round(time.Millisecond), ok+refused, ok, refused, float64(ok)/elapsed.Seconds(), maxSeen, samples)
	if ok == 0 || refused == 0 {
		t.Errorf("%d echoed, %d refused: the soak did not run at the queue limit", ok, refused)
	}
	if maxSeen > loadConcurrency {
		t.Errorf("%d sandboxes ran at once (%v), SANDBOX_MAX_CONCURRENT=%d", maxSeen, procs, loadConcurrency)
	}

	// 4. no growth, after a settle period.
	grown := func(end workerSample) []string {
		var out []string
		if end.fds > start.fds+5 {
			out = append(out, fmt.Sprintf("open fds %d -> %d (slack 5)", start.fds, end.fds))
		}
		if slack := max(start.goroutines/10, 10); end.goroutines > start.goroutines+slack {
			out = append(out, fmt.Sprintf("goroutines %d -> %d (slack %d)", start.goroutines, end.goroutines, slack))
		}
		if end.rssKB > start.rssKB*110/100 {
			out = append(out, fmt.Sprintf("RSS %d kB -> %d kB (slack 10%%)", start.rssKB, end.rssKB))
		}
		return out
	}
	var end workerSample
	settled := waitUntil(30*time.Second, func() bool {
		end = sampleWorker(t, w)
		return len(grown(end)) == 0
	})
	t.Logf("end (after %s): %s", settled, end)
	for _, g := range grown(end) {
		t.Errorf("the worker grew during the soak: %s", g)
	}
	checkNoLeftovers(t, w, e)
	checkNoErrorLogs(t, w)
}

// soakFor has every agent call, 2 in flight, for d, and waits for every
// answer.
func soakFor(t *testing.T, agents []*loadAgent, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.drive(func(int) bool { return time.Now().Before(deadline) }, 2)
		}()
	}
	wg.Wait()
	for _, a := range agents {
		a.waitAnswered(t, 3*time.Minute)
	}
}

// runLoad has every agent make perAgent calls, inflight at a time, and
// waits for every answer.
func runLoad(t *testing.T, agents []*loadAgent, perAgent, inflight int) {
	t.Helper()
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.drive(func(n int) bool { return n < perAgent }, inflight)
		}()
	}
	wg.Wait()
	for _, a := range agents {
		a.waitAnswered(t, 3*time.Minute)
	}
}

// loadAgent is an agent on its own broker connection, with reply and
// status topics of its own: a reply sent to another agent's topic shows
// up as a stray there. It records every reply it gets, per request id.
type loadAgent struct {
	name    string
	c       *devbroker.Client
	base    string
	backoff time.Duration // how long a refused call's slot waits

	mu       sync.Mutex
	slots    chan struct{}           // one per unanswered call (drive)
	sent     map[string]string       // request id -> the message the call carries
	replies  map[string][][]byte     // request id (from the reply topic) -> every reply to it
	strays   []string                // replies to ids this agent never sent
	errs     []string                // publish failures
	statuses map[string][]statusNote // request id (from the status topic) -> its status notes
}

// statusNote is a status notification and whether it came after a reply
// to its call.
type statusNote struct {
	payload    []byte
	afterReply bool
}

func newLoadAgents(t *testing.T, port, n int) []*loadAgent {
	t.Helper()
	var out []*loadAgent
	for i := range n {
		name := fmt.Sprintf("load-%d", i)
		c, err := devbroker.NewClient(devbroker.ClientOptions{
			Host: "127.0.0.1", Port: port, ClientID: fmt.Sprintf("e2e-%s-%d", name, time.Now().UnixNano()),
			TokenFile:  broker.TokenFileFor(port),
			RetryDelay: 200 * time.Millisecond, ReceiveTimeout: 200 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		must(t, err)
		a := &loadAgent{name: name, c: c, base: "e2e/a2a/v1", sent: map[string]string{}, replies: map[string][][]byte{}, statuses: map[string][]statusNote{}}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		must(t, c.Connect(ctx, []string{a.base + "/sam_remote_tool/response/" + name + "/>", a.base + "/sam_remote_tool/status/" + name + "/>"}))
		cancel()
		go a.loop()
		t.Cleanup(func() { c.Close() })
		out = append(out, a)
	}
	return out
}

func (a *loadAgent) loop() {
	for {
		d, err := a.c.Receive(context.Background())
		if err != nil {
			return
		}
		if d.Ack != nil {
			d.Ack()
		}
		id := d.Topic[strings.LastIndexByte(d.Topic, '/')+1:]
		if strings.Contains(d.Topic, "/status/") {
			a.mu.Lock()
			a.statuses[id] = append(a.statuses[id], statusNote{d.Payload, len(a.replies[id]) > 0})
			a.mu.Unlock()
			continue
		}
		a.mu.Lock()
		_, mine := a.sent[id]
		first := mine && len(a.replies[id]) == 0
		a.replies[id] = append(a.replies[id], d.Payload)
		if !mine {
			a.strays = append(a.strays, d.Topic)
		}
		slots := a.slots
		a.mu.Unlock()
		if first {
			// The call's slot is free again (a refused one after the
			// backoff).
			if a.backoff > 0 && !isSuccess(d.Payload) {
				time.AfterFunc(a.backoff, func() { <-slots })
			} else {
				<-slots
			}
		}
	}
}

// drive calls echo_tool while more(n) says so, n being the calls made so
// far, with at most inflight calls unanswered.
func (a *loadAgent) drive(more func(n int) bool, inflight int) {
	slots := make(chan struct{}, inflight)
	a.mu.Lock()
	a.slots = slots
	a.mu.Unlock()
	for n := 0; more(n); n++ {
		slots <- struct{}{}
		id := newID(a.name)
		msg := fmt.Sprintf("%s says %d to %s", a.name, n, id)
		p := map[string]any{"task_id": "task-" + id, "tool_name": "echo_tool", "app_name": "e2e", "user_id": "u-1",
			"session_id": "s-1", "args": map[string]any{"message": msg}}
		payload, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "sam_remote_tool/invoke", "params": p})
		if err != nil {
			panic(err)
		}
		a.mu.Lock()
		a.sent[id] = msg
		a.mu.Unlock()
		err = a.c.Publish(context.Background(), transport.Message{
			Topic: a.base + "/sam_remote_tool/invoke/echo_tool", Payload: payload,
			UserProperties: map[string]string{
				"replyTo":  a.base + "/sam_remote_tool/response/" + a.name + "/" + id,
				"statusTo": a.base + "/sam_remote_tool/status/" + a.name + "/" + id,
				"clientId": "e2e", "userId": "u-1",
			}})
		if err != nil {
			a.mu.Lock()
			a.errs = append(a.errs, fmt.Sprintf("publish %s: %v", id, err))
			delete(a.sent, id)
			a.mu.Unlock()
			<-slots
		}
	}
}

// unanswered counts the sent calls with no reply yet.
func (a *loadAgent) unanswered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for id := range a.sent {
		if len(a.replies[id]) == 0 {
			n++
		}
	}
	return n
}

// waitAnswered waits until every sent call has a reply, then a little
// longer for any duplicate to arrive.
func (a *loadAgent) waitAnswered(t *testing.T, within time.Duration) {
	t.Helper()
	if !waitUntilOK(within, func() bool { return a.unanswered() == 0 }) {
		t.Fatalf("%s: %d calls unanswered after %v (lost)", a.name, a.unanswered(), within)
	}
	time.Sleep(500 * time.Millisecond)
}

// check verifies every reply: one per sent call, none to an id not sent,
// the reply's id the call's, the call's message echoed, and before it
// the tool's one status line ("echoing", for the call's task id); with
// overloadOK a RESOURCE_EXHAUSTED answer for a full queue, with no
// status, is accepted instead. It returns the echoed and refused counts.
func (a *loadAgent) check(t *testing.T, overloadOK bool) (ok, refused int) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.errs {
		t.Errorf("%s: %s", a.name, e)
	}
	for _, s := range a.strays {
		t.Errorf("%s: a reply to a call it never made, on %s", a.name, s)
	}
	for id := range a.statuses {
		if _, ok := a.sent[id]; !ok {
			t.Errorf("%s: a status for a call it never made: %s", a.name, id)
		}
	}
	bad := 0
	report := func(format string, args ...any) {
		// The first few of each agent: a systematic fault repeats.
		if bad++; bad <= 5 {
			t.Errorf(a.name+": "+format, args...)
		}
	}
	for id, msg := range a.sent {
		rs := a.replies[id]
		if len(rs) != 1 {
			report("%d replies to %s (want exactly 1): %q", len(rs), id, rs)
			continue
		}
		var r struct {
			JSONRPC string `json:"jsonrpc"`
			ID      string `json:"id"`
			Result  *struct {
				ToolResult struct {
					Echo   string `json:"echo"`
					UserID string `json:"user_id"`
				} `json:"tool_result"`
				TimedOut bool `json:"timed_out"`
			} `json:"result"`
			Error *struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(rs[0], &r); err != nil {
			report("reply to %s is not JSON: %v: %s", id, err, rs[0])
			continue
		}
		switch {
		case r.JSONRPC != "2.0" || r.ID != id:
			report("reply on %s's topic has jsonrpc %q, id %q: %s", id, r.JSONRPC, r.ID, rs[0])
		case r.Result != nil && !r.Result.TimedOut && r.Result.ToolResult.Echo == msg && r.Result.ToolResult.UserID == "u-1":
			if problem := checkEchoStatus(id, a.statuses[id]); problem != "" {
				report("%s", problem)
				continue
			}
			ok++
		case overloadOK && r.Error != nil && r.Error.Code == "RESOURCE_EXHAUSTED" && strings.Contains(r.Error.Message, "queue is full"):
			if n := len(a.statuses[id]); n != 0 {
				report("%d status notes to %s, refused: %s", n, id, rs[0])
				continue
			}
			refused++
		default:
			report("reply to %s (message %q): %s", id, msg, rs[0])
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d bad replies in all", a.name, bad)
	}
	return ok, refused
}

// checkEchoStatus says what is wrong with the status notes of an echoed
// call, or "".
func checkEchoStatus(id string, notes []statusNote) string {
	if len(notes) != 1 {
		return fmt.Sprintf("%d status notes to %s (want 1)", len(notes), id)
	}
	var st struct {
		Method string `json:"method"`
		Params struct {
			TaskID     string `json:"task_id"`
			StatusText string `json:"status_text"`
		} `json:"params"`
	}
	if err := json.Unmarshal(notes[0].payload, &st); err != nil || st.Method != "sam_remote_tool/status" ||
		st.Params.TaskID != "task-"+id || st.Params.StatusText != "echoing" {
		return fmt.Sprintf("status note to %s: %s", id, notes[0].payload)
	}
	if notes[0].afterReply {
		return fmt.Sprintf("the status note to %s came after the reply", id)
	}
	return ""
}

// reset forgets the calls made so far.
func (a *loadAgent) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent, a.replies, a.strays, a.errs, a.statuses = map[string]string{}, map[string][][]byte{}, nil, nil, map[string][]statusNote{}
}

// sandboxSampler counts, every interval, the worker's live child
// processes: each is one sandbox (just after the clone a copy of the
// worker, comm "str-worker"; then its init, comm the number of the descriptor it
// was executed from; then the runner it becomes, python3, PID 1 of the
// sandbox's pid namespace); the worker starts no other
// process in sandbox mode, and with no warm pool a sandbox exists only
// while its call holds an execution slot (it is reaped before the slot
// is given up). Zombies are not counted: a child that has exited is no
// longer running; until the worker reaps it, its call still holds the
// slot anyway.
type sandboxSampler struct {
	quit, done chan struct{}
	max, n     int
	maxProcs   []string
}

func startSandboxSampler(t *testing.T, pid int, every time.Duration) *sandboxSampler {
	t.Helper()
	s := &sandboxSampler{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			procs := liveChildren(pid)
			s.n++
			if len(procs) > s.max {
				s.max, s.maxProcs = len(procs), procs
			}
			select {
			case <-s.quit:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// stop ends the sampling: the most children seen at once, the number of
// samples and the children of that sample ("pid comm").
func (s *sandboxSampler) stop() (int, int, []string) {
	close(s.quit)
	<-s.done
	return s.max, s.n, s.maxProcs
}

// liveChildren lists the processes whose parent is pid and that have not
// exited ("pid comm"), from /proc/*/stat.
func liveChildren(pid int) []string {
	var out []string
	for _, p := range allPids() {
		if st, ok := readStat(p); ok && st.ppid == pid && st.state != "Z" && st.state != "X" {
			out = append(out, fmt.Sprintf("%d %s", p, st.comm))
		}
	}
	return out
}

// workerSample is the worker's resources at one moment.
type workerSample struct {
	rssKB, fds, goroutines int
	anonKB, fileKB         int // VmRSS's parts: RssAnon (heap, stacks: where a leak shows) and RssFile (the binary's and libraries' pages mapped so far)
}

func (s workerSample) String() string {
	return fmt.Sprintf("RSS %d kB (anonymous %d kB, file %d kB), %d open fds, %d goroutines", s.rssKB, s.anonKB, s.fileKB, s.fds, s.goroutines)
}

// readWorkerSample reads VmRSS from /proc/<pid>/status, counts
// /proc/<pid>/fd, and takes go_goroutines from /metrics.
func readWorkerSample(w *workerProc) (workerSample, error) {
	var s workerSample
	pid := w.cmd.Process.Pid
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for l := range strings.Lines(string(b)) {
		for _, f := range []struct {
			key string
			v   *int
		}{{"VmRSS:", &s.rssKB}, {"RssAnon:", &s.anonKB}, {"RssFile:", &s.fileKB}} {
			if v, ok := strings.CutPrefix(l, f.key); ok {
				if *f.v, err = strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB"))); err != nil {
					return s, fmt.Errorf("%s %q: %w", f.key, v, err)
				}
			}
		}
	}
	if s.rssKB == 0 {
		return s, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return s, err
	}
	s.fds = len(fds)
	_, body := w.get("/metrics")
	for l := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(l, "go_goroutines "); ok {
			g, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return s, fmt.Errorf("go_goroutines %q: %w", v, err)
			}
			s.goroutines = int(g)
			return s, nil
		}
	}
	return s, fmt.Errorf("no go_goroutines in /metrics")
}

func sampleWorker(t *testing.T, w *workerProc) workerSample {
	t.Helper()
	s, err := readWorkerSample(w)
	must(t, err)
	return s
}

// checkNoLeftovers fails the test when, once the calls are answered and
// torn down (within 30 s), the worker still has a child process, a work
// dir, or a mount (a work dir's tmpfs cap) under its work base.
func checkNoLeftovers(t *testing.T, w *workerProc, e *env) {
	t.Helper()
	pid := w.cmd.Process.Pid
	var left []string
	waitUntil(30*time.Second, func() bool {
		left = nil
		for _, p := range liveChildren(pid) {
			left = append(left, "child process "+p)
		}
		ents, err := os.ReadDir(e.work)
		if err != nil {
			left = append(left, err.Error())
		}
		for _, ent := range ents {
			left = append(left, "work dir "+ent.Name())
		}
		for _, m := range mountsUnder(t, e.work) { // the worker's mount namespace is ours
			left = append(left, "mount "+m)
		}
		return len(left) == 0
	})
	for _, l := range left {
		t.Errorf("left after the calls: %s", l)
	}
}

// checkNoErrorLogs fails the test when the worker logged an error, and
// prints those lines.
func checkNoErrorLogs(t *testing.T, w *workerProc) {
	t.Helper()
	var errs []string
	for l := range strings.Lines(w.log.String()) {
		if strings.Contains(l, `"level":"ERROR"`) {
			errs = append(errs, strings.TrimSpace(l))
		}
	}
	if len(errs) > 0 {
		t.Errorf("the worker logged %d errors:\n%s", len(errs), tail(strings.Join(errs, "\n"), 40))
	}
}

// waitUntil polls cond every 500 ms until it holds or within has passed,
// and says how long it waited.
func waitUntil(within time.Duration, cond func() bool) string {
	start := time.Now()
	for !cond() && time.Since(start) < within {
		time.Sleep(500 * time.Millisecond)
	}
	return "a settle period of " + time.Since(start).Round(100*time.Millisecond).String()
}

func waitUntilOK(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
