package worker

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// Bounds on what one execution may produce.
const (
	maxStatusLine     = 64 << 10 // longer status lines are truncated
	maxStatusLines    = 10000    // further lines are read and dropped
	maxOutputFiles    = 1000
	statusDrainWindow = 10 * time.Second // after exit, to read what is buffered
	// stderrTailBytes is how much of the end of a sandbox's standard
	// error is kept for the error message and the log.
	stderrTailBytes = 8 << 10
)

// Reply size. The dev broker takes one request line of at most
// brokerMessageLimit bytes (devbroker.DefaultMaxLineBytes), and a reply
// travels inside a PUBLISH command with its topic and user properties, so
// a reply may use all of it but publishEnvelopeRoom. result.json gets the
// same cap; the encoded reply (tool_result plus execution time and
// created_artifacts) is checked again before it is published.
const (
	brokerMessageLimit  = 16 << 20
	publishEnvelopeRoom = 64 << 10
	maxReplyBytes       = brokerMessageLimit - publishEnvelopeRoom
	maxResultBytes      = maxReplyBytes
)

// Reply publishing: a reply is retried (backoff from replyRetryFirst up to
// replyRetryMax between attempts) until the task's deadline (receipt +
// timeout + 5 s) and for at least replyRetryWindow. Once the worker is
// stopping, a reply gets two attempts, so that a dead broker cannot hold a
// shutdown for the deadline of every queued request.
var (
	replyRetryWindow = 30 * time.Second
	replyRetryFirst  = 100 * time.Millisecond
	replyRetryMax    = 5 * time.Second
)

// outcomeReplyFailed is the outcome label of an invocation whose reply
// could not be published.
const outcomeReplyFailed = "reply_failed"

