package worker

import (
	"encoding/json"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/securetoolruntime/str/worker/runner"
)

// FuzzParseInitRequest feeds arbitrary payloads to ParseInitRequest under
// both methods and checks, besides that it never panics: a notification
// (no id) is exactly ErrNotARequest; a refusal is INVALID_REQUEST with an
// id and an encodable reply; an accepted request has its id, a non-empty
// tool name and a tool_config that is a JSON object, and both
// generations' replies for it are valid JSON.
func FuzzParseInitRequest(f *testing.F) {
	for _, seed := range []string{
		`{"jsonrpc":"2.0","id":"1","method":"sam_remote_tool/init","params":{"tool_name":"t","tool_config":{"k":1}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"sam_remote_tool/init_request","params":{"tool_name":"t"}}`,
		`{"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"tool_name":"t","description":"d"}}`,
		`{"jsonrpc":"2.0","id":null,"method":"sam_remote_tool/init"}`,
		`{"id":"x","params":{"tool_config":[]}}`, `[]`, `nul`,
	} {
		f.Add([]byte(seed), false)
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, payload []byte, newer bool) {
		method := MethodInit
		if newer {
			method = MethodInitRequest
		}
		r, id, err := ParseInitRequest(payload, method, 0)
		if errors.Is(err, ErrNotARequest) {
			if r != nil || id != "" {
				t.Fatalf("notification with r=%v id=%q", r, id)
			}
			return
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeInvalidRequest || r != nil || id == "" {
				t.Fatalf("refusal: r=%v id=%q err=%v", r, id, err)
			}
			if reply := EncodeError(id, e); !json.Valid(reply) || !utf8.Valid(reply) {
				t.Fatalf("error reply is not valid JSON: %q", reply)
			}
			return
		}
		var cfg map[string]json.RawMessage
		if r.ID != id || id == "" || r.ToolName == "" || json.Unmarshal(r.ToolConfig, &cfg) != nil || cfg == nil {
			t.Fatalf("accepted %+v (id %q)", r, id)
		}
		info := &runner.InitInfo{ToolName: r.ToolName, Description: r.ToolName}
		for _, m := range []string{MethodInit, MethodInitRequest} {
			if reply := EncodeInitResult(r.ID, m, info); !json.Valid(reply) {
				t.Fatalf("%s reply is not valid JSON: %q", m, reply)
			}
		}
	})
}
