package launcher

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/securetoolruntime/str/launcher/initbin"
	"github.com/securetoolruntime/str/nsinit"
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
// template has a mapper: a raw clone of the launcher (no Go runtime in
// it: only the precomputed raw syscalls of mapperChild, as Go's own
// forkAndExecInChild1 runs) that joins the template's user namespace,
// becomes its root (the template's first leased host id: not host root),
// and executes the init binary as nsinit.MapperArgv0 (nsinit.MapperMain):
// with every capability of the template's user namespace and none on
// the host, it opens the uid_map/gid_map paths the supervisor sends on
// its socketpair (nothing else) and sends the descriptors back. The
// supervisor writes the maps through them. The template cannot reach it
// (another pid namespace, ptrace denied). Executed, it holds none of the
// launcher's memory or descriptors.

// mapperMem is everything mapperChild touches, allocated before the
// clone so that the child allocates nothing.
type mapperMem struct {
	empty [1]byte    // "": execveat's path with AT_EMPTY_PATH
	argv0 [32]byte   // nsinit.MapperArgv0, NUL-terminated
	argv  [2]uintptr // argv0, NULL
	envp  [1]uintptr // NULL
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
	bin, err := initbin.File()
	if err != nil {
		closeFDs(sp[:])
		return nil, fmt.Errorf("template mapper: %w", err)
	}
	m := &mapperMem{}
	copy(m.argv0[:], nsinit.MapperArgv0)
	m.argv[0] = uintptr(unsafe.Pointer(&m.argv0[0]))

	// The clone runs on one locked thread with every signal blocked: the
	// child inherits the mask, so no Go signal handler ever runs in it.
	runtime.LockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^uint64(0)
	}
	_ = unix.PthreadSigmask(unix.SIG_SETMASK, &all, &old)
	pid, errno := forkMapper(m, nsfd, sp[1], int(bin.Fd()), os.Getpid())
	runtime.KeepAlive(bin)
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
func forkMapper(m *mapperMem, nsfd, sock, bin, ppid int) (uintptr, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r != 0 {
		return r, e
	}
	mapperChild(m, nsfd, sock, bin, ppid)
	return 0, 0
}

// mapperChild is the mapper until its execve, in order (any failure
// exits; the supervisor then finds no mapper on the socket):
//
//  1. the socket becomes descriptor 3 (dup3 keeps it across the exec);
//     every other descriptor but the namespace's and the init binary's
//     is closed (the rest of the launcher's never reach the mapper)
//  2. setns into the template's user namespace (single-threaded: it is a
//     fresh clone); close it
//  3. become its root: setresgid, setresuid 0 (the template's first
//     leased host id), so the exec keeps every capability of that
//     namespace and the mapper is not host root
//  4. die with the launcher (PR_SET_PDEATHSIG after the credential
//     changes, which clear it; then check the parent is the same)
//  5. execveat the init binary as nsinit.MapperArgv0, no environment
//
//go:nosplit
//go:norace
func mapperChild(m *mapperMem, nsfd, sock, bin, ppid int) {
	// 1. 3 is free for the socket once the others are moved above it.
	for _, fd := range [...]*int{&nsfd, &bin, &sock} {
		if *fd <= 3 {
			nfd, _, e := syscall.RawSyscall(syscall.SYS_FCNTL, uintptr(*fd), syscall.F_DUPFD_CLOEXEC, 10)
			if e != 0 {
				syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 1, 0, 0)
			}
			*fd = int(nfd)
		}
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_DUP3, uintptr(sock), 3, 0); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 1, 0, 0)
	}
	keep := [3]int{3, nsfd, bin}
	if keep[1] > keep[2] {
		keep[1], keep[2] = keep[2], keep[1]
	}
	lo := 0
	for _, k := range keep {
		if k > lo {
			syscall.RawSyscall(unix.SYS_CLOSE_RANGE, uintptr(lo), uintptr(k-1), 0)
		}
		lo = k + 1
	}
	syscall.RawSyscall(unix.SYS_CLOSE_RANGE, uintptr(lo), uintptr(^uint32(0)), 0)
	// 2.
	if _, _, e := syscall.RawSyscall(unix.SYS_SETNS, uintptr(nsfd), unix.CLONE_NEWUSER, 0); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 2, 0, 0)
	}
	syscall.RawSyscall(syscall.SYS_CLOSE, uintptr(nsfd), 0, 0)
	// 3.
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESGID, 0, 0, 0); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 3, 0, 0)
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SETRESUID, 0, 0, 0); e != 0 {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 3, 0, 0)
	}
	// 4.
	syscall.RawSyscall6(syscall.SYS_PRCTL, unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0, 0)
	if p, _, _ := syscall.RawSyscall(syscall.SYS_GETPPID, 0, 0, 0); int(p) != ppid {
		syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 4, 0, 0)
	}
	// 5.
	syscall.RawSyscall6(unix.SYS_EXECVEAT, uintptr(bin), uintptr(unsafe.Pointer(&m.empty[0])),
		uintptr(unsafe.Pointer(&m.argv[0])), uintptr(unsafe.Pointer(&m.envp[0])), unix.AT_EMPTY_PATH, 0)
	syscall.RawSyscall(syscall.SYS_EXIT_GROUP, 5, 0, 0)
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