// task is one accepted request.
type task struct {
	req      *Request
	tool     *manifest.Tool
	profile  string
	timeout  time.Duration // effective tool timeout (without the 5 s slack)
	replyTo  string
	statusTo string
	received time.Time
	delivery *transport.Delivery
	log      *slog.Logger
	ctx      context.Context
	cancel   context.CancelCauseFunc
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
		out = s.execute(t)
		s.metrics.stopRunning()
	}
	// 1. the reply, retried while the task's deadline allows; one the
	// broker refuses is replaced by an error reply, so the agent does not
	// wait for nothing. Either way the invocation counts as a failure.
	if err := s.publishReply(t, out.payload); err != nil {
		t.log.Error("publishing the reply failed", "reply_to", t.replyTo, "reply_bytes", len(out.payload),
			"outcome_not_delivered", out.label, "error", err)
		if errors.Is(err, errReplyRefused) {
			e := errorf(CodeInternalError, "the worker could not deliver the reply (%d bytes): %v", len(out.payload), err)
			if err2 := s.publishReply(t, EncodeError(t.req.ID, e)); err2 != nil {
				t.log.Error("publishing the fallback error reply failed", "reply_to", t.replyTo, "error", err2)
			}
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
	// 4. the work dir.
	dir := s.workDir(t)
	if err := os.RemoveAll(dir); err != nil {
		t.log.Error("removing the work dir failed", "path", dir, "error", err)
	}
}

func (s *Server) workDir(t *task) string { return filepath.Join(s.cfg.WorkDir, t.req.TaskID) }

func (s *Server) errorOutcome(t *task, e *Error) outcome {
	t.log.Warn("invocation failed", "code", e.Code, "error", e.Message)
	return outcome{payload: EncodeError(t.req.ID, e), label: string(e.Code), code: e.Code}
}

func cancelledError(cause error) *Error {
	if errors.Is(cause, errShutdown) {
		return errorf(CodeCancelled, "the tool was stopped: worker shutting down and the grace period is over")
	}
	return errorf(CodeCancelled, "the tool was cancelled by a cancel request")
}

// execute runs the steps of spec §7 for one task. The sandbox is created
// before its work dir is filled, because the work dir's owner is the
// sandbox's own host uid, known only once the sandbox exists; a sandbox
// created but not started is released on every path (the deferred Kill).
func (s *Server) execute(t *task) outcome {
	fail := func(e *Error) outcome { return s.errorOutcome(t, e) }
	dir := s.workDir(t)
	// 1. the tool's code is what the manifest pinned, and its package is
	// installed.
	if err := t.tool.Verify(s.cfg.ToolsDir); err != nil {
		return fail(errorf(CodeImportError, "tool %s cannot be loaded: %v", t.req.ToolName, err))
	}
	if s.inst != nil && t.tool.Package != "" {
		if err := s.inst.Ensure(t.ctx, t.tool); err != nil {
			return fail(errorf(CodeImportError, "tool %s: installing package %s: %v", t.req.ToolName, t.tool.Package, err))
		}
	}
	// 2. the work dir itself, exclusively, still the worker's (the
	// sandbox's plan binds it, so it must exist before step 3).
	if err := makeTaskDir(dir); err != nil {
		if errors.Is(err, os.ErrExist) {
			return fail(errorf(CodeInvalidRequest, "task %q already has a work dir", t.req.TaskID))
		}
		return fail(workDirError(err))
	}
	// 3. the sandbox, created (plan, cgroup, its host ids) but not started.
	argsPath := filepath.Join(dir, "runner_args.json")
	resultPath := filepath.Join(dir, "result.json")
	outputDir := filepath.Join(dir, "output")
	stderr := newTailBuffer(stderrTailBytes)
	spec := SandboxSpec{
		Profile:  t.profile,
		Argv:     []string{s.cfg.PythonBin, s.runnerPath, argsPath},
		Env:      []string{"PYTHONPATH=" + s.cfg.ToolsDir + ":" + s.cfg.SiteDir},
		Workdir:  dir,
		ReadOnly: []string{s.cfg.ToolsDir, filepath.Dir(s.runnerPath), s.cfg.SiteDir},
		Timeout:  t.timeout + timeoutSlack,
		Stderr:   stderr,
	}
	setupStart := time.Now()
	created, err := s.sb.Create(t.ctx, spec)
	if err != nil {
		if errors.Is(err, ErrInvalidSandboxRequest) {
			return fail(errorf(CodeInvalidRequest, "the sandbox refused the request: %v", err))
		}
		if cause := context.Cause(t.ctx); cause != nil {
			return fail(cancelledError(cause))
		}
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"create\": %v", err))
	}
	started := false
	defer func() {
		if !started {
			created.Kill()
		}
	}()
	setupTime := time.Since(setupStart)
	// 4. input/, output/ and the status FIFO, owned by the sandbox's uid.
	uid, gid := created.Owner()
	pipePath, err := fillWorkDir(dir, uid, gid)
	if err != nil {
		return fail(workDirError(err))
	}
	// 5. inputs.
	paths, meta, perr := s.writeInputs(t, dir)
	if perr != nil {
		return fail(perr)
	}
	// 6. runner_args.json.
	err = runner.WriteArgs(argsPath, &runner.Args{
		Module: t.tool.Module, Function: t.tool.Function, ClassName: t.tool.ClassName,
		Args: t.req.Args, ToolConfig: t.req.ToolConfig,
		ArtifactPaths: paths, ArtifactMetadata: meta,
		StatusPipe: pipePath, ResultFile: resultPath, OutputDir: outputDir,
		UserID: t.req.UserID, SessionID: t.req.SessionID, AppName: t.req.AppName,
	})
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"runner arguments\": %v", err))
	}
	// 7. the FIFO's read end, before the tool starts: the tool's blocking
	// open would hang otherwise. A write end held by the worker keeps the
	// reader from seeing EOF when the tool closes it between lines; it is
	// closed after the sandbox is gone, and the reader drains to EOF.
	relay, err := s.startStatusRelay(t, pipePath)
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"status pipe\": %v", err))
	}
	// 8. start.
	startAt := time.Now()
	started = true // Start releases the sandbox itself when it fails
	sb, err := created.Start()
	if err != nil {
		relay.finish()
		if cause := context.Cause(t.ctx); cause != nil {
			return fail(cancelledError(cause))
		}
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"start\": %v%s", err, stderrNote(stderr)))
	}
	setupTime += time.Since(startAt)
	exit, err := sb.Wait()
	exitedAt := time.Now()
	// 9. the sandbox is gone: drain the status FIFO to EOF.
	relay.finish()
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "waiting for the sandbox: %v%s", err, stderrNote(stderr)))
	}
	if exit.SetupTime > 0 {
		setupTime = exit.SetupTime
	}
	s.metrics.SetupTime.Observe(setupTime.Seconds())
	out := s.classify(t, exit, dir, resultPath, exitedAt.Sub(t.received), stderr)
	out.exitedAt = exitedAt
	if out.label == "success" || out.label == "timeout" {
		// execution_time_ms runs from receipt to the tool's exit.
		t.log.Info("tool finished", "execution_ms", exitedAt.Sub(t.received).Milliseconds(),
			"exit_code", exit.ExitCode, "timed_out", exit.TimedOut)
		if tail := stderr.String(); tail != "" {
			t.log.Debug("sandbox stderr", "stderr", tail)
		}
	}
	return out
}

