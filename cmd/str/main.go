// Command str is the secure tool runtime: one binary whose subcommands run a
// sandbox (run), serve tool invocations (worker), run the dev broker
// (broker), send one invocation (invoke), show profiles (profile), check the
// host (doctor) and measure spawn latency (bench). The sandbox's init is a
// separate static program embedded in it (cmd/str-init, launcher/initbin).
package main

import (
	"fmt"
	"os"
)

const usage = `usage: str <command> [flags]

commands:
  run      run a command in a fresh sandbox
  worker   serve tool invocations from a broker
  broker   run the embedded dev broker
  invoke   send one tool invocation and print status lines and the reply
  profile  list profiles or show one (with --plan, the concrete plan)
  doctor   check what this host supports and how to fix what is missing
  bench    measure spawn latency against bubblewrap
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	args := os.Args[2:]
	var code int
	switch os.Args[1] {
	case "run":
		code = cmdRun(args)
	case "worker":
		code = cmdWorker(args)
	case "broker":
		code = cmdBroker(args)
	case "invoke":
		code = cmdInvoke(args)
	case "profile":
		code = cmdProfile(args)
	case "doctor":
		code = cmdDoctor(args)
	case "bench":
		code = cmdBench(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "str: unknown command %q\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}
