// Command str-worker holds str's commands that talk to a broker rather
// than run a sandbox: the worker (worker, the default), which serves tool
// invocations from a broker (the dev broker, or Solace PubSub+ when
// SOLACE_HOST is set) and runs each in a sandbox of the launcher (package
// worker; its settings are worker.ConfigUsage); the dev broker (broker);
// one invocation sent and its reply printed (invoke); and the tools a
// namespace's workers serve (tools). Two hidden commands decode an
// operator's YAML for bin/str, which links no YAML decoder (decode.go).
//
// It is a program of its own because the Solace client library is C (cgo,
// 21 MB with it) and the broker, its transport and the worker's manifests
// are large: str itself (cmd/str: run, bwrap, serve, profile, doctor) is
// built with CGO_ENABLED=0, a small static program, so that starting a
// sandbox with `str run` never pays for them (issues 19 and 30). `str CMD
// ARGS` execs `str-worker CMD ARGS` from the directory str itself is in, so
// `str worker`, `str broker`, `str invoke` and `str tools` stay the
// commands users and deployments run. `str-worker ARGS` whose first
// argument is none of these commands is `str-worker worker ARGS`.
package main

import "os"

// commands are str-worker's commands by their first argument.
var commands = map[string]func(args []string) int{
	"worker": cmdWorker,
	"broker": cmdBroker,
	"invoke": cmdInvoke,
	"tools":  cmdTools,
	// bin/str's YAML decoder (decode.go).
	"decode-profiles": cmdDecodeProfiles,
	"decode-seccomp":  cmdDecodeSeccomp,
}

func main() {
	if len(os.Args) > 1 {
		if cmd, ok := commands[os.Args[1]]; ok {
			os.Exit(cmd(os.Args[2:]))
		}
	}
	os.Exit(cmdWorker(os.Args[1:]))
}
