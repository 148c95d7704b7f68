package worker

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/runner"
	"github.com/securetoolruntime/str/worker/transport"
)

// The init sub-protocol of class-based tools (spec §14; the reference's
// sandbox worker wins where the spec differs).
//
// Requests. Every manifest entry (served or unavailable) has both
// generations' request topics subscribed (server.go, entryTopics): the
// older {base}/sam_remote_tool/init/{tool} with method
// sam_remote_tool/init, the newer {base}/sam_remote_tool/init_request/{tool}
// with sam_remote_tool/init_request. Each is answered on its replyTo with
// its own generation's field names (EncodeInitResult). A message on the
// init topic without an id is a notification (this or another worker's
// init broadcast) and is ignored. The answers, in order of the checks:
//  1. no id: ignored (not a request); no replyTo: logged, ignored;
//  2. signature, when STR_SIGNING_SECRET is set: AUTHENTICATION_FAILED;
//  3. not a valid request of the topic's generation, or params.tool_name
//     not the topic's tool: INVALID_REQUEST;
//  4. the worker stopping: RESOURCE_EXHAUSTED;
//  5. an entry the manifest's checks refused: TOOL_NOT_AVAILABLE with its
//     reason; a tool not in the manifest, or not class-based (no
//     class_name): TOOL_NOT_AVAILABLE ("not available for init");
//     a tool that cannot work here (toolcheck.go): TOOL_NOT_AVAILABLE;
//  6. more init runs waiting than SANDBOX_MAX_CONCURRENT+SANDBOX_MAX_QUEUED:
//     RESOURCE_EXHAUSTED;
//  7. the description: runner.InitInfo from the runner in init mode,
//     inside a sandbox of the tool's profile ceiling (never tool code on
//     the host), at most SANDBOX_MAX_CONCURRENT at a time, through the
//     same path as a call (executeCold); its failure is INIT_ERROR
//     "Init failed: <why>".
//
// Cache. A description is kept per (tool, sha256 of the tool_config,
// sha256 of the module's source file) while the manifest entry is the
// same: a hash of one small file per request is cheap next to a sandbox.
// Requests for one key arriving together share one run. Failures are not
// kept. A tool whose module is not a file in the tools dir (installed from
// its package) is not cached; nor is a change in a module the tool's
// module imports seen (restart the worker, or touch the module).
//
// Notices. At start-up and for each tool added by a reload (or repaired),
// the newer generation's init broadcast on {base}/sam_remote_tool/init/{tool}
// with the manifest's description, parameters, artifact_params,
// instructions and config_schema (tools with neither description nor
// parameters are skipped, as the reference does); for each entry that leaves the manifest,
// sam_remote_tool/removed on {base}/sam_remote_tool/removed/{tool}. Init
// replies and notices go through the notice writer: one goroutine and a
// bounded queue, so neither the receive loop nor a reload (which holds the
// dispatch lock) waits on the broker.

// initGeneration is which of the two request generations a topic carries.
type initGeneration int

const (
	initOlder initGeneration = iota // .../init/{tool}, sam_remote_tool/init
	initNewer                       // .../init_request/{tool}, sam_remote_tool/init_request
)

func (g initGeneration) method() string {
	if g == initOlder {
		return MethodInit
	}
	return MethodInitRequest
}

// initTimeout bounds one init run (the reference's 60 s), within the
// tool's own timeout when that is shorter; the sandbox adds timeoutSlack.
const initTimeout = 60 * time.Second

// initCacheMax bounds the cached descriptions; when full, the finished
// ones are dropped.
const initCacheMax = 256

// noticeQueueLen bounds the messages waiting for the notice writer; one
// more is dropped and logged.
const noticeQueueLen = 1024

// initState is the init sub-protocol's share of a Server.
type initState struct {
	pending chan struct{} // one per init request taken, until answered
	running chan struct{} // one per init run in a sandbox

	mu    sync.Mutex
	cache map[initKey]*initEntry

	notices     chan transport.Message
	noticesDone chan struct{}
	noticeCtx   context.Context
	noticeStop  context.CancelFunc
}

