package seccomp

import (
	"fmt"
	"runtime"
	"sync"
)

// Audit architecture values (linux/audit.h) of the architectures this
// package compiles for, and the x32 syscall bit.
const (
	AuditArchX86_64  uint32 = 0xc000003e
	AuditArchI386    uint32 = 0x40000003
	AuditArchAArch64 uint32 = 0xc00000b7
	AuditArchARM     uint32 = 0x40000028

	// X32SyscallBit is __X32_SYSCALL_BIT: x32 syscalls enter the x86_64
	// kernel with AUDIT_ARCH_X86_64 and this bit set in nr.
	X32SyscallBit int32 = 0x40000000
)

// archSpec is one architecture the generator compiles for: its Go name,
// its AUDIT_ARCH value and its syscall numbers (syscalls.go, generated
// from libseccomp and checked against it by the tests).
type archSpec struct {
	name     string // GOARCH: "amd64", "arm64"
	audit    uint32
	syscalls func() map[string]int32 // built on first use: not at every str process's start
}

var (
	archAMD64 = archSpec{"amd64", AuditArchX86_64, sync.OnceValue(syscallsAMD64)}
	archARM64 = archSpec{"arm64", AuditArchAArch64, sync.OnceValue(syscallsARM64)}

	// supportedArches are the architectures str runs on; policies name
	// syscalls of either, and every one is compiled ahead of time.
	supportedArches = []archSpec{archAMD64, archARM64}
)

// native is the architecture this program runs on.
func native() (archSpec, error) {
	for _, a := range supportedArches {
		if a.name == runtime.GOARCH {
			return a, nil
		}
	}
	return archSpec{}, fmt.Errorf("seccomp: architecture %s is not supported (amd64 and arm64 are)", runtime.GOARCH)
}

// resolve returns the number of syscall name on a; ok is false when the
// syscall does not exist there (open on arm64).
func (a archSpec) resolve(name string) (int32, bool) {
	nr, ok := a.syscalls()[name]
	return nr, ok
}

// knownSyscall reports whether name is a syscall on amd64 or arm64
// (policies are shared by both; a name that exists only on one is skipped
// on the other and shown as skipped in the plan).
func knownSyscall(name string) bool {
	for _, a := range supportedArches {
		if _, ok := a.resolve(name); ok {
			return true
		}
	}
	return false
}
