package resident

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/launcher"
)

// mustEncode is req's request bytes.
func mustEncode(t testing.TB, req Request) []byte {
	t.Helper()
	b, err := encodeResidentRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestResidentRequestRoundTrip: every field of a request as str run
// sends it decodes as it was.
func TestResidentRequestRoundTrip(t *testing.T) {
	for _, req := range []Request{
		{Profile: "restrictive", Argv: []string{"/bin/true"}},
		{Argv: []string{"x", ""}, Environ: []string{"A=1", "A=2", "X"}, Env: []string{"K=V"}, WantResult: true, Timeout: 90 * time.Second},
		{Profile: "standard", Argv: []string{"\xff"}, Timeout: 1},
	} {
		got, err := decodeResidentRequest(mustEncode(t, req))
		if err != nil || !reflect.DeepEqual(got, req) {
			t.Errorf("decoded %+v (%v), want %+v", got, err, req)
		}
	}
	for _, req := range []Request{
		{Argv: nil},
		{Argv: []string{"a\x00b"}},
		{Argv: []string{"x"}, Environ: []string{"A=\x00"}},
		{Argv: []string{"x"}, Timeout: -1},
	} {
		if _, err := encodeResidentRequest(req); err == nil {
			t.Errorf("%+v encoded", req)
		}
	}
}

// TestDecodeResidentRequest: every malformed request is refused with what
// is wrong; another version is errResidentVersion.
func TestDecodeResidentRequest(t *testing.T) {
	good := mustEncode(t, Request{Profile: "p", Argv: []string{"x"}, Environ: []string{"E=1"}})
	set := func(b []byte, at int, v uint32) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint32(b[at:], v)
		return b
	}
	const counts = 4 + 4 + 8 // magic, flags, timeout
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "no header"},
		{"JSON", []byte(`{"version":1}`), "no header"},
		{"short", good[:requestHeader-1], "no header"},
		{"no NUL", good[:len(good)-1], "without its NUL"},
		{"trailing", append(bytes.Clone(good), 'x'), "1 bytes after the last string"},
		{"no argv", set(good, counts, 0), "no argv"},
		{"unknown flag", set(good, 4, 2), "unknown flags 0x2"},
		{"negative timeout", set(good, 12, 0x80000000), "negative timeout"},
		{"counts beyond the bytes", set(good, counts+8, 0xffffffff), "strings in"},
	} {
		if _, err := decodeResidentRequest(c.b); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
	old := append([]byte("STR\x01"), good[4:]...)
	if _, err := decodeResidentRequest(old); !errors.Is(err, errResidentVersion) || !strings.Contains(err.Error(), "protocol version 1, this server speaks 2") {
		t.Errorf("version 1: %v", err)
	}
}

// TestResidentReply: the reply's layout both ways, its text cut to
// residentTextMax, and the malformed ones the client refuses.
func TestResidentReply(t *testing.T) {
	b := residentReply{typ: replyResult, status: 137, text: "str run: warning: x\n", result: []byte("{}\n")}.encode()
	if string(b[:4]) != residentMagic || b[4] != replyResult || !bytes.Equal(b[5:8], []byte{0, 0, 0}) ||
		binary.LittleEndian.Uint32(b[8:]) != 137 || binary.LittleEndian.Uint32(b[12:]) != 20 || string(b[16:]) != "str run: warning: x\n{}\n" {
		t.Fatalf("reply % x", b)
	}
	if r, err := decodeResidentReply(b); err != nil || r.status != 137 || r.text != "str run: warning: x\n" || string(r.result) != "{}\n" {
		t.Fatalf("decoded %+v %v", r, err)
	}
	long := residentReply{typ: replyFailed, status: -1, text: strings.Repeat("x", 2*residentTextMax)}.encode()
	if r, err := decodeResidentReply(long); err != nil || len(r.text) != residentTextMax || r.status != -1 {
		t.Fatalf("long reply: %d bytes, %v", len(r.text), err)
	}
	for name, b := range map[string][]byte{
		"short":          b[:replyHeader-1],
		"text too long":  b[:replyHeader+3],
		"bytes after":    append(residentReply{typ: replyRefused, text: "no"}.encode(), 'x'),
		"nonzero filler": append(append([]byte(residentMagic), replyResult, 1, 0, 0), make([]byte, 8)...),
	} {
		if _, err := decodeResidentReply(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// FuzzDecodeResidentRequest: any bytes decode without a panic; what
// decodes has argv and no negative timeout, and encodes back to the same
// bytes; its plan (Launcher.Plan, as str serve's check 3) never loosens
// the profile's wall clock.
func FuzzDecodeResidentRequest(f *testing.F) {
	f.Add(mustEncode(f, Request{Profile: "restrictive", Argv: []string{"/bin/true"}, Environ: []string{"A=1"}, Timeout: time.Second}))
	f.Add(mustEncode(f, Request{Argv: []string{"x", ""}, WantResult: true}))
	f.Add(mustEncode(f, Request{Profile: "standard", Argv: []string{"\xff"}, Env: []string{"K=V"}, Environ: []string{"PYTHONUNBUFFERED=1", "X"},
		Timeout: 99999 * time.Hour}))
	f.Add([]byte(`{"version":1}`))
	l := planLauncher(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := decodeResidentRequest(b)
		if err != nil {
			return
		}
		if len(req.Argv) == 0 || req.Timeout < 0 {
			t.Fatalf("decoded %+v", req)
		}
		again, err := encodeResidentRequest(req)
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoded: % x %v, want % x", again, err, b)
		}
		pl, err := l.Plan(launcher.Request{Profile: req.Profile, Argv: req.Argv, Env: req.Env, Timeout: req.Timeout})
		if err != nil {
			return
		}
		base, err := l.Plan(launcher.Request{Profile: req.Profile, Argv: req.Argv, Env: req.Env})
		if err != nil {
			t.Fatalf("the plan without the timeout fails: %v", err)
		}
		if pl.Timeout > base.Timeout {
			t.Fatalf("timeout %v planned %v, the profile's %v: loosened", req.Timeout, pl.Timeout, base.Timeout)
		}
	})
}
