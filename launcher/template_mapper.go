package launcher

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The id-map opener of a per-tool template. A call's user namespace is
// created by the template's clone, so its parent is the template's user
// namespace, and the kernel lets /proc/PID/uid_map and gid_map be
// written only through a file opened by a process of that parent
// namespace (or of the call's own) holding CAP_SETUID/CAP_SETGID there
// (kernel/user_namespace.c map_write, new_idmap_permitted: the opener's
// credentials are checked, and the writer's). The supervisor is in the
// host's user namespace, two levels up, and as a multi-threaded Go
// program it may never setns into another user namespace. So each
// template has a mapper: a raw clone of the launcher (no exec, no Go
// runtime: only the precomputed raw syscalls of mapperChild, as Go's own
// forkAndExecInChild1 runs) that joins the template's user namespace
// (full capabilities there, none on the host) and, for each path the
// supervisor sends on its socket, opens that file O_WRONLY and sends the
// descriptor back. The supervisor writes the maps through them. The
// mapper takes paths from the supervisor only (its socketpair); the
// template cannot reach it (another pid namespace, ptrace denied).
//
// It keeps a copy-on-write image of the launcher's memory until it exits
// (the template's Close); an exec'd helper would not (not done yet).

// atFDCWD is AT_FDCWD (-100) as a syscall argument.
const atFDCWD = ^uintptr(99)

// mapperMem is everything mapperChild touches, allocated before the
// clone so that the child allocates nothing.
type mapperMem struct {
	path          [256]byte
	iovIn         unix.Iovec
	msgIn         unix.Msghdr
	reply         [2]byte // 'k' (with the descriptor) or 'e'
	iovOK, iovErr unix.Iovec
	cmsg          [24]byte // CmsgSpace(4): one SCM_RIGHTS descriptor
	msgOK, msgErr unix.Msghdr
}

type idMapper struct {
	mu   sync.Mutex // one request at a time
	pid  int
	sock *os.File
	mem  *mapperMem
}

// startMapper forks the mapper of the user namespace at nsPath.
func startMapper(nsPath string) (*idMapper, error) {
	nsfd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("template mapper: open %s: %w", nsPath, err)
	}
	defer unix.Close(nsfd)
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("template mapper: socketpair: %w", err)
	}
	m := &mapperMem{}
	m.reply = [2]byte{'k', 'e'}
	m.iovIn.Base, m.iovIn.Len = &m.path[0], uint64(len(m.path)-1)
	m.msgIn.Iov, m.msgIn.Iovlen = &m.iovIn, 1
	m.iovOK.Base, m.iovOK.Len = &m.reply[0], 1
	m.iovErr.Base, m.iovErr.Len = &m.reply[1], 1
	copy(m.cmsg[:], unix.UnixRights(0))
	m.msgOK.Iov, m.msgOK.Iovlen = &m.iovOK, 1
	m.msgOK.Control, m.msgOK.Controllen = &m.cmsg[0], uint64(len(m.cmsg))
	m.msgErr.Iov, m.msgErr.Iovlen = &m.iovErr, 1

	// The clone runs on one locked thread with every signal blocked: the
	// child inherits the mask, so no Go signal handler ever runs in it.
	runtime.LockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	_ = unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old)
	pid, errno := forkMapper(m, nsfd, sp[1], os.Getpid())
	_ = unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	runtime.UnlockOSThread()
	unix.Close(sp[1])
	if errno != 0 {
		unix.Close(sp[0])
		return nil, fmt.Errorf("template mapper: clone: %w", errno)
	}
	if err := unix.SetNonblock(sp[0], true); err != nil {
		unix.Close(sp[0])
		return nil, err
	}
	return &idMapper{pid: int(pid), sock: os.NewFile(uintptr(sp[0]), "template mapper"), mem: m}, nil
}

// forkMapper clones; the child never returns from mapperChild. nosplit
// and norace: the child runs on this goroutine's stack without a Go
// runtime (no stack growth, no race-detector calls).
//
//go:nosplit
//go:norace
func forkMapper(m *mapperMem, nsfd, sock, ppid int) (uintptr, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r != 0 {
		return r, e
	}
	mapperChild(m, nsfd, sock, ppid)
	return 0, 0
}

