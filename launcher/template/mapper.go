package template

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/idmap"
)

// The id-map opener of a per-tool template. A call's user namespace is
// created by the template's clone, so its parent is the template's user
// namespace, and the kernel lets /proc/PID/uid_map and gid_map be
// written only through a file opened by a process of that parent
// namespace (or of the call's own) holding CAP_SETUID/CAP_SETGID there
// (kernel/user_namespace.c proc_uid_map_write, new_idmap_permitted: the
// opener's credentials are checked, and the writer's). The supervisor is
// in the host's user namespace, two levels up, and as a multi-threaded
// Go program it may never setns into another user namespace. So each
// template has a mapper: a raw clone of the launcher (no Go runtime in
// it: only the raw syscalls of mapperChild, as Go's own
// forkAndExecInChild1 runs) that joins the template's user namespace,
// becomes its root (the template's first leased host id: not host root),
// and executes the launcher's own program again (/proc/self/exe, opened
// before the clone) as mapperArgv0, which this package's init turns into
// serveMapper (the program's main never runs): with every capability of
// the template's user namespace and none on the host, it opens the
// uid_map/gid_map paths the supervisor sends on its socketpair (nothing
// else) and sends the descriptors back. The supervisor writes the maps
// through them. The template cannot reach it (another pid namespace,
// ptrace denied). Executed, it holds none of the launcher's memory or
// descriptors. Before serveMapper, the program initialises its packages
// as at any start (with mapperEnv as its only environment): for
// str-worker, built with cgo, that includes the dynamic loader and the
// messaging client library's initialisation (it reads /etc/passwd).
//
// Why executed, not a clone that serves the requests itself: a clone
// without an execve keeps a copy of the launcher's whole memory for the
// template's life (its secrets; and each page the launcher writes
// afterwards becomes the mapper's own: its Pss grows towards the
// launcher's heap). Why the program itself and not a binary of its own:
// no second program to build, ship or keep from being written (the
// running program's file is the host's, which the template's ids cannot
// write: CVE-2019-5736); and the dispatch is in this package's init,
// which every program that can start a template links (Start is here:
// str, str-worker, str-bench, the tests), so each serves as its mapper
// by construction.

// mapperArgv0 is the argv[0] under which the launcher's program is a
// template's id-map opener (serveMapper).
const mapperArgv0 = "str-id-mapper"

func init() {
	if len(os.Args) == 1 && os.Args[0] == mapperArgv0 {
		serveMapper()
	}
}

// mapperEnv is the mapper's whole environment: the Go runtime then
// reads no cgroup CPU limit and keeps none of its files open, so the
// mapper's only descriptor is its socket (0-2 are /dev/null, which the
// runtime opens for closed standard descriptors).
const mapperEnv = "GODEBUG=containermaxprocs=0,updatemaxprocs=0"

// mapperMem is everything mapperChild touches, allocated before the
// clone so that the child allocates nothing.
type mapperMem struct {
	empty [1]byte    // "": execveat's path with AT_EMPTY_PATH
	argv0 [32]byte   // mapperArgv0, NUL-terminated
	env0  [64]byte   // mapperEnv, NUL-terminated
	argv  [2]uintptr // argv0, NULL
	envp  [2]uintptr // env0, NULL
}

type idMapper struct {
	mu   sync.Mutex // one request at a time
	pid  int
	sock *os.File
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
	exe, err := openSelf()
	if err != nil {
		launcher.CloseFDs(sp[:])
		return nil, fmt.Errorf("template mapper: %w", err)
	}
	m := &mapperMem{}
	copy(m.argv0[:], mapperArgv0)
	copy(m.env0[:], mapperEnv)
	m.argv[0] = uintptr(unsafe.Pointer(&m.argv0[0]))
	m.envp[0] = uintptr(unsafe.Pointer(&m.env0[0]))

	var pid uintptr
	var errno syscall.Errno
	idmap.WithSignalsBlocked(func() { pid, errno = forkMapper(m, nsfd, sp[1], exe, os.Getpid()) })
	unix.Close(exe)
	unix.Close(sp[1])
	if errno != 0 {
		unix.Close(sp[0])
		return nil, fmt.Errorf("template mapper: clone: %w", errno)
	}
	if err := unix.SetNonblock(sp[0], true); err != nil {
		unix.Close(sp[0])
		return nil, err
	}
	return &idMapper{pid: int(pid), sock: os.NewFile(uintptr(sp[0]), "template mapper")}, nil
}

