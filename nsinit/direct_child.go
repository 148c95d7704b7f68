package nsinit

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The runtime's fork hooks, as package syscall uses them around its own
// fork-and-exec child: BeforeFork blocks every signal and keeps the stack
// from growing, AfterFork undoes it in the parent. The child does not
// call AfterForkInChild, which writes the runtime's state (shared with
// CLONE_VM): resetSignals does its part with raw calls.
//
//go:linkname beforeFork syscall.runtime_BeforeFork
func beforeFork()

//go:linkname afterFork syscall.runtime_AfterFork
func afterFork()

// cloneArgs is the kernel's struct clone_args (clone3).
type cloneArgs struct {
	flags, pidfd, childTID, parentTID, exitSignal, stack, stackSize, tls, setTID, setTIDSize, cgroup uint64
}

// Start is launcher step L4 for a Program: it clones the child with
// cloneFlags (into the cgroup v2 directory cgroupFD with
// CLONE_INTO_CGROUP when it is >= 0), which runs the program and never
// returns; then, in the launcher, it opens the child's pidfd
// (non-blocking, close-on-exec: the launcher watches and signals the
// child through it), maps writes the child's id maps and one byte on
// sync[1] (DirectFiles.Sync's write end) lets it go on. On error the
// child, if any, is killed and reaped. The child runs only child (see
// there); a program starts once (programLife).
func (p *Program) Start(cloneFlags uintptr, cgroupFD int, sync [2]int, maps func(pid int) error) (pid, pidfd int, err error) {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	switch {
	case p.life.released:
		return 0, -1, errors.New("start a released program")
	case p.life.started:
		return 0, -1, errors.New("start a program a second time")
	}
	p.life.started = true
	pinned.Store(p, nil)
	args := &cloneArgs{flags: uint64(cloneFlags), exitSignal: uint64(unix.SIGCHLD)}
	if cgroupFD >= 0 {
		args.flags |= unix.CLONE_INTO_CGROUP
		args.cgroup = uint64(cgroupFD)
	}
	// The mask the tool starts with: the launcher's threads' own (each
	// runs with the one the process started with), as Go's child
	// restores it.
	if _, _, e := syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_BLOCK, 0, uintptr(unsafe.Pointer(&p.sigmask)), 8, 0, 0); e != 0 {
		return 0, -1, fmt.Errorf("rt_sigprocmask: %w", e)
	}
	r := &cloneReq{p: p, flags: cloneFlags, args: args, top: p.mem.stackTop(), done: make(chan struct{})}
	cloner() <- r
	<-r.done
	if r.e != 0 {
		return 0, -1, fmt.Errorf("clone: %w", r.e)
	}
	// Its pid cannot be reused before this process reaps it.
	pid = int(r.r1)
	p.life.running, p.life.pid, p.life.pidfd = true, pid, -1
	if pidfd, err = unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err != nil {
		pidfd, err = -1, fmt.Errorf("pidfd_open: %w", err)
	} else if p.life.pidfd, err = unix.FcntlInt(uintptr(pidfd), unix.F_DUPFD_CLOEXEC, 0); err != nil {
		p.life.pidfd, err = -1, fmt.Errorf("the program's own pidfd: %w", err)
	} else if err = maps(pid); err == nil {
		_, err = unix.Write(sync[1], []byte{1})
	}
	if err != nil {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		var werr error = unix.EINTR
		for errors.Is(werr, unix.EINTR) {
			_, werr = unix.Wait4(pid, &ws, 0, nil)
		}
		if werr == nil && p.life.pidfd >= 0 { // reaped: Release may recycle
			unix.Close(p.life.pidfd)
		}
		p.life.running = werr != nil
		return 0, -1, err
	}
	return pid, pidfd, nil
}

// cloneReq is one clone for the cloner: its program, flags, clone_args
// and the child's stack top (everything computed before beforeFork: from
// there to afterFork no function with a stack check may run), and the
// result.
type cloneReq struct {
	p     *Program
	flags uintptr
	args  *cloneArgs
	top   uintptr
	r1    uintptr
	e     syscall.Errno
	done  chan struct{}
}

