package worker

// The warm pool: sandboxes created and started ahead of demand, each used
// for exactly one call. Its policy (sizing, budget, claim, age, death and
// backoff, shutdown, the counts) is launcher/pool's, the one str serve's
// pre-built sandboxes follow too; this file has what is the worker's:
// what a pooled sandbox is, how a call is handed to it, and which sets
// the manifest asks for.
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
// "r" once the tool's module is imported (the item is ready) and "d" once
// result.json is complete. So the runner, the tool's module (and asyncio
// for a coroutine tool) are loaded before any call arrives, and the
// runner blocks reading descriptor 3.
//
// The wall clock: a pooled sandbox waits unarmed. It is created with an
// idle limit (warmIdleLimit: STR_WARM_MAX_AGE_SECONDS plus pool.Backstop,
// a backstop: the pool retires it at the max age) instead of a timeout;
// claim arms it (Sandbox.Arm, provider.Box) with the call's own wall clock
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
// (retired "died", with the pool's backoff).
//
// A call (executeWarm), in order: the manifest's sha256 is checked as for
// every call (execute, step 1); claim takes the pool's item for the tool
// whose key (the whole manifest entry and the call's profile) matches,
// alive and younger than STR_WARM_MAX_AGE_SECONDS (the pool's checks),
// whose module file is still the one it imported (device, inode, size,
// mtime and ctime unchanged since just before its start: else retired
// "code_changed") and that accepts the call's wall clock (Arm fails for
// one whose idle limit ran out or that is being killed: retired "died");
// otherwise the call is cold (a sandbox created for it, the ordinary
// path) and counted as a miss. Then the call's cancellation is armed (it
// kills the sandbox), the inputs are written through the descriptor of
// input/ the worker has held since it created it (the tool already runs
// and owns the work area, so no path inside it is trusted), the status
// FIFO is opened (O_NOFOLLOW, must be a FIFO), and the arguments are
// written on the pipe, never into a file. The rest is the cold path's:
// the reply as soon as result.json is complete and the outputs are
// stored, then the sandbox is killed, waited for and its work area
// removed. Only then does the pool refill (Claimed.Done).
//
// The sets: a tool's manifest entry says warm: N (0..16), else
// STR_WARM_DEFAULT (default 0); a tool with credentials is never pooled.
// STR_WARM_MEMORY is the pool's budget: each pooled sandbox costs its
// profile's cgroup memory limit, the most it may use at any time (its
// module runs code at import; a measured RSS would bound nothing), or
// the whole budget when its profile sets no limit. The sets follow the
// manifest (configure): a tool removed or changed in any way (a new key)
// has its idle sandboxes retired "drained" and, if it still wants some,
// refilled. Work areas carry the work dir marker, so a crashed worker's
// are swept at the next start-up like any work dir. In root mode a work
// area is capped like a call's work dir: a tmpfs of the profile's
// work_dir size and inode count, mounted after the sandbox is created
// and unmounted when the area is removed.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/pool"
	"github.com/securetoolruntime/str/launcher/workdir"
	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
)

// warmDirPrefix starts the name of every work area under SANDBOX_WORK_DIR.
const warmDirPrefix = ".warm-"

// codeChanged retires a pooled sandbox whose module file changed since
// it imported it.
const codeChanged pool.Reason = "code_changed"

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

// warmSandbox is one pooled sandbox: a pool.Item.
type warmSandbox struct {
	s         *Server
	wd        *workdir.Dir // its work area, made by the launcher: removed by Release
	dir       string       // wd.Path, bound read-write at the same path
	inputFd   int          // input/, held since the launcher made it
	run       *sandboxRun
	argsW     *os.File // the worker's end of the arguments pipe
	stderr    *tailBuffer
	createdAt time.Time
	source    fileID // the module file just before the sandbox started

	// Set by the call's cancellation (executeWarm).
	cancelled atomic.Bool
}

func (w *warmSandbox) Ready() <-chan struct{} { return w.run.ready }
func (w *warmSandbox) Ended() <-chan struct{} { return w.run.exited }
func (w *warmSandbox) Kill()                  { w.run.sb.Kill() }

// EndReason: Aged at its idle limit (TimedOut while unarmed), else it died.
func (w *warmSandbox) EndReason() pool.Reason {
	if w.run.exit != nil && w.run.exit.TimedOut {
		return pool.Aged
	}
	return pool.Died
}

// Release closes the worker's descriptors of w and removes its work
// area; the sandbox is gone.
func (w *warmSandbox) Release() {
	w.argsW.Close()
	if w.inputFd >= 0 {
		unix.Close(w.inputFd)
		w.inputFd = -1
	}
	if err := w.run.sb.Release(); err != nil {
		w.s.log.Error("removing a warm work area failed", "path", w.dir, "error", err)
	}
}

// warmClaim is a pooled sandbox a call took.
type warmClaim = pool.Claimed[warmKey, *warmSandbox]

// warmPool is the worker's pool. Its methods are no-ops on a nil pool
// (no sandboxes: SANDBOX_MODE=none or STR_WARM_MEMORY=0).
type warmPool struct {
	s *Server
	p *pool.Pool[warmKey, *warmSandbox]
}

