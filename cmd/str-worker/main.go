// Command str-worker is str's worker: it serves tool invocations from a
// broker (the dev broker, or Solace PubSub+ when SOLACE_HOST is set) and
// runs each in a sandbox of the launcher (package worker; its settings are
// worker.ConfigUsage).
//
// It is a program of its own because the Solace client library is C (cgo,
// 21 MB with it): str itself (cmd/str: run, bwrap, profile, doctor, broker,
// invoke, tools) is built with CGO_ENABLED=0, a small static program, so
// that starting a sandbox with `str run` never pays for the worker's
// start (issue 19). `str worker ARGS` execs this program from the directory
// str itself is in, so `str worker` stays the command deployments run;
// `str-worker ARGS` is the same.
package main

import "os"

func main() {
	os.Exit(cmdWorker(os.Args[1:]))
}
