package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestDefaultBroker: --broker's default from DEV_BROKER_HOST and
// DEV_BROKER_PORT; the port alone used to be ignored.
func TestDefaultBroker(t *testing.T) {
	for _, c := range []struct{ host, port, want string }{
		{"", "", "127.0.0.1:55554"},
		{"", "6000", "127.0.0.1:6000"},
		{"broker.local", "", "broker.local:55555"},
		{"broker.local", "6000", "broker.local:6000"},
		{"::1", "6000", "[::1]:6000"},
	} {
		env := map[string]string{"DEV_BROKER_HOST": c.host, "DEV_BROKER_PORT": c.port}
		if got := defaultBroker(func(k string) string { return env[k] }); got != c.want {
			t.Errorf("host %q port %q: %s, want %s", c.host, c.port, got, c.want)
		}
	}
}

// TestJSONObjectProblem: --args that is not JSON names the position and
// shows the text around it (it said only "must be a JSON object"); JSON
// that is not an object says what it is instead.
func TestJSONObjectProblem(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{`{"message":"hi"}`, ""},
		{`{}`, ""},
		{`{"message":hi}`, "--args is not valid JSON at byte 12 of 14: invalid character 'h' looking for beginning of value\n  {\"message\":hi}\n             ^"},
		{`{"a": 1,,}`, "--args is not valid JSON at byte 9 of 10: invalid character ',' looking for beginning of object key string\n  {\"a\": 1,,}\n          ^"},
		{"{\"a\":\n x}", "--args is not valid JSON at byte 8 of 9: invalid character 'x' looking for beginning of value\n  {\"a\":. x}\n         ^"},
		{`{"message":"hi"`, "--args is not valid JSON: it ends (after 15 bytes) before the value does: unexpected end of JSON input"},
		{``, "--args is not valid JSON: it ends (after 0 bytes) before the value does: unexpected end of JSON input"},
		{`[1]`, "--args must be a JSON object ({...}), got an array"},
		{`null`, "--args must be a JSON object ({...}), got null"},
		{`7`, "--args must be a JSON object ({...}), got 7"},
		{`"x"`, `--args must be a JSON object ({...}), got a string (did the shell eat the braces? quote the object: '{"key":"value"}')`},
	} {
		if got := jsonObjectProblem("--args", c.raw); got != c.want {
			t.Errorf("%q:\n got %q\nwant %q", c.raw, got, c.want)
		}
	}
}

// TestConnectRefusedHint: a broker address nothing listens on says so,
// names the address and make run (it said only "connection refused").
func TestConnectRefusedHint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // now refused: nothing listens there
	target, problems := resolveBroker(addr, "")
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = target.connect(ctx, "str-test", nil)
	if err == nil {
		t.Fatalf("connect to %s (closed): no error", addr)
	}
	for _, want := range []string{"connection refused", "nothing listens on " + addr, "make run", "--broker"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("connect to %s: %v\nwant it to contain %q", addr, err, want)
		}
	}
}
