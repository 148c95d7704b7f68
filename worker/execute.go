package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"
	"golang.org/x/text/unicode/norm"

	"github.com/securetoolruntime/str/worker/artifacts"
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

// publishEnvelopeRoom is what a reply leaves of the transport's
// MaxMessageBytes for its topic, its user properties and the transport's
// framing (the dev broker's PUBLISH command around it); see maxReplyBytes.
const publishEnvelopeRoom = 64 << 10

// maxReplyBytes is the largest reply payload: the transport's message
// limit (its broker's, reported by the transport) less
// publishEnvelopeRoom. result.json gets the same cap; the encoded reply
// (tool_result plus execution time and created_artifacts) is checked
// again before it is published.
func (s *Server) maxReplyBytes() int { return s.tr.MaxMessageBytes() - publishEnvelopeRoom }

// Reply publishing: a reply is retried (backoff from replyRetryFirst up to
// replyRetryMax between attempts) until the task's deadline (receipt +
// timeout + 5 s) and for at least replyRetryWindow. Once the worker is
// stopping, a reply gets two attempts, so that a dead broker cannot hold a
// shutdown for the deadline of every queued request; and an attempt still
// waiting for the broker replyShutdownWindow after the grace period is
// abandoned (the reply is reported lost).
var (
	replyRetryWindow    = 30 * time.Second
	replyRetryFirst     = 100 * time.Millisecond
	replyRetryMax       = 5 * time.Second
	replyShutdownWindow = 5 * time.Second
)

// outcomeReplyFailed is the outcome label of an invocation whose reply
// could not be published.
const outcomeReplyFailed = "reply_failed"

// task is one accepted request.
type task struct {
	req      *Request
	who      requester // who asked (identity.go): the key of per-requester state
	tool     *manifest.Tool
	profile  string
	clamped  string        // "asked->used" when choose clamped the request's profile (PropProfileClamped)
	timeout  time.Duration // effective tool timeout (without the 5 s slack)
	replyTo  string
	statusTo string
	received time.Time
	delivery *transport.Delivery
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelCauseFunc
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

// errorOutcome is the error reply of t: the log keeps the message as it
// is, the agent reads it with the worker's host paths replaced
// (agentpaths.go; the call's generated work dir is one level under the work base).
func (s *Server) errorOutcome(t *task, e *Error) outcome {
	t.log.Warn("invocation failed", "code", e.Code, "error", e.Message)
	shown := &Error{Code: e.Code, Message: s.forAgent(e.Message, ""), Data: e.Data}
	return outcome{payload: EncodeError(t.req.ID, shown), label: string(e.Code), code: e.Code}
}

func cancelledError(cause error) *Error {
	if errors.Is(cause, errShutdown) {
		return errorf(CodeCancelled, "the tool was stopped: worker shutting down and the grace period is over")
	}
	return errorf(CodeCancelled, "the tool was cancelled by a cancel request")
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
	// 2. a pre-started sandbox of the pool, if one fits this call.
	if w := s.pool.claim(t); w != nil {
		return s.executeWarm(t, w)
	}
	return s.executeCold(t)
}

// runnerArgv is the runner's command line in a sandbox that gets its done
// pipe as descriptor doneFD (none in SANDBOX_MODE=none, where the tool is
// a plain process: doneFD < 0).
func (s *Server) runnerArgv(doneFD int, rest ...string) []string {
	argv := []string{s.cfg.PythonBin, s.runnerPath}
	if doneFD >= 0 {
		argv = append(argv, "--done-fd", strconv.Itoa(doneFD))
	}
	return append(argv, rest...)
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
		WorkDir:  launcher.WorkDirSpec{Base: s.cfg.WorkDir, Prefix: prefix},
		ReadOnly: ro,
		Timeout:  timeout,
		Stderr:   stderr,
	}
}

// runnerArgsArg is the runner's arguments file as its argv names it:
// relative to the work dir (its cwd), which does not exist yet.
var runnerArgsArg = filepath.Join(launcher.RunnerDirName, launcher.RunnerArgsName)

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
	spec := s.sandboxSpec(t.profile, callDirPrefix, s.callTimeout(t), stderr, t.tool.Network, t.tool)
	var doneR, doneW *os.File
	var err error
	if s.cfg.SandboxMode != ModeNone {
		if doneR, doneW, err = os.Pipe(); err != nil {
			return s.errorOutcome(t, errorf(CodeSandboxFailed, "sandbox setup failed at step \"done pipe\": %v", err)), nil
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
		if errors.Is(err, ErrInvalidSandboxRequest) {
			// Everything of the call's that reaches the sandbox (its
			// profile, its timeout) was checked at dispatch, so a refusal
			// now is the worker's side: a bind source (the tools, runner
			// or site dir) gone, e.g. the tools dir removed after
			// availableNow looked. Never INVALID_REQUEST.
			if perr := s.toolProblem(t.tool); perr != nil {
				t.log.Error("tool cannot work on this worker", "error", perr)
				return s.errorOutcome(t, errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker: it cannot be loaded here (the worker log says why)", truncateName(t.req.ToolName))), nil
			}
			return s.errorOutcome(t, errorf(CodeSandboxFailed, "sandbox setup failed at step \"create\" (the worker's configuration): %v", err)), nil
		}
		if isNoSpace(err) {
			// the work dir could not be made (the host's disk).
			s.noteWorkDirFault(err)
			return s.errorOutcome(t, workDirError(err)), nil
		}
		return s.errorOutcome(t, errorf(CodeSandboxFailed, "sandbox setup failed at step \"create\": %v", err)), nil
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
			return fail(errorf(CodeResourceExhausted, "no disk space for the work dir: runner arguments: %v", err))
		}
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"runner arguments\": %v", err))
	}
	// 5. the FIFO's read end, before the tool starts: the tool's blocking
	// open would hang otherwise. A write end held by the worker keeps the
	// reader from seeing EOF when the tool closes it between lines.
	relay, err := s.startStatusRelay(t, wd.StatusPipe)
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"status pipe\": %v", err))
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
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"start\": %v%s", err, stderrNote(stderr)))
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
func (s *Server) runnerArgs(t *task, wd *launcher.WorkDir, paths map[string]string, meta map[string]runner.ArtifactMeta) *runner.Args {
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
	select {
	case <-run.done:
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
	default:
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

// classifyDone is classify for a sandbox that may still be running: its
// runner said result.json is complete. ok is false when the result cannot
// be read (then the caller waits for the sandbox's end and classifies
// that). The call is CANCELLED only when its cancellation was asked
// before the runner's signal: a result complete before it is the reply.
func (s *Server) classifyDone(t *task, x *execution, elapsed time.Duration) (outcome, bool) {
	if s.cancelledBefore(t, x.run.doneAt) {
		return s.errorOutcome(t, cancelledError(context.Cause(t.ctx))), true
	}
	if out, ok := s.resultTooLarge(t, x.resultPath); ok {
		return out, true
	}
	res, err := runner.ReadResult(x.resultPath, int64(s.maxReplyBytes()))
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) && strings.Contains(se.Error(), "max depth") {
			return s.errorOutcome(t, errorf(CodeToolError, "the tool's result is nested too deeply (more than %d levels): %v", MaxResultDepth, err)), true
		}
		return outcome{}, false
	}
	return s.resultOutcome(t, res, x.dir, elapsed, x.run.sb.NetworkReport()), true
}

