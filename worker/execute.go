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
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
)

// Bounds on what one execution may produce.
const (
	maxResultBytes    = 16 << 20 // result.json
	maxStatusLine     = 64 << 10 // longer status lines are truncated
	maxStatusLines    = 10000    // further lines are read and dropped
	maxOutputFiles    = 1000
	statusDrainWindow = 10 * time.Second // after exit, to read what is buffered
)

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
	} else {
		s.metrics.startRunning()
		out = s.execute(t)
		s.metrics.stopRunning()
	}
	// 1. the reply.
	if err := s.publish(t.replyTo, out.payload); err != nil {
		t.log.Error("publishing the reply failed", "reply_to", t.replyTo, "error", err)
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

// execute runs the steps of spec §7 for one task.
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
	// 2. the work dir with input/, output/ and the status FIFO.
	uid, gid, err := s.sb.ToolOwner(t.profile)
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"tool owner\" (profile %s): %v", t.profile, err))
	}
	pipePath, err := makeWorkDir(dir, uid, gid)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return fail(errorf(CodeInvalidRequest, "task %q already has a work dir", t.req.TaskID))
		}
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return fail(errorf(CodeResourceExhausted, "no disk space for the work dir: %v", err))
		}
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"work dir\": %v", err))
	}
	// 3. inputs.
	paths, meta, perr := s.writeInputs(t, dir)
	if perr != nil {
		return fail(perr)
	}
	// 4. runner_args.json.
	argsPath := filepath.Join(dir, "runner_args.json")
	resultPath := filepath.Join(dir, "result.json")
	outputDir := filepath.Join(dir, "output")
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
	// 5. the FIFO's read end, before the tool starts: the tool's blocking
	// open would hang otherwise. A write end held by the worker keeps the
	// reader from seeing EOF when the tool closes it between lines; it is
	// closed after the sandbox is gone, and the reader drains to EOF.
	relay, err := s.startStatusRelay(t, pipePath)
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed at step \"status pipe\": %v", err))
	}
	// 6. the sandbox.
	spec := SandboxSpec{
		Profile:  t.profile,
		Argv:     []string{s.cfg.PythonBin, s.runnerPath, argsPath},
		Env:      []string{"PYTHONPATH=" + s.cfg.ToolsDir + ":" + s.cfg.SiteDir},
		Workdir:  dir,
		ReadOnly: []string{s.cfg.ToolsDir, filepath.Dir(s.runnerPath), s.cfg.SiteDir},
		Timeout:  t.timeout + timeoutSlack,
	}
	setupStart := time.Now()
	sb, err := s.sb.Start(t.ctx, spec)
	if err != nil {
		relay.finish()
		if errors.Is(err, ErrInvalidSandboxRequest) {
			return fail(errorf(CodeInvalidRequest, "the sandbox refused the request: %v", err))
		}
		if cause := context.Cause(t.ctx); cause != nil {
			return fail(cancelledError(cause))
		}
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed: %v", err))
	}
	startTime := time.Since(setupStart)
	exit, err := sb.Wait()
	exitedAt := time.Now()
	// 7. the sandbox is gone: drain the status FIFO to EOF.
	relay.finish()
	if err != nil {
		return fail(errorf(CodeSandboxFailed, "waiting for the sandbox: %v", err))
	}
	if exit.SetupTime > 0 {
		startTime = exit.SetupTime
	}
	s.metrics.SetupTime.Observe(startTime.Seconds())
	out := s.classify(t, exit, dir, resultPath, exitedAt.Sub(t.received))
	out.exitedAt = exitedAt
	if out.label == "success" || out.label == "timeout" {
		// execution_time_ms runs from receipt to the tool's exit.
		t.log.Info("tool finished", "execution_ms", exitedAt.Sub(t.received).Milliseconds(),
			"exit_code", exit.ExitCode, "timed_out", exit.TimedOut)
	}
	return out
}

