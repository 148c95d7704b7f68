package nsinit

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childMem is the memory a direct sandbox's clone child has for itself:
// the stack it runs on (above a guard page) and the area a pre-built
// sandbox's call arrives in. On linux/amd64 the child shares the
// launcher's address space until its execve (CLONE_VM, see clone
// in direct_clone_amd64.go), so everything it writes must be its own: this mapping,
// and its Program's slots and buffers; nothing of another sandbox's.
//
// Mappings are reused once Release has run, which it does only after
// the child's exit (programLife): a fresh one costs an mmap, an mprotect and a page
// fault for every page the child touches.
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
	if len(freeChildMem.list) < maxFreeChildMem {
		freeChildMem.list = append(freeChildMem.list, m)
		freeChildMem.Unlock()
		return
	}
	freeChildMem.Unlock()
	unix.Munmap(m.region)
}

// programLife keeps a Program's memory (its lists, buffers, slots and
// childMem) from being reused, or freed by the collector, while a child
// may still read it: with CLONE_VM the child runs on it, the launcher's
// own memory, until its execve or exit.
//
//   - Start runs once: a second Start, or one after Release, fails
//     before any clone.
//   - From the clone on, the program is pinned (reachable from pinned:
//     the collector frees none of it) and keeps its own pidfd of the
//     child (pidfd; running).
//   - Release recycles the memory only when no child can read it: none
//     was cloned, Start reaped it (its error path), or the pidfd is
//     readable, which the kernel makes it once the child has exited,
//     after the child dropped its hold on the memory (exit_mm before
//     exit_notify in do_exit). Otherwise it fails and keeps everything;
//     a Release after the exit recycles.
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
	p.ops, p.descs, p.keep, p.mem, p.call, p.listen = nil, nil, nil, nil, nil, nil
	return nil
}
