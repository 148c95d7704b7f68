package main

import (
	"runtime/debug"
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
