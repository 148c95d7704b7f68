package nsinit

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childMem is the memory a clone child has for itself: its stack, above a
// guard page, and a pre-built sandbox's call area (SECURITY.md, "The
// init's sequence", items 1 and 2: with CLONE_VM what it writes must be
// its own). A mapping is reused once Release has run (programLife): a
// fresh one costs an mmap, an mprotect and a fault per page touched.
type childMem struct {
	region []byte
	call   *callArea
}

const (
	childGuard = 4 << 10  // PROT_NONE below the stack: an overflow faults, never writes the launcher's memory
	childStack = 60 << 10 // the child's frames are nosplit: a few KiB at most
	childPage  = 4 << 10
)

// childMemSize is the whole mapping: guard page, stack, call area.
var childMemSize = (childGuard + childStack + int(unsafe.Sizeof(callArea{})) + childPage - 1) &^ (childPage - 1)

// freeChildMem holds the mappings of released programs; at most
// maxFreeChildMem (the rest are unmapped).
var freeChildMem struct {
	sync.Mutex
	list []*childMem
}

const maxFreeChildMem = 32

func getChildMem() (*childMem, error) {
	freeChildMem.Lock()
	if n := len(freeChildMem.list); n > 0 {
		m := freeChildMem.list[n-1]
		freeChildMem.list = freeChildMem.list[:n-1]
		freeChildMem.Unlock()
		return m, nil
	}
	freeChildMem.Unlock()
	region, err := unix.Mmap(-1, 0, childMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("mmap the child's stack: %w", err)
	}
	if err := unix.Mprotect(region[:childGuard], unix.PROT_NONE); err != nil {
		unix.Munmap(region)
		return nil, fmt.Errorf("mprotect the child's guard page: %w", err)
	}
	m := &childMem{region: region, call: (*callArea)(unsafe.Pointer(&region[childGuard+childStack]))}
	m.call.init()
	return m, nil
}

// stackTop is the child's initial stack pointer: the stack's end, 16-byte
// aligned (it is: the stack ends at a page offset).
func (m *childMem) stackTop() uintptr {
	return uintptr(unsafe.Pointer(&m.region[childGuard+childStack-1])) + 1
}

func putChildMem(m *childMem) {
	freeChildMem.Lock()
	defer freeChildMem.Unlock()
	if len(freeChildMem.list) < maxFreeChildMem {
		freeChildMem.list = append(freeChildMem.list, m)
		return
	}
	unix.Munmap(m.region) // under the lock: rare (more than maxFreeChildMem programs released at once)
}

// programLife keeps a Program's memory (lists, buffers, slots, childMem)
// from being reused or collected while a child may still read it, by
// construction: the checklist is SECURITY.md, "The init's sequence",
// item 3 (Start runs once; from the clone the program is pinned and keeps
// its own pidfd; Release recycles only when no child can read the memory:
// none cloned, reaped by Start, or the pidfd readable, which the kernel
// makes it after the child dropped the memory: exit_mm before exit_notify).
type programLife struct {
	mu       sync.Mutex // held by Start and Release
	started  bool
	running  bool // a child was cloned and not seen exited: pid, pidfd are its
	pid      int
	pidfd    int
	released bool
}

// pinned holds the programs whose child may run (as keys).
var pinned sync.Map

// childExited is whether the pidfd is readable: its process has exited
// (or was reaped). An error says no.
func childExited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n == 1 && fds[0].Revents&unix.POLLIN != 0
	}
}

// Release gives the program's lists and its child's memory back for the
// next program once no child can read them (programLife): the launcher
// calls it after it has reaped the child and read its failure, if any.
// Before the child's exit it fails and recycles nothing. p must not be
// used after a Release that succeeded; another Release does nothing.
func (p *Program) Release() error {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	if p.life.released {
		return nil
	}
	if p.life.running {
		if !childExited(p.life.pidfd) {
			return fmt.Errorf("release the program of child %d before it exited: it may still run on the program's memory", p.life.pid)
		}
		unix.Close(p.life.pidfd)
		p.life.running = false
	}
	p.life.released = true
	pinned.Delete(p)
	if p.ops != nil {
		clear(p.ops[:cap(p.ops)]) // no pointer kept alive through a pooled list
		clear(p.descs[:cap(p.descs)])
		opListPool.Put(&opLists{ops: p.ops[:0], descs: p.descs[:0]})
	}
	if p.mem != nil {
		putChildMem(p.mem)
	}
	p.ops, p.descs, p.keep, p.mem, p.listen = nil, nil, nil, nil, nil
	return nil
}