// workDirError is the reply for a work dir that could not be made.
func workDirError(err error) *Error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return errorf(CodeResourceExhausted, "no disk space for the work dir: %v", err)
	}
	return errorf(CodeSandboxFailed, "sandbox setup failed at step \"work dir\": %v", err)
}

// stderrNote is the sandbox's stderr tail as a message suffix ("" when
// there was none).
func stderrNote(b *tailBuffer) string {
	tail := b.String()
	if tail == "" {
		return ""
	}
	return "; stderr: " + tail
}

// classify turns the sandbox's end and the result file into the reply.
// Every SANDBOX_FAILED message ends with the tail of the sandbox's stderr
// (the runner's traceback, the interpreter's complaint, a setup error).
func (s *Server) classify(t *task, exit *SandboxExit, dir, resultPath string, elapsed time.Duration, stderr *tailBuffer) outcome {
	fail := func(e *Error) outcome { return s.errorOutcome(t, e) }
	switch {
	case exit.SetupError != nil:
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed: %v%s", exit.SetupError, stderrNote(stderr)))
	case exit.Cancelled || context.Cause(t.ctx) != nil:
		cause := context.Cause(t.ctx)
		if cause == nil {
			cause = errCancelRequested
		}
		return fail(cancelledError(cause))
	case exit.TimedOut:
		return outcome{payload: EncodeTimeout(t.req.ID, elapsed), label: "timeout"}
	case exit.OOMKilled:
		return fail(errorf(CodeSandboxFailed, "the tool was killed: out of memory (the profile %s memory limit)%s", t.profile, stderrNote(stderr)))
	}
	// A result too large to send is the tool's fault, not the sandbox's.
	if fi, err := os.Lstat(resultPath); err == nil && fi.Mode().IsRegular() && fi.Size() > maxResultBytes {
		return fail(errorf(CodeToolError, "the tool's result is too large: result.json has %d bytes, the limit is %d (the broker's message limit less the reply envelope)", fi.Size(), maxResultBytes))
	}
	res, err := runner.ReadResult(resultPath, maxResultBytes)
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
		if errors.Is(err, runner.ErrNoResult) {
			return fail(errorf(CodeSandboxFailed, "the tool died without a result (%s)%s", how, stderrNote(stderr)))
		}
		return fail(errorf(CodeSandboxFailed, "unusable result (%s): %v%s", how, err, stderrNote(stderr)))
	}
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
	payload := EncodeResult(t.req.ID, toolResult, elapsed, created, skipped...)
	if len(payload) > maxReplyBytes {
		return fail(errorf(CodeToolError, "the tool's result is too large: the reply would have %d bytes, the limit is %d (the broker's message limit less the publish envelope)", len(payload), maxReplyBytes))
	}
	return outcome{payload: payload, label: "success"}
}

// WorkDirMarker is the file every task work dir carries (see makeTaskDir).
const WorkDirMarker = ".str-workdir"

// Modes of what the worker creates for a sandbox. Every one is set with
// fchmod/chmod after creation, never left to the umask: under the systemd
// unit's UMask=0027 a mode given to mkdir or open loses the bits the
// sandbox's uid needs.
const (
	modeTaskDir   = 0o700 // chowned to the sandbox's uid
	modeInputDir  = 0o755 // worker-owned, readable by the sandbox
	modeInputFile = 0o644
	modeOutputDir = 0o700 // chowned to the sandbox's uid
	modeFIFO      = 0o600 // chowned to the sandbox's uid
	modeMarker    = 0o444
)

// makeTaskDir creates dir (which must not exist) and its marker file; it
// stays the worker's until fillWorkDir.
func makeTaskDir(dir string) error {
	// 1. the dir itself, exclusively.
	if err := mkdirMode(dir, modeTaskDir); err != nil {
		return err
	}
	// 2. the marker that makes it removable as stale after a crash: the
	// startup sweep deletes only directories carrying it, never whatever
	// else an operator keeps under SANDBOX_WORK_DIR.
	if err := writeNewFile(filepath.Join(dir, WorkDirMarker), nil, modeMarker); err != nil {
		return fmt.Errorf("mark %s: %w", dir, err)
	}
	return nil
}