func newInitState(cfg *Config) *initState {
	ctx, stop := context.WithCancel(context.Background())
	return &initState{
		pending: make(chan struct{}, max(cfg.MaxConcurrent, 1)+cfg.MaxQueued),
		running: make(chan struct{}, max(cfg.MaxConcurrent, 1)),
		cache:   map[initKey]*initEntry{},
		notices: make(chan transport.Message, noticeQueueLen), noticesDone: make(chan struct{}),
		noticeCtx: ctx, noticeStop: stop,
	}
}

type initKey struct {
	tool, config, source string
}

// initEntry is one description, being made (done open) or made.
type initEntry struct {
	done chan struct{}
	tool *manifest.Tool // the definition it was made for
	info *runner.InitInfo
	err  *Error
}

// dispatchInit handles one message on an init topic, in the receive loop:
// the checks are quick; the run and every answer happen elsewhere.
func (s *Server) dispatchInit(d *transport.Delivery, gen initGeneration, topicTool string, received time.Time) {
	shown := truncateName(topicTool)
	log := s.log.With("tool", shown, "method", gen.method())
	// The request is settled at once: its answer goes through the notice
	// writer, and an agent that gets none keeps its static description.
	defer ack(log, d)
	req, id, err := ParseInitRequest(d.Payload, gen.method(), s.cfg.MaxPayloadBytes)
	// 1. a notification, or nobody to answer.
	if errors.Is(err, ErrNotARequest) {
		log.Debug("init notification ignored (not a request)", "topic", truncateName(d.Topic))
		return
	}
	replyTo := d.UserProperties[PropReplyTo]
	if replyTo == "" {
		log.Warn("init request without replyTo ignored", "id", truncateName(id))
		return
	}
	// 2. signature.
	// A request that fails it is not answered: its replyTo could be
	// anyone's (as for an invoke, auth.go).
	if s.signing() {
		if _, e := s.checkSignature(d, received); e != nil {
			log.Warn("init request refused, not answered", "error", e.Message)
			return
		}
	}
	// 3. the request.
	if err != nil {
		var e *Error
		if !errors.As(err, &e) {
			e = errorf(CodeInvalidRequest, "%v", err)
		}
		s.answerInitError(replyTo, id, e, log)
		return
	}
	log = log.With("id", truncateName(req.ID))
	if req.ToolName != topicTool {
		s.answerInitError(replyTo, id, errorf(CodeInvalidRequest,
			"params.tool_name %q does not match the topic's tool %q", truncateName(req.ToolName), shown), log)
		return
	}
	// 4, 5. the tool, as the manifest has it now.
	s.mu.RLock()
	tool := s.manifest.Tools[topicTool]
	reason, bad := s.manifest.Unavailable[topicTool]
	s.mu.RUnlock()
	var e *Error
	switch {
	case s.stopping.Load():
		e = errorf(CodeResourceExhausted, "worker is shutting down")
	case bad:
		e = unavailableEntryError(topicTool, reason)
	case tool == nil:
		e = errorf(CodeToolNotAvailable, "Tool '%s' is not available for init on this worker", shown)
	case tool.ClassName == "":
		e = errorf(CodeToolNotAvailable, "Tool '%s' is not available for init on this worker: it is not class-based (its manifest entry has no class_name)", shown)
	default:
		if perr := s.toolProblem(tool); perr != nil {
			log.Error("tool cannot work on this worker", "error", perr)
			e = notHereError(tool.Name, perr)
		}
	}
	if e != nil {
		s.answerInitError(replyTo, id, e, log)
		return
	}
	// 6. bounded.
	select {
	case s.init.pending <- struct{}{}:
	default:
		s.answerInitError(replyTo, id, errorf(CodeResourceExhausted,
			"too many init requests waiting (%d)", cap(s.init.pending)), log)
		return
	}
	// 7. the description, away from the receive loop; the shutdown waits
	// for it (execWG) and its stop kills the sandbox.
	s.execWG.Add(1)
	go func() {
		defer s.execWG.Done()
		defer func() { <-s.init.pending }()
		info, e := s.describe(tool, req, log)
		if e != nil {
			s.answerInitError(replyTo, req.ID, e, log)
			return
		}
		log.Info("init answered", "description_bytes", len(info.Description), "parameters", len(info.ParametersSchema) > 0)
		s.notify(replyTo, EncodeInitResult(req.ID, gen.method(), info))
	}()
}

