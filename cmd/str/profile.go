package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/planfmt"
	"github.com/securetoolruntime/str/profiles"
)

func cmdProfile(args []string) int {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		fmt.Fprintln(os.Stderr, "usage: str profile list | str profile show NAME [--plan] [--json] [--profile-dir DIR]")
		return exitUsage
	}
	fs := flag.NewFlagSet("profile", flag.ContinueOnError)
	plan := fs.Bool("plan", false, "print the concrete plan: mounts, clone flags, id maps, rlimits, cgroup limits, seccomp rules")
	asJSON := fs.Bool("json", false, "print JSON")
	profileDir := fs.String("profile-dir", os.Getenv("STR_PROFILE_DIR"), "directory with extra *.yaml profiles")
	sub, rest := args[0], args[1:]
	var name string
	if sub == "show" {
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			fmt.Fprintln(os.Stderr, "usage: str profile show NAME [--plan] [--json]")
			return exitUsage
		}
		name, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return exitUsage
	}
	l, err := launcher.New(launcher.Options{ProfileDir: *profileDir, Decoder: workerDecoder{}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "str profile:", err)
		return exitLauncher
	}
	set := l.Profiles()
	if sub == "list" {
		aliases := map[string][]string{}
		for a, n := range set.Aliases() {
			aliases[n] = append(aliases[n], a)
		}
		for _, n := range set.Names() {
			p, _ := set.Lookup(n)
			extra := ""
			if len(aliases[n]) > 0 {
				extra = " (also: " + strings.Join(aliases[n], ", ") + ")"
			}
			fmt.Printf("%-14s %s%s\n", n, p.Description, extra)
		}
		return 0
	}
	p, err := set.Lookup(name)
	if err != nil {
		fmt.Fprintln(os.Stderr, "str profile:", err)
		return exitLauncher
	}
	if !*plan {
		if *asJSON {
			return printJSON(p)
		}
		out, _ := json.MarshalIndent(p, "", "  ")
		fmt.Println(string(out))
		return 0
	}
	pl, err := l.Plan(launcher.Request{Profile: name, Argv: []string{"CMD"}, Workdir: ""})
	if err == nil {
		err = planfmt.AddViews(pl)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "str profile:", err)
		return exitLauncher
	}
	if *asJSON {
		return printJSON(pl)
	}
	fmt.Print(planfmt.Plan(pl, profiles.FormatBytes))
	return 0
}

func printJSON(v any) int {
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(string(out))
	return 0
}