// fillWorkDir creates input/, output/ and the FIFO status.pipe in dir and
// hands dir, output/ and the FIFO to the tool's host uid/gid. It returns
// the FIFO's path.
func fillWorkDir(dir string, uid, gid int) (string, error) {
	// 1. input/ (worker-owned, readable), output/ (tool-owned).
	if err := mkdirMode(filepath.Join(dir, "input"), modeInputDir); err != nil {
		return "", err
	}
	if err := mkdirMode(filepath.Join(dir, "output"), modeOutputDir); err != nil {
		return "", err
	}
	// 2. the FIFO. Nothing but the worker can write dir yet, so the path
	// chmod follows is the FIFO just made.
	pipe := filepath.Join(dir, "status.pipe")
	if err := unix.Mkfifo(pipe, modeFIFO); err != nil {
		return "", fmt.Errorf("mkfifo %s: %w", pipe, err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, pipe, modeFIFO, 0); err != nil {
		return "", fmt.Errorf("chmod %s to %o: %w", pipe, modeFIFO, err)
	}
	// 3. ownership (Lchown: nothing here can be a symlink yet, but never
	// follow one).
	for _, p := range []string{dir, filepath.Join(dir, "output"), pipe} {
		if err := os.Lchown(p, uid, gid); err != nil {
			return "", fmt.Errorf("chown %s to %d:%d: %w", p, uid, gid, err)
		}
	}
	return pipe, nil
}

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

// writeInputs places every input artifact under input/.
func (s *Server) writeInputs(t *task, dir string) (map[string]string, map[string]runner.ArtifactMeta, *Error) {
	paths := map[string]string{}
	meta := map[string]runner.ArtifactMeta{}
	write := func(param, filename string, data []byte, mime string, version int) *Error {
		local := LocalInputName(filename)
		if err := artifacts.CheckFilename(local); err != nil {
			return errorf(CodeInvalidRequest, "input %q: %v", param, err)
		}
		path := filepath.Join(dir, "input", local)
		if err := writeNewFile(path, data, modeInputFile); err != nil {
			if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
				return errorf(CodeResourceExhausted, "no disk space for input %q: %v", param, err)
			}
			return errorf(CodeArtifactError, "input %q: %v", param, err)
		}
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
		if e := write(param, a.Filename, a.Content, a.MimeType, v); e != nil {
			return nil, nil, e
		}
	}
	// 2. referenced: loaded from the store, mime type from its metadata.
	for _, param := range sortedKeys(t.req.References) {
		ref := t.req.References[param]
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
			return nil, nil, errorf(CodeArtifactError, "input %q: loading artifact %q (%s): %v", param, ref.Filename, which, err)
		}
		if e := write(param, ref.Filename, art.Data, art.MimeType, art.Version); e != nil {
			return nil, nil, e
		}
	}
	return paths, meta, nil
}

// writeNewFile creates path exclusively (no symlink followed), sets its
// mode on the descriptor (whatever the umask) and writes data.
func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
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