// answerInitError queues an init error reply.
func (s *Server) answerInitError(replyTo, id string, e *Error, log *slog.Logger) {
	s.metrics.Errors.WithLabelValues(string(e.Code)).Inc()
	log.Warn("init request answered with an error", "code", e.Code, "error", e.Message)
	s.notify(replyTo, EncodeError(id, e))
}

// describe returns tool's description for req's tool_config: from the
// cache, from a run another request started, or from a new run.
func (s *Server) describe(tool *manifest.Tool, req *InitRequest, log *slog.Logger) (*runner.InitInfo, *Error) {
	key, cacheable := s.initCacheKey(tool, req.ToolConfig)
	if !cacheable {
		return s.runInit(tool, req, log)
	}
	st := s.init
	st.mu.Lock()
	if ent, ok := st.cache[key]; ok && ent.tool.Equal(tool) {
		st.mu.Unlock()
		select {
		case <-ent.done:
		case <-s.execCtx.Done():
			return nil, errorf(CodeResourceExhausted, "worker is shutting down")
		}
		if ent.err == nil {
			log.Debug("init description from the cache")
			return ent.info, nil
		}
		return nil, ent.err
	}
	if len(st.cache) >= initCacheMax {
		for k, ent := range st.cache {
			select {
			case <-ent.done:
				delete(st.cache, k)
			default:
			}
		}
	}
	ent := &initEntry{done: make(chan struct{}), tool: tool}
	st.cache[key] = ent
	st.mu.Unlock()

	ent.info, ent.err = s.runInit(tool, req, log)
	if ent.err != nil {
		st.mu.Lock()
		if st.cache[key] == ent {
			delete(st.cache, key) // a failure is asked again next time
		}
		st.mu.Unlock()
	}
	close(ent.done)
	return ent.info, ent.err
}

// initCacheKey is the cache key of tool's description for config; false
// when the module's source is not a file of the tools dir.
func (s *Server) initCacheKey(tool *manifest.Tool, config json.RawMessage) (initKey, bool) {
	path, err := tool.SourcePath(s.cfg.ToolsDir)
	if err != nil {
		return initKey{}, false
	}
	source, err := manifest.FileSHA256(path)
	if err != nil {
		return initKey{}, false
	}
	sum := sha256.Sum256(config)
	return initKey{tool: tool.Name, config: hex.EncodeToString(sum[:]), source: source}, true
}

// runInit runs the runner in init mode for tool in a sandbox of the
// tool's profile ceiling, through the call path (executeCold): the same
// source check, package install, sandbox spec, work dir and result
// reading as a call, with the runner told to describe the class instead
// of calling it.
func (s *Server) runInit(tool *manifest.Tool, req *InitRequest, log *slog.Logger) (*runner.InitInfo, *Error) {
	failed := func(format string, a ...any) *Error {
		return errorf(CodeInitError, "Init failed: %s", fmt.Sprintf(format, a...))
	}
	// 1. a run slot.
	select {
	case s.init.running <- struct{}{}:
		defer func() { <-s.init.running }()
	case <-s.execCtx.Done():
		return nil, errorf(CodeResourceExhausted, "worker is shutting down")
	}
	// 2. the code is what the manifest pinned; its package installed.
	if err := tool.Verify(s.cfg.ToolsDir); err != nil {
		return nil, failed("tool %s cannot be loaded: %v", tool.Name, err)
	}
	// Its package was installed at start-up or reload (packages.go),
	// never here: a failed installation is the tool's problem.
	if err := s.packageProblem(tool); err != nil {
		return nil, failed("%v", err)
	}
	// 3. a task of its own: a fresh work dir name, the tool's ceiling.
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return nil, errorf(CodeInternalError, "init: random work dir name: %v", err)
	}
	profile := tool.SandboxProfile
	if profile == "" {
		profile = s.cfg.DefaultProfile
	}
	timeout := min(initTimeout, manifestTimeout(tool))
	taskID := "init-" + hex.EncodeToString(rnd[:])
	t := &task{
		req: &Request{
			ID: req.ID, TaskID: taskID, ToolName: tool.Name, AppName: "init",
			Args: json.RawMessage("{}"), ToolConfig: req.ToolConfig,
		},
		tool: tool, profile: profile, timeout: timeout, received: time.Now(),
		sandboxTimeout: s.sandboxTimeout(profile, timeout+timeoutSlack),
		log:            log.With("task_id", taskID, "profile", profile), mode: runner.ModeInit,
	}
	t.ctx, t.cancel = context.WithCancelCause(s.execCtx)
	defer t.cancel(nil)
	// 4. run; the sandbox and its work dir are gone before the answer.
	out, teardown := s.executeCold(t)
	if teardown != nil {
		teardown()
	}
	switch out.label {
	case "success":
	case "timeout":
		return nil, failed("init timed out after %s", timeout)
	default:
		return nil, failed("%s", errorMessage(out.payload))
	}
	// 5. the description: one JSON object, for this tool.
	var info runner.InitInfo
	dec := json.NewDecoder(bytes.NewReader(out.payload))
	if err := dec.Decode(&info); err != nil {
		return nil, failed("the runner's description is not usable: %v", err)
	}
	info.ToolName = tool.Name
	for what, raw := range map[string]json.RawMessage{"parameters_schema": info.ParametersSchema, "config_schema": info.ConfigSchema} {
		if len(raw) > 0 && !json.Valid(raw) {
			return nil, failed("the runner's %s is not JSON", what)
		}
	}
	return &info, nil
}

