package nsinit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ConfigVersion is the version of Config this nsinit understands (2: the
// launcher passes the bind sources' trees, Mount.TreeFD).
const ConfigVersion = 2

// Phase is one timed setup phase, in milliseconds.
type Phase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// Event is one message on the report socket, init -> launcher: a unix
// SOCK_SEQPACKET socketpair, one JSON event per message. The socket is
// close-on-exec, so the tool never holds it; the launcher sees EOF when
// the init has become the tool (execve) or has exited.
type Event = event

type event struct {
	Type    string     `json:"type"` // "timings", "warning", "error", "listeners", "await_call" (step 10a)
	Phases  []Phase    `json:"phases,omitempty"`
	Message string     `json:"message,omitempty"`
	Error   *StepError `json:"error,omitempty"`
	// Listeners names the descriptors of a "listeners" event, in the order
	// they travel as SCM_RIGHTS with it.
	Listeners []Listener `json:"listeners,omitempty"`
}

type reporter struct {
	mu sync.Mutex
	f  *os.File
}

func newReporter(f *os.File) *reporter { return &reporter{f: f} }

// send writes one event as one message. A write error means the launcher
// is gone; there is nobody left to tell, so it is ignored.
func (r *reporter) send(e event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(b)
}

// sendFDs sends an event with descriptors attached (SCM_RIGHTS).
func (r *reporter) sendFDs(e event, fds []int) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return unix.Sendmsg(int(r.f.Fd()), b, unix.UnixRights(fds...), nil, 0)
}

// readerGone reports whether the report socket's other end, which only
// the launcher holds, is closed.
func (r *reporter) readerGone() bool {
	fds := []unix.PollFd{{Fd: int32(r.f.Fd()), Events: unix.POLLOUT}}
	n, err := unix.Poll(fds, 0)
	return err == nil && n > 0 && fds[0].Revents&(unix.POLLERR|unix.POLLHUP) != 0
}

// ErrNoNewPrivs is the cause when InstallSeccomp runs on a thread without
// no_new_privs.
var ErrNoNewPrivs = errors.New("no_new_privs is not set on this thread")

// InstallSeccomp is str's one seccomp installer: the init's step 19, and
// the installer the seccomp package's kernel tests use. filter is the
// program in the one byte format of str (package seccomp, EncodeFilter):
// struct sock_filter records of 8 bytes in the machine's byte order,
// handed to the kernel as they are. It loads the filter on the calling
// thread only (no TSYNC): the caller holds a locked OS thread that then
// execs, so the filter is exactly the new program's. no_new_privs must be
// set first: without it the kernel takes a filter only from CAP_SYS_ADMIN,
// and a setuid exec could shed it.
func InstallSeccomp(filter []byte) error {
	if err := checkFilter(filter); err != nil {
		return err
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("prctl(PR_GET_NO_NEW_PRIVS): %w", err)
	}
	if nnp != 1 {
		return ErrNoNewPrivs
	}
	fprog := unix.SockFprog{Len: uint16(len(filter) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&filter[0]))}
	_, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if e != 0 {
		return e
	}
	return nil
}

// InstallSeccompListener is InstallSeccomp with
// SECCOMP_FILTER_FLAG_NEW_LISTENER: it returns the filter's listener, the
// descriptor on which a supervisor receives the syscalls the filter
// answers SECCOMP_RET_USER_NOTIF (a per-tool template's one clone per
// call). The descriptor is close-on-exec.
func InstallSeccompListener(filter []byte) (int, error) {
	if err := checkFilter(filter); err != nil {
		return -1, err
	}
	nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
	if err != nil {
		return -1, fmt.Errorf("prctl(PR_GET_NO_NEW_PRIVS): %w", err)
	}
	if nnp != 1 {
		return -1, ErrNoNewPrivs
	}
	fprog := unix.SockFprog{Len: uint16(len(filter) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&filter[0]))}
	fd, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// checkFilter: filter is 1 to maxBPFInsns whole sock_filter records (the
// one check of str-init's installers and of a direct sandbox's program).
func checkFilter(filter []byte) error {
	if len(filter) == 0 || len(filter)%8 != 0 || len(filter)/8 > maxBPFInsns {
		return fmt.Errorf("seccomp program of %d bytes is not 1-%d sock_filter records", len(filter), maxBPFInsns)
	}
	return nil
}

// maxBPFInsns is the kernel's BPF_MAXINSNS.
const maxBPFInsns = 4096
