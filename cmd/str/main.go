// Command str is the secure tool runtime: its subcommands run a sandbox
// (run, or bwrap: bubblewrap's command line), keep sandboxes pre-built
// (serve), show profiles (profile), check the host (doctor) and print its
// version (version). It is built with CGO_ENABLED=0: a static program that
// links no C, so a one-shot `str run` pays only for a small Go start (issue
// 19). The commands that talk to a broker rather than run a sandbox (worker,
// broker, invoke, tools) are a program of their own (cmd/str-worker, with
// the Solace client library's cgo, the broker and the worker's manifests):
// `str CMD ARGS` execs `str-worker CMD ARGS` from str's directory, so `str
// run` links none of them (issue 30). The
// sandbox's init is no program of its own: the launcher's clone child
// runs the init's compiled steps (nsinit). The benchmarks are a program of their
// own (cmd/str-bench, make bench), not part of this binary.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
)

const usage = `usage: str <command> [flags]

commands:
  run      run a command in a fresh sandbox
  bwrap    run a bubblewrap command line in a fresh sandbox (also: str invoked as bwrap)
  serve    keep sandboxes pre-built for str run (a resident launcher on a unix socket)
  worker   serve tool invocations from a broker (execs str-worker beside str)
  broker   run the embedded dev broker
  invoke   send one tool invocation and print status lines and the reply
  tools    list the tools the workers of a namespace serve
  profile  list profiles or show one (with --plan, the concrete plan)
  doctor   check what this host supports and how to fix what is missing
  runtimes list the runtime classes (namespaces, gvisor, microvm) and whether each runs here
  version  print str's module version and VCS revision (also --version)
`

func main() {
	// Invoked as bwrap (a symlink named so), or with an option where the
	// command goes (`/proc/self/exe --unshare-all …` from inside a str
	// bwrap sandbox, as bubblewrap's own nested lines run it):
	// bubblewrap's command line.
	if filepath.Base(os.Args[0]) == "bwrap" || bwrapLine(os.Args[1:]) {
		os.Exit(cmdBwrap("bwrap", os.Args[1:]))
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	args := os.Args[2:]
	var code int
	switch os.Args[1] {
	case "run":
		code = cmdRun(args)
	case "bwrap":
		code = cmdBwrap("str bwrap", args)
	case "serve":
		code = cmdServe(args)
	case "worker", "broker", "invoke", "tools":
		code = cmdWorkerProgram(os.Args[1], args)
	case "profile":
		code = cmdProfile(args)
	case "doctor":
		code = cmdDoctor(args)
	case "runtimes":
		code = cmdRuntimes(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	case "version", "--version", "-version":
		info, _ := debug.ReadBuildInfo()
		fmt.Println(versionLine(info))
	default:
		fmt.Fprintf(os.Stderr, "str: unknown command %q\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}

// versionLine is `str VERSION (revision REV[, modified], built DATE, GO)`
// from the binary's build info: the module version ("(devel)" for a
// build from a checkout) and the VCS stamp go build records (absent with
// -buildvcs=false or outside a checkout).
func versionLine(info *debug.BuildInfo) string {
	if info == nil {
		return "str (no build info)"
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	line := "str " + info.Main.Version
	rev := settings["vcs.revision"]
	if rev == "" {
		return line + " (no VCS revision recorded), " + info.GoVersion
	}
	line += " (revision " + rev
	if settings["vcs.modified"] == "true" {
		line += ", modified"
	}
	if t := settings["vcs.time"]; t != "" {
		line += ", committed " + t
	}
	return line + "), " + info.GoVersion
}

// bwrapLine: args start with an option that is none of str's own (-h,
// --help, help, version, --version, -version): a bubblewrap command line,
// since no str command starts with a dash.
func bwrapLine(args []string) bool {
	if len(args) == 0 || !strings.HasPrefix(args[0], "-") {
		return false
	}
	switch args[0] {
	case "-h", "--help", "--version", "-version":
		return false
	}
	return true
}
