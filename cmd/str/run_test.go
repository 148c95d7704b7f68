package main

import (
	"flag"
	"io"
	"os"
	"testing"
)

// TestResidentSocket: the socket str run tries first, by precedence:
// --one-shot (none), --serve as given ("" is none), $STR_SERVE_SOCKET
// when set (empty is none), else serve.sock in the state directory.
func TestResidentSocket(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  *string // $STR_SERVE_SOCKET; nil: unset
		want string
	}{
		{"default", nil, nil, "/state/serve.sock"},
		{"one-shot", []string{"--one-shot"}, nil, ""},
		{"one-shot over --serve", []string{"--one-shot", "--serve", "/s"}, nil, ""},
		{"--serve", []string{"--serve", "/s"}, ptr("/e"), "/s"},
		{"--serve empty", []string{"--serve="}, ptr("/e"), ""},
		{"env", nil, ptr("/e"), "/e"},
		{"env empty", nil, ptr(""), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("STR_STATE_DIR", "/state")
			if c.env != nil {
				t.Setenv("STR_SERVE_SOCKET", *c.env)
			} else {
				// t.Setenv restores the variable afterwards; then unset it.
				t.Setenv("STR_SERVE_SOCKET", "")
				if err := os.Unsetenv("STR_SERVE_SOCKET"); err != nil {
					t.Fatal(err)
				}
			}
			fs := flag.NewFlagSet("run", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			serve := fs.String("serve", "", "")
			oneShot := fs.Bool("one-shot", false, "")
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			if got := residentSocket(fs, *serve, *oneShot); got != c.want {
				t.Errorf("residentSocket(%q, STR_SERVE_SOCKET %v) = %q, want %q", c.args, c.env, got, c.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }
