// Command str-init is the sandbox's init: a small static program (built
// with CGO_ENABLED=0; no libseccomp, YAML, broker or metrics code) that
// performs nsinit's numbered sequence and then executes the tool in its
// own place. It is not installed anywhere: str embeds it (launcher/initbin)
// and runs it from a read-only copy or a sealed memfd. argv[1] is the number of descriptors
// passed on to the tool (see nsinit.Main).
package main

import (
	"runtime"
	"runtime/debug"

	"github.com/securetoolruntime/str/nsinit"
)

func init() {
	// The setup runs on the main thread, start to end; the per-thread
	// steps run on a thread of their own (nsinit.execTool).
	runtime.LockOSThread()
}

func main() {
	// No garbage collection: the init lives for milliseconds, and after
	// RLIMIT_AS no background worker may need fresh memory.
	debug.SetGCPercent(-1)
	nsinit.Main()
}
