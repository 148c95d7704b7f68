// Command str-bench measures str: `str run` next to bubblewrap, plain exec
// and the kernel's clone floor, the warm pool's dispatch, echo_tool end to
// end through throw-away workers, and per-sandbox memory (make bench,
// scripts/bench.sh). It is a separate program so that the production binary
// carries none of it; it drives a str binary (--str, default: the str next
// to this one) as a child process and never links into it.
//
//	str-bench [flags]       the whole interleaved comparison (bench_suite.go)
//	str-bench spawn ...     the spawn driver and the clone floor (bench.go)
//	str-bench echo ...      one worker end to end (bench_echo.go)
//	str-bench warm ...      the warm pool's dispatch (bench_warm.go)
//	str-bench template ...  per-tool templates next to bubblewrap (bench_template.go)
//	str-bench load ...      str run next to bubblewrap under background load (bench_load.go)
//	str-bench spin ...      one CPU spinner of that load (bench_load.go)
package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// exitUsage is the exit status of bad flags (before anything was attempted).
const exitUsage = 2

func main() {
	os.Exit(benchMain(os.Args[1:]))
}

// benchMain is str-bench: without a subcommand the whole interleaved
// comparison (bench_suite.go); the spawn driver (spawn), the worker's end
// to end measurement (echo, bench_echo.go) and the warm pool's dispatch
// (warm, bench_warm.go) are its building blocks.
func benchMain(args []string) int {
	if len(args) > 0 {
		switch args[0] {
		case "spawn":
			return benchSpawn(args[1:], os.Stdout)
		case "echo":
			return benchEcho(args[1:], os.Stdout)
		case "warm":
			return benchWarm(args[1:], os.Stdout)
		case "template":
			return benchTemplate(args[1:], os.Stdout)
		case "load":
			return benchLoadMain(args[1:], os.Stdout, os.Stderr)
		case "spin":
			return benchSpin(args[1:])
		}
		if !strings.HasPrefix(args[0], "-") {
			fmt.Fprintf(os.Stderr, "str-bench: %s %q\n\n%s\n%s\n%s", benchUnknownCommand, args[0], benchSuiteUsage, benchUsage, benchEchoUsage)
			return exitUsage
		}
	}
	return benchSuite(args, os.Stdout, os.Stderr)
}

// benchUnknownCommand starts the message for a subcommand str-bench does
// not have.
const benchUnknownCommand = "unknown bench command"

// randomID is a random UUID-shaped id (task and client ids).
func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
