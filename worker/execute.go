package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
)

// Bounds on what one execution may produce.
const (
	maxStatusLine  = 64 << 10 // longer status lines are truncated
	maxStatusLines = 10000    // further lines are read and dropped
	maxOutputFiles = 1000
	// The status relay's memory: lines read from the FIFO wait for their
	// publish in a queue of at most statusQueueBytes (line bytes); while
	// it is full the relay stops reading the FIFO, so the tool's status
	// writes block until the broker catches up (back-pressure, as the
	// reference's synchronous publish does). At most statusTaskBytes of
	// status text and maxStatusLines lines are published per task; the
	// rest is dropped. Drops are counted, logged and announced by one
	// last status line.
	statusQueueBytes = 1 << 20
	statusTaskBytes  = 16 << 20
	// stderrTailBytes is how much of the end of a sandbox's standard
	// error is kept for the worker's log.
	stderrTailBytes = 8 << 10
	// stderrAgentBytes is how much of that tail an error reply carries:
	// the tool writes it, so the agent gets only the last lines (enough
	// for a traceback's final exception), marked as the tool's own text.
	stderrAgentBytes = 300
)

// task is one accepted request.
type task struct {
	req     *Request
	who     requester // who asked (identity.go): the key of per-requester state
	tool    *manifest.Tool
	profile string
	clamped string        // "asked->used" when choose clamped the request's profile (PropProfileClamped)
	timeout time.Duration // effective tool timeout (without the 5 s slack)
	// sandboxTimeout is the sandbox's wall clock, cold (from its start)
	// or warm (armed at the claim): timeout + timeoutSlack within the
	// profile's, computed once (choose, or sandboxTimeout for an init).
	sandboxTimeout time.Duration
	replyTo        string
	statusTo       string
	received       time.Time
	delivery       *transport.Delivery
	log            *slog.Logger
	ctx            context.Context
	cancel         context.CancelCauseFunc
	// cancelAt is when a cancel message asked for the task's end, stored
	// before its context is cancelled (see cancelledBefore).
	cancelAt atomic.Pointer[time.Time]
	// mode is the runner's mode: "" (a call) or runner.ModeInit (a
	// class-based tool describing itself, init.go: its result is taken
	// as it is, nothing is saved).
	mode string
}

// outcome is what one execution ends with: a reply payload plus the
// metric labels.
type outcome struct {
	payload  []byte
	label    string // "success", "timeout" or the error code
	code     Code   // set for errors
	exitedAt time.Time
}

// runTask executes t and answers it: reply published, delivery acked,
// work dir removed, in that order.
func (s *Server) runTask(t *task) {
	s.idle.begin()
	defer s.idle.end()
	defer s.forget(t)
	defer t.cancel(nil)
	var out outcome
	var teardown func() // after the reply: the sandbox, its pipes, its work dir
	if s.stopping.Load() && t.ctx.Err() == nil && context.Cause(t.ctx) == nil {
		// Queued when the shutdown began: not started.
		out = s.errorOutcome(t, errorf(CodeResourceExhausted, "worker is shutting down; the request was not started"))
	} else if cause := context.Cause(t.ctx); cause != nil {
		out = s.errorOutcome(t, cancelledError(cause))
	} else if e := s.availableNow(t); e != nil {
		// Removed from the manifest or unreadable while queued (server.go).
		out = s.errorOutcome(t, e)
	} else {
		s.metrics.startRunning()
		out, teardown = s.execute(t)
		defer s.metrics.stopRunning()
	}
	// 1. the reply, retried while the task's deadline allows; one the
	// broker refuses is replaced by an error reply, so the agent does not
	// wait for nothing. Either way the invocation counts as a failure.
	// A reply that never reaches the broker is lost: the agent gets no
	// answer, which the log and str_worker_replies_lost_total say.
	if err := s.publishReply(t, out.payload); err != nil {
		t.log.Error("publishing the reply failed", "reply_to", t.replyTo, "reply_bytes", len(out.payload),
			"outcome_not_delivered", out.label, "error", err)
		lost := err
		if errors.Is(err, transport.ErrRefused) {
			e := errorf(CodeInternalError, "the worker could not deliver the reply (%d bytes): %v", len(out.payload), err)
			if lost = s.publishReply(t, EncodeError(t.req.ID, e)); lost != nil {
				t.log.Error("publishing the fallback error reply failed", "reply_to", t.replyTo, "error", lost)
			}
		}
		if lost != nil {
			s.metrics.RepliesLost.Inc()
			t.log.Error("reply lost: the agent got no answer", "reply_to", t.replyTo, "outcome_not_delivered", out.label, "error", lost)
		}
		out.label, out.code = outcomeReplyFailed, ""
	}
	// 2. metrics and the log line of the invocation.
	s.metrics.Invocations.WithLabelValues(t.req.ToolName, out.label).Inc()
	if out.code != "" {
		s.metrics.Errors.WithLabelValues(string(out.code)).Inc()
	}
	if out.label == "timeout" {
		s.metrics.Timeouts.WithLabelValues(t.req.ToolName).Inc()
	}
	if !out.exitedAt.IsZero() {
		s.metrics.ExecutionTime.WithLabelValues(t.req.ToolName).Observe(out.exitedAt.Sub(t.received).Seconds())
	}
	t.log.Info("invocation answered", "outcome", out.label)
	// 3. settle the message only now (guaranteed delivery redelivers
	// requests whose worker died before answering).
	ack(t.log, t.delivery)
	// 4. only now the sandbox (killed if still there: its result is
	// taken), its pipes and the work dir.
	if teardown != nil {
		teardown()
	}
}

