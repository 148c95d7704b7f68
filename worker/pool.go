package worker

// The warm pool: sandboxes created and started ahead of demand, each used
// for exactly one call.
//
// A pooled sandbox is an ordinary sandbox of the launcher (namespaces,
// mounts, cgroup, limits, seccomp: nothing about it is shared or
// reused) whose work dir is a fresh work area {SANDBOX_WORK_DIR}/.warm-<random>
// made by the launcher with the sandbox (capped in root mode; input/,
// output/, .str/ with the status FIFO; the tool's), exactly as a call's
// work dir is, and whose
// command is the runner in warm mode:
//
//	python3 runner.py --done-fd 4 --warm 3 MODULE FUNCTION CLASS_NAME
//
// It gets two pipes: descriptor 3, from which the runner reads the call's
// runner arguments (JSON, up to EOF), and descriptor 4, on which it writes
// "r" once the tool's module is imported and "d" once result.json is
// complete. So the runner, the tool's module (and asyncio for a coroutine
// tool) are loaded before any call arrives, and the runner blocks reading
// descriptor 3.
//
// The wall clock: a pooled sandbox waits unarmed. It is created with an
// idle limit (warmIdleLimit: STR_WARM_MAX_AGE_SECONDS plus a minute, a
// backstop: the pool recycles it at the max age) instead of a timeout;
// claim arms it (Sandbox.Arm, launcher.Box) with the call's own wall clock
// (task.sandboxTimeout: the request's timeout + 5 s, at most the
// profile's, computed once by choose), counted from the claim. So a call may ask
// the profile's whole limit and still be served warm, and it never gets
// more than a cold call of the same request. RLIMIT_CPU is not re-armed:
// the kernel counts it from the process's start, so the runner's and the
// module's import CPU is charged to the call, as a cold call's own import
// is; the runner then blocks in a read, so an ordinary module adds
// nothing while pooled. A module that burns CPU while pooled (a thread
// started at import) is held to the profile's cpu.max like any sandbox,
// only shortens its own call, and once it exhausts RLIMIT_CPU dies idle
// (discarded "died", with the backoff below).
//
// A call (executeWarm), in order: the manifest's sha256 is checked as for
// every call (execute, step 1); claim takes the oldest idle sandbox of the
// tool whose key (the whole manifest entry and the call's profile) matches,
// that is alive, younger than STR_WARM_MAX_AGE_SECONDS, whose module file
// is still the one it imported (device, inode, size, mtime and ctime
// unchanged since just before its start) and that accepts the call's
// wall clock (Arm fails for one whose idle limit ran out or that is being
// killed: it is discarded and the next one tried); otherwise the call is
// cold (a sandbox created for it, the ordinary path) and counted as a
// miss. Then the call's cancellation is armed (it kills the sandbox), the
// inputs are written through the descriptor of input/ the worker has held
// since it created it (the tool already runs and owns the work area, so
// no path inside it is trusted), the status FIFO is opened (O_NOFOLLOW,
// must be a FIFO), and the arguments are written on the pipe, never into
// a file. The rest is the cold path's: the reply as soon as result.json
// is complete and the outputs are stored, then the sandbox is killed,
// waited for and its work area removed. Only then does the pool refill
// (see Sizing).
//
// Sizing: a tool's manifest entry says warm: N (0..16), else
// STR_WARM_DEFAULT (default 0). N counts the tool's pooled sandboxes
// idle, being made and serving a call (warmSet.serving), so a claimed
// one is replaced once its call is over (its teardown done), not at the
// claim: a refill begun at the claim is a sandbox setup and a Python
// start running beside the call on the same CPUs, which the call waited
// for (echo_tool from a ready pool on 2 cores: p50 3.3-3.9 ms against
// 7.3-10.3 ms) and which saved no CPU. Calls beyond N at once run
// cold. STR_WARM_MEMORY bounds the pool: each pooled sandbox counts at
// its profile's cgroup memory limit, the most it may use at any time
// (its module runs code at import; a measured RSS would bound nothing),
// or at the whole budget when its profile sets no limit. A sandbox is
// counted from its creation until it is claimed or gone. Sets fill in the
// order of tool names.
//
// Lifecycle: the pool follows the manifest: a tool removed or changed in
// any way (a new key) has its idle sandboxes killed and, if it still
// wants some, refilled. Idle sandboxes older than the max age are
// replaced; one that dies idle is replaced after a backoff (1 s doubling
// to 60 s, reset once a new one is ready), so a module that crashes the
// interpreter at import cannot spin. On shutdown the pool stops filling,
// kills its idle sandboxes and waits for every one to be gone and its
// work area removed (stop, wait); work areas carry the work dir marker, so
// a crashed worker's are swept at the next start-up like any work dir.
// In root mode a work area is capped like a call's work dir: a tmpfs of
// the profile's work_dir size and inode count, mounted after the sandbox
// is created and unmounted when the area is removed.

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
)

