package nsinit

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ConfigVersion is the version of Config's form, as a plan shows it (2:
// the launcher passes the bind sources' trees, Mount.TreeFD).
const ConfigVersion = 2

// Phase is one timed setup phase, in milliseconds.
type Phase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// Event is what one message on the report socket says, child ->
// launcher (a unix SOCK_SEQPACKET socketpair; Program.Event reads the
// child's fixed records). The socket is close-on-exec, so the tool never
// holds it; the launcher sees EOF when the child has become the tool
// (execve) or has exited.
type Event struct {
	Type    string     // "warning", "error", "listeners", "seccomp_listener" (sub-step 19a), "await_call" (sub-step 10a)
	Message string     // a warning's text
	Error   *StepError // an error's
	// Listeners names the descriptors of a "listeners" event, in the order
	// they travel as SCM_RIGHTS with it.
	Listeners []Listener
}

// ErrNoNewPrivs is the cause when InstallSeccomp runs on a thread without
// no_new_privs.
var ErrNoNewPrivs = errors.New("no_new_privs is not set on this thread")

// InstallSeccomp loads a filter on the calling thread as a Program's
// step 19 does (the same call, the same check: checkFilter), for the
// seccomp package's kernel tests. filter is the
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
// one check of a Program's step 19 and of the installers above).
func checkFilter(filter []byte) error {
	if len(filter) == 0 || len(filter)%8 != 0 || len(filter)/8 > maxBPFInsns {
		return fmt.Errorf("seccomp program of %d bytes is not 1-%d sock_filter records", len(filter), maxBPFInsns)
	}
	return nil
}

// maxBPFInsns is the kernel's BPF_MAXINSNS.
const maxBPFInsns = 4096
