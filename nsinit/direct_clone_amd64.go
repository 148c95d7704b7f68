package nsinit

import (
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawClone is in direct_clone_amd64.s.
//
//go:noescape
func rawClone(nr, a1, a2 uintptr, p *Program, entry uintptr) (r1, errno uintptr)

// childEntryFn is childEntry as a func value: its first word is the
// code of childEntry itself (the register ABI), which rawClone's child
// calls.
var childEntryFn = childEntry

// CloneSharesMemory is whether the clone child shares the launcher's address
// space until its execve (CLONE_VM).
const CloneSharesMemory = true

// clone is L4's clone on linux/amd64: CLONE_VM, the child on its own
// stack (childMem; top is its initial stack pointer), so the clone costs
// no page-table copy and the launcher's later writes no copy-on-write
// fault (with pre-built sandboxes waiting, those were most of a resident
// launcher's CPU per call). What that asks is SECURITY.md's checklist
// ("The init's sequence"). Called between beforeFork and afterFork: no
// stack check.
//
//go:nosplit
//go:norace
func (p *Program) clone(flags uintptr, args *cloneArgs, top uintptr) (uintptr, syscall.Errno) {
	entry := **(**uintptr)(unsafe.Pointer(&childEntryFn))
	if args.flags&unix.CLONE_INTO_CGROUP != 0 {
		args.flags |= unix.CLONE_VM
		args.stack, args.stackSize = uint64(top-childStack), childStack
		r1, e := rawClone(unix.SYS_CLONE3, uintptr(unsafe.Pointer(args)), unsafe.Sizeof(*args), p, entry)
		return r1, syscall.Errno(e)
	}
	r1, e := rawClone(unix.SYS_CLONE, flags|unix.CLONE_VM|uintptr(unix.SIGCHLD), top, p, entry)
	return r1, syscall.Errno(e)
}

// childEntry is where rawClone's child starts, on its own stack.
//
//go:nosplit
//go:norace
func childEntry(p *Program) {
	p.child()
}