// warmDirPrefix starts the name of every work area under SANDBOX_WORK_DIR.
const warmDirPrefix = ".warm-"

// Backoff after a pooled sandbox could not be made or died idle.
const (
	warmBackoffFirst = time.Second
	warmBackoffMax   = time.Minute
)

// warmTick is how often the pool looks for aged sandboxes and ended
// backoffs without being woken.
const warmTick = time.Second

// warmKey says which calls a pooled sandbox may serve: those of exactly
// this manifest entry (module, function, sha256, timeout, ... any change
// is a new key) with this profile.
type warmKey struct {
	tool    manifest.Tool // with Network nil: the policy is in network
	profile string
	network string // the tool's network policy as JSON ("" = the profile's)
}

// newWarmKey is the key of tool's sandboxes under profile: comparable
// with ==, and equal for equal manifest entries of different loads.
func newWarmKey(tool *manifest.Tool, profile string) warmKey {
	k := warmKey{tool: *tool, profile: profile}
	if tool.Network != nil {
		b, _ := json.Marshal(tool.Network)
		k.network = string(b)
	}
	k.tool.Network = nil
	return k
}

// networkPolicy is the key's network policy for a sandbox spec.
func (k warmKey) networkPolicy() *egress.Policy {
	if k.network == "" {
		return nil
	}
	var n egress.Policy
	if json.Unmarshal([]byte(k.network), &n) != nil {
		return &egress.Policy{Mode: egress.Isolated} // fail closed
	}
	return &n
}

type warmState int

const (
	warmIdle      warmState = iota // in its set's idle list
	warmClaimed                    // a call owns it (and releases it)
	warmDiscarded                  // killed unused; the pool releases it
)

// warmSandbox is one pooled sandbox.
type warmSandbox struct {
	key       warmKey
	set       *warmSet
	wd        *launcher.WorkDir // its work area, made by the launcher: removed by release
	dir       string            // wd.Path, bound read-write at the same path
	inputFd   int               // input/, held since the launcher made it
	run       *sandboxRun
	argsW     *os.File // the worker's end of the arguments pipe
	stderr    *tailBuffer
	createdAt time.Time
	source    fileID // the module file just before the sandbox started
	memory    int64  // what it counts against STR_WARM_MEMORY

	state warmState // guarded by warmPool.mu
	// Set by the call's cancellation (executeWarm).
	cancelled atomic.Bool
}

// release closes the worker's descriptors of w and removes its work
// area; the sandbox is gone.
func (w *warmSandbox) release(s *Server) {
	w.argsW.Close()
	if w.inputFd >= 0 {
		unix.Close(w.inputFd)
		w.inputFd = -1
	}
	if err := w.run.sb.Release(); err != nil {
		s.log.Error("removing a warm work area failed", "path", w.dir, "error", err)
	}
}

// warmSet is the pool of one tool.
type warmSet struct {
	name     string
	key      warmKey
	size     int   // sandboxes wanted
	memory   int64 // each one's share of the budget
	idle     []*warmSandbox
	filling  int
	serving  int // claimed sandboxes whose call has not ended (callEnded): replaced after it
	failures int
	retryAt  time.Time
}