// cloner is the goroutine that makes every clone, locked to its OS thread
// and never exiting, so the thread lives as long as the launcher: a
// child's parent-death signal (armed in L4's child half) follows the
// thread that cloned it (SECURITY.md, "The init's sequence", item 7). The
// clone is under syscall.ForkLock, as Go's own fork: no descriptor is
// half-made while it happens.
var cloner = sync.OnceValue(func() chan<- *cloneReq {
	c := make(chan *cloneReq)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		for r := range c {
			syscall.ForkLock.Lock()
			beforeFork()
			r.r1, r.e = r.p.clone(r.flags, r.args, r.top)
			afterFork()
			syscall.ForkLock.Unlock()
			close(r.done)
		}
	}()
	return c
})

// emptyPath is "" as a C string.
var emptyPath = [1]byte{}

// child runs the program in the clone child and ends in the tool's
// execve, or in exit_group after writing the failed operation's record
// on the report socket. Only raw system calls on prepared memory: no
// allocation, no write barrier (no pointer is stored), no stack growth:
// every function it calls is //go:nosplit (beforeFork made any stack
// check fail), so no closure and no helper that is not.
//
//go:nosplit
//go:norace
func (p *Program) child() {
	p.resetSignals()
	for i := 0; i < len(p.ops); i++ {
		o := &p.ops[i]
		if o.cond != noSlot && p.slots[o.cond&(maxSlots-1)] != 0 {
			continue
		}
		var r1, errno uintptr
		a := o.a
		for j := 0; j < 6; j++ {
			if o.slotArgs&(1<<j) != 0 {
				a[j] = p.slots[a[j]&(maxSlots-1)]
			}
		}
		switch o.kind {
		case opSys:
			r, _, e := syscall.RawSyscall6(o.nr, a[0], a[1], a[2], a[3], a[4], a[5])
			r1, errno = r, uintptr(e)
			hit := uintptr(0) // okErr occurred: not a failure
			if errno != 0 && errno == uintptr(o.okErr) {
				errno, hit = 0, 1
			}
			if o.hit != noSlot {
				p.slots[o.hit&(maxSlots-1)] = hit
			}
			if errno == 0 && o.check && r1 != o.want {
				p.fail(i, 0, o.exit)
			}
		case opFdPath:
			v := p.slots[o.a[0]&(maxSlots-1)]
			digits := uintptr(1)
			for t := v; t >= 10; t /= 10 {
				digits++
			}
			*(*byte)(unsafe.Add(o.mem, digits)) = 0
			for k := digits; k > 0; k-- {
				*(*byte)(unsafe.Add(o.mem, k-1)) = byte('0' + v%10)
				v /= 10
			}
		case opStore32:
			*(*int32)(o.mem) = int32(p.slots[o.a[0]&(maxSlots-1)])
		case opStorePtr:
			*(*uintptr)(o.mem) = p.slots[o.a[0]&(maxSlots-1)]
		case opOr16:
			*(*uint16)(o.mem) |= uint16(o.a[1])
		case opCheckLink:
			_, _, e := syscall.RawSyscall6(unix.SYS_NEWFSTATAT, p.slots[o.a[0]&(maxSlots-1)], uintptr(unsafe.Pointer(&emptyPath[0])),
				uintptr(unsafe.Pointer(&p.stat)), unix.AT_EMPTY_PATH, 0, 0)
			errno = uintptr(e)
			if errno == 0 && p.stat.Mode&unix.S_IFMT == unix.S_IFLNK {
				p.fail(i, 0, o.exit)
			}
		case opCheckCwd:
			n := o.a[1] // the planned path's length with its NUL
			r, _, e := syscall.RawSyscall(unix.SYS_GETCWD, uintptr(unsafe.Add(o.mem, n)), n, 0)
			errno = uintptr(e)
			if errno == uintptr(unix.ERANGE) {
				p.fail(i, 0, o.exit) // longer than the planned path
			}
			if errno == 0 {
				if r != n {
					p.fail(i, 0, o.exit)
				}
				for k := uintptr(0); k < n; k++ {
					if *(*byte)(unsafe.Add(o.mem, n+k)) != *(*byte)(unsafe.Add(o.mem, k)) {
						p.fail(i, 0, o.exit)
					}
				}
			}
		case opCheckPoll:
			p.pfd = unix.PollFd{Fd: int32(a[0]), Events: int16(a[1])}
			// ppoll with a zero timeout: poll(2) is not on every
			// architecture (arm64 has only ppoll).
			p.zero = unix.Timespec{}
			r, _, e := syscall.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&p.pfd)), 1, uintptr(unsafe.Pointer(&p.zero)), 0, 0, 0)
			errno = uintptr(e)
			if errno == 0 && r > 0 && p.pfd.Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLIN) != 0 {
				p.fail(i, 0, o.exit)
			}
		case opResolve:
			errno = p.resolve(o, a[1], &r1)
		case opCloseOthers:
			p.closeOthers(o, a[0], a[1])
		case opFork:
			// The child goes on, on its own copy of the memory; the parent closes every
			// descriptor (the report socket's EOF is the child's execve), waits and exits.
			r, _, e := syscall.RawSyscall6(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
			if errno = uintptr(e); errno == 0 && r != 0 {
				syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 0, ^uintptr(0)>>32, 0)
				_, _, e = syscall.RawSyscall6(unix.SYS_WAIT4, r, uintptr(unsafe.Pointer(&p.status)), 0, 0, 0, 0) // no handler: no EINTR
				code := uintptr(p.status) >> 8 & 0xff
				if sig := uintptr(p.status) & 0x7f; sig != 0 || e != 0 {
					code = 128 + sig // killed by sig: as a shell reports it
				}
				for {
					syscall.RawSyscall(unix.SYS_EXIT_GROUP, code, 0, 0)
				}
			}
		case opSysWarn:
			if _, _, e := syscall.RawSyscall6(o.nr, a[0], a[1], a[2], a[3], a[4], a[5]); e != 0 {
				p.record(&warningMagic, i, uintptr(e)) // and the program goes on
			}
		case opAwaitCall:
			var ok bool
			errno, ok = awaitCallRaw((*callArea)(o.mem), a[0], &r1)
			if errno == 0 && !ok {
				p.fail(i, 0, o.exit)
			}
		}
		if errno != 0 {
			p.fail(i, errno, o.exit)
		}
		if o.out != noSlot {
			p.slots[o.out&(maxSlots-1)] = r1
		}
	}
	// The last operation is the execve: reaching here means a program
	// without one.
	p.fail(len(p.ops)-1, uintptr(unix.ENOEXEC), exitSetup)
}