// workDirError is the reply for a work dir that could not be made.
func workDirError(err error) *Error {
	if isNoSpace(err) {
		return errorf(CodeResourceExhausted, "no disk space for the work dir: %v", err)
	}
	return errorf(CodeSandboxFailed, "sandbox setup failed at step \"work dir\": %v", err)
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

// stderrNote is the end of the sandbox's stderr as an error message's
// suffix ("" when there was none): at most stderrAgentBytes bytes, after
// a marker line saying that what follows is the tool's output, not the
// worker's. The message ends there; the log keeps the longer tail.
func stderrNote(b *tailBuffer) string {
	tail, cut := b.tail(stderrAgentBytes)
	if tail == "" {
		return ""
	}
	if cut {
		return fmt.Sprintf("\n--- tool stderr (last %d bytes) ---\n%s", stderrAgentBytes, tail)
	}
	return "\n--- tool stderr ---\n" + tail
}

// classify turns the sandbox's end and the result file into the reply.
// Every SANDBOX_FAILED message ends with the tail of the sandbox's stderr
// (the runner's traceback, the interpreter's complaint, a setup error).
func (s *Server) classify(t *task, sb Sandbox, exit *SandboxExit, dir, resultPath string, elapsed time.Duration, stderr *tailBuffer) outcome {
	fail := func(e *Error) outcome { return s.errorOutcome(t, e) }
	switch {
	case exit.SetupError != nil:
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed: %v%s", exit.SetupError, stderrNote(stderr)))
	case exit.Cancelled:
		// Stopped by the cancellation while it ran. One asked after the
		// tool had ended on its own does not count: its result (below)
		// is the reply; without a result, it is CANCELLED (see there).
		cause := context.Cause(t.ctx)
		if cause == nil {
			cause = errCancelRequested
		}
		return fail(cancelledError(cause))
	case exit.TimedOut:
		return outcome{payload: EncodeTimeout(t.req.ID, elapsed), label: "timeout"}
	case exit.OOMKilled:
		return fail(errorf(CodeSandboxFailed, "the tool was killed: out of memory (the profile %s memory limit)%s", t.profile, stderrNote(stderr)))
	case exit.KilledForViolation:
		net := sb.NetworkReport()
		s.countViolations(t, net)
		return fail(errorf(CodeSandboxFailed, "the tool was killed: it broke the network policy (on_violation: kill)\n%s", net.Summary))
	}
	if out, ok := s.resultTooLarge(t, resultPath); ok {
		return out
	}
	res, err := runner.ReadResult(resultPath, int64(s.maxReplyBytes()))
	if err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) && strings.Contains(se.Error(), "max depth") {
			return fail(errorf(CodeToolError, "the tool's result is nested too deeply (more than %d levels): %v", MaxResultDepth, err))
		}
		how := fmt.Sprintf("exit code %d", exit.ExitCode)
		if exit.Signal != 0 {
			how = "killed by " + exit.SignalName
			if exit.SignalName == "" {
				how = fmt.Sprintf("killed by signal %d", exit.Signal)
			}
		}
		if exit.PidsLimit {
			return fail(errorf(CodeSandboxFailed, "the tool died (%s): process limit of profile %s reached%s", how, t.profile, stderrNote(stderr)))
		}
		if cause := context.Cause(t.ctx); cause != nil {
			return fail(cancelledError(cause))
		}
		if errors.Is(err, runner.ErrNoResult) {
			return fail(errorf(CodeSandboxFailed, "the tool died without a result (%s)%s", how, stderrNote(stderr)))
		}
		return fail(errorf(CodeSandboxFailed, "unusable result (%s): %v%s", how, err, stderrNote(stderr)))
	}
	return s.resultOutcome(t, res, dir, elapsed, sb.NetworkReport())
}

// resultTooLarge is the reply for a result.json too large to send (the
// tool's fault, not the sandbox's); ok is false when it is not.
func (s *Server) resultTooLarge(t *task, resultPath string) (outcome, bool) {
	if fi, err := os.Lstat(resultPath); err == nil && fi.Mode().IsRegular() && fi.Size() > int64(s.maxReplyBytes()) {
		return s.errorOutcome(t, errorf(CodeToolError, "the tool's result is too large: result.json has %d bytes, the limit is %d (the broker's message limit less the reply envelope)", fi.Size(), s.maxReplyBytes())), true
	}
	return outcome{}, false
}

