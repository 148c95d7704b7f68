// Package outcome is what `str run` makes of a launcher.Result: its exit
// code and the lines it writes to stderr. One-shot str run and the
// resident launcher's replies (package launcher/resident: str run writes
// the text and exits with the code) both use it, so the two agree byte
// for byte. It only reads the result: it does nothing on the host.
package outcome

import (
	"strings"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/nsinit"
)

// Exit codes of `str run` when the failure is str's, not the tool's.
// Everything else is the tool's own status (128+N when signal N killed
// it). 125-127 are the init's own (defined once, in nsinit).
const (
	ExitTimedOut   = 124                    // the wall-clock timeout killed the sandbox
	ExitLauncher   = nsinit.ExitSetupFailed // str could not build or start the sandbox (usage, profile, setup step)
	ExitCannotExec = nsinit.ExitCannotExec  // the command exists but cannot be executed
	ExitNotFound   = nsinit.ExitNotFound    // the command does not exist inside the sandbox
	// ExitResidentLost: the resident launcher (str serve) took the call
	// and went away before its reply; the command may have run, so str
	// run does not run it again (unlike 125, nothing says it is safe to).
	ExitResidentLost = 123
)

// Of is str run's exit code for res and the lines it writes to stderr
// (each ending in a newline).
func Of(res *launcher.Result) (code int, stderr string) {
	var b strings.Builder
	line := func(parts ...string) {
		b.WriteString(strings.Join(parts, " "))
		b.WriteByte('\n')
	}
	for _, w := range res.Warnings {
		line("str run: warning:", w)
	}
	if res.ViolationSummary != "" {
		line(res.ViolationSummary)
	}
	if wb := res.WriteBack; wb != nil {
		for _, p := range wb.Skipped {
			line("str run: warning: " + wb.Dir + "/" + p + ": not copied back (not a file, directory or symlink)")
		}
		if wb.Error != nil {
			// The tool's changes did not all reach DIR: whatever the
			// tool's own status, the run failed on str's side.
			line("str run:", wb.Error.Error())
			return ExitLauncher, b.String()
		}
	}
	switch {
	case res.SetupError != nil:
		line("str run:", res.SetupError.Error())
		if res.ExitCode == ExitNotFound || res.ExitCode == ExitCannotExec {
			return res.ExitCode, b.String()
		}
		return ExitLauncher, b.String()
	case res.TimedOut:
		line("str run: timed out; the sandbox was killed")
		return ExitTimedOut, b.String()
	case res.OOMKilled:
		line("str run: the memory limit was hit; the OOM killer ended the tool")
	}
	return res.ExitCode, b.String()
}
