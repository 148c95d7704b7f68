package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/securetoolruntime/str/launcher"
)

// workerDecoder is str's launcher.Decoder. str links no YAML decoder
// (issue 30: a one-shot `str run` pays for none, and the embedded
// profiles and policies come decoded), so the operator's YAML it is given
// (--profile-dir or STR_PROFILE_DIR, and a seccomp policy file a profile
// there names) is decoded by the one decoder, in `str-worker
// decode-profiles DIR` or `str-worker decode-seccomp FILE` beside str
// (cmd/str-worker/decode.go): its stdout is the decoded form, and on
// failure its stderr is the error, passed on unchanged. Only then is
// anything run: without operator YAML str starts no other program.
type workerDecoder struct{}

var _ launcher.Decoder = workerDecoder{}

func (workerDecoder) DecodeProfileDir(dir string) ([]byte, error) {
	return runDecoder("decode-profiles", dir)
}

func (workerDecoder) DecodePolicyFile(file string) ([]byte, error) {
	return runDecoder("decode-seccomp", file)
}

// runDecoder runs `str-worker command arg` and returns its stdout, or
// its stderr as the error when it fails.
func runDecoder(command, arg string) ([]byte, error) {
	path, err := workerPath("decoding YAML (--profile-dir, STR_PROFILE_DIR, a seccomp policy file)")
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", workerProgram, command, err)
	}
	defer outR.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		outW.Close()
		return nil, fmt.Errorf("%s %s: %w", workerProgram, command, err)
	}
	defer errR.Close()
	// The environment is str's own plus MALLOC_ARENA_MAX=1; stdin is
	// closed. str-worker links C (cgo), and glibc reserves 64 MiB of
	// address space for each further malloc arena: under an RLIMIT_AS of
	// 1 GiB (str inside str bwrap --str-profile nesting) its thread
	// creation failed (pthread_create: EAGAIN) in 3 runs of 40, in none
	// with one arena. Decoding is one thread's work.
	proc, err := os.StartProcess(path, []string{path, command, arg}, &os.ProcAttr{Env: append(os.Environ(), "MALLOC_ARENA_MAX=1"), Files: []*os.File{nil, outW, errW}})
	outW.Close()
	errW.Close()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", workerProgram, command, err)
	}
	var stderr bytes.Buffer
	done := make(chan struct{})
	go func() {
		io.Copy(&stderr, errR) //nolint:errcheck // a read error leaves what was read
		close(done)
	}()
	out, readErr := io.ReadAll(outR)
	<-done
	state, err := proc.Wait()
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s %s: %w", workerProgram, command, err)
	case !state.Success() && stderr.Len() > 0:
		return nil, errors.New(string(bytes.TrimSuffix(stderr.Bytes(), []byte("\n"))))
	case !state.Success():
		return nil, fmt.Errorf("%s %s %s: %s", path, command, arg, state)
	case readErr != nil:
		return nil, fmt.Errorf("%s %s: read its output: %w", workerProgram, command, readErr)
	}
	return out, nil
}
