package worker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/runner"
)

// Method names of the JSON-RPC messages (spec §2, §3).
const (
	MethodInvoke = "sam_remote_tool/invoke"
	MethodStatus = "sam_remote_tool/status"
)

// UnknownID is the reply id used when the request's id cannot be read.
const UnknownID = "unknown"

// DefaultMaxPayloadBytes bounds an invoke payload (spec §13: 10 MB).
const DefaultMaxPayloadBytes = 10 << 20

// Name limits. Task ids become directory names and user and session ids
// become artifact store path components, so all three are bounded.
const (
	maxTaskIDLen = 128
	maxIDLen     = 256
	// maxNameInMessage bounds a name from the wire (tool name, id, topic)
	// repeated in a reply message or a log line.
	maxNameInMessage = 128
)

// reservedSessionID is the session id the artifact stores use for the
// directory of a user's "user:" artifacts ({user_id}/user/{name}); a
// request with it would fail only when its outputs are saved.
const reservedSessionID = "user"

// Code is one error code of spec §4. Agents require it to be a string.
type Code string

// The error codes of spec §4 with the meanings str gives them.
const (
	// CodeToolNotAvailable: the tool is not (or no longer) in the manifest;
	// the worker also unsubscribes its invoke topic.
	CodeToolNotAvailable Code = "TOOL_NOT_AVAILABLE"
	// CodeInvalidRequest: not JSON, not JSON-RPC, a missing required field,
	// a wrong type, an unknown profile, an unsafe name, an oversized payload.
	CodeInvalidRequest Code = "INVALID_REQUEST"
	// CodeImportError: the tool's module or function cannot be imported or
	// found (also: its source does not match the manifest's sha256, or its
	// package cannot be installed).
	CodeImportError Code = "IMPORT_ERROR"
	// CodeExecutionError: the tool raised an exception.
	CodeExecutionError Code = "EXECUTION_ERROR"
	// CodeToolError: the tool reported an error through the runner's error
	// channel (raised ToolError).
	CodeToolError Code = "TOOL_ERROR"
	// CodeSandboxFailed: the sandbox could not be set up (the step is
	// named) or died abnormally (OOM kill, pids limit, no result).
	CodeSandboxFailed Code = "SANDBOX_FAILED"
	// CodeArtifactError: an input artifact is missing or unreadable, or an
	// output could not be saved.
	CodeArtifactError Code = "ARTIFACT_ERROR"
	// CodeResourceExhausted: the worker cannot take the work (queue full,
	// per-user rate limit, disk space, shutting down).
	CodeResourceExhausted Code = "RESOURCE_EXHAUSTED"
	// CodeAuthenticationFailed: the request signature is missing or
	// invalid while signing is required.
	CodeAuthenticationFailed Code = "AUTHENTICATION_FAILED"
	// CodeCancelled: a cancel message stopped the execution, or the worker
	// stopped it at the end of its shutdown grace period.
	CodeCancelled Code = "CANCELLED"
	// CodeInternalError: a worker bug; never used for a tool's fault.
	CodeInternalError Code = "INTERNAL_ERROR"
	// CodeInitError: a class-based tool could not describe itself for the
	// init sub-protocol (spec §14): "Init failed: <why>".
	CodeInitError Code = "INIT_ERROR"
)

// Error is a protocol error: it becomes the reply's "error" member.
type Error struct {
	Code    Code
	Message string
	// Data is optional; it is encoded only when non-nil.
	Data json.RawMessage
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Message }

// errorf builds a protocol error.
func errorf(code Code, format string, a ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, a...)}
}

// PreloadedArtifact is an input artifact carried inside the request.
type PreloadedArtifact struct {
	Filename string
	Content  []byte // base64-decoded
	MimeType string // "" when absent
	Version  *int
}

// ArtifactReference names an artifact in the store; Version nil = latest.
type ArtifactReference struct {
	Filename string
	Version  *int
}

// Request is a validated invoke request (spec §2).
type Request struct {
	ID         string // JSON-RPC id, as a string
	TaskID     string
	ToolName   string
	Args       json.RawMessage // a JSON object, "{}" by default
	ToolConfig json.RawMessage // a JSON object, "{}" by default
	AppName    string
	UserID     string
	SessionID  string
	Preloaded  map[string]PreloadedArtifact
	References map[string]ArtifactReference
	// TimeoutSeconds is the request's timeout; TimeoutSet reports whether
	// the request carried one (otherwise the worker default applies).
	TimeoutSeconds float64
	TimeoutSet     bool
	// SandboxProfile is "" when the request did not name one.
	SandboxProfile string
}

