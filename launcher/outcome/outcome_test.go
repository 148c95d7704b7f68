package outcome

import (
	"testing"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/writeback"
)

// TestOf: str run's exit code and stderr text for each kind of
// result, as finishRun printed them before Outcome was shared.
func TestOf(t *testing.T) {
	setup := &launcher.StepError{Who: "nsinit", Step: 3, Action: "execve", Path: "/x", Msg: "no such file or directory"}
	for _, c := range []struct {
		name string
		res  launcher.Result
		code int
		text string
	}{
		{"status", launcher.Result{ExitCode: 3}, 3, ""},
		{"signal", launcher.Result{ExitCode: 137, Signal: 9}, 137, ""},
		{"timeout", launcher.Result{ExitCode: 137, TimedOut: true}, ExitTimedOut, "str run: timed out; the sandbox was killed\n"},
		{"oom", launcher.Result{ExitCode: 137, OOMKilled: true}, 137, "str run: the memory limit was hit; the OOM killer ended the tool\n"},
		{"not found", launcher.Result{ExitCode: ExitNotFound, SetupError: setup}, ExitNotFound, "str run: " + setup.Error() + "\n"},
		{"setup", launcher.Result{ExitCode: 1, SetupError: setup}, ExitLauncher, "str run: " + setup.Error() + "\n"},
		{"warnings and violations first", launcher.Result{ExitCode: 0, Warnings: []string{"a", "b"}, ViolationSummary: "blocked: x"},
			0, "str run: warning: a\nstr run: warning: b\nblocked: x\n"},
		{"write-back", launcher.Result{ExitCode: 0, WriteBack: &writeback.Report{Dir: "/w", Skipped: []string{"fifo"}, Error: setup}},
			ExitLauncher, "str run: warning: /w/fifo: not copied back (not a file, directory or symlink)\nstr run: " + setup.Error() + "\n"},
	} {
		code, text := Of(&c.res)
		if code != c.code || text != c.text {
			t.Errorf("%s: %d %q, want %d %q", c.name, code, text, c.code, c.text)
		}
	}
}