// execute runs the steps of spec §7 for one task in a sandbox of the warm
// pool when one fits (executeWarm, pool.go), else in a new one. It
// returns the outcome as soon as the result is complete (the runner's
// done signal) and the outputs are stored, and the teardown to run after
// the reply: kill what is left of the sandbox, wait until it is gone,
// close its pipes, remove the work dir.
func (s *Server) execute(t *task) (outcome, func()) {
	// 1. the tool's code is what the manifest pinned (checked again for
	// every call, also one a pooled sandbox serves: the code may have
	// changed on disk since the pool imported it). Its declared package
	// was installed at start-up or reload (availableNow checked it).
	if err := t.tool.Verify(s.cfg.ToolsDir); err != nil {
		return s.errorOutcome(t, errorf(CodeImportError, "tool %s cannot be loaded: %v", t.req.ToolName, err)), nil
	}
	// 2. the tool's template (`warm: template`), where the call may run
	// in one; else a pre-started sandbox of the pool, if one fits.
	if s.templateEligible(t) {
		if out, teardown, ok := s.executeTemplate(t); ok {
			return out, teardown
		}
	} else if t.tool.Template {
		s.metrics.TemplateFallbacks.WithLabelValues(fallbackNotEligible).Inc()
	}
	if w := s.pool.claim(t); w != nil {
		return s.executeWarm(t, w)
	}
	return s.executeCold(t)
}

// runnerArgv is the runner's command line in a sandbox that gets its done
// pipe as descriptor doneFD (none in SANDBOX_MODE=none, where the tool is
// a plain process: doneFD < 0), as runner.Command builds it (python -S).
func (s *Server) runnerArgv(doneFD int, rest ...string) []string {
	if doneFD >= 0 {
		rest = append([]string{"--done-fd", strconv.Itoa(doneFD)}, rest...)
	}
	return runner.Command(s.cfg.PythonBin, s.runnerPath, rest...)
}

// sandboxSpec is what every sandbox of a call of tool has in common: the
// profile, PYTHONPATH, where its work dir is made, the read-only binds.
// The import path is the tools dir and, if the tool declares a package
// installed by the worker, that package's own site dir: no other
// package's (so none can shadow its modules), and never the whole site dir.
func (s *Server) sandboxSpec(profile, prefix string, timeout time.Duration, stderr io.Writer, network *egress.Policy, tool *manifest.Tool) SandboxSpec {
	path := []string{s.cfg.ToolsDir}
	ro := []string{s.cfg.ToolsDir, filepath.Dir(s.runnerPath)}
	if site := s.packageDir(tool); site != "" {
		path = append(path, site)
		ro = append(ro, site)
	}
	return SandboxSpec{
		Profile:  profile,
		Network:  network,
		Env:      []string{"PYTHONPATH=" + strings.Join(path, ":")},
		WorkDir:  workdir.Spec{Base: s.cfg.WorkDir, Prefix: prefix},
		ReadOnly: ro,
		Timeout:  timeout,
		Stderr:   stderr,
	}
}

// runnerArgsArg is the runner's arguments file as its argv names it:
// relative to the work dir (its cwd), which does not exist yet.
var runnerArgsArg = filepath.Join(workdir.RunnerDirName, workdir.RunnerArgsName)