// ParseLimits are the request parser's bounds.
type ParseLimits struct {
	MaxPayloadBytes int // 0 = DefaultMaxPayloadBytes
}

// decodeJSONObject checks payload's size against max (0 =
// DefaultMaxPayloadBytes) before anything is decoded, then decodes it as
// a JSON object.
func decodeJSONObject(payload []byte, max int) (map[string]json.RawMessage, *Error) {
	if max <= 0 {
		max = DefaultMaxPayloadBytes
	}
	if len(payload) > max {
		return nil, errorf(CodeInvalidRequest, "payload of %d bytes exceeds the limit of %d bytes", len(payload), max)
	}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(payload, &env); err != nil || env == nil {
		msg := "payload is not a JSON object"
		if err != nil {
			msg += ": " + err.Error()
		}
		return nil, errorf(CodeInvalidRequest, "%s", msg)
	}
	return env, nil
}

// envelope reads a JSON-RPC 2.0 request's id (UnknownID when it cannot)
// and params (nil when missing or not an object), collecting every
// problem of the envelope, the method included.
func envelope(env map[string]json.RawMessage, method string) (string, map[string]json.RawMessage, []string) {
	id, idErr := parseID(env["id"])
	var problems []string
	if idErr != "" {
		problems = append(problems, idErr)
	}
	if s, ok := jsonString(env["jsonrpc"]); !ok || s != "2.0" {
		problems = append(problems, `"jsonrpc" must be "2.0"`)
	}
	if s, ok := jsonString(env["method"]); !ok || s != method {
		problems = append(problems, fmt.Sprintf("%q must be %q", "method", method))
	}
	var params map[string]json.RawMessage
	if raw, ok := env["params"]; !ok || isNull(raw) {
		problems = append(problems, `"params" is missing`)
	} else if err := json.Unmarshal(raw, &params); err != nil || params == nil {
		problems = append(problems, `"params" must be an object`)
	}
	return id, params, problems
}

// ParseRequest parses and validates one invoke payload. On failure it
// returns the request id it could read ("unknown" otherwise) and an
// INVALID_REQUEST error listing every problem found.
func ParseRequest(payload []byte, lim ParseLimits) (*Request, string, *Error) {
	// 1.-4. size, a JSON object, the id (so that every later error can
	// be correlated), the JSON-RPC envelope.
	env, e := decodeJSONObject(payload, lim.MaxPayloadBytes)
	if e != nil {
		return nil, UnknownID, e
	}
	id, params, problems := envelope(env, MethodInvoke)
	if params == nil {
		return nil, id, invalid(problems)
	}
	// 5. params, every problem collected.
	r := &Request{ID: id}
	p := &paramReader{params: params}
	r.TaskID = p.name("task_id", maxTaskIDLen)
	r.ToolName = p.requiredString("tool_name")
	r.AppName = p.requiredString("app_name")
	r.UserID = p.name("user_id", maxIDLen)
	r.SessionID = p.name("session_id", maxIDLen)
	if r.SessionID == reservedSessionID {
		p.fail("params.session_id %q is reserved: the artifact store keeps user-scoped (\"user:\") artifacts under it", reservedSessionID)
	}
	r.Args = p.object("args")
	r.ToolConfig = p.object("tool_config")
	r.TimeoutSeconds, r.TimeoutSet = p.timeout("timeout_seconds")
	r.SandboxProfile = p.optionalString("sandbox_profile")
	r.Preloaded = p.preloaded("preloaded_artifacts")
	r.References = p.references("artifact_references")
	p.oneSourcePerInput(r)
	problems = append(problems, p.problems...)
	if len(problems) > 0 {
		return nil, id, invalid(problems)
	}
	return r, id, nil
}

func invalid(problems []string) *Error {
	return errorf(CodeInvalidRequest, "invalid request: %s", strings.Join(problems, "; "))
}

// parseID reads the JSON-RPC id: a string is used as is, a number as its
// JSON text (agents require a string id in replies).
func parseID(raw json.RawMessage) (string, string) {
	if raw == nil || isNull(raw) {
		return UnknownID, `"id" is missing`
	}
	if s, ok := jsonString(raw); ok {
		if s == "" {
			return UnknownID, `"id" is empty`
		}
		return s, ""
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		return n.String(), ""
	}
	return UnknownID, `"id" must be a string or a number`
}

