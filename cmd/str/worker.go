package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// workerProgram is the worker's own program (cmd/str-worker), found in the
// directory str itself is in. It also holds the commands that talk to a
// broker rather than run a sandbox: broker, invoke and tools.
const workerProgram = "str-worker"

// cmdWorkerProgram runs `str CMD ARGS` for one of workerCommands: it
// replaces this process by `str-worker CMD ARGS` from str's own directory.
// The same process goes on (execve), so a container's PID 1, systemd's main
// PID and the signals they send stay the worker's (or the broker's), and
// str invoke's exit status is str-worker's. str carries none of their code:
// the worker links the Solace client library (cgo), and all four link the
// broker, its transport and the worker's manifests, which `str run` must
// not pay for at every start (issues 19 and 30).
func cmdWorkerProgram(command string, args []string) int {
	path, err := workerPath("str " + command)
	if err != nil {
		fmt.Fprintf(os.Stderr, "str %s: %v\n", command, err)
		return 1
	}
	err = syscall.Exec(path, append([]string{path, command}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "str %s: exec %s: %v\n", command, path, err)
	return 1
}

// workerPath is str-worker beside this binary (/proc/self/exe, symlinks
// resolved: a str reached through a link finds the worker beside the real
// file), or an error that says where it was looked for, that what (`str
// command`, decoding YAML) needs it, and how to fix it.
func workerPath(what string) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("the str binary's own path, to find %s beside it: %w", workerProgram, err)
	}
	path := filepath.Join(filepath.Dir(self), workerProgram)
	fi, err := os.Stat(path)
	if err == nil && (!fi.Mode().IsRegular() || fi.Mode()&0o111 == 0) {
		err = errors.New("not an executable file")
	}
	if err != nil {
		return "", fmt.Errorf("%s runs in the program %s installed beside str: %s: %w (install both: make build puts bin/str and bin/%s side by side)",
			what, workerProgram, path, err, workerProgram)
	}
	return path, nil
}
