package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/securetoolruntime/str/launcher"
)

// cmdRuntimes is `str runtimes [--json]`: each runtime class (issue 33;
// docs/runtimes.md), weakest first, with whether it can run here and why
// not. Exit 0 whatever is missing: a missing class is information.
func cmdRuntimes(args []string) int {
	fs := flag.NewFlagSet("str runtimes", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "str runtimes: no arguments expected")
		return exitUsage
	}
	list := launcher.Runtimes()
	if *asJSON {
		data, _ := json.MarshalIndent(list, "", "  ")
		fmt.Println(string(data))
		return 0
	}
	for _, r := range list {
		fmt.Println(runtimeLine(r))
	}
	return 0
}

// runtimeLine is one class in one line: "gvisor      yes  runsc ...".
func runtimeLine(r launcher.RuntimeStatus) string {
	if r.Available {
		return fmt.Sprintf("%-11s yes  %s", r.Class, r.Detail)
	}
	return fmt.Sprintf("%-11s no   %s (%s)", r.Class, r.Problem, strings.TrimSpace(r.Detail))
}

// runtimesSummary is str doctor's line: the classes this host runs.
func runtimesSummary() string {
	var yes, no []string
	for _, r := range launcher.Runtimes() {
		if r.Available {
			yes = append(yes, r.Class)
		} else {
			no = append(no, r.Class+": "+r.Problem)
		}
	}
	s := "runs " + strings.Join(yes, ", ")
	if len(no) > 0 {
		s += "; not " + strings.Join(no, "; not ")
	}
	return s + " (str runtimes)"
}