// resetSignals is the child's first step (SECURITY.md, "The init's
// sequence", item 4): every caught signal back to SIG_DFL (an ignored one
// stays ignored, as execve keeps it), then the launcher's mask in place of
// beforeFork's all-blocked one, so no handler of the launcher's ever runs
// in the child, and the tool starts as Go's fork-and-exec child would.
//
//go:nosplit
//go:norace
func (p *Program) resetSignals() {
	for sig := uintptr(1); sig <= 64; sig++ {
		if sig == uintptr(unix.SIGKILL) || sig == uintptr(unix.SIGSTOP) {
			continue
		}
		p.sigact[0] = 0 // SIG_DFL
		if _, _, e := syscall.RawSyscall6(unix.SYS_RT_SIGACTION, sig, uintptr(unsafe.Pointer(&p.sigact)), uintptr(unsafe.Pointer(&p.sigold)), 8, 0, 0); e != 0 {
			continue
		}
		if p.sigold[0] == 1 { // it was SIG_IGN: put it back
			p.sigact[0] = 1
			syscall.RawSyscall6(unix.SYS_RT_SIGACTION, sig, uintptr(unsafe.Pointer(&p.sigact)), 0, 8, 0, 0)
		}
	}
	syscall.RawSyscall6(unix.SYS_RT_SIGPROCMASK, unix.SIG_SETMASK, uintptr(unsafe.Pointer(&p.sigmask)), 0, 8, 0, 0)
}