// mapperChild is the mapper, in order:
//
//  1. close every descriptor but the namespace's and the socket
//  2. setns into the template's user namespace (single-threaded: it is
//     a fresh clone); close it
//  3. die with the launcher (PR_SET_PDEATHSIG after the credential
//     change of 2, which clears it; then check the parent is the same)
//  4. for each message (a NUL-free path): open it O_WRONLY|O_NOFOLLOW
//     and send the descriptor back ('k'), or 'e'; EOF ends it
//
//go:nosplit
//go:norace
func mapperChild(m *mapperMem, nsfd, sock, ppid int) {
	// 1.
	lo, hi := nsfd, sock
	if lo > hi {
		lo, hi = hi, lo
	}
	syscall.RawSyscall(unix.SYS_CLOSE_RANGE, 0, uintptr(lo-1), 0)
	if hi-lo > 1 {
		syscall.RawSyscall(unix.SYS_CLOSE_RANGE, uintptr(lo+1), uintptr(hi-1), 0)
	}
	syscall.RawSyscall(unix.SYS_CLOSE_RANGE, uintptr(hi+1), uintptr(^uint32(0)), 0)
	// 2.
	if _, _, e := syscall.RawSyscall(unix.SYS_SETNS, uintptr(nsfd), unix.CLONE_NEWUSER, 0); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 2, 0, 0)
	}
	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(nsfd), 0, 0)
	// 3.
	syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0, 0)
	if p, _, _ := syscall.RawSyscall(syscall.SYS_GETPPID, 0, 0, 0); int(p) != ppid {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 3, 0, 0)
	}
	// 4.
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_RECVMSG, uintptr(sock), uintptr(unsafe.Pointer(&m.msgIn)), 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 || n == 0 || n >= uintptr(len(m.path)) {
			syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 0, 0, 0)
		}
		m.path[n] = 0
		fd, _, e := syscall.RawSyscall6(syscall.SYS_OPENAT, atFDCWD, uintptr(unsafe.Pointer(&m.path[0])),
			uintptr(unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW), 0, 0, 0)
		if e != 0 {
			syscall.RawSyscall(syscall.SYS_SENDMSG, uintptr(sock), uintptr(unsafe.Pointer(&m.msgErr)), 0)
			continue
		}
		*(*int32)(unsafe.Pointer(&m.cmsg[16])) = int32(fd)
		syscall.RawSyscall(syscall.SYS_SENDMSG, uintptr(sock), uintptr(unsafe.Pointer(&m.msgOK)), 0)
		syscall.RawSyscall(syscall.SYS_CLOSE, fd, 0, 0)
	}
}

// open asks the mapper for path opened for writing.
func (mp *idMapper) open(path string) (*os.File, error) {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	if err := sendJSONRaw(mp.sock, []byte(path)); err != nil {
		return nil, fmt.Errorf("template mapper: send %s: %w", path, err)
	}
	buf := make([]byte, 8)
	oob := make([]byte, unix.CmsgSpace(4))
	raw, err := mp.sock.SyscallConn()
	if err != nil {
		return nil, err
	}
	var n, oobn int
	var rerr error
	if err := raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, unix.MSG_CMSG_CLOEXEC)
		return rerr != unix.EAGAIN
	}); err != nil {
		return nil, err
	}
	if rerr != nil || n != 1 {
		return nil, fmt.Errorf("template mapper: %s: no answer (%v)", path, rerr)
	}
	if buf[0] != 'k' || oobn == 0 {
		return nil, fmt.Errorf("template mapper: open %s: refused", path)
	}
	cms, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(cms) != 1 {
		return nil, errors.New("template mapper: bad answer")
	}
	fds, err := unix.ParseUnixRights(&cms[0])
	if err != nil || len(fds) != 1 {
		closeFDs(fds)
		return nil, errors.New("template mapper: bad answer")
	}
	return os.NewFile(uintptr(fds[0]), path), nil
}

// close ends the mapper (EOF) and reaps it.
func (mp *idMapper) close() {
	mp.sock.Close()
	var ws unix.WaitStatus
	_, _ = unix.Wait4(mp.pid, &ws, 0, nil)
	runtime.KeepAlive(mp.mem)
}

// sendJSONRaw sends b as one message.
func sendJSONRaw(f *os.File, b []byte) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, nil, nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}