// openSelf opens the running program's file (O_PATH: it is only
// executed, by descriptor, so no path is looked up as the mapper). The
// mapper executes it as the template's root, a leased host id: the file
// must be executable by others, which is checked here so that a
// template fails at its start, with the reason, not at its first call.
func openSelf() (int, error) {
	const self = "/proc/self/exe"
	fd, err := unix.Open(self, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", self, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("fstat %s: %w", self, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Mode&0o001 == 0 {
		unix.Close(fd)
		target, _ := os.Readlink(self)
		return -1, fmt.Errorf("%s (mode %o) is not a regular file executable by others: the mapper runs it as the template's root, a leased host id (chmod o+x it)", target, st.Mode&0o7777)
	}
	return fd, nil
}

// forkMapper clones; the child never returns from mapperChild. nosplit
// and norace: the child runs on this goroutine's stack without a Go
// runtime (no stack growth, no race-detector calls).
//
//go:nosplit
//go:norace
func forkMapper(m *mapperMem, nsfd, sock, exe, ppid int) (uintptr, syscall.Errno) {
	r, _, e := syscall.RawSyscall6(syscall.SYS_CLONE, uintptr(syscall.SIGCHLD), 0, 0, 0, 0, 0)
	if e != 0 || r != 0 {
		return r, e
	}
	mapperChild(m, nsfd, sock, exe, ppid)
	return 0, 0
}

// mapperChild is the mapper until its execve, in order (any failure
// exits; the supervisor then finds no mapper on the socket):
//
//  1. the socket becomes descriptor 3 (dup3 keeps it across the exec);
//     every other descriptor but the namespace's and the program's is
//     closed (the rest of the launcher's never reach the mapper)
//  2. setns into the template's user namespace (single-threaded: it is a
//     fresh clone); close it
//  3. become its root: setresgid, setresuid 0 (the template's first
//     leased host id), so the exec keeps every capability of that
//     namespace and the mapper is not host root
//  4. die with the launcher (PR_SET_PDEATHSIG after the credential
//     changes, which clear it; then check the parent is the same)
//  5. execveat the launcher's program (by descriptor: exe) as
//     mapperArgv0, with mapperEnv only: it runs serveMapper
//
//go:nosplit
//go:norace
func mapperChild(m *mapperMem, nsfd, sock, exe, ppid int) {
	// 1. 3 is free for the socket once the others are moved above it.
	for _, fd := range [...]*int{&nsfd, &exe, &sock} {
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
	keep := [3]int{3, nsfd, exe}
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
	syscall.RawSyscall6(unix.SYS_EXECVEAT, uintptr(exe), uintptr(unsafe.Pointer(&m.empty[0])),
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
		launcher.CloseFDs(fds)
		return nil, errors.New("template mapper: bad answer")
	}
	return os.NewFile(uintptr(fds[0]), path), nil
}

// close ends the mapper and reaps it. It is killed, not left to read
// EOF: another child cloned meanwhile may hold a copy of the socket
// until its own execve.
func (mp *idMapper) close() {
	_ = unix.Kill(mp.pid, unix.SIGKILL)
	mp.sock.Close()
	var ws unix.WaitStatus
	_, _ = unix.Wait4(mp.pid, &ws, 0, nil)
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

// mapperPath is the only kind of path the mapper opens: a process's uid
// or gid map in the host's /proc.
var mapperPath = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^/proc/[1-9][0-9]{0,9}/(uid_map|gid_map)$`)
})

// serveMapper is the mapper, once mapperChild has executed it: it
// serves the supervisor on descriptor 3 (a SOCK_SEQPACKET socket): each
// message is a path, answered 'k' with the file opened O_WRONLY as
// SCM_RIGHTS, or 'e'. It runs in a template's user namespace as its
// root, with every capability there and none on the host: the kernel
// lets a user namespace's id maps be written only through a file opened
// by such a process of its parent namespace. Only the paths of
// mapperPath are opened. EOF (or SIGKILL: idMapper.close) ends it.
func serveMapper() {
	buf := make([]byte, 256)
	for {
		n, _, _, _, err := unix.Recvmsg(3, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			os.Exit(0)
		}
		path := string(buf[:n])
		if !mapperPath().MatchString(path) {
			_ = unix.Sendmsg(3, []byte{'e'}, nil, nil, 0)
			continue
		}
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			_ = unix.Sendmsg(3, []byte{'e'}, nil, nil, 0)
			continue
		}
		_ = unix.Sendmsg(3, []byte{'k'}, unix.UnixRights(fd), nil, 0)
		unix.Close(fd)
	}
}
