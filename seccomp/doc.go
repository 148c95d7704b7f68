// Package seccomp holds str's seccomp policies as data and turns them into
// classic-BPF programs that the sandbox's init installs as its last step.
//
// # Policies
//
// A policy is a YAML file under policies/ (embedded with go:embed), one
// strict schema, version 1, unknown fields rejected. The one decoder of
// that YAML is package policyyaml (linked by str-worker and go generate):
// this package reads each policy's decoded form (predecoded/, go
// generate; seccomp.ReadDecoded for an operator's file) and links no YAML.
//
//	version: 1
//	name: standard
//	description: "..."
//	default_action: {action: errno, errno: ENOSYS}
//	rules:
//	  - names: [read, write, close]
//	    action: allow                      # allow | errno | kill_process | kill_thread | log
//	    reason: "basic I/O"                # mandatory on every rule
//	  - names: [ioctl]
//	    action: errno
//	    errno: EPERM                       # only with action errno
//	    args: [{index: 1, op: masked_eq, mask: 0xffffffff, value: 0x5412}]
//	    reason: "TIOCSTI ..."
//
// Ops are eq, ne, lt, le, gt, ge (64-bit unsigned) and masked_eq
// ((arg & mask) == value). Semantics: for a syscall, its conditional rules
// are tried in file order and the first whose conditions all hold decides;
// otherwise its unconditional rule decides; otherwise default_action.
// Policy.Evaluate is that sentence in Go. Validate collects every problem
// (errors.Join of *ValidationError naming policy, rule index and field).
//
// A policy may extend an embedded one and list only its differences:
//
//	extends: restrictive
//	replaces: [prlimit64]       # base rules of these syscalls are dropped...
//	rules:
//	  - names: [prlimit64]      # ...and this policy's own rules decide them
//	    action: allow
//	    reason: "..."
//
// Decoding resolves that once (Resolve, Policy.inherit): the base's rules without
// the replaced syscalls, then the policy's own rules, and the base's
// default action unless the policy gives one. A replaced syscall must be
// in the base and in the policy's own rules (no silent removal); any other
// syscall the base decides unconditionally cannot be decided again
// (Validate's usual conflict check on the resolved rules).
//
// There are four policies: restrictive, standard (extends restrictive),
// permissive (extends standard) and nesting (extends standard). Each
// allows what CPython 3.11 with its standard library needs and what Go's
// runtime and syscall.ForkExec do after the filter is in place; they
// differ in the extras (SysV IPC, xattr writes, AIO, personalities;
// nesting: namespaces, mounts and pivot_root for a sandbox inside).
// The known-dangerous set is EPERM in all of them, nesting's less the
// namespace and mount calls it exists for (a test enforces it).
//
// # What it protects against
//
//   - Kernel attack surface that a sandboxed tool never needs: the mount
//     API, namespace creation and joining (unshare, setns, clone with any
//     CLONE_NEW* flag), keyrings, bpf, perf_event_open, userfaultfd,
//     io_uring, module and kexec loading, ptrace and process_vm_*,
//     open_by_handle_at, clock and hostname changes, syslog, iopl, ...
//     (EPERM, each with its reason in the policy file).
//   - Terminal injection: ioctl TIOCSTI/TIOCLINUX/TIOCSETD are refused,
//     compared on the low 32 bits only, so setting the upper bits of the
//     command cannot bypass the rule (the CVE-2019-10063 class).
//   - Architecture confusion: any arch other than the native one, and on
//     amd64 any x32 syscall number (bit 0x40000000), kills the process.
//     A six-instruction guard in front of the program checks both before
//     the syscall number is looked at (archGuard).
//   - Unknown or new syscalls: ENOSYS, so software falls back gracefully
//     (clone3 is ENOSYS on purpose: its flags live in memory seccomp cannot
//     read, and glibc and Go fall back to clone, whose flags are checked).
//
// # What it does not protect against
//
//   - Bugs in allowed syscalls. Seccomp narrows the kernel interface; it
//     does not make read, mmap or futex safe.
//   - Anything reached through arguments in memory (paths, sockaddrs,
//     clone3 args): seccomp sees only the six register values. Which files
//     and networks exist is the job of the mount and network namespaces.
//   - Threads other than the one that installs the filter. The installer
//     (the init's step 19, the only one) is per thread (no TSYNC); see
//     the ordering rule below.
//   - Resource exhaustion (cgroups do that) and information available
//     through allowed calls (uname, sysinfo).
//
// # What it trusts
//
//   - The kernel's seccomp implementation and its BPF checker.
//   - The generator (compile.go, dispatch.go, argcode.go), the only one,
//     pure Go: a guard, a binary search over ranges of syscall numbers,
//     and for syscalls with argument conditions a block that tries their
//     rules in file order. Compile runs every program it produces through
//     Simulate and compares it with Evaluate before returning it.
//   - The syscall tables (syscalls.go), generated from libseccomp.
//
// libseccomp (through libseccomp-golang and cgo) is a cross-check in the
// tests only (libseccomp_test.go, build tag cgo): the tables must equal
// its view, and on amd64 and arm64 every policy's program must return
// what libseccomp's returns for every syscall number 0..1100 and every
// argument probe. No code a sandbox runs with links it: this package,
// the launcher and the init build with CGO_ENABLED=0
// (TestRunTimePathHasNoCgo).
//   - The embedded policy files, which are reviewed like code.
//
// # Kernel features needed
//
//   - seccomp filter mode (CONFIG_SECCOMP_FILTER, seccomp(2): Linux 3.17)
//   - SECCOMP_RET_ERRNO and SECCOMP_RET_KILL_PROCESS (Linux 4.14)
//   - no_new_privs (Linux 3.5), so that installing needs no privilege
//
// A missing feature is a hard error from the installer; there is no
// fallback.
//
// # One byte format, one installer
//
// A compiled program travels as bytes, and only as bytes: struct
// sock_filter records of 8 bytes in the machine's byte order
// (EncodeFilter writes them; the interpreter reads them back). The
// embedded policies are compiled at go generate time into
// precompiled/POLICY_ARCH.bpf for amd64 and arm64 (32 bytes of SHA-256
// of the policy files, then the records), so `str run` reads bytes and
// decodes no YAML and no JSON; the reviewer's view of the rules (.json
// beside it) is read only for `str profile show --plan`. A policy file
// loaded at run time is compiled by the same generator. The
// init's compiled program (nsinit, step 19) hands the bytes to seccomp(2)
// by a raw system call; the kernel tests here make the same call
// (installFilter).
//
// # Ordering rule
//
// The filter is installed after prctl(PR_SET_NO_NEW_PRIVS, 1), on the
// locked OS thread that then sets the rlimits and calls execve itself
// (nsinit steps 18-21):
//
//	runtime.LockOSThread()
//	... every other setup step (mounts, pivot_root, ids, capabilities) ...
//	prctl(PR_SET_NO_NEW_PRIVS, 1)
//	seccomp(SECCOMP_SET_MODE_FILTER)    // only rlimits and execve follow
//	prlimit64(0, ...) ...; execve(tool) // raw, from the same thread
//
// After every setup step, so the policy need not allow setup syscalls
// (mount, pivot_root); after no_new_privs, because the kernel demands it
// of unprivileged callers and so that exec cannot gain privileges the
// filter did not anticipate; on the exec'ing thread, because a filter
// belongs to the thread that installed it, not to the Go program's other
// threads. Every policy therefore allows prlimit64 on the caller itself
// and execve.
//
// # Tests
//
// Filters are tested twice (STYLE.md rule 11): rows of seccomp_data
// through Simulate in plain unit tests (against Evaluate, against
// libseccomp, and against testdata/frozen, the decisions of the programs
// before the generator became one), and for real in a re-executed copy of
// the test binary that sets no_new_privs, installs each policy, checks the
// errnos the kernel returns, runs CPython under it, dies of SIGSYS on an
// x32 call, and asks the kernel for its decision on every row of the
// frozen fixture without running the probed calls (TestKernelSweep). The
// go test process itself never installs a filter.
package seccomp
