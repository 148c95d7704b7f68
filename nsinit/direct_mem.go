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
// Mappings are reused once Release has run (the child has executed the
// tool or exited): a fresh one costs an mmap, an mprotect and a page
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
