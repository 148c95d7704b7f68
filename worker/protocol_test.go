package worker

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/securetoolruntime/str/egress"
)

func golden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestEncodersMatchGolden(t *testing.T) {
	ts := time.Date(2026, 2, 9, 12, 34, 56, 789012345, time.UTC)
	cases := []struct {
		golden string
		got    []byte
	}{
		{"result.json", EncodeResult("req-1", json.RawMessage(`{"status":"success"}`), 150*time.Millisecond,
			[]CreatedArtifact{{Filename: "summary.txt", Version: 0, MimeType: "text/plain", SizeBytes: 256}}, nil, NetworkReport{})},
		{"result_none.json", EncodeResult("req-1", mustNormalize(t, "null"), 7*time.Millisecond, nil, nil, NetworkReport{})},
		{"timeout.json", EncodeTimeout("req-1", 35012*time.Millisecond)},
		{"error_tool_not_available.json", EncodeError("req-1", errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker", "nope"))},
		{"error_with_data.json", EncodeError("req-1", &Error{Code: CodeSandboxFailed, Message: "m", Data: json.RawMessage(`{"step":4}`)})},
		{"status.json", EncodeStatus("task-1", "Processing row 500 of 1000...", ts)},
	}
	for _, c := range cases {
		if want := golden(t, c.golden); string(c.got) != want {
			t.Errorf("%s:\n got %s\nwant %s", c.golden, c.got, want)
		}
	}
	_, id, perr := ParseRequest([]byte("not json"), ParseLimits{})
	if got, want := string(EncodeError(id, perr)), golden(t, "error_unknown_id.json"); got != want {
		t.Errorf("unparseable:\n got %s\nwant %s", got, want)
	}
}

func TestStatusTimestampOtherZone(t *testing.T) {
	loc := time.FixedZone("X", 3600)
	ts := time.Date(2026, 2, 9, 13, 0, 0, 0, loc)
	if got := StatusTimestamp(ts); got != "2026-02-09T12:00:00.000000+00:00" {
		t.Fatalf("got %s", got)
	}
}

func mustNormalize(t *testing.T, v string) json.RawMessage {
	t.Helper()
	r, err := NormalizeToolResult(json.RawMessage(v))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNormalizeToolResult(t *testing.T) {
	cases := map[string]string{
		`{"a": null, "z": 1, "b": [1, 2]}`: `{"a":null,"z":1,"b":[1,2]}`,
		`null`:                             `{"text":null,"data_objects":[]}`,
		`"hi <b>"`:                         `{"text":"hi <b>","data_objects":[]}`,
		`42`:                               `{"text":"42","data_objects":[]}`,
		`1.5`:                              `{"text":"1.5","data_objects":[]}`,
		`1e20`:                             `{"text":"1e+20","data_objects":[]}`,
		`true`:                             `{"text":"True","data_objects":[]}`,
		`[1, "a", null, false, 2.0]`:       `{"text":"[1, 'a', None, False, 2.0]","data_objects":[]}`,
		`["it's"]`:                         `{"text":"[\"it's\"]","data_objects":[]}`,
	}
	for in, want := range cases {
		if got := string(mustNormalize(t, in)); got != want {
			t.Errorf("%s: got %s want %s", in, got, want)
		}
	}
	if _, err := NormalizeToolResult(json.RawMessage(`{"a":`)); err == nil {
		t.Error("broken JSON accepted")
	}
}

const validRequest = `{"jsonrpc":"2.0","id":"r1","method":"sam_remote_tool/invoke",
 "params":{"task_id":"t-1","tool_name":"echo_tool","args":{"message":"hi"},"tool_config":{},
   "app_name":"MyAgent","user_id":"user-42","session_id":"web-session-abc",
   "preloaded_artifacts":{"p":{"filename":"y.csv","content":"YSxiCg==","mime_type":"text/csv","version":0}},
   "artifact_references":{"input_file":{"filename":"data.csv","version":0},"latest":{"filename":"user:z.txt"}},
   "timeout_seconds":30,"sandbox_profile":"standard","unknown_field":1}}`

func TestParseValidRequest(t *testing.T) {
	r, id, perr := ParseRequest([]byte(validRequest), ParseLimits{})
	if perr != nil {
		t.Fatal(perr)
	}
	if id != "r1" || r.TaskID != "t-1" || r.ToolName != "echo_tool" || r.UserID != "user-42" ||
		r.SessionID != "web-session-abc" || r.AppName != "MyAgent" || r.SandboxProfile != "standard" {
		t.Fatalf("fields: %+v", r)
	}
	if string(r.Args) != `{"message":"hi"}` || string(r.ToolConfig) != `{}` {
		t.Fatalf("args %s config %s", r.Args, r.ToolConfig)
	}
	if !r.TimeoutSet || r.TimeoutSeconds != 30 {
		t.Fatalf("timeout %v %v", r.TimeoutSeconds, r.TimeoutSet)
	}
	p := r.Preloaded["p"]
	if string(p.Content) != "a,b\n" || p.MimeType != "text/csv" || p.Version == nil || *p.Version != 0 {
		t.Fatalf("preloaded %+v", p)
	}
	if ref := r.References["latest"]; ref.Filename != "user:z.txt" || ref.Version != nil {
		t.Fatalf("reference %+v", ref)
	}
}

func TestParseDefaults(t *testing.T) {
	r, _, perr := ParseRequest([]byte(`{"jsonrpc":"2.0","id":7,"method":"sam_remote_tool/invoke",
	  "params":{"task_id":"t","tool_name":"x","app_name":"a","user_id":"u","session_id":"s"}}`), ParseLimits{})
	if perr != nil {
		t.Fatal(perr)
	}
	if r.ID != "7" || string(r.Args) != "{}" || string(r.ToolConfig) != "{}" || r.TimeoutSet ||
		r.SandboxProfile != "" || len(r.Preloaded) != 0 || len(r.References) != 0 {
		t.Fatalf("defaults: %+v", r)
	}
}

func TestParseRejects(t *testing.T) {
	base := func(params string) string {
		return `{"jsonrpc":"2.0","id":"r9","method":"sam_remote_tool/invoke","params":{` + params + `}}`
	}
	ok := `"tool_name":"x","app_name":"a",`
	cases := []struct {
		name, payload, wantID string
		wantIn                []string
	}{
		{"not json", `{`, "unknown", []string{"not a JSON object"}},
		{"array", `[1]`, "unknown", []string{"not a JSON object"}},
		{"no id", `{"jsonrpc":"2.0","method":"sam_remote_tool/invoke","params":{}}`, "unknown", []string{`"id" is missing`}},
		{"wrong version", `{"jsonrpc":"1.0","id":"r9","method":"sam_remote_tool/invoke"}`, "r9", []string{`"jsonrpc" must be "2.0"`, `"params" is missing`}},
		{"wrong method", `{"jsonrpc":"2.0","id":"r9","method":"x","params":[]}`, "r9", []string{`"method" must be`, `"params" must be an object`}},
		{"missing fields", base(``), "r9", []string{"task_id is required", "tool_name is required", "app_name is required", "user_id is required", "session_id is required"}},
		{"dotdot task", base(ok + `"task_id":"../etc","user_id":"u","session_id":"s"`), "r9", []string{"params.task_id", `contains ".."`}},
		{"slash user", base(ok + `"task_id":"t","user_id":"a/b","session_id":"s"`), "r9", []string{"params.user_id", "path separator"}},
		{"dot session", base(ok + `"task_id":"t","user_id":"u","session_id":".."`), "r9", []string{"params.session_id"}},
		{"reserved session", base(ok + `"task_id":"t","user_id":"u","session_id":"user"`), "r9", []string{`params.session_id "user" is reserved`}},
		{"nul task", base(ok + `"task_id":"a\u0000b","user_id":"u","session_id":"s"`), "r9", []string{"control character"}},
		{"long task", base(ok + `"task_id":"` + strings.Repeat("a", 129) + `","user_id":"u","session_id":"s"`), "r9", []string{"longer than 128"}},
		{"bad types", base(ok + `"task_id":1,"user_id":"u","session_id":"s","args":[],"timeout_seconds":"x"`), "r9",
			[]string{"task_id must be a string", "args must be an object", "timeout_seconds must be a number"}},
		{"negative timeout", base(ok + `"task_id":"t","user_id":"u","session_id":"s","timeout_seconds":-1`), "r9", []string{"positive"}},
		{"unsafe filename", base(ok + `"task_id":"t","user_id":"u","session_id":"s","artifact_references":{"f":{"filename":"../x"}}`), "r9", []string{`filename "../x" is unsafe`}},
		{"abs filename", base(ok + `"task_id":"t","user_id":"u","session_id":"s","preloaded_artifacts":{"f":{"filename":"/etc/passwd","content":""}}`), "r9", []string{"absolute"}},
		{"backslash filename", base(ok + `"task_id":"t","user_id":"u","session_id":"s","artifact_references":{"f":{"filename":"a\\b"}}`), "r9", []string{"path separator"}},
		{"bad base64", base(ok + `"task_id":"t","user_id":"u","session_id":"s","preloaded_artifacts":{"f":{"filename":"a","content":"!!"}}`), "r9", []string{"base64"}},
		{"no content", base(ok + `"task_id":"t","user_id":"u","session_id":"s","preloaded_artifacts":{"f":{"filename":"a"}}`), "r9", []string{"content is required"}},
		{"bad version", base(ok + `"task_id":"t","user_id":"u","session_id":"s","artifact_references":{"f":{"filename":"a","version":-2}}`), "r9", []string{"non-negative integer"}},
		{"both preloaded and referenced", base(ok + `"task_id":"t","user_id":"u","session_id":"s","artifact_references":{"f":{"filename":"a"}},"preloaded_artifacts":{"f":{"filename":"a","content":""}}`), "r9", []string{`parameter "f" is both preloaded and referenced`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, id, perr := ParseRequest([]byte(c.payload), ParseLimits{})
			if perr == nil {
				t.Fatal("accepted")
			}
			if perr.Code != CodeInvalidRequest || id != c.wantID {
				t.Fatalf("code %s id %q", perr.Code, id)
			}
			for _, w := range c.wantIn {
				if !strings.Contains(perr.Message, w) {
					t.Errorf("message %q lacks %q", perr.Message, w)
				}
			}
		})
	}
}

func TestParseOversized(t *testing.T) {
	payload := []byte(validRequest)
	_, id, perr := ParseRequest(payload, ParseLimits{MaxPayloadBytes: len(payload) - 1})
	if perr == nil || perr.Code != CodeInvalidRequest || id != UnknownID || !strings.Contains(perr.Message, "exceeds the limit") {
		t.Fatalf("got %v %q", perr, id)
	}
	if _, _, perr := ParseRequest(payload, ParseLimits{MaxPayloadBytes: len(payload)}); perr != nil {
		t.Fatalf("at the limit: %v", perr)
	}
}

func TestLenientID(t *testing.T) {
	if got := LenientID([]byte(`{"id":"abc","junk":`), 0); got != UnknownID {
		t.Fatalf("broken JSON: %q", got)
	}
	if got := LenientID([]byte(`{"id":"abc"}`), 0); got != "abc" {
		t.Fatalf("got %q", got)
	}
	if got := LenientID([]byte(`{"id":"abc"}`), 3); got != UnknownID {
		t.Fatalf("oversized: %q", got)
	}
}

func TestTruncateKeepsUTF8(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdef", 3, "abc…"},
		{"éé", 3, "é…"}, // the cut would split the second é
		{"ééé", 1, "…"},
	} {
		if got := truncate(c.in, c.n); got != c.want || !utf8.ValidString(got) {
			t.Errorf("truncate(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}

// EncodeResult's reply is marshal's of the whole envelope, byte for byte,
// whatever the id, the result's spacing and characters, the artifacts,
// skipped outputs and denials.
func TestEncodeResultIsMarshal(t *testing.T) {
	results := []string{`{}`, `{"a": [1, 2, {"b": "x y"}], "c": null}`, "{\n \"html\": \"<a href='x'>&</a>\", \"ls\": \"\u2028\", \"é\": 1}",
		`{"tool_result":{},"x":"\"tool_result\":{}"}`}
	ids := []string{"req-1", `we"ird "tool_result":{} id`, "é<&>"}
	for _, r := range results {
		for _, id := range ids {
			arts := []CreatedArtifact{{Filename: "a.txt", Version: 2, MimeType: "text/plain", SizeBytes: 3}}
			skipped := []SkippedOutput{{Filename: "b", Reason: "r"}}
			net := NetworkReport{Violations: []egress.Event{{Kind: "net", Host: "h", Reason: "not_allowed", Count: 2}}, Dropped: 1, Summary: "s"}
			want := marshal(replyEnvelope{JSONRPC: "2.0", ID: id, Result: &resultBody{
				ToolResult: json.RawMessage(r), ExecutionTimeMs: 150, CreatedArtifacts: arts, SkippedOutputs: skipped,
				Violations: net.Violations, ViolationsDropped: net.Dropped, ViolationSummary: net.Summary,
			}})
			if got := EncodeResult(id, json.RawMessage(r), 150*time.Millisecond, arts, skipped, net); string(got) != string(want) {
				t.Errorf("result %q id %q:\n got %s\nwant %s", r, id, got, want)
			}
		}
	}
}

// The reply written in place, around the result in its buffer, is
// EncodeResult's; with too little room around the result it says so,
// the result compacted, and EncodeResult of that is the reply.
func TestEncodeResultInPlace(t *testing.T) {
	results := []string{`{}`, "{ \"a\" : [ 1 ,\t2 ] ,\n\"s\": \"x \\\" \\\\ y\", \"u\": \"\u2028<&>\" }", `{"tool_result":{}}`, `{"k":"\\\\"}`}
	arts := []CreatedArtifact{{Filename: "a.txt", Version: 2, MimeType: "text/plain", SizeBytes: 3}}
	for _, r := range results {
		var want bytes.Buffer
		must(t, json.Compact(&want, []byte(r)))
		if b := []byte(r); string(b[:compactInPlace(b)]) != want.String() {
			t.Errorf("compactInPlace(%q) = %q, want %q", r, b[:compactInPlace([]byte(r))], want.String())
		}
		for _, room := range []struct{ head, tail int }{{1024, 4096}, {10, 4096}, {1024, 10}} {
			buf := make([]byte, room.head+len(r)+room.tail)
			copy(buf[room.head:], r)
			reply, compacted, ok := encodeResultInPlace(buf, room.head, len(r), `id "1"`, 150*time.Millisecond, arts, nil, NetworkReport{})
			want := EncodeResult(`id "1"`, json.RawMessage(r), 150*time.Millisecond, arts, nil, NetworkReport{})
			if ok != (room.head == 1024 && room.tail == 4096) {
				t.Fatalf("%q with room %v: in place %v", r, room, ok)
			}
			if !ok {
				reply = EncodeResult(`id "1"`, compacted, 150*time.Millisecond, arts, nil, NetworkReport{})
			}
			if string(reply) != string(want) {
				t.Errorf("%q with room %v:\n got %s\nwant %s", r, room, reply, want)
			}
		}
	}
}
