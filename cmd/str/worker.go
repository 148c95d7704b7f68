package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// workerProgram is the worker's own program (cmd/str-worker), found in the
// directory str itself is in.
const workerProgram = "str-worker"

// cmdWorker runs `str worker ARGS`: it replaces this process by
// `str-worker ARGS` from str's own directory. The same process goes on
// (execve), so a container's PID 1, systemd's main PID and the signals they
// send stay the worker's. str carries no worker code: the worker links the
// Solace client library (cgo), which `str run` must not pay for at every
// start (issue 19).
func cmdWorker(args []string) int {
	path, err := workerPath()
	if err != nil {
		fmt.Fprintf(os.Stderr, "str worker: %v\n", err)
		return 1
	}
	err = syscall.Exec(path, append([]string{path}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "str worker: exec %s: %v\n", path, err)
	return 1
}

// workerPath is str-worker beside this binary (/proc/self/exe, symlinks
// resolved: a str reached through a link finds the worker beside the real
// file), or an error that says where it was looked for and how to fix it.
func workerPath() (string, error) {
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
		return "", fmt.Errorf("the worker is the program %s installed beside str: %s: %w (install both: make build puts bin/str and bin/%s side by side)",
			workerProgram, path, err, workerProgram)
	}
	return path, nil
}