// resultOutcome turns a readable result into the reply: the tool's error,
// or its result cleaned and normalised plus the stored outputs.
func (s *Server) resultOutcome(t *task, res *runner.Outcome, dir string, elapsed time.Duration, net NetworkReport) outcome {
	s.countViolations(t, net)
	fail := func(e *Error) outcome { return s.errorOutcome(t, e) }
	if res.Error != "" || res.Result == nil {
		switch res.ErrorKind {
		case runner.KindImport:
			return fail(errorf(CodeImportError, "%s", res.Error))
		case runner.KindTool:
			return fail(errorf(CodeToolError, "%s", res.Error))
		default:
			return fail(errorf(CodeExecutionError, "%s", res.Error))
		}
	}
	if t.mode == runner.ModeInit {
		// The tool's description of itself (runner.InitInfo), checked
		// and mapped onto a reply by init.go; no output is saved.
		return outcome{payload: res.Result, label: "success"}
	}
	// The result must be something every agent can parse: bounded
	// nesting, valid UTF-8 (the broker refuses anything else).
	cleaned, fixes, err := CleanToolResult(res.Result)
	if err != nil {
		return fail(errorf(CodeToolError, "%v", err))
	}
	if fixes > 0 {
		t.log.Warn("the tool's result had invalid UTF-8 or unpaired surrogates: replaced with U+FFFD", "replacements", fixes)
	}
	toolResult, err := NormalizeToolResult(cleaned)
	if err != nil {
		return fail(errorf(CodeExecutionError, "%v", err))
	}
	created, skipped, aerr := s.saveOutputs(t, dir, res.OutputMimeTypes)
	if aerr != nil {
		return fail(aerr)
	}
	payload := EncodeResult(t.req.ID, toolResult, elapsed, created, skipped, net)
	if max := s.maxReplyBytes(); len(payload) > max {
		return fail(errorf(CodeToolError, "the tool's result is too large: the reply would have %d bytes, the limit is %d (the broker's message limit less the publish envelope)", len(payload), max))
	}
	return outcome{payload: payload, label: "success"}
}

// countViolations logs and counts what the call's network policy denied.
func (s *Server) countViolations(t *task, net NetworkReport) {
	if len(net.Violations) == 0 {
		return
	}
	for _, v := range net.Violations {
		s.metrics.NetworkViolations.WithLabelValues(v.Kind, v.Reason).Add(float64(max(v.Count, 1)))
	}
	t.log.Warn("network policy denials", "count", len(net.Violations), "dropped", net.Dropped, "summary", net.Summary)
}

// Modes of the files the worker creates for a sandbox (the launcher
// makes the work dir and its directories). Set with fchmod after
// creation, never left to the umask.
const modeInputFile = 0o644

// mkdirMode creates path (which must not exist) and sets its mode through
// a descriptor opened without following a symlink, whatever the umask.
func mkdirMode(path string, mode os.FileMode) error {
	if err := os.Mkdir(path, mode); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
		return fmt.Errorf("chmod %s to %o: %w", path, mode.Perm(), err)
	}
	return nil
}