// errorMessage is the code and message of an error reply payload.
func errorMessage(payload []byte) string {
	var env struct {
		Error *errorBody `json:"error"`
	}
	if json.Unmarshal(payload, &env) != nil || env.Error == nil {
		return "no usable result"
	}
	return env.Error.Code + ": " + env.Error.Message
}

// broadcastInits queues the newer generation's init broadcast for each
// of names served by m, with the manifest's description fields; tools
// with neither description nor parameters are skipped, as the reference
// skips them.
func (s *Server) broadcastInits(m *manifest.Manifest, names []string) {
	for _, name := range names {
		tool := m.Tools[name]
		if tool == nil || (tool.Description == "" && tool.Parameters == "") || !manifest.ValidToolName(name) {
			continue
		}
		info := &runner.InitInfo{
			ToolName: name, Description: tool.Description, Instructions: tool.Instructions,
			ParametersSchema: rawOrNil(tool.Parameters), ConfigSchema: rawOrNil(tool.ConfigSchema),
		}
		if tool.ArtifactParams != "" {
			// Checked by the manifest's parser: {param: {is_list, is_optional}}.
			if err := json.Unmarshal([]byte(tool.ArtifactParams), &info.ArtifactParams); err != nil {
				s.log.Warn("artifact_params not announced", "tool", name, "error", err)
			}
		}
		s.notify(s.initTopic(name), EncodeInitBroadcast(info))
	}
}

// rawOrNil is JSON text as a raw message, nil for "".
func rawOrNil(text string) json.RawMessage {
	if text == "" {
		return nil
	}
	return json.RawMessage(text)
}

// notify queues one message for the notice writer; a full queue drops it,
// loudly (a broker that slow loses notices, never the receive loop).
func (s *Server) notify(topic string, payload []byte) {
	msg := transport.Message{Topic: topic, Payload: payload}
	select {
	case s.init.notices <- msg:
	default:
		s.log.Warn("notice queue full: message dropped", "topic", truncateName(topic), "queued", noticeQueueLen)
	}
}

// startNotices starts the notice writer: it publishes the queued
// messages in order until stopNotices.
func (s *Server) startNotices() {
	st := s.init
	go func() {
		defer close(st.noticesDone)
		for msg := range st.notices {
			ctx, cancel := context.WithTimeout(st.noticeCtx, 30*time.Second)
			err := s.tr.Publish(ctx, transport.Message{
				Topic: msg.Topic, Payload: msg.Payload,
				UserProperties: map[string]string{PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10)},
			})
			cancel()
			if err != nil {
				s.log.Warn("publishing a notice or init reply failed", "topic", truncateName(msg.Topic), "error", err)
			}
		}
	}()
}

// stopNotices ends the notice writer once every message queued is sent,
// waiting at most replyShutdownWindow for the broker. Nothing may be
// queued after it (the receive loop, the watcher and the init runs have
// ended).
func (s *Server) stopNotices() {
	st := s.init
	close(st.notices)
	select {
	case <-st.noticesDone:
	case <-time.After(replyShutdownWindow):
		st.noticeStop()
		<-st.noticesDone
	}
	st.noticeStop()
}
