package nsinit

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestProgramMemoryOutlivesItsChild: a started program's lists and child
// memory are not recycled, nor collectable, while its child may run on
// them: Release before the child's exit fails and keeps them (the
// program stays pinned), Release after it recycles; a program starts
// once, and never after Release. The program is made here, not compiled:
// its child reads one byte from a pipe the test holds (so it is alive,
// blocked, until the test writes) and exits; no namespace, no mount.
func TestProgramMemoryOutlivesItsChild(t *testing.T) {
	var hold, sync, report [2]int
	for _, fds := range []*[2]int{&hold, &sync, &report} {
		if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
	}
	p := &Program{}
	var err error
	if p.mem, err = getChildMem(); err != nil {
		t.Fatal(err)
	}
	b := &builder{p: p}
	p.report = b.slot(uintptr(report[1]))
	var buf [1]byte
	b.sys(opDesc{action: "read"}, unix.SYS_READ, 0, noSlot, uintptr(hold[0]), b.mem(&buf, unsafe.Pointer(&buf)), 1)
	b.sys(opDesc{action: "exit"}, unix.SYS_EXIT_GROUP, 0, noSlot, 0)
	if b.err != nil {
		t.Fatal(b.err)
	}
	mem, ops := p.mem, p.ops

	pid, pidfd, err := p.Start(0, -1, sync, func(int) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	defer unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0) // a failed check leaves no child behind
	if _, fd, err := p.Start(0, -1, sync, func(int) error { return nil }); err == nil {
		unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		unix.Close(fd)
		t.Fatal("a program started a second time")
	}

	// The child is blocked in its read: nothing may be recycled.
	if err := p.Release(); err == nil {
		t.Fatal("Release succeeded while the child may run on the program's memory")
	}
	reused := false // the free list, drained and filled again (no other test runs meanwhile)
	for n := len(freeChildMem); n > 0; n-- {
		m := <-freeChildMem
		reused = reused || m == mem
		freeChildMem <- m
	}
	_, isPinned := pinned.Load(p)
	if reused || p.mem != mem || len(p.ops) != len(ops) || !isPinned {
		t.Fatalf("after a refused Release: memory recycled %v, kept %v, lists kept %v, pinned %v", reused, p.mem == mem, len(p.ops) == len(ops), isPinned)
	}

	// Let it go on; it exits; reap it.
	if _, err := unix.Write(hold[1], []byte{1}); err != nil {
		t.Fatal(err)
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		break
	}
	if !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("the child ended with %#x, want exit 0", ws)
	}
	if err := p.Release(); err != nil {
		t.Fatalf("Release after the child's exit: %v", err)
	}
	_, isPinned = pinned.Load(p)
	if p.mem != nil || p.ops != nil || isPinned {
		t.Fatalf("after Release: memory kept %v, lists kept %v, pinned %v", p.mem != nil, p.ops != nil, isPinned)
	}
	if err := p.Release(); err != nil {
		t.Errorf("a second Release: %v", err)
	}
	if _, _, err := p.Start(0, -1, sync, func(int) error { return nil }); err == nil {
		t.Error("a released program started")
	}
}