// ensureDir makes sure the directory path exists with the group and
// other bits of mode, whatever the umask: a missing dir is created with
// mode (missing parents 0755), an existing one gets those of mode's
// group/other bits it lacks and keeps everything else, so pointing it at
// a shared directory such as /tmp changes nothing there. prepareDirs uses
// it for the work base (others need x), the runner dir and the site dir
// (others need rx), which the sandbox's uid must traverse or read; a dir
// left 0750 by an earlier start under UMask=0027 is repaired.
func ensureDir(path string, mode os.FileMode) error {
	// 1. what is missing, from the top down.
	path = filepath.Clean(path)
	var missing []string
	for p := path; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		missing = append(missing, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		m := os.FileMode(0o755)
		if i == 0 {
			m = mode
		}
		if err := mkdirMode(missing[i], m); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	// 2. the bits needed, added through a descriptor (no symlink followed).
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	need := uint32(mode.Perm() & 0o077)
	if st.Mode&need != need {
		if err := unix.Fchmod(fd, st.Mode&0o7777|need); err != nil {
			return fmt.Errorf("chmod %s to add %o: %w", path, need, err)
		}
	}
	return nil
}

// writeInputs places every input artifact under input/, through a
// descriptor of input/: inputFd, held since the worker created it (a
// pooled sandbox's tool already runs and owns the work dir, so it could
// put something else at the path input/), or, when inputFd < 0, input/
// opened here without following a symlink (a sandbox not started yet).
// Each file is created O_EXCL|O_NOFOLLOW in that directory, which only
// the worker can write. Parameters naming one file share it when their
// bytes are the same (each keeps its own metadata); else INVALID_REQUEST.
func (s *Server) writeInputs(t *task, dir string, inputFd int) (map[string]string, map[string]runner.ArtifactMeta, *Error) {
	if inputFd < 0 {
		fd, err := unix.Open(filepath.Join(dir, "input"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, errorf(CodeSandboxFailed, "sandbox setup failed at step \"work dir\": open %s/input: %v", dir, err)
		}
		defer unix.Close(fd)
		inputFd = fd
	}
	paths := map[string]string{}
	meta := map[string]runner.ArtifactMeta{}
	// Two parameters may name one file (input/<filename>: the "user:"
	// prefix dropped): the same bytes are written once and both point at
	// them, as the reference does. Different bytes are refused: the tool
	// sees one file per name, and the reference's last write would hand
	// one parameter the other's bytes without a word.
	type written struct {
		param, what string
		data        []byte
	}
	files := map[string]written{}
	write := func(param, filename string, data []byte, mime string, version int, what string) *Error {
		local := LocalInputName(filename)
		if err := artifacts.CheckFilename(local); err != nil {
			return errorf(CodeInvalidRequest, "input %q: %v", param, err)
		}
		path := filepath.Join(dir, "input", local)
		if first, ok := files[local]; ok {
			if !bytes.Equal(first.data, data) {
				return errorf(CodeInvalidRequest, "inputs %q (%s) and %q (%s) are both input/%s but their contents differ (%d and %d bytes): "+
					"a tool sees one file per name; pass the same version, or the file under another name",
					first.param, first.what, param, what, local, len(first.data), len(data))
			}
		} else if err := writeNewFileAt(inputFd, local, path, data, modeInputFile); err != nil {
			if isNoSpace(err) {
				s.noteWorkDirFileFault(err)
				return errorf(CodeResourceExhausted, "no space for input %q in the work dir (the profile's work_dir cap, or the host's disk): %v", param, err)
			}
			return errorf(CodeArtifactError, "input %q: %v", param, err)
		}
		files[local] = written{param: param, what: what, data: data}
		if mime == "" {
			mime = artifacts.MimeByExtension(local)
		}
		paths[param] = path
		meta[param] = runner.ArtifactMeta{Filename: filename, MimeType: mime, Version: version, LocalPath: path}
		return nil
	}
	// 1. preloaded: the bytes came with the request.
	for _, param := range sortedKeys(t.req.Preloaded) {
		a := t.req.Preloaded[param]
		v := 0
		if a.Version != nil {
			v = *a.Version
		}
		if e := write(param, a.Filename, a.Content, a.MimeType, v, fmt.Sprintf("preloaded %q", a.Filename)); e != nil {
			return nil, nil, e
		}
	}
	// 2. referenced: loaded from the store, mime type from its metadata.
	// A user-scoped one only when the tool's manifest entry lets it read
	// them (artifacts.user_scope read or write).
	for _, param := range sortedKeys(t.req.References) {
		ref := t.req.References[param]
		if artifacts.IsUserScoped(ref.Filename) && !t.tool.UserScope.CanRead() {
			return nil, nil, errorf(CodeArtifactError, "input %q: artifact %q is user-scoped (%q), and tool %s may not read user-scoped artifacts (manifest artifacts.user_scope: %s)",
				param, ref.Filename, artifacts.UserPrefix, t.req.ToolName, t.tool.UserScope)
		}
		art, err := s.store.Load(t.ctx, t.req.UserID, t.req.SessionID, ref.Filename, ref.Version)
		if err != nil {
			which := "latest version"
			if ref.Version != nil {
				which = fmt.Sprintf("version %d", *ref.Version)
			}
			if errors.Is(err, artifacts.ErrNotFound) {
				return nil, nil, errorf(CodeArtifactError, "input %q: artifact %q (%s) not found", param, ref.Filename, which)
			}
			if errors.Is(err, artifacts.ErrUnsafeName) {
				return nil, nil, errorf(CodeInvalidRequest, "input %q: %v", param, err)
			}
			s.noteStoreFault(err)
			return nil, nil, errorf(storeErrorCode(err), "input %q: loading artifact %q (%s): %v", param, ref.Filename, which, err)
		}
		if e := write(param, ref.Filename, art.Data, art.MimeType, art.Version, fmt.Sprintf("artifact %q version %d", ref.Filename, art.Version)); e != nil {
			return nil, nil, e
		}
	}
	return paths, meta, nil
}

// writeNewFileAt creates name exclusively in the directory dirFd (no
// symlink followed), sets its mode on the descriptor (whatever the umask)
// and writes data; path is for messages.
func writeNewFileAt(dirFd int, name, path string, data []byte, mode os.FileMode) error {
	fd, err := unix.Openat(dirFd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s to %o: %w", path, mode, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}

// saveOutputs stores the top-level regular files of output/, all or
// nothing: every output is checked first (count, total size, name,
// scope, mime type), and only when all pass is any saved, each streamed
// from its file into the store (the worker never holds an output whole). The tool
// owns the work dir, so output/ is opened without following a symlink
// and every file through that directory fd, also without following one.
// Regular files that cannot be stored are returned as skipped, with the
// reason: names breaking the filename rule (artifacts.CheckFilename), and
// user-scoped ("user:") names when the tool's manifest entry does not
// allow writing them (artifacts.user_scope read or none). Anything that
// is not a regular file is not an output (spec §7.6) and is only logged.
// A mime type the tool gave that breaks artifacts.CheckMimeType (longer
// than 255 bytes, not type/subtype) is replaced by the one of the
// file's extension, and logged; so is an active one (HTML, SVG, XML,
// JavaScript: artifacts.IsActiveMimeType) unless ARTIFACT_ACTIVE_MIME_TYPES
// is keep, which stores it and marks the entry (active_mime_type). Two
// outputs whose names are one after NFKC normalisation (the store's form)
// are not saved as one artifact's two versions: the first in name order
// is saved, the other skipped with the reason. A save that fails after others succeeded
// cannot be undone (the store keeps versions): the error lists exactly
// what was saved.
func (s *Server) saveOutputs(t *task, dir string, toolMimes map[string]string) ([]CreatedArtifact, []SkippedOutput, *Error) {
	// 1. the directory, by fd.
	dirFd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errorf(CodeArtifactError, "open work dir %s: %v", dir, err)
	}
	defer unix.Close(dirFd)
	outFd, err := unix.Openat(dirFd, "output", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errorf(CodeArtifactError, "open %s/output (a symlink is refused): %v", dir, err)
	}
	outDir := os.NewFile(uintptr(outFd), filepath.Join(dir, "output"))
	defer outDir.Close()
	names, err := outDir.Readdirnames(maxOutputFiles + 1)
	if err != nil && err != io.EOF {
		return nil, nil, errorf(CodeArtifactError, "list %s/output: %v", dir, err)
	}
	if len(names) > maxOutputFiles {
		return nil, nil, errorf(CodeArtifactError, "the tool wrote more than %d files to output/; nothing was saved", maxOutputFiles)
	}
	sort.Strings(names)
	// 2. every output read and checked; nothing saved yet.
	type pending struct {
		name, mime string
		active     bool // a tool-chosen active mime type, kept
		size       int64
		dev, ino   uint64 // the file checked, so that step 4 saves that one
	}
	var todo []pending
	var total int64
	var skipped []SkippedOutput
	kept := map[string]string{} // NFKC name -> the output saved under it
	isRegular := func(name string) bool {
		var st unix.Stat_t
		return unix.Fstatat(outFd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
	}
	for _, name := range names {
		log := t.log.With("output", name)
		if err := artifacts.CheckFilename(name); err != nil {
			if isRegular(name) {
				reason := err.Error()
				var fe *artifacts.FilenameError
				if errors.As(err, &fe) {
					reason = fe.Reason
				}
				log.Warn("output skipped: its name breaks the filename rule", "output_quoted", strconv.Quote(name), "reason", reason)
				skipped = append(skipped, SkippedOutput{Filename: strings.ToValidUTF8(name, "\uFFFD"), Reason: reason})
			} else {
				log.Debug("not an output (not a regular file) and an unsafe name", "error", err)
			}
			continue
		}
		if artifacts.IsUserScoped(name) && !t.tool.UserScope.CanWrite() {
			if isRegular(name) {
				reason := fmt.Sprintf("a user-scoped artifact (%q), shared by all of the user's sessions: tool %s may not write them (manifest artifacts.user_scope: %s; write allows it)",
					artifacts.UserPrefix, t.req.ToolName, t.tool.UserScope)
				log.Warn("output skipped: user-scoped artifacts are not allowed for this tool", "user_scope", t.tool.UserScope.String())
				skipped = append(skipped, SkippedOutput{Filename: name, Reason: reason})
			}
			continue
		}
		stored := norm.NFKC.String(name) // the name the store keeps
		if first, ok := kept[stored]; ok {
			if isRegular(name) {
				reason := fmt.Sprintf("its name is %q after NFKC normalisation (the form the store keeps), as is the name of output %q: only %q was saved",
					stored, first, first)
				log.Warn("output skipped: its name merges with another output's", "stored_as", stored, "kept", first)
				skipped = append(skipped, SkippedOutput{Filename: name, Reason: reason})
			}
			continue
		}
		fd, err := unix.Openat(outFd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			log.Warn("output skipped (symlinks are not followed)", "error", err)
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			log.Warn("output that is not a regular file skipped")
			continue
		}
		// Only the size is taken now: the data is streamed into the
		// store in step 4, never read whole into the worker's memory.
		total += st.Size
		if s.cfg.MaxOutputBytes > 0 && total > s.cfg.MaxOutputBytes {
			return nil, nil, errorf(CodeArtifactError, "outputs exceed the limit of %d bytes; nothing was saved", s.cfg.MaxOutputBytes)
		}
		mime := toolMimes[name]
		if mime != "" {
			if err := artifacts.CheckMimeType(mime); err != nil {
				log.Warn("the tool's mime type for this output is refused; the extension's is used", "mime_type_bytes", len(mime), "reason", err.Error())
				mime = ""
			}
		}
		active := false
		if mime != "" && artifacts.IsActiveMimeType(mime) {
			if s.cfg.ActiveMimeTypes == "keep" {
				active = true
				log.Warn("output stored with the active mime type the tool chose (ARTIFACT_ACTIVE_MIME_TYPES=keep)", "mime_type", mime)
			} else {
				log.Warn("the tool's active mime type is replaced by the extension's (ARTIFACT_ACTIVE_MIME_TYPES=fallback)", "mime_type", mime)
				mime = ""
			}
		}
		if mime == "" {
			mime = artifacts.MimeByExtension(name)
		}
		kept[stored] = name
		todo = append(todo, pending{name: name, mime: mime, active: active, size: st.Size, dev: st.Dev, ino: st.Ino})
	}
	// 3. the user's and the session's artifact quotas (artifacts.Quota),
	// for all of them at once: over quota, nothing is saved.
	if qc, ok := s.store.(artifacts.QuotaChecker); ok && len(todo) > 0 {
		names, sizes := make([]string, len(todo)), make([]int64, len(todo))
		for i, p := range todo {
			names[i], sizes[i] = p.name, p.size
		}
		if err := qc.CheckQuota(t.ctx, t.req.UserID, t.req.SessionID, names, sizes); err != nil {
			t.log.Warn("outputs refused by the artifact quota", "outputs", len(todo), "error", err)
			s.noteStoreFault(err)
			return nil, nil, errorf(storeErrorCode(err), "save outputs: %v; nothing was saved", err)
		}
	}
	// 4. save them, in name order, each streamed from the file checked in
	// step 2 (reopened without following a symlink; the same inode, and
	// exactly the size checked: the store reads no byte more).
	created := []CreatedArtifact{}
	for _, p := range todo {
		v, err := s.saveOutput(t, outFd, p.name, p.size, p.dev, p.ino, p.mime)
		if err != nil {
			saved := "nothing was saved"
			if len(created) > 0 {
				list := make([]string, len(created))
				for i, c := range created {
					list[i] = fmt.Sprintf("%q version %d", c.Filename, c.Version)
				}
				saved = fmt.Sprintf("already saved (and kept: versions are never removed): %s", strings.Join(list, ", "))
			}
			t.log.Error("saving an output failed", "output", p.name, "saved_before", len(created), "error", err)
			s.noteStoreFault(err)
			var ae *artifacts.AuditError
			if errors.As(err, &ae) {
				// stored, but unaudited: reported failed (fail closed).
				saved = fmt.Sprintf("%s; %s itself was stored but its audit line was not written", saved, p.name)
			}
			return nil, nil, errorf(storeErrorCode(err), "save output %s: %v; %d of %d outputs were saved before: %s", p.name, err, len(created), len(todo), saved)
		}
		created = append(created, CreatedArtifact{Filename: p.name, Version: v, MimeType: p.mime, SizeBytes: p.size, ActiveMimeType: p.active})
	}
	return created, skipped, nil
}

// saveOutput streams output name (under outFd) into the store. The file
// must still be the regular file (dev, ino) of size bytes that
// saveOutputs checked; the store's SaveReader copies it through a fixed
// buffer and fails if it yields more or fewer bytes.
func (s *Server) saveOutput(t *task, outFd int, name string, size int64, dev, ino uint64, mime string) (int, error) {
	fd, err := unix.Openat(outFd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("reopen: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != dev || st.Ino != ino || st.Size != size {
		return 0, fmt.Errorf("the file changed after it was checked (%d bytes then, %d now)", size, st.Size)
	}
	return s.store.SaveReader(t.ctx, t.req.UserID, t.req.SessionID, name, f, size, mime)
}

// statusRelay reads the status FIFO and publishes each line, in order.
// Reading and publishing are two goroutines joined by a queue bounded in
// bytes (statusQueue). While the queue is full the reader waits, so the
// FIFO fills and the tool's next status write blocks: a broker slower
// than the tool slows the tool down, no line within the caps is lost, and
// a slow subscriber costs at most statusQueueBytes of the worker's memory
// per task (plus the FIFO's own buffer in the kernel). Only lines beyond
// the caps (maxStatusLines, statusTaskBytes) are dropped and counted. A
// tool blocked writing status is still ended by its timeout or a cancel:
// the sandbox is killed, the relay reads what is left.
type statusRelay struct {
	r, w   *os.File
	reader *fifoReader
	done   chan struct{} // closed once every queued line is published
	once   sync.Once
}

func (s *Server) startStatusRelay(t *task, path string) (*statusRelay, error) {
	// 1. read end, non-blocking so the open does not wait for a writer;
	// the fd stays non-blocking and is read through Go's poller.
	rfd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(rfd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		unix.Close(rfd)
		return nil, fmt.Errorf("%s is not a FIFO", path)
	}
	r := os.NewFile(uintptr(rfd), path)
	// 2. the worker's own write end (succeeds at once: a reader exists).
	w, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("open %s for writing: %w", path, err)
	}
	rel := &statusRelay{r: r, w: w, reader: &fifoReader{f: r}, done: make(chan struct{})}
	q := newStatusQueue(statusQueueBytes, statusTaskBytes, maxStatusLines)
	// 3. the publisher: in order, until the reader has closed the queue
	// and it is empty; then the drop notice, if any. The first publish
	// that fails (the broker unreachable for the publish's whole wait)
	// ends the task's status publishing: the later lines are read and
	// counted lost without waiting for the broker each (a tool writing
	// 100 lines during an outage would otherwise hold its reply for 100
	// waits); logged once, counted in str_worker_status_lines_lost_total.
	go func() {
		defer close(rel.done)
		failed := false
		for {
			line, ok := q.pop()
			if !ok {
				break
			}
			if !failed {
				err := s.relayStatus(t, line)
				if err == nil {
					continue
				}
				failed = true
				t.log.Warn("publishing a status line failed: this and the task's later status lines are lost",
					"status_to", t.statusTo, "error", err)
			}
			s.metrics.StatusLost.Inc()
		}
		if !failed {
			s.finishStatus(t, q)
		}
	}()
	// 4. the reader.
	go func() {
		defer q.close()
		s.relayLines(t, rel.reader, q)
	}()
	return rel, nil
}

// drain relays what the FIFO holds now and stops, without waiting for
// EOF (a process of the tool may still hold a write end): used when the
// runner has signalled its result, after which every line it wrote is in
// the FIFO or relayed already (its writes are blocking and complete).
// It returns once every line read is published (or dropped).
func (r *statusRelay) drain() {
	r.reader.draining.Store(true)
	r.r.SetReadDeadline(time.Unix(1, 0)) // wakes a blocked read
	<-r.done
}

// finish closes the worker's write end and relays what the FIFO holds,
// as drain does: the sandbox is gone, and with it (its pid namespace)
// every process that could write, so what they wrote is in the FIFO. No
// clock bounds it: the reader may wait for a slow broker (back-pressure)
// without losing those lines, and drainLimit bounds the reading.
// (SANDBOX_MODE=none has no pid namespace: what a process the tool left
// running writes after the tool's end is not relayed.) After drain it
// only closes. Safe to call more than once.
func (r *statusRelay) finish() {
	r.once.Do(func() {
		r.w.Close()
		r.reader.draining.Store(true)
		r.r.SetReadDeadline(time.Unix(1, 0)) // wakes a blocked read
		<-r.done
		r.r.Close()
	})
}

// fifoReader reads the status FIFO through Go's poller until draining is
// set; from then on each read takes only what is there (non-blocking) and
// reports EOF when nothing is, after at most drainLimit bytes (a tool
// that keeps writing cannot hold the reply).
type fifoReader struct {
	f        *os.File
	draining atomic.Bool
	drained  int
}

const drainLimit = 4 << 20

func (r *fifoReader) Read(p []byte) (int, error) {
	if !r.draining.Load() {
		n, err := r.f.Read(p)
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !r.draining.Load() {
			return n, err
		}
	}
	if r.drained >= drainLimit {
		return 0, io.EOF
	}
	rc, err := r.f.SyscallConn()
	if err != nil {
		return 0, err
	}
	for attempt := 0; ; attempt++ {
		// drain's deadline is in the past: clear it, so the raw read below
		// is not refused (it never waits: the function returns true).
		r.f.SetReadDeadline(time.Time{})
		var n int
		var rerr error
		err = rc.Read(func(fd uintptr) bool {
			for {
				n, rerr = unix.Read(int(fd), p)
				if rerr != unix.EINTR {
					return true
				}
			}
		})
		if errors.Is(err, os.ErrDeadlineExceeded) && attempt == 0 {
			continue // drain set its deadline after ours was cleared
		}
		switch {
		case err != nil:
			return 0, err
		case rerr == unix.EAGAIN || n == 0:
			return 0, io.EOF
		case rerr != nil:
			return 0, rerr
		}
		r.drained += n
		return n, nil
	}
}

// statusQueue holds the status lines read and not yet published: FIFO
// order, bounded in queued bytes (maxQueued: push waits for room), in
// bytes accepted over the task's life (maxTotal) and in lines accepted
// (maxLines): a line beyond either cap is dropped and counted, at once.
type statusQueue struct {
	mu                  sync.Mutex
	cond                *sync.Cond // signals a push, a pop and close
	lines               [][]byte
	queued, peak        int    // bytes in lines now; the most ever
	total, accepted     int    // bytes and lines accepted so far
	dropped, droppedB   int    // lines and bytes dropped
	waits               int    // pushes that waited for room
	onFirstWait         func() // called (under mu) as the first wait begins
	maxQueued, maxTotal int
	maxLines            int
	closed              bool
	firstDropReason     string
}

func newStatusQueue(maxQueued, maxTotal, maxLines int) *statusQueue {
	q := &statusQueue{maxQueued: maxQueued, maxTotal: maxTotal, maxLines: maxLines}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// push queues line, waiting while the queue holds maxQueued bytes (an
// empty queue takes any line), or drops it when it is beyond the task's
// caps. It returns why it was dropped ("" when queued), whether it was
// the task's first drop, and whether it had to wait.
func (q *statusQueue) push(line []byte) (reason string, first, waited bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	// 1. the caps: a line beyond them is dropped without waiting.
	switch {
	case q.accepted >= q.maxLines:
		reason = fmt.Sprintf("more than %d status lines", q.maxLines)
	case q.total+len(line) > q.maxTotal:
		reason = fmt.Sprintf("more than %d bytes of status text", q.maxTotal)
	}
	if reason != "" {
		q.dropped++
		q.droppedB += len(line)
		if q.dropped == 1 {
			q.firstDropReason = reason
		}
		return reason, q.dropped == 1, false
	}
	// 2. back-pressure: wait for the publisher to make room. The reader
	// is the only pusher, so nothing else can take the room meanwhile.
	for q.queued > 0 && q.queued+len(line) > q.maxQueued && !q.closed {
		if !waited {
			waited = true
			q.waits++
			if q.waits == 1 && q.onFirstWait != nil {
				q.onFirstWait()
			}
		}
		q.cond.Wait()
	}
	// 3. queue it.
	q.lines = append(q.lines, line)
	q.queued += len(line)
	q.peak = max(q.peak, q.queued)
	q.total += len(line)
	q.accepted++
	q.cond.Broadcast()
	return "", false, waited
}

// pop returns the oldest line, waiting for one; ok is false once the
// queue is closed and empty.
func (q *statusQueue) pop() ([]byte, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.lines) == 0 && !q.closed {
		q.cond.Wait()
	}
	if len(q.lines) == 0 {
		return nil, false
	}
	line := q.lines[0]
	q.lines[0] = nil
	q.lines = q.lines[1:]
	q.queued -= len(line)
	q.cond.Broadcast() // room for a waiting push
	return line, true
}

func (q *statusQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// relayLines reads the FIFO line by line (each cut to maxStatusLine) into
// q until EOF or a read error.
func (s *Server) relayLines(t *task, r io.Reader, q *statusQueue) {
	br := bufio.NewReaderSize(r, maxStatusLine)
	q.mu.Lock()
	q.onFirstWait = func() {
		t.log.Debug("status queue full: the status pipe is read at the broker's pace (the tool's status writes wait)",
			"queue_limit_bytes", statusQueueBytes)
	}
	q.mu.Unlock()
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			if reason, first, _ := q.push(line); first {
				t.log.Warn("status lines dropped; the rest of the task's drops are counted and reported at its end", "reason", reason,
					"task_limit_bytes", statusTaskBytes, "line_limit", maxStatusLines)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.log.Warn("reading the status pipe stopped", "error", err)
			}
			return
		}
	}
}

// finishStatus runs once every queued line is published: dropped lines
// are logged with their count (there is no metric for them yet: the log
// line is the count) and announced to the agent by one last status line.
func (s *Server) finishStatus(t *task, q *statusQueue) {
	q.mu.Lock()
	dropped, droppedB, accepted, peak, waits, why := q.dropped, q.droppedB, q.accepted, q.peak, q.waits, q.firstDropReason
	q.mu.Unlock()
	if dropped == 0 {
		if waits > 0 {
			t.log.Debug("status lines relayed at the broker's pace", "status_lines_relayed", accepted,
				"status_queue_peak_bytes", peak, "status_queue_waits", waits)
		}
		return
	}
	t.log.Warn("status lines dropped", "status_lines_dropped", dropped, "status_bytes_dropped", droppedB,
		"status_lines_relayed", accepted, "status_queue_peak_bytes", peak, "status_queue_waits", waits, "first_reason", why)
	if err := s.publishStatusText(t, fmt.Sprintf("[str] %d status lines (%d bytes) were dropped: %s", dropped, droppedB, why)); err != nil {
		s.metrics.StatusLost.Inc()
		t.log.Warn("publishing the status drop notice failed", "status_to", t.statusTo, "error", err)
	}
}

// readLine returns one line without its newline, truncated to
// maxStatusLine bytes (the rest of an overlong line is discarded).
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line) < maxStatusLine {
			room := maxStatusLine - len(line)
			if len(chunk) < room {
				room = len(chunk)
			}
			line = append(line, chunk[:room]...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

// relayStatus publishes one status line ({"status": "..."} as the runner
// writes it; any other line is relayed as its text).
func (s *Server) relayStatus(t *task, line []byte) error {
	text := string(line)
	var doc struct {
		Status *string `json:"status"`
	}
	if json.Unmarshal(line, &doc) == nil && doc.Status != nil {
		text = *doc.Status
	}
	return s.publishStatusText(t, strings.ToValidUTF8(text, "\uFFFD"))
}

// publishStatusText publishes one status notification of t; a request
// without statusTo has nowhere to send it (nil).
func (s *Server) publishStatusText(t *task, text string) error {
	if t.statusTo == "" {
		s.metrics.StatusLines.Inc()
		return nil
	}
	if err := s.publish(t.statusTo, EncodeStatus(t.req.TaskID, text, time.Now())); err != nil {
		return err
	}
	s.metrics.StatusLines.Inc()
	return nil
}

// cancelTaskID reads a task id from a cancel payload, if any.
func cancelTaskID(payload []byte) string {
	var doc struct {
		TaskID string `json:"task_id"`
		Params struct {
			TaskID string `json:"task_id"`
		} `json:"params"`
	}
	if json.Unmarshal(payload, &doc) != nil {
		return ""
	}
	if doc.TaskID != "" {
		return doc.TaskID
	}
	return doc.Params.TaskID
}

// publishReply publishes a reply to the task's replyTo, retrying while the
// broker cannot be reached, until the task's deadline (receipt + timeout
// + 5 s) or for at least replyRetryWindow. A refusal by the broker (as
// the transport classifies it: transport.ErrRefused) is not retried.
func (s *Server) publishReply(t *task, payload []byte) error {
	deadline := t.received.Add(t.timeout + timeoutSlack)
	if least := time.Now().Add(replyRetryWindow); deadline.Before(least) {
		deadline = least
	}
	ctx, cancel := context.WithDeadline(s.replyCtx, deadline)
	defer cancel()
	wait := replyRetryFirst
	for attempt := 1; ; attempt++ {
		props := map[string]string{PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10)}
		if t.clamped != "" {
			props[PropProfileClamped] = t.clamped
		}
		err := s.tr.Publish(ctx, transport.Message{Topic: t.replyTo, Payload: payload, UserProperties: props})
		if err == nil {
			if attempt > 1 {
				t.log.Info("reply published after retries", "attempts", attempt)
			}
			return nil
		}
		if errors.Is(err, transport.ErrRefused) {
			return err
		}
		if s.stopping.Load() && attempt >= 2 {
			return fmt.Errorf("worker stopping: reply not published after %d attempts: %w", attempt, err)
		}
		t.log.Warn("publishing the reply failed; retrying", "attempt", attempt, "retry_until", deadline.UTC().Format(time.RFC3339), "error", err)
		select {
		case <-ctx.Done():
			if s.replyCtx.Err() != nil {
				return fmt.Errorf("worker stopped: reply not published %v after the shutdown grace period (%d attempts): %w", replyShutdownWindow, attempt, err)
			}
			return fmt.Errorf("reply not published within the task's deadline (%d attempts): %w", attempt, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, replyRetryMax)
	}
}

// tailBuffer is an io.Writer that keeps the last max bytes written to it
// (a sandbox's stderr: the end of a traceback is what explains a crash).
type tailBuffer struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	total int64
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.total += int64(len(p))
	if len(p) >= b.max {
		b.buf = append(b.buf[:0], p[len(p)-b.max:]...)
		return len(p), nil
	}
	if over := len(b.buf) + len(p) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// String is the kept tail, trimmed, as valid UTF-8; when earlier output
// was dropped it starts with "…" (and never inside a UTF-8 sequence).
func (b *tailBuffer) String() string {
	s, _ := b.tail(b.max)
	return s
}

// tail is String for the last n bytes kept (n <= max), and whether
// earlier output was dropped.
func (b *tailBuffer) tail(n int) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	tail := b.buf
	if len(tail) > n {
		tail = tail[len(tail)-n:]
	}
	prefix := ""
	cut := b.total > int64(len(tail))
	if cut {
		prefix = "…"
		for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
			tail = tail[1:]
		}
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(tail), "\uFFFD"))
	if s == "" {
		return "", cut
	}
	return prefix + s, cut
}

// The runner's signals on its done pipe (runner.py --done-fd).
const (
	signalReady = 'r' // warm runner: imports done, waiting for its arguments
	signalDone  = 'd' // result.json is complete (written and renamed)
)

// sandboxRun is a started sandbox as the worker watches it: its end
// (Wait, in a goroutine) and the runner's signals on the done pipe.
type sandboxRun struct {
	sb      Sandbox
	exited  chan struct{} // closed when Wait has returned; exit and waitErr are set then
	exit    *SandboxExit
	waitErr error
	ready   chan struct{} // closed on signalReady; readyAt is set before
	readyAt time.Time
	done    chan struct{} // closed on signalDone; doneAt is set before
	doneAt  time.Time
}

// watchSandbox starts watching sb; doneR (nil = no done pipe) is the
// worker's read end of the runner's done pipe, closed by the watcher.
func watchSandbox(sb Sandbox, doneR *os.File) *sandboxRun {
	run := &sandboxRun{sb: sb, exited: make(chan struct{}), ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		run.exit, run.waitErr = sb.Wait()
		close(run.exited)
	}()
	if doneR != nil {
		go run.readSignals(doneR)
	}
	return run
}

// readSignals reads the done pipe until signalDone or EOF (every write
// end is closed once the sandbox is gone). The bytes are hints only: a
// tool can write on the descriptor too, so nothing but timing depends on
// them (awaitResult reads result.json itself).
func (run *sandboxRun) readSignals(doneR *os.File) {
	defer doneR.Close()
	var b [1]byte
	for {
		n, err := doneR.Read(b[:])
		if n == 1 {
			switch b[0] {
			case signalReady:
				if run.readyAt.IsZero() {
					run.readyAt = time.Now()
					close(run.ready)
				}
			case signalDone:
				run.doneAt = time.Now()
				close(run.done)
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// teardown kills what is left of the sandbox (its result is taken, or it
// is not wanted) and returns once the whole sandbox is gone.
func (run *sandboxRun) teardown() {
	select {
	case <-run.exited:
		return
	default:
	}
	run.sb.Kill()
	<-run.exited
}