// resolve is lookPath on prepared C strings: the first candidate that
// stats as a non-directory and passes access(X_OK); else the first error
// that is not ENOENT, or ENOENT.
//
//go:nosplit
//go:norace
func (p *Program) resolve(o *op, n uintptr, out *uintptr) uintptr {
	first := uintptr(unix.ENOENT)
	for k := uintptr(0); k < n; k++ {
		c := *(*uintptr)(unsafe.Add(o.mem, k*unsafe.Sizeof(uintptr(0))))
		_, _, e := syscall.RawSyscall6(unix.SYS_NEWFSTATAT, atFDCWD, c, uintptr(unsafe.Pointer(&p.stat)), 0, 0, 0)
		err := uintptr(e)
		if err == 0 && p.stat.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = uintptr(unix.EACCES)
		}
		if err == 0 {
			_, _, e = syscall.RawSyscall(unix.SYS_FACCESSAT, atFDCWD, c, unix.X_OK)
			err = uintptr(e)
		}
		if err == 0 {
			*out = c
			return 0
		}
		if err != uintptr(unix.ENOENT) && first == uintptr(unix.ENOENT) {
			first = err
		}
	}
	return first
}

// closeOthers closes every descriptor from first on that is not in one
// of the n slots listed at o.mem: the launcher's, copied by the fork.
//
//go:nosplit
//go:norace
func (p *Program) closeOthers(o *op, first, n uintptr) {
	top := uintptr(0)
	for k := uintptr(0); k < n; k++ {
		if v := p.slots[*(*slotID)(unsafe.Add(o.mem, k*unsafe.Sizeof(slotID(0))))&(maxSlots-1)]; v > top {
			top = v
		}
	}
	for fd := first; fd <= top; fd++ {
		ours := false
		for k := uintptr(0); k < n; k++ {
			if p.slots[*(*slotID)(unsafe.Add(o.mem, k*unsafe.Sizeof(slotID(0))))&(maxSlots-1)] == fd {
				ours = true
				break
			}
		}
		if !ours {
			syscall.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
		}
	}
	syscall.RawSyscall(unix.SYS_CLOSE_RANGE, top+1, ^uintptr(0)>>32, 0)
}

