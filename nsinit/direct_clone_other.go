//go:build linux && !amd64

package nsinit

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CloneSharesMemory is whether the clone child shares the launcher's address
// space until its execve: not here (a fork, as Go's own fork-and-exec
// child without CLONE_VM).
const CloneSharesMemory = false

// clone is L4's clone where no CLONE_VM entry is written: a fork, the
// child on the calling goroutine's stack (its own copy; the childMem
// stack is not used). Called between
// beforeFork and afterFork: no stack check.
//
//go:nosplit
//go:norace
func (p *Program) clone(flags uintptr, args *cloneArgs, _ uintptr) (uintptr, syscall.Errno) {
	var r1 uintptr
	var e syscall.Errno
	if args.flags&unix.CLONE_INTO_CGROUP != 0 {
		r1, _, e = syscall.RawSyscall(unix.SYS_CLONE3, uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args), 0)
	} else {
		r1, _, e = syscall.RawSyscall6(unix.SYS_CLONE, flags|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
	}
	if e == 0 && r1 == 0 {
		p.child() // never returns
	}
	return r1, e
}