// executeCold runs t in a sandbox created for it. The launcher makes the
// work dir with the sandbox (capped, filled, the tool's); the worker
// writes the inputs and the runner's arguments, then starts it. A
// sandbox created but not started is released on every path.
func (s *Server) executeCold(t *task) (outcome, func()) {
	// 2. the done pipe (the runner's "result complete", descriptor 3 in
	// the sandbox) and the sandbox with its work dir, created (plan,
	// cgroup, its host ids, the work dir under a name the launcher
	// generates, never the task id) but not started.
	stderr := newTailBuffer(stderrTailBytes)
	spec := s.sandboxSpec(t.profile, callDirPrefix, t.sandboxTimeout, stderr, t.tool.Network, t.tool)
	var doneR, doneW *os.File
	var err error
	// The tool's credentials, read for this call (a changed secret file
	// is this call's value) with placeholders of its own.
	if spec.Credentials, err = t.tool.Credentials.Secrets(os.Getenv); err != nil {
		return s.errorOutcome(t, setupError(stageCredentials, err, nil)), nil
	}
	if s.cfg.SandboxMode != ModeNone {
		if doneR, doneW, err = os.Pipe(); err != nil {
			return s.errorOutcome(t, setupError(stageDonePipe, err, nil)), nil
		}
		spec.ExtraFiles = []*os.File{doneW}
		spec.Argv = s.runnerArgv(3, runnerArgsArg)
	} else {
		spec.Argv = s.runnerArgv(-1, runnerArgsArg)
	}
	closePipes := func() {
		if doneR != nil {
			doneR.Close()
			doneW.Close()
		}
	}
	sb, err := s.sb.Create(t.ctx, spec)
	if err != nil {
		closePipes()
		if cause := context.Cause(t.ctx); cause != nil {
			return s.errorOutcome(t, cancelledError(cause)), nil
		}
		if errors.Is(err, launcher.ErrRuntimeUnavailable) {
			// The tool's runtime class cannot run this call here
			// (launcher/provider: e.g. what the class does not run yet).
			t.log.Error("tool cannot run under its runtime class here", "error", err)
			return s.errorOutcome(t, notHereError(t.req.ToolName, err)), nil
		}
		if errors.Is(err, ErrInvalidSandboxRequest) {
			// Everything of the call's that reaches the sandbox (its
			// profile, its timeout) was checked at dispatch, so a refusal
			// now is the worker's side: a bind source (the tools, runner
			// or site dir) gone, e.g. the tools dir removed after
			// availableNow looked. Never INVALID_REQUEST.
			if perr := s.toolProblem(t.tool); perr != nil {
				t.log.Error("tool cannot work on this worker", "error", perr)
				return s.errorOutcome(t, notHereError(t.req.ToolName, perr)), nil
			}
			return s.errorOutcome(t, errorf(CodeSandboxFailed, "sandbox setup failed at step %q (the worker's configuration): %v", stageCreate, err)), nil
		}
		if isNoSpace(err) {
			// the work dir could not be made (the host's disk).
			s.noteWorkDirFault(err)
			return s.errorOutcome(t, setupError("", err, nil)), nil
		}
		return s.errorOutcome(t, setupError(stageCreate, err, nil)), nil
	}
	wd := sb.WorkDir()
	dir := wd.Path
	// Its name says nothing of the task: this line ties them together.
	t.log = t.log.With("work_dir", filepath.Base(dir))
	t.log.Info("work dir made", "path", dir)
	removeDir := func() {
		if err := sb.Release(); err != nil {
			t.log.Error("removing the work dir failed", "path", dir, "error", err)
		}
	}
	fail := func(e *Error) (outcome, func()) { return s.errorOutcome(t, e), removeDir }
	started := false
	defer func() {
		if !started {
			sb.Kill()
			closePipes()
		}
	}()
	// 3. inputs.
	paths, meta, perr := s.writeInputs(t, wd.Path, -1)
	if perr != nil {
		return fail(perr)
	}
	// 4. runner_args.json, on the runner dir (off the work dir's cap).
	err = runner.WriteArgs(wd.Args, s.runnerArgs(t, wd, paths, meta))
	if err != nil {
		if isNoSpace(err) {
			s.noteWorkDirFileFault(err)
		}
		return fail(setupError(stageRunnerArgs, err, nil))
	}
	// 5. the FIFO's read end, before the tool starts: the tool's blocking
	// open would hang otherwise. A write end held by the worker keeps the
	// reader from seeing EOF when the tool closes it between lines.
	relay, err := s.startStatusRelay(t, wd.StatusPipe)
	if err != nil {
		return fail(setupError(stageStatusPipe, err, nil))
	}
	// 6. start; the sandbox holds its end of the done pipe now.
	started = true // Start releases the sandbox itself when it fails
	err = sb.Start()
	if doneW != nil {
		doneW.Close()
	}
	if err != nil {
		relay.finish()
		if doneR != nil {
			doneR.Close()
		}
		if cause := context.Cause(t.ctx); cause != nil {
			return fail(cancelledError(cause))
		}
		return fail(setupError(stageStart, err, stderr))
	}
	run := watchSandbox(sb, doneR)
	// 7. the result, as soon as it is complete.
	out := s.awaitResult(t, &execution{run: run, dir: dir, resultPath: wd.Result, relay: relay, stderr: stderr})
	return out, func() {
		run.teardown()
		s.observeSetupTime(run)
		relay.finish()
		removeDir()
	}
}

