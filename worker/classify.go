package worker

// Classification: how a sandbox's end and its result file become the
// call's reply (a result, or an error code blaming the right side).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/worker/runner"
)

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

// The worker's own setup stages around the launcher's (its pipes, the
// runner's arguments, the inputs' directory), named in setupError. The
// launcher's steps (L1-L9, the init's 1-N) are never renamed here.
const (
	stageDonePipe   = "done pipe"
	stageCreate     = "create"
	stageWorkDir    = "work dir"
	stageRunnerArgs = "runner arguments"
	stageStatusPipe = "status pipe"
	stageStart      = "start"
	// stageCredentials: reading a tool's credentials (a missing secret
	// is the worker's configuration, named with its source).
	stageCredentials = "credentials"
)

// setupError is the one place a sandbox that could not be set up becomes
// the call's error. The disk full under the work dir and no free id block
// are RESOURCE_EXHAUSTED; anything else is SANDBOX_FAILED. An error that
// carries a launcher.StepError (the launcher's Create or Start, the
// init's report as SandboxExit.SetupError) already names its step and
// object: it is passed on unchanged, without a stage of the worker's. Any
// other error is the worker's own at stage ("" = none known). stderr
// (nil = none) adds the tail of the sandbox's standard error.
func setupError(stage string, err error, stderr *tailBuffer) *Error {
	note := ""
	if stderr != nil {
		note = stderrNote(stderr)
	}
	var step *launcher.StepError
	switch {
	case errors.Is(err, launcher.ErrNoFreeIDs):
		// Capacity, not a fault, and not the agent's business where the
		// host keeps its leases: no host path in the message.
		return errorf(CodeResourceExhausted, "no free sandbox id block: every block of this worker's id range is leased by a running sandbox on its host; retry when calls finish")
	case isNoSpace(err) && stage != "":
		return errorf(CodeResourceExhausted, "no disk space for the work dir: %s: %v", stage, err)
	case isNoSpace(err):
		return errorf(CodeResourceExhausted, "no disk space for the work dir: %v", err)
	case errors.As(err, &step) || stage == "":
		return errorf(CodeSandboxFailed, "sandbox setup failed: %v%s", err, note)
	}
	return errorf(CodeSandboxFailed, "sandbox setup failed at step %q: %v%s", stage, err, note)
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
		return fail(setupError("", exit.SetupError, stderr))
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
		return fail(oomKilled(t, stderrNote(stderr)))
	case exit.KilledForViolation:
		return fail(s.killedForViolation(t, sb.NetworkReport()))
	}
	if out, ok := s.resultTooLarge(t, resultPath); ok {
		return out
	}
	res, err := runner.ReadResult(resultPath, int64(s.maxReplyBytes()))
	if err != nil {
		if e := nestedTooDeeply(err); e != nil {
			return fail(e)
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
		return s.tooLargeResult(t, "result.json", fi.Size()), true
	}
	return outcome{}, false
}

// tooLargeResult is the reply for a result document (what: result.json,
// or a template call's answer) of size bytes, more than a reply may
// carry: the tool's fault, not the sandbox's. A cold and a template
// call answer alike.
func (s *Server) tooLargeResult(t *task, what string, size int64) outcome {
	return s.errorOutcome(t, errorf(CodeToolError, "the tool's result is too large: %s has %d bytes, the limit is %d (the broker's message limit less the reply envelope)", what, size, s.maxReplyBytes()))
}

// nestedTooDeeply is the error for a result document the decoder refused
// at its depth limit (the tool's fault), nil for any other error. A cold
// and a template call answer alike.
func nestedTooDeeply(err error) *Error {
	var se *json.SyntaxError
	if errors.As(err, &se) && strings.Contains(se.Error(), "max depth") {
		return errorf(CodeToolError, "the tool's result is nested too deeply (more than %d levels): %v", MaxResultDepth, err)
	}
	return nil
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
	toolResult, err := resultObject(cleaned) // an object uncopied: EncodeResult compacts it into the reply
	if err != nil {
		return fail(errorf(CodeExecutionError, "%v", err))
	}
	created, skipped, aerr := s.saveOutputs(t, dir, res.OutputMimeTypes)
	if aerr != nil {
		return fail(aerr)
	}
	var payload []byte
	if res.Buf != nil && fixes == 0 && len(toolResult) == len(res.Result) && &toolResult[0] == &res.Result[0] {
		// The result as ReadResult left it, in its buffer with room
		// around it: the reply is written there (a result may be most of
		// a broker message; a copy of it doubled the worker's memory).
		var ok bool
		if payload, toolResult, ok = encodeResultInPlace(res.Buf, res.ResultAt, len(toolResult), t.req.ID, elapsed, created, skipped, net); !ok {
			payload = EncodeResult(t.req.ID, toolResult, elapsed, created, skipped, net)
		}
	} else {
		payload = EncodeResult(t.req.ID, toolResult, elapsed, created, skipped, net)
	}
	if max := s.maxReplyBytes(); len(payload) > max {
		return fail(errorf(CodeToolError, "the tool's result is too large: the reply would have %d bytes, the limit is %d (the broker's message limit less the publish envelope)", len(payload), max))
	}
	return outcome{payload: payload, label: "success"}
}

// oomKilled is the error of a call killed at its profile's memory limit
// (note: the tail of its stderr, or ""). A cold and a template call
// answer alike.
func oomKilled(t *task, note string) *Error {
	return errorf(CodeSandboxFailed, "the tool was killed: out of memory (the profile %s memory limit)%s", t.profile, note)
}

// killedForViolation is the error of a call its network policy killed
// (on_violation: kill), its denials counted. A cold and a template call
// answer alike.
func (s *Server) killedForViolation(t *task, net NetworkReport) *Error {
	s.countViolations(t, net)
	return errorf(CodeSandboxFailed, "the tool was killed: it broke the network policy (on_violation: kill)\n%s", net.Summary)
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