// saveOutputs stores the top-level regular files of output/. The tool
// owns the work dir, so output/ is opened without following a symlink and
// every file through that directory fd, also without following one.
// Regular files whose names break the filename rule
// (artifacts.CheckFilename) are not stored and are returned as skipped;
// anything that is not a regular file is not an output (spec §7.6) and is
// only logged.
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
		return nil, nil, errorf(CodeArtifactError, "the tool wrote more than %d files to output/", maxOutputFiles)
	}
	sort.Strings(names)
	// 2. each regular file, read through an O_NOFOLLOW fd, size-capped.
	var total int64
	created := []CreatedArtifact{}
	var skipped []SkippedOutput
	for _, name := range names {
		log := t.log.With("output", name)
		if err := artifacts.CheckFilename(name); err != nil {
			var st unix.Stat_t
			if unix.Fstatat(outFd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
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
		fd, err := unix.Openat(outFd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			log.Warn("output skipped (symlinks are not followed)", "error", err)
			continue
		}
		f := os.NewFile(uintptr(fd), name)
		st, err := f.Stat()
		if err != nil || !st.Mode().IsRegular() {
			f.Close()
			log.Warn("output that is not a regular file skipped")
			continue
		}
		if s.cfg.MaxOutputBytes > 0 && total+st.Size() > s.cfg.MaxOutputBytes {
			f.Close()
			return nil, nil, errorf(CodeArtifactError, "outputs exceed the limit of %d bytes", s.cfg.MaxOutputBytes)
		}
		limit := st.Size() + 1
		if s.cfg.MaxOutputBytes > 0 {
			limit = s.cfg.MaxOutputBytes - total + 1
		}
		data, err := io.ReadAll(io.LimitReader(f, limit))
		f.Close()
		if err != nil {
			return nil, nil, errorf(CodeArtifactError, "read output %s: %v", name, err)
		}
		total += int64(len(data))
		if s.cfg.MaxOutputBytes > 0 && total > s.cfg.MaxOutputBytes {
			return nil, nil, errorf(CodeArtifactError, "outputs exceed the limit of %d bytes", s.cfg.MaxOutputBytes)
		}
		mime := toolMimes[name]
		if mime == "" {
			mime = artifacts.MimeByExtension(name)
		}
		v, err := s.store.Save(t.ctx, t.req.UserID, t.req.SessionID, name, data, mime)
		if err != nil {
			return nil, nil, errorf(CodeArtifactError, "save output %s: %v", name, err)
		}
		created = append(created, CreatedArtifact{Filename: name, Version: v, MimeType: mime, SizeBytes: int64(len(data))})
	}
	return created, skipped, nil
}

// statusRelay reads the status FIFO and publishes each line, in order.
type statusRelay struct {
	r, w *os.File
	done chan struct{}
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
	rel := &statusRelay{r: r, w: w, done: make(chan struct{})}
	go func() {
		defer close(rel.done)
		s.relayLines(t, r)
	}()
	return rel, nil
}

// finish closes the worker's write end and waits until every line
// written before has been relayed (EOF), within statusDrainWindow.
func (r *statusRelay) finish() {
	r.w.Close()
	r.r.SetReadDeadline(time.Now().Add(statusDrainWindow))
	<-r.done
	r.r.Close()
}

func (s *Server) relayLines(t *task, r io.Reader) {
	br := bufio.NewReaderSize(r, maxStatusLine)
	n := 0
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			n++
			if n <= maxStatusLines {
				s.relayStatus(t, line)
			} else if n == maxStatusLines+1 {
				t.log.Warn("too many status lines; the rest are dropped", "limit", maxStatusLines)
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
func (s *Server) relayStatus(t *task, line []byte) {
	text := string(line)
	var doc struct {
		Status *string `json:"status"`
	}
	if json.Unmarshal(line, &doc) == nil && doc.Status != nil {
		text = *doc.Status
	}
	text = strings.ToValidUTF8(text, "\uFFFD")
	s.metrics.StatusLines.Inc()
	if t.statusTo == "" {
		return
	}
	if err := s.publish(t.statusTo, EncodeStatus(t.req.TaskID, text, time.Now())); err != nil {
		t.log.Warn("publishing a status line failed", "status_to", t.statusTo, "error", err)
	}
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

// errReplyRefused marks a reply the broker refused (as opposed to one it
// could not be reached for): sending it again cannot succeed.
var errReplyRefused = errors.New("the broker refused the message")

// publishReply publishes a reply to the task's replyTo, retrying while the
// broker cannot be reached, until the task's deadline (receipt + timeout
// + 5 s) or for at least replyRetryWindow. A refusal by the broker is not
// retried: the error wraps errReplyRefused.
func (s *Server) publishReply(t *task, payload []byte) error {
	deadline := t.received.Add(t.timeout + timeoutSlack)
	if least := time.Now().Add(replyRetryWindow); deadline.Before(least) {
		deadline = least
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	wait := replyRetryFirst
	for attempt := 1; ; attempt++ {
		err := s.tr.Publish(ctx, transport.Message{
			Topic: t.replyTo, Payload: payload,
			UserProperties: map[string]string{PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10)},
		})
		if err == nil {
			if attempt > 1 {
				t.log.Info("reply published after retries", "attempts", attempt)
			}
			return nil
		}
		var be *devbroker.BrokerError
		if errors.As(err, &be) && be.Code != devbroker.CodeNotConnected {
			return fmt.Errorf("%w: %w", errReplyRefused, err)
		}
		if s.stopping.Load() && attempt >= 2 {
			return fmt.Errorf("worker stopping: reply not published after %d attempts: %w", attempt, err)
		}
		t.log.Warn("publishing the reply failed; retrying", "attempt", attempt, "retry_until", deadline.UTC().Format(time.RFC3339), "error", err)
		select {
		case <-ctx.Done():
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
	b.mu.Lock()
	defer b.mu.Unlock()
	tail := b.buf
	prefix := ""
	if b.total > int64(len(tail)) {
		prefix = "…"
		for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
			tail = tail[1:]
		}
	}
	s := strings.TrimSpace(strings.ToValidUTF8(string(tail), "\uFFFD"))
	if s == "" {
		return ""
	}
	return prefix + s
}
