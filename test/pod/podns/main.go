// Command podns stands in for a container runtime's user namespace in the
// pod-constraints test (test/pod): it runs a command as uid 0 of a new user
// namespace whose uids and gids 0-COUNT-1 map to OUTSIDE..OUTSIDE+COUNT-1,
// as Kubernetes does for a pod with hostUsers: false (COUNT 65536), with a
// mount namespace of its own (the container's mounts, now owned by the
// pod's user namespace), and
// relays SIGTERM and SIGINT to it (it is the container's PID 1, so docker
// stop reaches the worker through it).
//
//	podns OUTSIDE COUNT PROGRAM ARGS...
//
// Test tooling only: it is built by the test and bind-mounted into the
// container, never shipped.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: podns OUTSIDE COUNT PROGRAM ARGS...")
		return 2
	}
	outside, err1 := strconv.Atoi(args[0])
	count, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || outside < 0 || count < 1 {
		fmt.Fprintf(os.Stderr, "podns: OUTSIDE %q and COUNT %q must be numbers\n", args[0], args[1])
		return 2
	}
	cmd := exec.Command(args[2], args[3:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: outside, Size: count}}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A mount namespace owned by the new user namespace, as a pod's
		// container has: the worker mounts there (e.g. the tmpfs that
		// caps a work dir). The mounts it inherits from the container
		// stay locked together (the read-only root stays read-only).
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: m, GidMappings: m,
		// The runtime writes gid_map as a privileged process and leaves
		// setgroups allowed; the worker's sandboxes drop their groups.
		GidMappingsEnableSetgroups: true,
		// The ids the process had (the container's root) have no mapping
		// in the new namespace: become its uid 0, as the runtime's init
		// does.
		Credential: &syscall.Credential{Uid: 0, Gid: 0},
		Pdeathsig:  syscall.SIGKILL,
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "podns: start %s in a user namespace (0 %d %d): %v\n", args[2], outside, count, err)
		return 126
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "podns: %v\n", err)
		return 1
	}
}