// LenientID extracts the request id from a payload that is not otherwise
// validated (for replies to requests rejected before parsing).
func LenientID(payload []byte, maxBytes int) string {
	if maxBytes > 0 && len(payload) > maxBytes {
		return UnknownID
	}
	var env struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(payload, &env) != nil {
		return UnknownID
	}
	id, _ := parseID(env.ID)
	return id
}

func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

func isNull(raw json.RawMessage) bool {
	return string(bytes.TrimSpace(raw)) == "null"
}

// paramReader validates params fields, collecting every problem.
type paramReader struct {
	params   map[string]json.RawMessage
	problems []string
}

func (p *paramReader) fail(format string, a ...any) {
	p.problems = append(p.problems, fmt.Sprintf(format, a...))
}

func (p *paramReader) requiredString(key string) string {
	raw, ok := p.params[key]
	if !ok || isNull(raw) {
		p.fail("params.%s is required", key)
		return ""
	}
	s, ok := jsonString(raw)
	if !ok {
		p.fail("params.%s must be a string", key)
		return ""
	}
	if s == "" {
		p.fail("params.%s must not be empty", key)
	}
	return s
}

func (p *paramReader) optionalString(key string) string {
	raw, ok := p.params[key]
	if !ok || isNull(raw) {
		return ""
	}
	s, ok := jsonString(raw)
	if !ok {
		p.fail("params.%s must be a string", key)
	}
	return s
}

// name reads a required identifier that becomes a path component.
func (p *paramReader) name(key string, maxLen int) string {
	s := p.requiredString(key)
	if s == "" {
		return ""
	}
	if why := unsafeName(s, maxLen); why != "" {
		p.fail("params.%s %q is unsafe: %s", key, truncate(s, 64), why)
		return ""
	}
	return s
}

func (p *paramReader) object(key string) json.RawMessage {
	raw, ok := p.params[key]
	if !ok || isNull(raw) {
		return json.RawMessage("{}")
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		p.fail("params.%s must be an object", key)
		return nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		p.fail("params.%s: %v", key, err)
		return nil
	}
	return buf.Bytes()
}

func (p *paramReader) timeout(key string) (float64, bool) {
	raw, ok := p.params[key]
	if !ok || isNull(raw) {
		return 0, false
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		p.fail("params.%s must be a number", key)
		return 0, false
	}
	if !(f > 0) || math.IsInf(f, 0) || f > 7*24*3600 {
		p.fail("params.%s must be a positive number of seconds (at most one week), got %v", key, f)
		return 0, false
	}
	return f, true
}

func (p *paramReader) artifactMap(key string) map[string]json.RawMessage {
	raw, ok := p.params[key]
	if !ok || isNull(raw) {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		p.fail("params.%s must be an object", key)
		return nil
	}
	return m
}

type artifactFields struct {
	Filename *string         `json:"filename"`
	Content  *string         `json:"content"`
	MimeType *string         `json:"mime_type"`
	Version  json.RawMessage `json:"version"`
}

func (p *paramReader) artifactEntry(key, param string, raw json.RawMessage) (artifactFields, bool) {
	var f artifactFields
	where := fmt.Sprintf("params.%s[%q]", key, param)
	if param == "" {
		p.fail("params.%s has an empty parameter name", key)
		return f, false
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		p.fail("%s must be an object with string fields: %v", where, err)
		return f, false
	}
	ok := true
	if f.Filename == nil {
		p.fail("%s.filename is required", where)
		ok = false
	} else if why := UnsafeFilename(*f.Filename); why != "" {
		p.fail("%s.filename %q is unsafe: %s", where, truncate(*f.Filename, 64), why)
		ok = false
	}
	return f, ok
}

func (p *paramReader) version(where string, raw json.RawMessage) (*int, bool) {
	if raw == nil || isNull(raw) {
		return nil, true
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		if v, err := strconv.Atoi(n.String()); err == nil && v >= 0 {
			return &v, true
		}
	}
	p.fail("%s.version must be a non-negative integer", where)
	return nil, false
}

func (p *paramReader) preloaded(key string) map[string]PreloadedArtifact {
	m := p.artifactMap(key)
	out := make(map[string]PreloadedArtifact, len(m))
	for _, param := range sortedKeys(m) {
		f, ok := p.artifactEntry(key, param, m[param])
		where := fmt.Sprintf("params.%s[%q]", key, param)
		v, vok := p.version(where, f.Version)
		if !ok || !vok {
			continue
		}
		if f.Content == nil {
			p.fail("%s.content is required", where)
			continue
		}
		data, err := base64.StdEncoding.DecodeString(*f.Content)
		if err != nil {
			p.fail("%s.content is not valid base64: %v", where, err)
			continue
		}
		a := PreloadedArtifact{Filename: *f.Filename, Content: data, Version: v}
		if f.MimeType != nil {
			a.MimeType = *f.MimeType
		}
		out[param] = a
	}
	return out
}