// warmPool holds the sets. Its methods are no-ops on a nil pool (no
// sandboxes: SANDBOX_MODE=none or STR_WARM_MEMORY=0).
type warmPool struct {
	s      *Server
	ctx    context.Context // ends when the pool stops: kills what it created
	cancel context.CancelFunc

	mu       sync.Mutex
	sets     map[string]*warmSet
	held     int64
	started  bool
	stopped  bool
	kick     chan struct{}
	quit     chan struct{}
	loopDone chan struct{}
	wg       sync.WaitGroup // one per pooled sandbox until it is gone
}

func newWarmPool(s *Server) *warmPool {
	if s.cfg.SandboxMode == ModeNone || s.cfg.WarmMemory <= 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &warmPool{s: s, ctx: ctx, cancel: cancel, sets: map[string]*warmSet{},
		kick: make(chan struct{}, 1), quit: make(chan struct{}), loopDone: make(chan struct{})}
}

// start runs the filler.
func (p *warmPool) start() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.started || p.stopped {
		return
	}
	p.started = true
	go p.loop()
}

func (p *warmPool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// configure makes the sets follow manifest m: a tool whose key changed or
// that is gone has its idle sandboxes killed; new and changed tools that
// want sandboxes get a set, filled in the background.
func (p *warmPool) configure(m *manifest.Manifest) {
	if p == nil || m == nil {
		return
	}
	s := p.s
	// 1. what each tool wants, outside the lock.
	want := map[string]*warmSet{}
	for _, name := range m.Names() {
		tool := m.Tools[name]
		size := s.cfg.WarmDefault
		if tool.WarmSet {
			size = tool.Warm
		}
		if size == 0 || tool.Credentials != nil {
			// A tool with credentials is never pooled: a pooled sandbox's
			// environment is fixed before its call, and a placeholder is
			// the call's own.
			continue
		}
		profile := tool.SandboxProfile
		if profile == "" {
			profile = s.cfg.DefaultProfile
		}
		prof, err := s.profiles.Lookup(profile)
		if err != nil || s.toolProblem(tool) != nil {
			continue // logged by logToolProblems; calls are TOOL_NOT_AVAILABLE
		}
		set := &warmSet{name: name, key: newWarmKey(tool, profile), size: size, memory: int64(prof.Cgroup.Memory)}
		if set.memory <= 0 {
			set.memory = s.cfg.WarmMemory
		}
		want[name] = set
	}
	// 2. drop what changed or went, keep what did not.
	p.mu.Lock()
	var kill []*warmSandbox
	for name, old := range p.sets {
		if nw := want[name]; nw != nil && nw.key == old.key && nw.size == old.size {
			continue
		}
		kill = append(kill, p.discardAllLocked(old, "drained")...)
		delete(p.sets, name)
		p.dropGauges(name)
	}
	if !p.stopped {
		for name, nw := range want {
			if p.sets[name] == nil {
				p.sets[name] = nw
				p.gaugeLocked(nw)
			}
		}
	}
	p.mu.Unlock()
	for _, w := range kill {
		w.run.sb.Kill()
	}
	p.wake()
}

// gaugeLocked sets set's pool size and ready gauges from its idle list.
func (p *warmPool) gaugeLocked(set *warmSet) {
	ready := 0
	for _, w := range set.idle {
		select {
		case <-w.run.ready:
			ready++
		default:
		}
	}
	p.s.metrics.WarmSize.WithLabelValues(set.name).Set(float64(len(set.idle)))
	p.s.metrics.WarmReady.WithLabelValues(set.name).Set(float64(ready))
}

// dropGauges removes the pool size and ready gauges of a tool that no
// longer has a pool.
func (p *warmPool) dropGauges(name string) {
	p.s.metrics.WarmSize.DeleteLabelValues(name)
	p.s.metrics.WarmReady.DeleteLabelValues(name)
}

// discardAllLocked marks every idle sandbox of set discarded and returns
// them, to be killed without the lock.
func (p *warmPool) discardAllLocked(set *warmSet, reason string) []*warmSandbox {
	out := set.idle
	for _, w := range out {
		p.discardLocked(w, reason)
	}
	set.idle = nil
	return out
}

// discardLocked marks w (already out of its idle list) discarded.
func (p *warmPool) discardLocked(w *warmSandbox, reason string) {
	w.state = warmDiscarded
	p.held -= w.memory
	p.s.metrics.WarmDiscards.WithLabelValues(reason).Inc()
	p.s.metrics.WarmMemory.Set(float64(p.held))
}

// claim returns an idle sandbox that may serve t, or nil (the call goes
// cold). See the file comment for the conditions.
func (p *warmPool) claim(t *task) *warmSandbox {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	set := p.sets[t.req.ToolName]
	p.mu.Unlock()
	if set == nil {
		return nil // no pool for this tool: not a miss
	}
	// Outside the lock: the module file's identity now, and the call's
	// wall clock.
	source := sourceID(p.s.cfg.ToolsDir, t.tool)
	timeout := t.sandboxTimeout
	now := time.Now()

	p.mu.Lock()
	var got *warmSandbox
	var kill []*warmSandbox
	if cur := p.sets[t.req.ToolName]; cur != nil && cur.key == newWarmKey(t.tool, t.profile) {
		set = cur
		var keep []*warmSandbox
		for i, w := range set.idle {
			if got != nil {
				keep = append(keep, set.idle[i:]...)
				break
			}
			reason := ""
			select {
			case <-w.run.exited:
				reason = "died"
			default:
				switch {
				case now.Sub(w.createdAt) > p.s.cfg.WarmMaxAge:
					reason = "aged"
				case w.source != source:
					reason = "code_changed"
				default:
					// The call's wall clock, from now (replacing the idle
					// limit). A failure: the sandbox is ending.
					if err := w.run.sb.Arm(timeout); err != nil {
						t.log.Warn("a pooled sandbox could not take the call", "work_dir", w.dir, "error", err)
						reason = "died"
					}
				}
			}
			if reason != "" {
				p.discardLocked(w, reason)
				kill = append(kill, w)
				continue
			}
			w.state = warmClaimed
			p.held -= w.memory
			set.serving++
			got = w
		}
		set.idle = keep
		p.gaugeLocked(set)
		p.s.metrics.WarmMemory.Set(float64(p.held))
	}
	p.mu.Unlock()
	for _, w := range kill {
		w.run.sb.Kill()
	}
	p.wake()
	if got == nil {
		p.s.metrics.WarmMisses.WithLabelValues(t.req.ToolName).Inc()
		t.log.Debug("no pooled sandbox for this call: starting one (cold)")
		return nil
	}
	p.s.metrics.WarmHits.WithLabelValues(t.req.ToolName).Inc()
	t.log.Debug("served by a pooled sandbox", "work_dir", got.dir, "age_ms", now.Sub(got.createdAt).Milliseconds(), "timeout", timeout)
	return got
}

// callEnded: the call that claimed w is over (its sandbox gone, its work
// area removed); its set may replace it now.
func (p *warmPool) callEnded(w *warmSandbox) {
	p.mu.Lock()
	w.set.serving--
	p.mu.Unlock()
	p.wake()
}

// loop fills and recycles until stop.
func (p *warmPool) loop() {
	defer close(p.loopDone)
	tick := time.NewTicker(warmTick)
	defer tick.Stop()
	for {
		p.recycle()
		p.fill()
		select {
		case <-p.quit:
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// recycle kills idle sandboxes older than the max age (fill replaces
// them).
func (p *warmPool) recycle() {
	now := time.Now()
	var kill []*warmSandbox
	p.mu.Lock()
	for _, set := range p.sets {
		var keep []*warmSandbox
		for _, w := range set.idle {
			if now.Sub(w.createdAt) > p.s.cfg.WarmMaxAge {
				p.discardLocked(w, "aged")
				kill = append(kill, w)
			} else {
				keep = append(keep, w)
			}
		}
		if len(keep) != len(set.idle) {
			set.idle = keep
			p.gaugeLocked(set)
		}
	}
	p.mu.Unlock()
	for _, w := range kill {
		w.run.sb.Kill()
	}
}

// fill creates sandboxes, one at a time, while a set wants one, its
// backoff is over and the budget has room. Create and Start return once
// the sandbox's init runs; the runner's start and imports go on inside
// it while the next one is made.
func (p *warmPool) fill() {
	for {
		p.mu.Lock()
		set := p.nextLocked(time.Now())
		if set == nil {
			p.mu.Unlock()
			return
		}
		set.filling++
		p.held += set.memory
		p.s.metrics.WarmMemory.Set(float64(p.held))
		p.mu.Unlock()

		t0 := time.Now()
		w, err := p.s.newWarm(p.ctx, set)

		p.mu.Lock()
		set.filling--
		if err != nil {
			p.held -= set.memory
			p.s.metrics.WarmMemory.Set(float64(p.held))
			p.backoffLocked(set)
			p.mu.Unlock()
			p.s.log.Warn("warm pool: a sandbox could not be made", "tool", set.name, "profile", set.key.profile,
				"retry_in", time.Until(set.retryAt).Round(time.Millisecond), "error", err)
			continue
		}
		if p.stopped || p.sets[set.name] != set {
			p.discardLocked(w, "drained")
		} else {
			set.idle = append(set.idle, w)
			p.gaugeLocked(set)
		}
		discarded := w.state == warmDiscarded
		p.wg.Add(1)
		p.mu.Unlock()
		if discarded {
			w.run.sb.Kill()
		}
		go p.watch(w, t0)
	}
}

// nextLocked is the first set (by tool name) that wants a sandbox now and
// fits the budget.
func (p *warmPool) nextLocked(now time.Time) *warmSet {
	if p.stopped {
		return nil
	}
	names := make([]string, 0, len(p.sets))
	for name := range p.sets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		set := p.sets[name]
		if len(set.idle)+set.filling+set.serving >= set.size || now.Before(set.retryAt) {
			continue
		}
		if p.held+set.memory > p.s.cfg.WarmMemory {
			continue
		}
		return set
	}
	return nil
}

func (p *warmPool) backoffLocked(set *warmSet) {
	set.failures++
	d := warmBackoffFirst << min(set.failures-1, 10)
	set.retryAt = time.Now().Add(min(d, warmBackoffMax))
}

// watch follows one pooled sandbox until it is gone: its readiness (the
// refill time; a ready sandbox ends its set's backoff), then its end.
func (p *warmPool) watch(w *warmSandbox, t0 time.Time) {
	defer p.wg.Done()
	select {
	case <-w.run.ready:
		p.s.metrics.WarmRefill.Observe(w.run.readyAt.Sub(t0).Seconds())
		p.mu.Lock()
		w.set.failures = 0
		if p.sets[w.set.name] == w.set {
			p.gaugeLocked(w.set)
		}
		p.mu.Unlock()
	case <-w.run.exited:
	}
	<-w.run.exited
	p.onExit(w)
}

// onExit: a pooled sandbox is gone. An idle one died waiting (its module
// crashed the interpreter) or reached its idle limit (TimedOut: aged): it
// leaves the pool, which refills, after a backoff unless it merely aged.
// A claimed one belongs to its call, which releases it.
func (p *warmPool) onExit(w *warmSandbox) {
	p.mu.Lock()
	state := w.state
	if state == warmIdle {
		set := w.set
		for i, x := range set.idle {
			if x == w {
				set.idle = append(set.idle[:i:i], set.idle[i+1:]...)
				break
			}
		}
		reason := "died"
		if w.run.exit != nil && w.run.exit.TimedOut {
			reason = "aged"
		} else {
			p.backoffLocked(set)
		}
		p.discardLocked(w, reason)
		p.gaugeLocked(set)
		if reason == "died" {
			exitCode := -1
			if w.run.exit != nil {
				exitCode = w.run.exit.ExitCode
			}
			p.s.log.Warn("warm pool: a pooled sandbox died before any call", "tool", set.name, "exit_code", exitCode,
				"retry_in", time.Until(set.retryAt).Round(time.Millisecond), "stderr", w.stderr.String())
		}
	}
	p.mu.Unlock()
	if state != warmClaimed {
		w.release(p.s)
		p.wake()
	}
}

// stop ends filling and kills every idle sandbox; wait then returns once
// every pooled sandbox is gone and released. Calls that claimed one
// release it themselves (the server waits for them first).
func (p *warmPool) stop() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.stopped = true
	started := p.started
	var kill []*warmSandbox
	for name, set := range p.sets {
		kill = append(kill, p.discardAllLocked(set, "drained")...)
		p.dropGauges(name)
	}
	p.mu.Unlock()
	close(p.quit)
	if started {
		<-p.loopDone // a sandbox being made is discarded by fill
	}
	for _, w := range kill {
		w.run.sb.Kill()
	}
	// Not p.cancel() here: the pool's context is the launcher context of
	// every pooled sandbox, the ones already handed to a call included,
	// and a call runs on within the shutdown grace (its own cancellation
	// kills it, see claim). Cancelling here interrupted those calls,
	// answered CANCELLED "by a cancel request" (test/fleet's docker stop).
}

// wait waits for every pooled sandbox to be gone. It runs once the calls
// are answered (shutdown, step 4): cancelling the pool's context then
// only stops what is left.
func (p *warmPool) wait() {
	if p == nil {
		return
	}
	p.cancel()
	p.wg.Wait()
}

// sandboxTimeout is asked fitted to profile's timeout by
// launcher.FitTimeout, the one place that rule is (the sandboxes refuse
// more, they do not cap), for a sandbox no call chose (an init request's,
// the start-up probe's). A name the profiles do not know keeps asked:
// Create refuses it.
func (s *Server) sandboxTimeout(profile string, asked time.Duration) time.Duration {
	prof, err := s.profiles.Lookup(profile)
	if err != nil {
		return asked
	}
	return launcher.FitTimeout(prof, asked)
}

// warmIdleLimit is how long a pooled sandbox may wait unclaimed before
// its sandbox kills it: a backstop, a minute beyond the max age at which
// the pool recycles it itself.
func (s *Server) warmIdleLimit() time.Duration {
	return s.cfg.WarmMaxAge + time.Minute
}

// fileID identifies one version of a file: a write or a rename changes
// it (ctime).
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64
}

// sourceID is the identity of the tool's module file (zero when it
// cannot be found: then only another zero matches, and the call's own
// checks report the problem).
func sourceID(toolsDir string, tool *manifest.Tool) fileID {
	path, err := tool.SourcePath(toolsDir)
	if err != nil {
		return fileID{}
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}
	}
	return fileID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}
}

