package seccomp

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// InstallError is the error of Install: which step failed and why.
//
//	seccomp: install (step 2, check no_new_privs): no_new_privs is not set on this thread (hint: ...)
type InstallError struct {
	Step   int
	Action string
	Detail string
	Hint   string
	Err    error
}

func (e *InstallError) Error() string {
	s := fmt.Sprintf("seccomp: install (step %d, %s", e.Step, e.Action)
	if e.Detail != "" {
		s += ", " + e.Detail
	}
	s += ")"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	if e.Hint != "" {
		s += " (hint: " + e.Hint + ")"
	}
	return s
}

func (e *InstallError) Unwrap() error { return e.Err }

// ErrNoNewPrivs is the cause when Install is called before
// prctl(PR_SET_NO_NEW_PRIVS, 1).
var ErrNoNewPrivs = errors.New("no_new_privs is not set on this thread")

// Install loads filter into the calling thread with
// seccomp(SECCOMP_SET_MODE_FILTER, 0, &prog). It does not use libseccomp
// and allocates nothing the filter depends on after the call.
//
// The filter applies to the calling OS thread and to whatever it clones
// afterwards, not to the other threads of a Go program, so the caller
// must hold runtime.LockOSThread and exec (syscall.ForkExec) from the same
// thread. Install is the last setup step: after it, only what the policy
// allows works, and the sandbox's init must have nothing left to do but
// start the tool.
//
//  1. check the program size (1..BPF_MAXINSNS)
//  2. check that no_new_privs is set: without it the kernel accepts a
//     filter only from CAP_SYS_ADMIN, and a filter without no_new_privs
//     could be dropped by exec'ing a setuid binary's fresh credentials
//  3. seccomp(SECCOMP_SET_MODE_FILTER, 0, &sock_fprog)
func Install(filter []unix.SockFilter) error {
	// 1.
	if len(filter) == 0 || len(filter) > maxInsns {
		return &InstallError{Step: 1, Action: "check program size", Detail: fmt.Sprintf("%d instructions", len(filter)),
			Err: fmt.Errorf("want 1..%d instructions", maxInsns)}
	}
	// 2.
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return &InstallError{Step: 2, Action: "check no_new_privs", Detail: "prctl(PR_GET_NO_NEW_PRIVS)", Err: err}
	}
	if nnp != 1 {
		return &InstallError{Step: 2, Action: "check no_new_privs", Err: ErrNoNewPrivs,
			Hint: "call prctl(PR_SET_NO_NEW_PRIVS, 1) on this locked thread first"}
	}
	// 3.
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	_, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		hint := ""
		switch errno {
		case unix.EINVAL:
			hint = "kernel built without CONFIG_SECCOMP_FILTER, or the program is invalid (run it through Simulate)"
		case unix.EACCES:
			hint = "no_new_privs got lost, or the caller lacks CAP_SYS_ADMIN"
		case unix.ENOSYS:
			hint = "seccomp(2) is not available (kernel older than 3.17 or blocked by an outer filter)"
		}
		return &InstallError{Step: 3, Action: "seccomp(SECCOMP_SET_MODE_FILTER)", Detail: fmt.Sprintf("%d instructions", len(filter)), Hint: hint, Err: errno}
	}
	return nil
}