func (p *paramReader) references(key string) map[string]ArtifactReference {
	m := p.artifactMap(key)
	out := make(map[string]ArtifactReference, len(m))
	for _, param := range sortedKeys(m) {
		f, ok := p.artifactEntry(key, param, m[param])
		v, vok := p.version(fmt.Sprintf("params.%s[%q]", key, param), f.Version)
		if ok && vok {
			out[param] = ArtifactReference{Filename: *f.Filename, Version: v}
		}
	}
	return out
}

// oneSourcePerInput rejects a parameter present in both maps. Two
// parameters may name the same file (an agent passes one artifact in a
// list and alone, as the reference's agents do): writeInputs writes it
// once when the contents are the same, and refuses them when not.
func (p *paramReader) oneSourcePerInput(r *Request) {
	for _, param := range sortedKeys(r.References) {
		if _, both := r.Preloaded[param]; both {
			p.fail("parameter %q is both preloaded and referenced", param)
		}
	}
}

// LocalInputName is the file name an input artifact gets under input/:
// the "user:" scope prefix is dropped (it names where the artifact lives in
// the store, not what the tool sees).
func LocalInputName(filename string) string {
	return strings.TrimPrefix(filename, "user:")
}

// unsafeName says why s cannot be used as one path component ("" = safe).
func unsafeName(s string, maxLen int) string {
	switch {
	case len(s) > maxLen:
		return fmt.Sprintf("longer than %d bytes", maxLen)
	case !utf8.ValidString(s):
		return "not valid UTF-8"
	case s == "." || s == "..":
		return "is a relative path element"
	case strings.Contains(s, ".."):
		return `contains ".."`
	case strings.ContainsAny(s, `/\`):
		return "contains a path separator"
	}
	for _, c := range s {
		if c == 0 || unicode.IsControl(c) {
			return "contains a control character"
		}
	}
	return ""
}

// UnsafeFilename says why an artifact filename is unsafe ("" = safe). It
// is artifacts.CheckFilename, str's one filename rule (a "user:" prefix is
// allowed: user-scoped artifacts, spec §9).
func UnsafeFilename(name string) string {
	var fe *artifacts.FilenameError
	if err := artifacts.CheckFilename(name); errors.As(err, &fe) {
		return fe.Reason
	} else if err != nil {
		return err.Error()
	}
	return ""
}

// truncate cuts s to at most n bytes, at a rune boundary (a reply must
// stay valid UTF-8), and marks the cut with "…".
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// truncateName is a name from the wire as it may appear in a message.
func truncateName(s string) string { return truncate(s, maxNameInMessage) }

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// ---- encoders (spec §3) ----
//
// Replies are compact JSON with the members in the spec's order, UTF-8
// unescaped (no HTML escaping). Envelope members that are null are
// omitted; nulls inside tool_result are kept as the tool produced them.

// CreatedArtifact is one entry of created_artifacts.
type CreatedArtifact struct {
	Filename  string `json:"filename"`
	Version   int    `json:"version"`
	MimeType  string `json:"mime_type"`
	SizeBytes int64  `json:"size_bytes"`
	// ActiveMimeType marks a mime type the tool chose that a viewer may
	// run code from (HTML, SVG, XML, JavaScript), stored as chosen
	// because ARTIFACT_ACTIVE_MIME_TYPES is keep. str's addition, omitted
	// when false.
	ActiveMimeType bool `json:"active_mime_type,omitempty"`
}

// SkippedOutput is one entry of skipped_outputs: a regular file the tool
// left in output/ that was not stored because its name breaks the
// filename rule (artifacts.CheckFilename). The member is str's addition
// and is omitted when empty, so every other reply is byte-identical to
// the reference's; agents read the result's members by name (JSON-RPC
// leaves "result" free-form) and ignore one they do not know.
type SkippedOutput struct {
	Filename string `json:"filename"` // invalid UTF-8 replaced by U+FFFD
	Reason   string `json:"reason"`
}

type resultBody struct {
	ToolResult       json.RawMessage   `json:"tool_result"`
	ExecutionTimeMs  int64             `json:"execution_time_ms"`
	TimedOut         bool              `json:"timed_out"`
	CreatedArtifacts []CreatedArtifact `json:"created_artifacts"`
	SkippedOutputs   []SkippedOutput   `json:"skipped_outputs,omitempty"`
	// The network policy's denials during the call (an optional member
	// the reference's agents ignore; absent when there were none) and the
	// text block an agent can show its model.
	Violations        []egress.Event `json:"violations,omitempty"`
	ViolationsDropped int            `json:"violations_dropped,omitempty"`
	ViolationSummary  string         `json:"violation_summary,omitempty"`
}

type replyEnvelope struct {
	JSONRPC string      `json:"jsonrpc"`
	ID      string      `json:"id"`
	Result  *resultBody `json:"result,omitempty"`
	Error   *errorBody  `json:"error,omitempty"`
}

type errorBody struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func marshal(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Only values built by this file are encoded, all encodable.
		panic("worker: encoding a reply: " + err.Error())
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// EncodeResult is a success reply. toolResult must be a JSON object (see
// NormalizeToolResult); artifacts may be nil (encoded as []); skipped
// outputs, if any, are listed in "skipped_outputs", and the network
// policy's denials, if any, in "violations" (with "violation_summary").
//
// The bytes are marshal's of the whole reply; toolResult (most of a
// large reply) is compacted once, straight into a buffer of the reply's
// size: marshal copied it into a buffer grown by doubling, then again
// into another (four 15 MiB results held some 300 MB at once in a
// worker, issue 29 item 7).
func EncodeResult(id string, toolResult json.RawMessage, executionTime time.Duration, artifacts []CreatedArtifact, skipped []SkippedOutput, net NetworkReport) []byte {
	if artifacts == nil {
		artifacts = []CreatedArtifact{}
	}
	// The reply around an empty tool_result, then the result in its
	// place. The first `"tool_result":` is the member: before it come
	// only `{"jsonrpc":"2.0","id":`, the id as a JSON string (whose every
	// '"' is escaped) and `,"result":{`.
	env := marshal(replyEnvelope{JSONRPC: "2.0", ID: id, Result: &resultBody{
		ToolResult: json.RawMessage(`{}`), ExecutionTimeMs: executionTime.Milliseconds(),
		CreatedArtifacts: artifacts, SkippedOutputs: skipped,
		Violations: net.Violations, ViolationsDropped: net.Dropped, ViolationSummary: net.Summary,
	}})
	at := bytes.Index(env, []byte(`"tool_result":{}`)) + len(`"tool_result":`)
	out := bytes.NewBuffer(make([]byte, 0, len(env)-len(`{}`)+len(toolResult)))
	out.Write(env[:at])
	// marshal's own encoding of a json.RawMessage: compacted, nothing
	// escaped (SetEscapeHTML(false)).
	if err := json.Compact(out, toolResult); err != nil {
		panic("worker: encoding a reply: tool_result: " + err.Error())
	}
	out.Write(env[at+len(`{}`):])
	return out.Bytes()
}

// encodeResultInPlace is EncodeResult's reply written into buf around
// its toolResult buf[at:at+n], where it is: the result compacted in place
// (compaction only moves bytes to the left), the envelope's start before
// it (in the room ReadResult left) and its end after it. ok is false when
// the room does not suffice; the result is then compacted and the caller
// encodes buf[at:at+n'] with EncodeResult. The reply is a slice of buf:
// no copy of the result is made.
func encodeResultInPlace(buf []byte, at, n int, id string, executionTime time.Duration, artifacts []CreatedArtifact, skipped []SkippedOutput, net NetworkReport) (reply, compacted []byte, ok bool) {
	if artifacts == nil {
		artifacts = []CreatedArtifact{}
	}
	env := marshal(replyEnvelope{JSONRPC: "2.0", ID: id, Result: &resultBody{
		ToolResult: json.RawMessage(`{}`), ExecutionTimeMs: executionTime.Milliseconds(),
		CreatedArtifacts: artifacts, SkippedOutputs: skipped,
		Violations: net.Violations, ViolationsDropped: net.Dropped, ViolationSummary: net.Summary,
	}})
	// As in EncodeResult: the first `"tool_result":` is the member.
	i := bytes.Index(env, []byte(`"tool_result":{}`)) + len(`"tool_result":`)
	head, tail := env[:i], env[i+len(`{}`):]
	m := compactInPlace(buf[at : at+n])
	if at < len(head) || at+m+len(tail) > len(buf) {
		return nil, buf[at : at+m], false
	}
	copy(buf[at-len(head):], head)
	copy(buf[at+m:], tail)
	return buf[at-len(head) : at+m+len(tail)], nil, true
}

// compactInPlace is json.Compact (nothing escaped) of the valid JSON text
// b, written over b: the whitespace outside strings removed. It returns
// the new length.
func compactInPlace(b []byte) int {
	w, in := 0, false
	for r := 0; r < len(b); r++ {
		c := b[r]
		switch {
		case in && c == '\\' && r+1 < len(b):
			b[w], b[w+1] = c, b[r+1]
			w += 2
			r++
			continue
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			continue
		}
		b[w] = c
		w++
	}
	return w
}

// EncodeTimeout is the timeout reply: a result, not an error.
func EncodeTimeout(id string, executionTime time.Duration) []byte {
	return marshal(replyEnvelope{JSONRPC: "2.0", ID: id, Result: &resultBody{
		ToolResult: json.RawMessage("{}"), ExecutionTimeMs: executionTime.Milliseconds(),
		TimedOut: true, CreatedArtifacts: []CreatedArtifact{},
	}})
}

// EncodeError is an error reply; "data" appears only when e.Data is set.
func EncodeError(id string, e *Error) []byte {
	if id == "" {
		id = UnknownID
	}
	return marshal(replyEnvelope{JSONRPC: "2.0", ID: id, Error: &errorBody{
		Code: string(e.Code), Message: e.Message, Data: e.Data,
	}})
}

type statusParams struct {
	TaskID     string `json:"task_id"`
	StatusText string `json:"status_text"`
	Timestamp  string `json:"timestamp"`
}

type statusEnvelope struct {
	JSONRPC string       `json:"jsonrpc"`
	Method  string       `json:"method"`
	Params  statusParams `json:"params"`
}

// StatusTimestamp formats t as Python's datetime.isoformat() of an aware
// UTC time: microseconds always present, "+00:00" offset.
func StatusTimestamp(t time.Time) string {
	return t.UTC().Format("2006-01-02T15:04:05.000000") + "+00:00"
}

// EncodeStatus is one status notification.
func EncodeStatus(taskID, text string, t time.Time) []byte {
	return marshal(statusEnvelope{JSONRPC: "2.0", Method: MethodStatus, Params: statusParams{
		TaskID: taskID, StatusText: text, Timestamp: StatusTimestamp(t),
	}})
}

// NormalizeToolResult turns the tool's return value (JSON) into the object
// tool_result must be (spec §3): an object passes through (compacted, key
// order and inner nulls kept); null → {"text":null,"data_objects":[]}; a
// string s → {"text":s,"data_objects":[]}; anything else → {"text":str(x),
// "data_objects":[]} with str(x) rendered as Python would.
func NormalizeToolResult(value json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(value)
	if len(t) == 0 {
		t = []byte("null")
	}
	if t[0] == '{' {
		var buf bytes.Buffer
		buf.Grow(len(t)) // the most it takes: one buffer, not a doubling
		if err := json.Compact(&buf, t); err != nil {
			return nil, fmt.Errorf("tool result is not valid JSON: %w", err)
		}
		return buf.Bytes(), nil
	}
	var v any
	dec := json.NewDecoder(bytes.NewReader(t))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("tool result is not valid JSON: %w", err)
	}
	type textResult struct {
		Text        *string `json:"text"`
		DataObjects []any   `json:"data_objects"`
	}
	r := textResult{DataObjects: []any{}}
	switch x := v.(type) {
	case nil:
	case string:
		r.Text = &x
	default:
		s := pyStr(x)
		r.Text = &s
	}
	return marshal(r), nil
}

// resultObject is NormalizeToolResult without its copy of an object:
// a valid object is returned as it is (EncodeResult compacts it straight
// into the reply); anything else is NormalizeToolResult's.
func resultObject(value json.RawMessage) (json.RawMessage, error) {
	if t := bytes.TrimSpace(value); len(t) > 0 && t[0] == '{' && json.Valid(t) {
		return t, nil
	}
	return NormalizeToolResult(value)
}

// MaxResultDepth bounds how deeply a tool result may nest objects and
// arrays. Agents parse replies with recursive JSON parsers (Python's json
// gives up near 1,000 levels, and the broker's reply adds two); a result
// nested deeper is refused with TOOL_ERROR instead of being forwarded.
const MaxResultDepth = 512

// ErrResultTooDeep is wrapped by CleanToolResult for a result nested more
// than MaxResultDepth levels.
var ErrResultTooDeep = errors.New("the tool's result is nested too deeply")

// CleanToolResult checks a tool result (JSON text) before it is
// forwarded: nesting beyond MaxResultDepth is an error wrapping
// ErrResultTooDeep; invalid UTF-8 inside strings (which a broker refuses)
// and \u escapes of unpaired surrogates (which strict parsers refuse) are
// replaced by U+FFFD. It returns the cleaned text and how many
// replacements were made; value itself is never modified. Outside strings
// valid JSON has only ASCII, so value is otherwise passed through.
func CleanToolResult(value []byte) ([]byte, int, error) {
	var (
		out    []byte // nil until the first replacement
		copied int    // value[:copied] is already in out
		fixes  int
		depth  int
		inStr  bool
	)
	replace := func(at, n int, with string) {
		out = append(out, value[copied:at]...)
		out = append(out, with...)
		copied = at + n
		fixes++
	}
	for i := 0; i < len(value); {
		c := value[i]
		if !inStr {
			switch c {
			case '"':
				inStr = true
			case '{', '[':
				if depth++; depth > MaxResultDepth {
					return nil, 0, fmt.Errorf("%w: more than %d levels of objects and arrays", ErrResultTooDeep, MaxResultDepth)
				}
			case '}', ']':
				depth--
			}
			i++
			continue
		}
		switch {
		case c == '"':
			inStr = false
			i++
		case c == '\\' && i+1 < len(value) && value[i+1] == 'u':
			r, ok := hexEscape(value, i)
			if !ok || !utf16.IsSurrogate(r) {
				i += 2
				continue
			}
			if r < 0xDC00 { // a high surrogate must be followed by a low one
				if r2, ok := hexEscape(value, i+6); ok && r2 >= 0xDC00 && r2 <= 0xDFFF {
					i += 12
					continue
				}
			}
			replace(i, 6, `\ufffd`)
			i += 6
		case c == '\\':
			i += 2
		case c < utf8.RuneSelf:
			i++
		default:
			if r, n := utf8.DecodeRune(value[i:]); r == utf8.RuneError && n <= 1 {
				replace(i, 1, "\uFFFD")
				i++
			} else {
				i += n
			}
		}
	}
	if out == nil {
		return value, 0, nil
	}
	return append(out, value[copied:]...), fixes, nil
}

// hexEscape reads the \uXXXX escape at value[i:], if there is one.
func hexEscape(value []byte, i int) (rune, bool) {
	if i+6 > len(value) || value[i] != '\\' || value[i+1] != 'u' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(value[i+2:i+6]), 16, 32)
	return rune(n), err == nil
}

// pyStr renders a decoded JSON value as Python's str() of the value the
// runner serialised.
func pyStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	default:
		return pyRepr(v)
	}
}

func pyRepr(v any) string {
	switch x := v.(type) {
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case json.Number:
		s := x.String()
		if !strings.ContainsAny(s, ".eE") {
			return s
		}
		f, err := x.Float64()
		if err != nil {
			return s
		}
		return pyFloat(f)
	case string:
		return pyStrRepr(x)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		parts := make([]string, 0, len(x))
		for _, k := range sortedKeys(x) {
			parts = append(parts, pyStrRepr(k)+": "+pyRepr(x[k]))
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// pyFloat mimics Python's float repr: shortest round-trip digits, always
// with a fractional part or an exponent.
func pyFloat(f float64) string {
	abs := math.Abs(f)
	if abs != 0 && (abs >= 1e16 || abs < 1e-4) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		mant, exp, _ := strings.Cut(s, "e")
		sign := exp[0]
		digits := strings.TrimLeft(exp[1:], "0")
		if len(digits) < 2 {
			digits = fmt.Sprintf("%02s", digits)
		}
		return mant + "e" + string(sign) + digits
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

func pyStrRepr(s string) string {
	q := "'"
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = `"`
	}
	var b strings.Builder
	b.WriteString(q)
	for _, c := range s {
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case string(c) == q:
			b.WriteString(`\` + q)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '\r':
			b.WriteString(`\r`)
		case c == '\t':
			b.WriteString(`\t`)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, c)
		default:
			b.WriteRune(c)
		}
	}
	b.WriteString(q)
	return b.String()
}

// The init sub-protocol (spec §14): two generations of request, answered
// with each one's own field names, and the newer generation's notices.
const (
	// MethodInit is the older generation's request on
	// {base}/sam_remote_tool/init/{tool}, and the newer generation's
	// broadcast notification (no id) on the same topic.
	MethodInit = "sam_remote_tool/init"
	// MethodInitRequest is the newer generation's request on
	// {base}/sam_remote_tool/init_request/{tool}.
	MethodInitRequest = "sam_remote_tool/init_request"
	// MethodRemoved is the notification on {base}/sam_remote_tool/removed/{tool}.
	MethodRemoved = "sam_remote_tool/removed"
)

// InitRequest is a validated init request of either generation.
type InitRequest struct {
	ID         string
	ToolName   string
	ToolConfig json.RawMessage // a JSON object, compact ({} when absent)
}

// ErrNotARequest is returned by ParseInitRequest for a message without an
// "id": a notification (another worker's, or this one's own, init
// broadcast on the same topic), which is never answered.
var ErrNotARequest = errors.New("a notification, not a request")

// ParseInitRequest parses one init request whose method must be method.
// A payload that is a JSON object without an id (or with a null one) is
// a notification: (nil, "", ErrNotARequest as the error's cause). Any
// other problem is an INVALID_REQUEST listing every problem, with the id
// read when it could be.
func ParseInitRequest(payload []byte, method string, maxBytes int) (*InitRequest, string, error) {
	// 1. size, then a JSON object.
	env, e := decodeJSONObject(payload, maxBytes)
	if e != nil {
		return nil, UnknownID, e
	}
	// 2. no id: a notification, not ours to answer.
	if raw, ok := env["id"]; !ok || isNull(raw) {
		return nil, "", ErrNotARequest
	}
	// 3. the envelope.
	id, params, problems := envelope(env, method)
	if params == nil {
		return nil, id, invalid(problems)
	}
	// 4. params.
	r := &InitRequest{ID: id}
	p := &paramReader{params: params}
	r.ToolName = p.requiredString("tool_name")
	r.ToolConfig = p.object("tool_config")
	problems = append(problems, p.problems...)
	if len(problems) > 0 {
		return nil, id, invalid(problems)
	}
	return r, id, nil
}

// initOlderResult is the older generation's init result.
type initOlderResult struct {
	ToolName           string          `json:"tool_name"`
	ToolDescription    string          `json:"tool_description,omitempty"`
	ParametersSchema   json.RawMessage `json:"parameters_schema,omitempty"`
	CtxFacadeParamName string          `json:"ctx_facade_param_name,omitempty"`
}

// initNewerResult is the newer generation's init result, also the params
// of its init broadcast.
type initNewerResult struct {
	ToolName           string                         `json:"tool_name"`
	Description        string                         `json:"description,omitempty"`
	Parameters         json.RawMessage                `json:"parameters,omitempty"`
	ArtifactParams     map[string]runner.ArtifactSpec `json:"artifact_params,omitempty"`
	Instructions       string                         `json:"instructions,omitempty"`
	ConfigSchema       json.RawMessage                `json:"config_schema,omitempty"`
	CtxFacadeParamName string                         `json:"ctx_facade_param_name,omitempty"`
}

func newerResult(info *runner.InitInfo) initNewerResult {
	return initNewerResult{
		ToolName: info.ToolName, Description: info.Description, Parameters: info.ParametersSchema,
		ArtifactParams: info.ArtifactParams, Instructions: info.Instructions,
		ConfigSchema: info.ConfigSchema, CtxFacadeParamName: info.CtxFacadeParamName,
	}
}

// EncodeInitResult is the success reply to an init request of method
// (MethodInit: the older generation's field names; MethodInitRequest:
// the newer's). Absent values are omitted, as the reference does.
func EncodeInitResult(id, method string, info *runner.InitInfo) []byte {
	var result any
	if method == MethodInit {
		result = initOlderResult{
			ToolName: info.ToolName, ToolDescription: info.Description,
			ParametersSchema: info.ParametersSchema, CtxFacadeParamName: info.CtxFacadeParamName,
		}
	} else {
		result = newerResult(info)
	}
	return marshal(struct {
		JSONRPC string `json:"jsonrpc"`
		ID      string `json:"id"`
		Result  any    `json:"result"`
	}{"2.0", id, result})
}

// EncodeInitBroadcast is the newer generation's init notification (no id).
func EncodeInitBroadcast(info *runner.InitInfo) []byte {
	return marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		Method  string          `json:"method"`
		Params  initNewerResult `json:"params"`
	}{"2.0", MethodInit, newerResult(info)})
}

// EncodeRemovedNotice is the notification that a tool left the manifest.
func EncodeRemovedNotice(tool string) []byte {
	return marshal(struct {
		JSONRPC string            `json:"jsonrpc"`
		Method  string            `json:"method"`
		Params  map[string]string `json:"params"`
	}{"2.0", MethodRemoved, map[string]string{"tool_name": tool}})
}
