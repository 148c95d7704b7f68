package main

import (
	"fmt"
	"os"

	"github.com/securetoolruntime/str/profiles/profileyaml"
)

// The YAML decoder of bin/str. str links no YAML (issue 30): when an
// operator gives it YAML (--profile-dir, STR_PROFILE_DIR, or a profile
// naming a seccomp policy file), it runs
//
//	str-worker decode-profiles DIR
//	str-worker decode-seccomp FILE
//
// from its own directory. Each prints the decoded form (the JSON that
// profiles.Set.AddDecoded or seccomp.ReadDecoded reads) on stdout and
// exits 0, or prints the decoder's error, exactly as the in-process
// decoder returns it, on stderr and exits 1. These are the worker's own
// decoder (profileyaml.Decoder), which the worker calls in-process.

func cmdDecodeProfiles(args []string) int {
	return decodeOne("decode-profiles DIR", args, profileyaml.Decoder{}.DecodeProfileDir)
}

func cmdDecodeSeccomp(args []string) int {
	return decodeOne("decode-seccomp FILE", args, profileyaml.Decoder{}.DecodePolicyFile)
}

func decodeOne(usage string, args []string, decode func(string) ([]byte, error)) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: str-worker", usage)
		return 2
	}
	out, err := decode(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := os.Stdout.Write(out); err != nil {
		fmt.Fprintln(os.Stderr, "str-worker: write the decoded form:", err)
		return 1
	}
	return 0
}