// awaitCallRaw is sub-step 10a in a direct sandbox: one message on the
// report socket (fd) with exactly CallFDs descriptors, dup3'd onto 0-2,
// and EncodeCall's strings laid out as execve's arrays in c. r1 is the
// number of paths to try. ok is false for a message that is not a call
// (or EOF: the launcher went away), errno for a failed system call.
//
//go:nosplit
//go:norace
func awaitCallRaw(c *callArea, fd uintptr, r1 *uintptr) (errno uintptr, ok bool) {
	var n uintptr
	for e := unix.EINTR; e != 0; {
		c.msg.Controllen, c.msg.Flags = uint64(len(c.cmsg)), 0
		if n, _, e = syscall.RawSyscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&c.msg)), unix.MSG_CMSG_CLOEXEC); e != 0 && e != unix.EINTR {
			return uintptr(e), false
		}
	}
	hdr := (*unix.Cmsghdr)(unsafe.Pointer(&c.cmsg[0]))
	const fdsLen = 4 * CallFDs
	if c.msg.Flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n < callHeader ||
		c.msg.Controllen < uint64(unix.SizeofCmsghdr+fdsLen) || hdr.Level != unix.SOL_SOCKET || hdr.Type != unix.SCM_RIGHTS ||
		hdr.Len != uint64(unix.SizeofCmsghdr+fdsLen) {
		return 0, false
	}
	for k := 0; k < CallFDs; k++ {
		got := uintptr(*(*int32)(unsafe.Pointer(&c.cmsg[unix.SizeofCmsghdr+4*k])))
		if _, _, e := syscall.RawSyscall(unix.SYS_DUP3, got, uintptr(k), 0); e != 0 {
			return uintptr(e), false
		}
		syscall.RawSyscall(unix.SYS_CLOSE, got, 0, 0)
	}
	// The counts, little-endian (no helper: nothing here may call a
	// function that checks its stack, see child).
	argc := uintptr(c.buf[0]) | uintptr(c.buf[1])<<8 | uintptr(c.buf[2])<<16 | uintptr(c.buf[3])<<24
	envc := uintptr(c.buf[4]) | uintptr(c.buf[5])<<8 | uintptr(c.buf[6])<<16 | uintptr(c.buf[7])<<24
	pathc := uintptr(c.buf[8]) | uintptr(c.buf[9])<<8 | uintptr(c.buf[10])<<16 | uintptr(c.buf[11])<<24
	if argc < 1 || argc > MaxCallArgs || envc > MaxCallEnv || pathc < 1 || pathc > MaxCallPaths {
		return 0, false
	}
	// The strings, one loop per array: each index is below a count
	// checked above, so below its array's length, which the compiler
	// sees (no bounds check, whose panic calls into the runtime;
	// TestCloneChildCallsNothingElse).
	pos := uintptr(callHeader)
	for k := uintptr(0); k < argc; k++ {
		if c.argv[k], pos = callString(c, pos, n); pos == 0 {
			return 0, false
		}
	}
	for k := uintptr(0); k < envc; k++ {
		if c.env[k], pos = callString(c, pos, n); pos == 0 {
			return 0, false
		}
	}
	for k := uintptr(0); k < pathc; k++ {
		if c.paths[k], pos = callString(c, pos, n); pos == 0 {
			return 0, false
		}
	}
	if pos != n {
		return 0, false
	}
	c.argv[argc] = 0
	c.env[envc] = 0
	*r1 = pathc
	return 0, true
}

// callString is the address of the NUL-terminated string at pos in the
// first n bytes of c's message, and the position after it; next is 0 for
// a string without its NUL.
//
//go:nosplit
//go:norace
func callString(c *callArea, pos, n uintptr) (s, next uintptr) {
	if n > uintptr(len(c.buf)) {
		return 0, 0
	}
	for start := pos; pos < n; pos++ {
		if c.buf[pos] == 0 {
			return uintptr(unsafe.Pointer(&c.buf[0])) + start, pos + 1
		}
	}
	return 0, 0
}

// record writes a failure's or a warning's record (magic) of operation
// i, which failed with errno, on the report socket.
//
//go:nosplit
//go:norace
func (p *Program) record(magic *[8]byte, i int, errno uintptr) {
	for k := 0; k < 8; k++ {
		p.rec[k] = magic[k]
	}
	for k := 0; k < 4; k++ {
		p.rec[8+k] = byte(uint32(i) >> (8 * k))
		p.rec[12+k] = byte(uint32(errno) >> (8 * k))
	}
	syscall.RawSyscall(unix.SYS_WRITE, p.slots[p.report&(maxSlots-1)], uintptr(unsafe.Pointer(&p.rec[0])), failureLen)
}

// fail writes the failure record of operation i on the report socket and
// exits with the operation's exit code.
//
//go:nosplit
//go:norace
func (p *Program) fail(i int, errno uintptr, class uint8) {
	p.record(&failureMagic, i, errno)
	code := uintptr(ExitSetupFailed)
	switch class {
	case exitExec:
		switch errno {
		case uintptr(unix.ENOENT):
			code = ExitNotFound
		case uintptr(unix.EACCES), uintptr(unix.ENOEXEC):
			code = ExitCannotExec
		}
	case exitResolve:
		code = ExitNotFound
		if errno == uintptr(unix.EACCES) {
			code = ExitCannotExec
		}
	}
	for {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, code, 0, 0)
	}
}
