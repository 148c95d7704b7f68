// Command str-init is a small static program (built with CGO_ENABLED=0;
// no libseccomp, YAML, broker or metrics code) that str embeds
// (launcher/initbin) for the two launcher uses left of it: the program a
// per-tool template's id-map opener executes (argv[0] nsinit.MapperArgv0,
// launcher/template_mapper.go) and the executable ownerMap's stopped
// child names (launcher/binds.go, never run). The sandbox's init steps are
// not here: every sandbox runs them as a Program in the launcher's own
// clone child (nsinit.CompileDirect).
package main

import (
	"fmt"
	"os"

	"github.com/securetoolruntime/str/nsinit"
)

func main() {
	argv0 := ""
	if len(os.Args) > 0 {
		argv0 = os.Args[0]
	}
	if argv0 == nsinit.MapperArgv0 {
		nsinit.MapperMain()
	}
	fmt.Fprintf(os.Stderr, "str-init: argv[0] %q is not %q: the sandbox's init runs in the launcher's own clone child\n", argv0, nsinit.MapperArgv0)
	os.Exit(nsinit.ExitSetupFailed)
}
