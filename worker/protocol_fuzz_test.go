package worker

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/securetoolruntime/str/worker/artifacts"
)

// FuzzParseRequest feeds arbitrary invoke payloads (seeds in
// testdata/fuzz/FuzzParseRequest) to ParseRequest under an arbitrary
// payload limit and checks, besides that it never panics:
//   - a refusal is INVALID_REQUEST with an id, and its reply encodes;
//   - an accepted request's task, user and session ids are one safe path
//     component each (no "/", "\", "..", control characters, within their
//     length bounds, session id not "user");
//   - every input filename passes artifacts.CheckFilename, and the name it
//     gets under input/ is one path component (two parameters may share
//     one: writeInputs writes equal bytes once and refuses different ones);
//   - args and tool_config are JSON objects, the timeout is in bounds;
//   - the request encoded again parses to the same request.
func FuzzParseRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, payload []byte, limit uint32) {
		lim := ParseLimits{MaxPayloadBytes: int(limit % (1 << 20))}
		r, id, perr := ParseRequest(payload, lim)
		if perr != nil {
			if r != nil || perr.Code != CodeInvalidRequest || id == "" {
				t.Fatalf("refusal: r=%v id=%q err=%v", r, id, perr)
			}
			if reply := EncodeError(id, perr); !json.Valid(reply) || !utf8.Valid(reply) {
				t.Fatalf("error reply is not valid JSON: %q", reply)
			}
			return
		}
		max := lim.MaxPayloadBytes
		if max <= 0 {
			max = DefaultMaxPayloadBytes
		}
		if len(payload) > max {
			t.Fatalf("accepted %d bytes over a limit of %d", len(payload), max)
		}
		if r.ID != id || id == "" {
			t.Fatalf("id %q, request id %q", id, r.ID)
		}
		checkRequest(t, r)

		again, id2, perr := ParseRequest(reencode(t, r), ParseLimits{})
		if perr != nil {
			t.Fatalf("re-encoded request refused: %v\nrequest: %+v", perr, r)
		}
		if id2 != id || !reflect.DeepEqual(again, r) {
			t.Fatalf("not stable under re-encoding:\n first %+v\nsecond %+v", r, again)
		}
	})
}

// checkRequest asserts what every accepted request guarantees.
func checkRequest(t *testing.T, r *Request) {
	t.Helper()
	for _, n := range []struct {
		what, v string
		max     int
	}{{"task_id", r.TaskID, maxTaskIDLen}, {"user_id", r.UserID, maxIDLen}, {"session_id", r.SessionID, maxIDLen}} {
		if why := fuzzUnsafeComponent(n.v, false); why != "" || len(n.v) > n.max {
			t.Fatalf("accepted %s %q: %s (%d bytes)", n.what, n.v, why, len(n.v))
		}
	}
	if r.SessionID == reservedSessionID {
		t.Fatalf("accepted the reserved session id %q", r.SessionID)
	}
	if r.ToolName == "" || r.AppName == "" {
		t.Fatalf("accepted an empty tool or app name: %+v", r)
	}
	for what, obj := range map[string]json.RawMessage{"args": r.Args, "tool_config": r.ToolConfig} {
		var m map[string]any
		if err := json.Unmarshal(obj, &m); err != nil || m == nil {
			t.Fatalf("%s is not a JSON object: %q", what, obj)
		}
	}
	if r.TimeoutSet && !(r.TimeoutSeconds > 0 && r.TimeoutSeconds <= 7*24*3600) {
		t.Fatalf("accepted timeout %v", r.TimeoutSeconds)
	}
	if !r.TimeoutSet && r.TimeoutSeconds != 0 {
		t.Fatalf("timeout %v without TimeoutSet", r.TimeoutSeconds)
	}
	input := func(param, filename string, version *int) {
		if param == "" {
			t.Fatalf("accepted an empty parameter name")
		}
		if err := artifacts.CheckFilename(filename); err != nil {
			t.Fatalf("accepted input %q with filename %q: %v", param, filename, err)
		}
		name := LocalInputName(filename)
		if why := fuzzUnsafeComponent(name, true); why != "" {
			t.Fatalf("input %q: input/%q is unsafe: %s", param, name, why)
		}
		if err := artifacts.CheckName(name); err != nil {
			t.Fatalf("input %q: input/%q: %v", param, name, err)
		}
		if version != nil && *version < 0 {
			t.Fatalf("input %q: version %d", param, *version)
		}
	}
	for param, a := range r.Preloaded {
		input(param, a.Filename, a.Version)
	}
	for param, a := range r.References {
		if _, both := r.Preloaded[param]; both {
			t.Fatalf("parameter %q both preloaded and referenced", param)
		}
		input(param, a.Filename, a.Version)
	}
}

// fuzzUnsafeComponent says why s is not one safe path component: the
// property the fuzz target checks, written independently of unsafeName.
// Ids may not contain ".." at all; a filename may ("a..b"), as long as it
// is not "." or ".." itself (innerDots).
func fuzzUnsafeComponent(s string, innerDots bool) string {
	switch {
	case s == "":
		return "empty"
	case !utf8.ValidString(s):
		return "invalid UTF-8"
	case strings.ContainsAny(s, `/\`):
		return "separator"
	case s == "." || s == "..":
		return "a directory reference"
	case !innerDots && strings.Contains(s, ".."):
		return `contains ".."`
	}
	for _, c := range s {
		if unicode.IsControl(c) {
			return "control character"
		}
	}
	return ""
}

// reencode writes r back as an invoke payload.
func reencode(t *testing.T, r *Request) []byte {
	t.Helper()
	type art struct {
		Filename string  `json:"filename"`
		Content  *[]byte `json:"content,omitempty"` // base64, as encoding/json writes []byte
		MimeType string  `json:"mime_type,omitempty"`
		Version  *int    `json:"version,omitempty"`
	}
	params := map[string]any{
		"task_id": r.TaskID, "tool_name": r.ToolName, "app_name": r.AppName,
		"user_id": r.UserID, "session_id": r.SessionID,
		"args": r.Args, "tool_config": r.ToolConfig,
	}
	if r.TimeoutSet {
		params["timeout_seconds"] = r.TimeoutSeconds
	}
	if r.SandboxProfile != "" {
		params["sandbox_profile"] = r.SandboxProfile
	}
	pre := map[string]art{}
	for k, a := range r.Preloaded {
		content := a.Content
		if content == nil {
			content = []byte{}
		}
		pre[k] = art{Filename: a.Filename, Content: &content, MimeType: a.MimeType, Version: a.Version}
	}
	params["preloaded_artifacts"] = pre
	refs := map[string]art{}
	for k, a := range r.References {
		refs[k] = art{Filename: a.Filename, Version: a.Version}
	}
	params["artifact_references"] = refs
	// marshal, the replies' encoder: no HTML escaping (json.Marshal would
	// write an "&" in args as \u0026, the same JSON but other bytes than
	// the request carried; the fuzzer found {"&":0}).
	return marshal(map[string]any{"jsonrpc": "2.0", "id": r.ID, "method": MethodInvoke, "params": params})
}
