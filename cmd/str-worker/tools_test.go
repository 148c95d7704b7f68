package main

import (
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/worker"
)

// TestParseInterspersed: issue 16 §6. Flags after TOOL used to be
// ignored (str invoke TOOL --profile x ran with no profile and exited 0).
func TestParseInterspersed(t *testing.T) {
	for _, c := range []struct {
		args    []string
		profile string
		pos     []string
	}{
		{[]string{"echo", "--profile", "restrictive"}, "restrictive", []string{"echo"}},
		{[]string{"--profile", "restrictive", "echo"}, "restrictive", []string{"echo"}},
		{[]string{"--timeout", "3", "echo", "--profile", "restrictive"}, "restrictive", []string{"echo"}},
		{[]string{"echo", "extra", "--profile=restrictive"}, "restrictive", []string{"echo", "extra"}},
		{[]string{"echo", "--", "--profile"}, "", []string{"echo", "--profile"}},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		profile := fs.String("profile", "", "")
		fs.Float64("timeout", 0, "")
		pos, err := parseInterspersed(fs, c.args)
		if err != nil || *profile != c.profile || !slices.Equal(pos, c.pos) {
			t.Errorf("%q: profile %q positional %q %v, want %q %q", c.args, *profile, pos, err, c.profile, c.pos)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	if _, err := parseInterspersed(fs, []string{"echo", "--nosuch"}); err == nil {
		t.Error("an unknown flag after TOOL was accepted")
	}
}

func TestServedAndPrintTools(t *testing.T) {
	replies := []worker.ToolsReply{
		{Version: 1, WorkerID: "w2", Tools: []worker.ToolInfo{
			{Name: "echo_tool", Profile: "standard", Network: "allow_egress", TimeoutSeconds: 300},
			{Name: "broken", Profile: "standard", Network: "allow_egress", TimeoutSeconds: 300, Unavailable: "module nosuch missing"},
		}},
		{Version: 1, WorkerID: "w1", Tools: []worker.ToolInfo{
			{Name: "echo_tool", Profile: "standard", Network: "allow_egress", TimeoutSeconds: 300},
			{Name: "http_get", Profile: "standard", Network: "restricted", AllowedHosts: []string{"pypi.org"}, Warm: 2, TimeoutSeconds: 30},
		}},
	}
	served, ok := servedTools(replies, "echo_tool")
	if !ok || !slices.Equal(served, []string{"echo_tool", "http_get"}) {
		t.Errorf("servedTools: %v %v", served, ok)
	}
	if served, ok := servedTools(replies, "broken"); !ok || slices.Contains(served, "broken") {
		t.Errorf("an unavailable tool: listed %v, among the served %v", ok, served)
	}
	if _, ok := servedTools(replies, "nobody"); ok {
		t.Error("a tool no worker lists counts as listed")
	}
	var b strings.Builder
	printTools(&b, replies)
	want := []string{
		"TOOL       PROFILE   NETWORK                WARM  TIMEOUT  WORKERS  STATUS",
		"broken     standard  allow_egress           0     300s+5s  w2       unavailable: module nosuch missing",
		"echo_tool  standard  allow_egress           0     300s+5s  w1,w2    serving",
		"http_get   standard  restricted (pypi.org)  2     30s+5s   w1       serving",
	}
	if got := strings.Split(strings.TrimRight(b.String(), "\n"), "\n"); !slices.Equal(got, want) {
		t.Errorf("printTools:\n%s\nwant\n%s", b.String(), strings.Join(want, "\n"))
	}
}

func TestDecodeToolsReply(t *testing.T) {
	if _, err := decodeToolsReply([]byte(`{"version":2,"tools":[]}`)); err == nil || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("version 2: %v", err)
	}
	if _, err := decodeToolsReply([]byte(`nope`)); err == nil {
		t.Error("not JSON accepted")
	}
	r, err := decodeToolsReply([]byte(`{"version":1,"worker_id":"w","tools":[{"name":"a","profile":"standard","network":"isolated","warm":1,"timeout_seconds":5}]}`))
	if err != nil || r.WorkerID != "w" || len(r.Tools) != 1 || r.Tools[0].Warm != 1 {
		t.Errorf("%+v %v", r, err)
	}
}