// observeSetupTime records a cold call's sandbox setup time, once the
// sandbox is gone: the launcher's figure (SandboxExit.SetupTime, its
// phases before the run plus the init's), the only one; the worker does
// not time the setup itself. A pooled sandbox's setup is not on its
// call's path and is not recorded; 0 (a host process: SANDBOX_MODE=none)
// is unknown and not recorded either.
func (s *Server) observeSetupTime(run *sandboxRun) {
	if run.exit != nil && run.exit.SetupTime > 0 {
		s.metrics.SetupTime.Observe(run.exit.SetupTime.Seconds())
	}
}

// runnerArgs is runner_args.json (spec §7.3) of t in work dir wd.
func (s *Server) runnerArgs(t *task, wd *workdir.Dir, paths map[string]string, meta map[string]runner.ArtifactMeta) *runner.Args {
	return &runner.Args{
		Module: t.tool.Module, Function: t.tool.Function, ClassName: t.tool.ClassName,
		Args: t.req.Args, ToolConfig: t.req.ToolConfig,
		ArtifactPaths: paths, ArtifactMetadata: meta,
		StatusPipe: wd.StatusPipe, ResultFile: wd.Result, OutputDir: wd.Output,
		UserID: t.req.UserID, SessionID: t.req.SessionID, AppName: t.req.AppName,
		Mode: t.mode,
	}
}

// execution is one started sandbox of a call as awaitResult sees it.
type execution struct {
	run        *sandboxRun
	dir        string
	resultPath string
	relay      *statusRelay
	stderr     *tailBuffer
	// warm: the worker's own cancellation of a pooled sandbox (its
	// launcher context is the pool's, not the call's).
	cancelled *atomic.Bool
}

// awaitResult waits for the runner's done signal or the sandbox's end,
// whichever comes first. On the signal the status lines written so far
// are relayed and result.json is read while the sandbox may still be
// exiting (reply before teardown); a result that cannot be read then
// (a tool can write on the descriptor too) falls back to waiting for the
// end, as without the signal.
func (s *Server) awaitResult(t *task, x *execution) outcome {
	run := x.run
	select {
	case <-run.done:
	case <-run.exited:
	}
	// Both may have happened by now: a result the runner said is complete
	// is taken as such whichever the select saw first (a cancellation
	// that came after it must not turn it into CANCELLED).
	if run.doneBeforeEnd() {
		doneAt := time.Now()
		x.relay.drain()
		if out, ok := s.classifyDone(t, x, doneAt.Sub(t.received)); ok {
			out.exitedAt = doneAt
			if out.label == "success" {
				t.log.Info("tool finished", "execution_ms", doneAt.Sub(t.received).Milliseconds(), "before_exit", true)
			}
			return out
		}
		t.log.Warn("done signal without a readable result: waiting for the sandbox's end")
		<-run.exited
	}
	exitedAt := time.Now()
	// the sandbox is gone: relay what its status FIFO holds.
	x.relay.finish()
	if run.waitErr != nil {
		return s.errorOutcome(t, errorf(CodeSandboxFailed, "waiting for the sandbox: %v%s", run.waitErr, stderrNote(x.stderr)))
	}
	exit := *run.exit
	if x.cancelled != nil && x.cancelled.Load() {
		exit.Cancelled = true
	}
	out := s.classify(t, run.sb, &exit, x.dir, x.resultPath, exitedAt.Sub(t.received), x.stderr)
	out.exitedAt = exitedAt
	if out.label == "success" || out.label == "timeout" {
		// execution_time_ms runs from receipt to the tool's exit.
		t.log.Info("tool finished", "execution_ms", exitedAt.Sub(t.received).Milliseconds(),
			"exit_code", exit.ExitCode, "timed_out", exit.TimedOut)
		if tail := x.stderr.String(); tail != "" {
			t.log.Debug("sandbox stderr", "stderr", tail)
		}
	} else if tail := x.stderr.String(); tail != "" {
		// the reply carries only the last stderrAgentBytes bytes.
		t.log.Warn("sandbox stderr", "stderr", tail)
	}
	return out
}

// warnUncappedWorkDirs says, once at start-up, when work dirs are not
// capped: a rootless worker cannot mount on the host, so each is a plain
// bind of a host directory whose size and file count only the host
// filesystem bounds.
func (s *Server) warnUncappedWorkDirs() {
	if s.cfg.SandboxMode == ModeNone || s.sb.CapsWorkDirs() {
		return
	}
	s.log.Warn("WORK DIRS ARE NOT CAPPED: the worker is not root (rootless), so the launcher cannot mount "+
		"a size- and inode-capped tmpfs per task; each work dir is a plain bind of a directory under SANDBOX_WORK_DIR and a tool can fill "+
		"that filesystem (bytes and inodes) for every other task. Put SANDBOX_WORK_DIR on a filesystem of its own (or with quotas), or run the worker as root",
		"work_dir", s.cfg.WorkDir)
}
