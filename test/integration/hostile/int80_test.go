package hostile

import (
	"errors"
	"os/exec"
	"sync"
	"syscall"
)

// int80Probe runs the int80_syscall case's machine code (i386 getpid
// through "int $0x80") in a plain python3 child on the host, outside any
// sandbox, to learn what the platform does with the instruction.
const int80Probe = `import ctypes, mmap
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(b"\xb8\x14\x00\x00\x00\xcd\x80\xc3")
ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()
`

var int80Once struct {
	sync.Once
	want, why string
}

// int80Want is the outcome the int80_syscall case must see inside a
// sandbox. Where the kernel runs 32-bit system calls (IA32 emulation), the
// sandbox's filter must kill the call: "signal:SIGSYS". Some hypervisors
// (a PVM guest, as on the project's machines) fault "int $0x80" before any
// system call is made, so even an unsandboxed process dies of SIGSEGV;
// there the same SIGSEGV inside the sandbox is the only outcome possible,
// and the case checks that the instruction still reaches nothing. The VM
// battery (QEMU) has IA32 emulation and asserts SIGSYS.
func int80Want() (want, why string) {
	int80Once.Do(func() {
		int80Once.want, int80Once.why = "signal:SIGSYS", "int $0x80 reaches the kernel's 32-bit entry on this host"
		err := exec.Command("python3", "-c", int80Probe).Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGSEGV {
				int80Once.want = "signal:SIGSEGV"
				int80Once.why = "int $0x80 faults (SIGSEGV) in an unsandboxed process on this host: the platform has no 32-bit system call entry, so seccomp is not reached"
			}
		}
	})
	return int80Once.want, int80Once.why
}