// newWarm makes one pooled sandbox of set: work area, pipes, sandbox
// created, work area filled and chowned, started. Everything is released
// on error.
func (s *Server) newWarm(ctx context.Context, set *warmSet) (_ *warmSandbox, err error) {
	tool := set.key.tool
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	// 1. the module file's identity, before the runner can read it.
	source := sourceID(s.cfg.ToolsDir, &tool)
	// 2. the arguments pipe (the tool's fd 3) and the done pipe (fd 4).
	argsR, argsW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("arguments pipe: %w", err)
	}
	undo = append(undo, func() { argsR.Close(); argsW.Close() })
	doneR, doneW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("done pipe: %w", err)
	}
	undo = append(undo, func() { doneR.Close(); doneW.Close() })
	// 3. the sandbox with its work area (made, capped in root mode,
	// filled and handed to the tool by the launcher, with its marker:
	// swept at start-up after a crash), created, not started.
	stderr := newTailBuffer(stderrTailBytes)
	// No timeout yet (0: the profile's is the most Arm may give): it
	// waits unarmed, up to its idle limit.
	spec := s.sandboxSpec(set.key.profile, warmDirPrefix, 0, stderr, set.key.networkPolicy(), &set.key.tool)
	spec.Idle = s.warmIdleLimit()
	spec.Argv = s.runnerArgv(4, "--warm", "3", tool.Module, tool.Function, tool.ClassName)
	spec.ExtraFiles = []*os.File{argsR, doneW}
	sb, err := s.sb.Create(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	wd := sb.WorkDir()
	dir := wd.Path
	undo = append(undo, func() { sb.Release() })
	killCreated := true
	undo = append(undo, func() {
		if killCreated {
			sb.Kill()
		}
	})
	// 4. input/ held open for the call's inputs (the tool owns its work
	// area by the time they come).
	inputFd, err := unix.Open(wd.Input, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", wd.Input, err)
	}
	undo = append(undo, func() { unix.Close(inputFd) })
	// 5. start; the sandbox holds its pipe ends now.
	createdAt := time.Now()
	killCreated = false // Start releases the sandbox itself when it fails
	err = sb.Start()
	argsR.Close()
	doneW.Close()
	if err != nil {
		return nil, fmt.Errorf("start: %w%s", err, stderrNote(stderr))
	}
	return &warmSandbox{key: set.key, set: set, wd: wd, dir: dir, inputFd: inputFd, run: watchSandbox(sb, doneR),
		argsW: argsW, stderr: stderr, createdAt: createdAt, source: source, memory: set.memory}, nil
}

