package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionLine(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}, {Key: "vcs.time", Value: "2026-01-02T03:04:05Z"}}}
	if got, want := versionLine(info), "str v1.2.3 (revision abc123, modified, committed 2026-01-02T03:04:05Z), go1.26.0"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	info.Settings = nil
	if got, want := versionLine(info), "str v1.2.3 (no VCS revision recorded), go1.26.0"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := versionLine(nil); got != "str (no build info)" {
		t.Errorf("nil: %q", got)
	}
}

// A command line that starts with an option is bubblewrap's (str run as
// /proc/self/exe inside a str bwrap sandbox); str's own help and version
// flags stay str's.
func TestBwrapLine(t *testing.T) {
	for args, want := range map[string]bool{
		"--unshare-all --bind / / true": true, "--ro-bind / / true": true, "--args 3": true,
		"run -- true": false, "--help": false, "-h": false, "--version": false, "-version": false, "": false, "bwrap --help": false,
	} {
		if got := bwrapLine(strings.Fields(args)); got != want {
			t.Errorf("bwrapLine(%q) = %v, want %v", args, got, want)
		}
	}
}
