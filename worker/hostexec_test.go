package worker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// hostSandboxes runs the tool as a plain child process, without any
// isolation. The package's unit tests use it to exercise the worker's own
// logic (protocol, FIFO relay, inputs, outputs, queueing, cancellation,
// reload) deterministically and without privileges; containment through
// the real launcher is covered by test/e2e.
//
// uid and gid, when set, are the owner the "sandbox" reports and the ids
// the tool runs as (root only), as a launcher sandbox's own host uid.
type hostSandboxes struct{ uid, gid int }

var knownTestProfiles = map[string]bool{"restrictive": true, "standard": true, "permissive": true}

func (hostSandboxes) CheckProfile(name string) error {
	if !knownTestProfiles[name] {
		return fmt.Errorf("%w: %q", ErrUnknownProfile, name)
	}
	return nil
}

// Create makes nothing yet: the host "sandbox" is a plain child process,
// owned by the test's own uid.
func (hs hostSandboxes) Create(ctx context.Context, spec SandboxSpec) (CreatedSandbox, error) {
	if _, err := os.Stat(spec.Workdir); err != nil {
		return nil, fmt.Errorf("%w: work dir: %w", ErrInvalidSandboxRequest, err)
	}
	return &hostCreated{ctx: ctx, spec: spec, uid: hs.uid, gid: hs.gid}, nil
}

type hostCreated struct {
	ctx      context.Context
	spec     SandboxSpec
	uid, gid int
}

func (c *hostCreated) Owner() (int, int) {
	if c.uid != 0 {
		return c.uid, c.gid
	}
	return os.Geteuid(), os.Getegid()
}
func (c *hostCreated) Kill() error { return nil }

func (c *hostCreated) Start() (RunningSandbox, error) {
	spec := c.spec
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Dir = spec.Workdir
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}, spec.Env...)
	cmd.Stderr = spec.Stderr
	cmd.ExtraFiles = spec.ExtraFiles
	if c.uid != 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(c.uid), Gid: uint32(c.gid)}}
	}
	// The same process handling as SANDBOX_MODE=none (unsandboxed.go).
	p, err := startProcess(c.ctx, cmd, spec.Timeout, spec.Idle)
	if err != nil {
		return nil, err
	}
	return p, nil
}