// classify turns the sandbox's end and the result file into the reply.
func (s *Server) classify(t *task, exit *SandboxExit, dir, resultPath string, elapsed time.Duration) outcome {
	fail := func(e *Error) outcome { return s.errorOutcome(t, e) }
	switch {
	case exit.SetupError != nil:
		return fail(errorf(CodeSandboxFailed, "sandbox setup failed: %v", exit.SetupError))
	case exit.Cancelled || context.Cause(t.ctx) != nil:
		cause := context.Cause(t.ctx)
		if cause == nil {
			cause = errCancelRequested
		}
		return fail(cancelledError(cause))
	case exit.TimedOut:
		return outcome{payload: EncodeTimeout(t.req.ID, elapsed), label: "timeout"}
	case exit.OOMKilled:
		return fail(errorf(CodeSandboxFailed, "the tool was killed: out of memory (the profile %s memory limit)", t.profile))
	}
	res, err := runner.ReadResult(resultPath, maxResultBytes)
	if err != nil {
		how := fmt.Sprintf("exit code %d", exit.ExitCode)
		if exit.Signal != 0 {
			how = "killed by " + exit.SignalName
			if exit.SignalName == "" {
				how = fmt.Sprintf("killed by signal %d", exit.Signal)
			}
		}
		if exit.PidsLimit {
			return fail(errorf(CodeSandboxFailed, "the tool died (%s): process limit of profile %s reached", how, t.profile))
		}
		if errors.Is(err, runner.ErrNoResult) {
			return fail(errorf(CodeSandboxFailed, "the tool died without a result (%s)", how))
		}
		return fail(errorf(CodeSandboxFailed, "unusable result (%s): %v", how, err))
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
	toolResult, err := NormalizeToolResult(res.Result)
	if err != nil {
		return fail(errorf(CodeExecutionError, "%v", err))
	}
	created, aerr := s.saveOutputs(t, dir, res.OutputMimeTypes)
	if aerr != nil {
		return fail(aerr)
	}
	return outcome{payload: EncodeResult(t.req.ID, toolResult, elapsed, created), label: "success"}
}

// WorkDirMarker is the file every task work dir carries (see makeWorkDir).
const WorkDirMarker = ".str-workdir"

// makeWorkDir creates dir (which must not exist) with input/, output/ and
// the FIFO status.pipe (0600); dir, output/ and the FIFO belong to the
// tool's host uid/gid. It returns the FIFO's path.
func makeWorkDir(dir string, uid, gid int) (string, error) {
	// 1. the dir itself, exclusively.
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("mkdir %s: %w", dir, err)
	}
	// 1b. the marker that makes it removable as stale after a crash: the
	// startup sweep deletes only directories carrying it, never whatever
	// else an operator keeps under SANDBOX_WORK_DIR.
	if err := os.WriteFile(filepath.Join(dir, WorkDirMarker), nil, 0o444); err != nil {
		return "", fmt.Errorf("mark %s: %w", dir, err)
	}
	// 2. input/ (worker-owned, readable), output/ (tool-owned).
	if err := os.Mkdir(filepath.Join(dir, "input"), 0o755); err != nil {
		return "", fmt.Errorf("mkdir %s/input: %w", dir, err)
	}
	if err := os.Mkdir(filepath.Join(dir, "output"), 0o700); err != nil {
		return "", fmt.Errorf("mkdir %s/output: %w", dir, err)
	}
	// 3. the FIFO.
	pipe := filepath.Join(dir, "status.pipe")
	if err := unix.Mkfifo(pipe, 0o600); err != nil {
		return "", fmt.Errorf("mkfifo %s: %w", pipe, err)
	}
	// 4. ownership (Lchown: nothing here can be a symlink yet, but never
	// follow one).
	for _, p := range []string{dir, filepath.Join(dir, "output"), pipe} {
		if err := os.Lchown(p, uid, gid); err != nil {
			return "", fmt.Errorf("chown %s to %d:%d: %w", p, uid, gid, err)
		}
	}
	return pipe, nil
}

// writeInputs places every input artifact under input/.
func (s *Server) writeInputs(t *task, dir string) (map[string]string, map[string]runner.ArtifactMeta, *Error) {
	paths := map[string]string{}
	meta := map[string]runner.ArtifactMeta{}
	write := func(param, filename string, data []byte, mime string, version int) *Error {
		local := LocalInputName(filename)
		if err := artifacts.CheckName(local); err != nil {
			return errorf(CodeInvalidRequest, "input %q: unsafe filename %q: %v", param, filename, err)
		}
		path := filepath.Join(dir, "input", local)
		if err := writeNewFile(path, data, 0o644); err != nil {
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

// writeNewFile creates path exclusively (no symlink followed) and writes data.
func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, mode)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
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
func (s *Server) saveOutputs(t *task, dir string, toolMimes map[string]string) ([]CreatedArtifact, *Error) {
	// 1. the directory, by fd.
	dirFd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errorf(CodeArtifactError, "open work dir %s: %v", dir, err)
	}
	defer unix.Close(dirFd)
	outFd, err := unix.Openat(dirFd, "output", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errorf(CodeArtifactError, "open %s/output (a symlink is refused): %v", dir, err)
	}
	outDir := os.NewFile(uintptr(outFd), filepath.Join(dir, "output"))
	defer outDir.Close()
	names, err := outDir.Readdirnames(maxOutputFiles + 1)
	if err != nil && err != io.EOF {
		return nil, errorf(CodeArtifactError, "list %s/output: %v", dir, err)
	}
	if len(names) > maxOutputFiles {
		return nil, errorf(CodeArtifactError, "the tool wrote more than %d files to output/", maxOutputFiles)
	}
	sort.Strings(names)
	// 2. each regular file, read through an O_NOFOLLOW fd, size-capped.
	var total int64
	created := []CreatedArtifact{}
	for _, name := range names {
		log := t.log.With("output", name)
		if err := artifacts.CheckName(name); err != nil {
			log.Warn("output with an unsafe name skipped", "error", err)
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
			return nil, errorf(CodeArtifactError, "outputs exceed the limit of %d bytes", s.cfg.MaxOutputBytes)
		}
		limit := st.Size() + 1
		if s.cfg.MaxOutputBytes > 0 {
			limit = s.cfg.MaxOutputBytes - total + 1
		}
		data, err := io.ReadAll(io.LimitReader(f, limit))
		f.Close()
		if err != nil {
			return nil, errorf(CodeArtifactError, "read output %s: %v", name, err)
		}
		total += int64(len(data))
		if s.cfg.MaxOutputBytes > 0 && total > s.cfg.MaxOutputBytes {
			return nil, errorf(CodeArtifactError, "outputs exceed the limit of %d bytes", s.cfg.MaxOutputBytes)
		}
		mime := toolMimes[name]
		if mime == "" {
			mime = artifacts.MimeByExtension(name)
		}
		v, err := s.store.Save(t.ctx, t.req.UserID, t.req.SessionID, name, data, mime)
		if err != nil {
			return nil, errorf(CodeArtifactError, "save output %s: %v", name, err)
		}
		created = append(created, CreatedArtifact{Filename: name, Version: v, MimeType: mime, SizeBytes: int64(len(data))})
	}
	return created, nil
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
