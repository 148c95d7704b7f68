package nsinit

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ConfigVersion is the version of Config this nsinit understands.
const ConfigVersion = 1

// Phase is one timed setup phase, in milliseconds.
type Phase struct {
	Name string  `json:"name"`
	Ms   float64 `json:"ms"`
}

// Event is one line on the report pipe (fd 4), nsinit -> launcher. The pipe
// is close-on-exec, so the tool never holds it; the launcher sees EOF when
// nsinit exits.
type Event = event

type event struct {
	Type    string     `json:"type"` // "timings", "warning", "error", "exit"
	Phases  []Phase    `json:"phases,omitempty"`
	Message string     `json:"message,omitempty"`
	Error   *StepError `json:"error,omitempty"`
	Code    int        `json:"code,omitempty"`
	Signal  int        `json:"signal,omitempty"`
}

type reporter struct {
	mu sync.Mutex
	f  *os.File
}

func newReporter(f *os.File) *reporter { return &reporter{f: f} }

// send writes one event as a JSON line. A write error means the launcher
// is gone; there is nobody left to tell, so it is ignored.
func (r *reporter) send(e event) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.f.Write(append(b, '\n'))
}

// installSeccomp loads a classic-BPF seccomp filter on the calling thread
// only (no TSYNC: the caller is the locked thread that forks the tool).
// no_new_privs must already be set.
func installSeccomp(filter []byte) error {
	if len(filter) == 0 || len(filter)%8 != 0 || len(filter)/8 > 4096 {
		return fmt.Errorf("seccomp program of %d bytes is not 1-4096 sock_filter records", len(filter))
	}
	prog := make([]unix.SockFilter, len(filter)/8)
	for i := range prog {
		r := filter[8*i:]
		prog[i] = unix.SockFilter{Code: uint16(r[0]) | uint16(r[1])<<8, Jt: r[2], Jf: r[3],
			K: uint32(r[4]) | uint32(r[5])<<8 | uint32(r[6])<<16 | uint32(r[7])<<24}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	_, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return e
	}
	return nil
}
