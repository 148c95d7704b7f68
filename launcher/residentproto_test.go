package launcher

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"time"
)

// compactRequest is a compact request as cmd/str's entry stub builds it.
func compactRequest(profile, timeout string, argv, environ []string) []byte {
	b := []byte(CompactMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(argv)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(environ)))
	for _, s := range append(append([]string{profile, timeout}, argv...), environ...) {
		b = append(append(b, s...), 0)
	}
	return b
}

// TestDecodeCompact: a request as the stub sends it, and every malformed
// one refused with what is wrong.
func TestDecodeCompact(t *testing.T) {
	argv := []string{"/bin/sh", "-c", "echo \"$@\"", "", "a b", "\xff"}
	environ := []string{"A=1", "STR_SERVE_SOCKET=/s", "A=2", "NOEQUALS", ""}
	req, err := decodeCompact(compactRequest("restrictive", "90s", argv, environ))
	if err != nil {
		t.Fatal(err)
	}
	if req.Version != ResidentVersion || req.Profile != "restrictive" || req.Timeout != 90*time.Second ||
		!slices.Equal(req.Argv, argv) || !slices.Equal(req.Environ, environ) || req.Env != nil || req.Network != nil {
		t.Fatalf("decoded %+v", req)
	}
	if req, err := decodeCompact(compactRequest("", "", []string{"x"}, nil)); err != nil || req.Profile != "" || req.Timeout != 0 {
		t.Fatalf("no profile, no timeout: %+v %v", req, err)
	}
	good := compactRequest("p", "", []string{"x"}, []string{"E=1"})
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "no header"},
		{"JSON", []byte(`{"version":1}`), "no header"},
		{"no argv", compactRequest("p", "", nil, nil), "0 arguments"},
		{"counts beyond the bytes", append(append([]byte(CompactMagic), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0), "p\x00\x00x\x00"...), "4294967295 arguments"},
		{"a string without its NUL", good[:len(good)-1], "without its NUL"},
		{"bytes after", append(slices.Clone(good), 'z'), "1 bytes after"},
		{"bad timeout", compactRequest("p", "soon", []string{"x"}, nil), `--timeout "soon"`},
		{"zero timeout", compactRequest("p", "0", []string{"x"}, nil), `--timeout "0"`},
		{"negative timeout", compactRequest("p", "-1s", []string{"x"}, nil), `--timeout "-1s"`},
	} {
		if _, err := decodeCompact(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestEncodeCompact: the reply's layout, and its text cut to
// CompactReplyMax.
func TestEncodeCompact(t *testing.T) {
	b := encodeCompact(CompactResult, 137, "str run: warning: x\n")
	if string(b[:4]) != CompactMagic || b[4] != CompactResult || !bytes.Equal(b[5:8], []byte{0, 0, 0}) ||
		binary.LittleEndian.Uint32(b[8:]) != 137 || string(b[12:]) != "str run: warning: x\n" {
		t.Fatalf("reply % x", b)
	}
	if b := encodeCompact(CompactError, -1, strings.Repeat("x", 2*CompactReplyMax)); len(b) != CompactReplyMax || int32(binary.LittleEndian.Uint32(b[8:])) != -1 {
		t.Fatalf("long reply: %d bytes", len(b))
	}
}

// TestOutcome: str run's exit code and stderr text for each kind of
// result, as finishRun printed them before Outcome was shared.
func TestOutcome(t *testing.T) {
	setup := &StepError{Who: "nsinit", Step: 3, Action: "execve", Path: "/x", Msg: "no such file or directory"}
	for _, c := range []struct {
		name string
		res  Result
		code int
		text string
	}{
		{"status", Result{ExitCode: 3}, 3, ""},
		{"signal", Result{ExitCode: 137, Signal: 9}, 137, ""},
		{"timeout", Result{ExitCode: 137, TimedOut: true}, ExitTimedOut, "str run: timed out; the sandbox was killed\n"},
		{"oom", Result{ExitCode: 137, OOMKilled: true}, 137, "str run: the memory limit was hit; the OOM killer ended the tool\n"},
		{"not found", Result{ExitCode: ExitNotFound, SetupError: setup}, ExitNotFound, "str run: " + setup.Error() + "\n"},
		{"setup", Result{ExitCode: 1, SetupError: setup}, ExitLauncher, "str run: " + setup.Error() + "\n"},
		{"warnings and violations first", Result{ExitCode: 0, Warnings: []string{"a", "b"}, ViolationSummary: "blocked: x"},
			0, "str run: warning: a\nstr run: warning: b\nblocked: x\n"},
		{"write-back", Result{ExitCode: 0, WriteBack: &WriteBack{Dir: "/w", Skipped: []string{"fifo"}, Error: setup}},
			ExitLauncher, "str run: warning: /w/fifo: not copied back (not a file, directory or symlink)\nstr run: " + setup.Error() + "\n"},
	} {
		code, text := c.res.Outcome()
		if code != c.code || text != c.text {
			t.Errorf("%s: %d %q, want %d %q", c.name, code, text, c.code, c.text)
		}
	}
}

// FuzzDecodeCompact: any bytes decode without a panic; what decodes has
// argc >= 1 NUL-free strings, a positive timeout or none, and encodes
// back to a request that decodes the same; its plan (Launcher.Plan, as
// str serve's check 3) never loosens the profile's wall clock.
func FuzzDecodeCompact(f *testing.F) {
	f.Add(compactRequest("restrictive", "1s", []string{"/bin/true"}, []string{"A=1"}))
	f.Add(compactRequest("", "", []string{"x", ""}, nil))
	f.Add(compactRequest("standard", "99999h", []string{"\xff"}, []string{"PYTHONUNBUFFERED=1", "X"}))
	f.Add([]byte(`{"version":1}`))
	l := planLauncher(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeCompact(b)
		if err != nil {
			return
		}
		if len(req.Argv) == 0 || req.Timeout < 0 || req.Version != ResidentVersion {
			t.Fatalf("decoded %+v", req)
		}
		for _, s := range append(append([]string{req.Profile}, req.Argv...), req.Environ...) {
			if strings.IndexByte(s, 0) >= 0 {
				t.Fatalf("a NUL inside %q", s)
			}
		}
		tm := ""
		if req.Timeout > 0 {
			tm = req.Timeout.String()
		}
		again, err := decodeCompact(compactRequest(req.Profile, tm, req.Argv, req.Environ))
		if err != nil || again.Profile != req.Profile || again.Timeout != req.Timeout || !slices.Equal(again.Argv, req.Argv) || !slices.Equal(again.Environ, req.Environ) {
			t.Fatalf("re-encoded: %+v %v, want %+v", again, err, req)
		}
		pl, err := l.Plan(Request{Profile: req.Profile, Argv: req.Argv, Timeout: req.Timeout})
		if err != nil {
			return
		}
		base, err := l.Plan(Request{Profile: req.Profile, Argv: req.Argv})
		if err != nil {
			t.Fatalf("the plan without the timeout fails: %v", err)
		}
		if pl.Timeout > base.Timeout {
			t.Fatalf("timeout %v planned %v, the profile's %v: loosened", req.Timeout, pl.Timeout, base.Timeout)
		}
	})
}