// executeWarm runs t in the pooled sandbox w (claimed for it). The
// sandbox is killed and its work area removed by the returned teardown.
func (s *Server) executeWarm(t *task, w *warmSandbox) (outcome, func()) {
	run := w.run
	var relay *statusRelay
	var stopCancel func() bool
	teardown := func() {
		stopCancel()
		run.teardown()
		if relay != nil {
			relay.finish()
		}
		w.release(s)
		s.pool.callEnded(w)
	}
	fail := func(e *Error) (outcome, func()) { return s.errorOutcome(t, e), teardown }
	// 1. the call's cancellation (its wall clock was armed by claim: the
	// sandbox kills itself at it and reports TimedOut).
	stopCancel = context.AfterFunc(t.ctx, func() {
		// A result already complete, or a sandbox already gone, is not
		// stopped by the cancellation (and not marked cancelled).
		select {
		case <-run.done:
			return
		case <-run.exited:
			return
		default:
		}
		w.cancelled.Store(true)
		run.sb.Kill()
	})
	// 2. inputs, through the descriptor of input/ (worker-owned; the tool
	// may have moved things around in its work area).
	paths, meta, perr := s.writeInputs(t, w.dir, w.inputFd)
	if perr != nil {
		return fail(perr)
	}
	// 3. the status FIFO's read end.
	var err error
	relay, err = s.startStatusRelay(t, w.wd.StatusPipe)
	if err != nil {
		return fail(setupError(stageStatusPipe, err, nil))
	}
	// 4. the arguments, on the pipe the runner waits on (not a file in
	// the work area: the tool could have put anything at any path there).
	data, err := runner.EncodeArgs(s.runnerArgs(t, w.wd, paths, meta))
	if err != nil {
		return fail(setupError(stageRunnerArgs, err, nil))
	}
	go func() {
		// A runner still importing reads once it is done; one that died
		// fails the write (EPIPE), and awaitResult sees its end.
		w.argsW.Write(data)
		w.argsW.Close()
	}()
	// 5. the result.
	out := s.awaitResult(t, &execution{run: run, dir: w.dir, resultPath: w.wd.Result,
		relay: relay, stderr: w.stderr, cancelled: &w.cancelled})
	return out, teardown
}