func newWarmPool(s *Server) *warmPool {
	if s.cfg.SandboxMode == ModeNone || s.cfg.WarmMemory <= 0 {
		return nil
	}
	return &warmPool{s: s, p: pool.New(context.Background(), pool.Config[warmKey, *warmSandbox]{
		Build:   s.newWarm,
		MaxAge:  s.cfg.WarmMaxAge,
		Budget:  s.cfg.WarmMemory,
		Metrics: warmMetrics{s.metrics},
		Failed: func(name string, spec pool.Spec[warmKey], err error, retryIn time.Duration) {
			s.log.Warn("warm pool: a sandbox could not be made", "tool", name, "profile", spec.Key.profile,
				"retry_in", retryIn.Round(time.Millisecond), "error", err)
		},
		Died: func(name string, w *warmSandbox, retryIn time.Duration) {
			exitCode := -1
			if w.run.exit != nil {
				exitCode = w.run.exit.ExitCode
			}
			s.log.Warn("warm pool: a pooled sandbox died before any call", "tool", name, "exit_code", exitCode,
				"retry_in", retryIn.Round(time.Millisecond), "stderr", w.stderr.String())
		},
	})}
}

// start runs the filler.
func (p *warmPool) start() {
	if p != nil {
		p.p.Start()
	}
}

// configure makes the sets follow manifest m: one per tool that wants
// pooled sandboxes, keyed by its manifest entry and profile.
func (p *warmPool) configure(m *manifest.Manifest) {
	if p == nil || m == nil {
		return
	}
	s := p.s
	want := map[string]pool.Spec[warmKey]{}
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
		cost := int64(prof.Cgroup.Memory)
		if cost <= 0 {
			cost = s.cfg.WarmMemory
		}
		want[name] = pool.Spec[warmKey]{Key: newWarmKey(tool, profile), Size: size, Cost: cost}
	}
	p.p.Configure(want)
}

// claim returns a pooled sandbox that may serve t, or nil (the call goes
// cold). See the file comment for the conditions.
func (p *warmPool) claim(t *task) *warmClaim {
	if p == nil {
		return nil
	}
	// Outside the pool's lock: the module file's identity now.
	source := sourceID(p.s.cfg.ToolsDir, t.tool)
	timeout := t.sandboxTimeout
	c := p.p.Claim(t.req.ToolName, newWarmKey(t.tool, t.profile), func(w *warmSandbox) pool.Reason {
		if w.source != source {
			return codeChanged
		}
		// The call's wall clock, from now (replacing the idle limit). A
		// failure: the sandbox is ending.
		if err := w.run.sb.Arm(timeout); err != nil {
			t.log.Warn("a pooled sandbox could not take the call", "work_dir", w.dir, "error", err)
			return pool.Died
		}
		return ""
	})
	if c != nil {
		t.log.Debug("served by a pooled sandbox", "work_dir", c.Item.dir, "age_ms", time.Since(c.Item.createdAt).Milliseconds(), "timeout", timeout)
	}
	return c
}

// stop ends filling and kills every idle sandbox; wait then returns once
// every pooled sandbox is gone and released. Calls that claimed one
// release it themselves (the server waits for them first). The pool's
// context (every pooled sandbox's launcher context, the claimed ones'
// too) is cancelled by wait only: cancelling it at stop interrupted the
// calls running on within the shutdown grace, answered CANCELLED "by a
// cancel request" (test/fleet's docker stop).
func (p *warmPool) stop() {
	if p != nil {
		p.p.Stop()
	}
}

// wait waits for every pooled sandbox to be gone. It runs once the calls
// are answered (shutdown, step 4).
func (p *warmPool) wait() {
	if p != nil {
		p.p.Wait()
	}
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
// its sandbox kills it: a backstop, pool.Backstop beyond the max age at
// which the pool retires it itself.
func (s *Server) warmIdleLimit() time.Duration {
	return s.cfg.WarmMaxAge + pool.Backstop
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

// newWarm makes one pooled sandbox of the set spec (the pool's Build):
// work area, pipes, sandbox created, work area filled and chowned,
// started. Everything is released on error.
func (s *Server) newWarm(ctx context.Context, _ string, spec pool.Spec[warmKey]) (_ *warmSandbox, err error) {
	key := spec.Key
	tool := key.tool
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
	sbSpec := s.sandboxSpec(key.profile, warmDirPrefix, 0, stderr, key.networkPolicy(), &tool)
	sbSpec.Idle = s.warmIdleLimit()
	sbSpec.Argv = s.runnerArgv(4, "--warm", "3", tool.Module, tool.Function, tool.ClassName)
	sbSpec.ExtraFiles = []*os.File{argsR, doneW}
	sb, err := s.sb.Create(ctx, sbSpec)
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
	return &warmSandbox{s: s, wd: wd, dir: dir, inputFd: inputFd, run: watchSandbox(sb, doneR),
		argsW: argsW, stderr: stderr, createdAt: createdAt, source: source}, nil
}

// executeWarm runs t in the pooled sandbox c claimed for it. The
// sandbox is killed and its work area removed by the returned teardown;
// then the pool may replace it.
func (s *Server) executeWarm(t *task, c *warmClaim) (outcome, func()) {
	w := c.Item
	run := w.run
	var relay *statusRelay
	var stopCancel func() bool
	teardown := func() {
		stopCancel()
		run.teardown()
		if relay != nil {
			relay.finish()
		}
		w.Release()
		c.Done()
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
