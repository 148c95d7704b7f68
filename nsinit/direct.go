package nsinit

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Program is the init's steps for one sandbox (compileDirect's numbered
// list) compiled in the launcher into raw system calls that the
// launcher's own clone child performs before it executes the tool (the
// package doc). Every operation carries its Step, which a failure's
// record names (Program.Event).
type Program struct {
	ops   []op
	descs []opDesc

	// Memory the child reads and writes: this program's alone (with
	// CLONE_VM the child writes the launcher's own memory here, see
	// CloneSharesMemory), and never read by the launcher.
	slots  [maxSlots]uintptr
	stat   unix.Stat_t
	pfd    unix.PollFd
	zero   unix.Timespec
	rec    [failureLen]byte
	report slotID // the slot holding the report socket
	// callTool is a pre-built sandbox's argv[0] once its call is sent
	// (SetCallTool): a failure names it.
	callTool atomic.Pointer[string]

	keep   []any      // every buffer an operation points into
	listen []Listener // the listeners its "listeners" record hands over, in order

	// The child's own stack and call area (childMem), and what it
	// resets the signals with: the launcher's thread mask, read before
	// the clone, a SIG_DFL action and room for the one it replaces.
	mem     *childMem
	sigmask uint64
	sigact  [4]uint64
	sigold  [4]uint64
	status  uint32 // sub-step 0a's fork's parent: the wait status

	life programLife // started once; released once its child cannot read it (direct_mem.go)
}

// op kinds: opSys is one raw system call; the others are the few steps
// between two calls that need the result of the one before (all done on
// memory prepared before the fork).
const (
	opSys         = iota // r1 = syscall(nr, a...)
	opFdPath             // the number in slot a0, in decimal and NUL-terminated, at mem (after "/proc/self/fd/")
	opStore32            // *(*int32)(mem) = int32(slots[a0])
	opStorePtr           // *(*uintptr)(mem) = slots[a0]
	opOr16               // *(*uint16)(mem) |= uint16(a1)
	opCheckLink          // fstat the O_PATH descriptor in slot a0: a symlink fails
	opCheckCwd           // getcwd into the a1 bytes after the a1 bytes at mem, which it must equal
	opCheckPoll          // poll the descriptor in slot a0 for events a1: POLLERR, POLLHUP or POLLIN fails
	opResolve            // r1 = the first of a1 candidate paths (C strings, their addresses at mem) that is an executable file
	opCloseOthers        // close every descriptor from a0 on but the a1 slots listed at mem (slot ids)
	opAwaitCall          // receive the call (sub-step 10a) into the callArea at mem; r1 = its candidate count
	opSysWarn            // syscall(nr, a...); a failure is a warning record, and the program goes on (best effort)
	opFork               // fork: the child goes on (r1 0), the parent waits for it and exits with its status
)

// Exit classes: which of str's exit codes a failure of the operation
// gives the process (ExitSetupFailed unless the class says otherwise).
const (
	exitSetup   = iota // 125
	exitExec           // ENOENT 127; EACCES, ENOEXEC 126; else 125
	exitResolve        // EACCES 126; else 127
)

const (
	maxSlots = 4096 // a power of two: an index is masked, never bounds-checked, in the child
	noSlot   = 0xffff
	// failureLen is the failure record: failureMagic, the operation's
	// index and the errno (0: a check failed; opDesc.check says which).
	failureLen = 16
)

// The child's records on the report socket, each starting with its own
// 8 bytes (a NUL first: the child writes nothing else there). A failure
// and a warning add the operation's index and the errno (failureLen in
// all); the others are the 8 bytes alone, the listeners' with their
// descriptors (SCM_RIGHTS).
var (
	failureMagic     = [8]byte{0, 's', 't', 'r', 'f', 'a', 'i', 'l'}
	warningMagic     = [8]byte{0, 's', 't', 'r', 'w', 'a', 'r', 'n'} // a best-effort step that failed
	listenersRecord  = [8]byte{0, 's', 't', 'r', 'l', 's', 't', 'n'} // the egress listeners, in the plan's order (step 10)
	awaitRecord      = [8]byte{0, 's', 't', 'r', 'w', 'a', 'i', 't'} // a pre-built sandbox waits for its call (sub-step 10a)
	seccompLstRecord = [8]byte{0, 's', 't', 'r', 's', 'e', 'c', 'l'} // a template filter's listener (sub-step 19a)
)

// slotID names one of a Program's slots.
type slotID uint16

type op struct {
	kind     uint8
	exit     uint8
	slotArgs uint8  // bit i: a[i] names a slot, whose value is passed
	out      slotID // the slot r1 is stored in (noSlot: none)
	cond     slotID // run only when this slot is 0 (noSlot: always)
	hit      slotID // the slot set to 1 when okErr occurred, else 0 (noSlot: none)
	okErr    uint16
	want     uintptr // with check: r1 must be exactly this (a write's length)
	check    bool
	nr       uintptr
	a        [6]uintptr
	// mem is the memory a non-syscall operation reads or writes (never
	// a[i]: a pointer kept as a uintptr is not one to the collector).
	mem unsafe.Pointer
}

// opDesc is what the launcher says of an operation that failed: the same
// fields a StepError has.
type opDesc struct {
	step                 Step
	who                  string // "nsinit", or "launcher" for L4's child half
	action, path, detail string
	prefix               string // before the errno's text ("mkdir usr: ")
	check                string // the message when a check failed (errno 0)
	hint                 string
	hintErrno            syscall.Errno // the hint only for this errno (0: always)
	warning              string        // opSysWarn: the warning, with %v for the errno
}

// DirectFiles are the launcher's descriptors the child takes: they are
// inherited by the fork at these numbers and moved above the tool's
// (step 1) before the tool's own are put in place.
type DirectFiles struct {
	Stdio  [3]int
	Pass   []int
	Report int
	Sync   [2]int // the L4 pipe: the child waits on Sync[0] for its id maps
	// Trees are the launcher's clones of the bind sources, in plan order
	// (root mode): a mount's TreeFD is FirstTreeFD(len(Pass)) + its index
	// here. Rootless there are none: the child clones each source itself
	// (step 3, a mount with TreeFD 0).
	Trees []int
}

// builder collects a Program's operations.
type builder struct {
	p       *Program
	next    slotID
	free    []slotID // slots of descriptors closed: reused
	scratch slotID   // mkdirAll's "existed" flag, set and read by neighbouring operations
	step    Step
	who     string
	err     error
	first   int // FirstTreeFD of the plan
}

// slot is a slot for a value an operation stores (init 0), or one that
// starts with init (a descriptor of the launcher's). A freed slot is
// reused only for the first kind, and its start value is left alone: an
// earlier operation may still read it at run time (the slots' start
// values are the program's, written once, before the fork).
func (b *builder) slot(init uintptr) slotID {
	if n := len(b.free); n > 0 && init == 0 {
		s := b.free[n-1]
		b.free = b.free[:n-1]
		return s
	}
	if b.next >= maxSlots {
		b.fail(errors.New("too many descriptors for one program"))
		return 0
	}
	s := b.next
	b.next++
	b.p.slots[s] = init
	return s
}

// close closes the descriptor in slot s, whose slot is then free.
func (b *builder) close(d opDesc, s slotID) {
	b.sys(d, unix.SYS_CLOSE, 1, noSlot, uintptr(s))
	b.free = append(b.free, s)
}

// fail records the first error of the compilation.
func (b *builder) fail(err error) { b.err = cmp.Or(b.err, err) }

// cstr is s as a C string the program keeps.
func (b *builder) cstr(s string) uintptr {
	if strings.IndexByte(s, 0) >= 0 {
		b.fail(fmt.Errorf("%q contains a NUL byte", s))
		return 0
	}
	buf := append([]byte(s), 0)
	b.p.keep = append(b.p.keep, buf)
	return uintptr(unsafe.Pointer(&buf[0]))
}

// cstrs is ss as a NULL-terminated array of C strings the program keeps.
func (b *builder) cstrs(ss []string) []uintptr {
	out := make([]uintptr, len(ss)+1)
	for i, s := range ss {
		out[i] = b.cstr(s)
	}
	b.p.keep = append(b.p.keep, out)
	return out
}

// mem keeps v and returns its address.
func (b *builder) mem(v any, p unsafe.Pointer) uintptr {
	b.p.keep = append(b.p.keep, v)
	return uintptr(p)
}

// add appends o with its description.
func (b *builder) add(o op, d opDesc) *op {
	d.step = b.step
	d.who = b.who
	b.p.ops = append(b.p.ops, o)
	b.p.descs = append(b.p.descs, d)
	return &b.p.ops[len(b.p.ops)-1]
}

// special adds one of the operations that are not a system call (kind),
// on mem with arguments a0 and a1; it stores nothing and always runs
// unless the caller sets out, cond or hit on the operation returned.
func (b *builder) special(kind uint8, mem unsafe.Pointer, a0, a1 uintptr, d opDesc) *op {
	return b.add(op{kind: kind, out: noSlot, cond: noSlot, hit: noSlot, mem: mem, a: [6]uintptr{a0, a1}}, d)
}

// sys is one raw call; slotArgs marks the arguments that name slots.
func (b *builder) sys(d opDesc, nr uintptr, slotArgs uint8, out slotID, a ...uintptr) *op {
	o := op{kind: opSys, nr: nr, slotArgs: slotArgs, out: out, cond: noSlot, hit: noSlot}
	copy(o.a[:], a)
	return b.add(o, d)
}

// CompileDirect compiles cfg into a Program for the launcher's clone
// child. lastCap is the host's /proc/sys/kernel/cap_last_cap; limits are
// the launcher's own hard rlimits by resource (the child inherits them at
// the fork).
func CompileDirect(cfg *Config, f DirectFiles, lastCap int, hardLimit func(resource int) (uint64, error)) (*Program, error) {
	p, err := compileDirect(cfg, f, lastCap, hardLimit)
	if err != nil {
		p.Release() // its child memory and lists, for the next program
		return nil, err
	}
	return p, nil
}

// compileDirect performs the sandbox setup as one linear sequence of
// operations that ends by executing the tool in the child's own place,
// so the tool is the sandbox's PID 1 and no str process stays inside
// (nothing privileged, no memory of ours). First L4's child half (wait
// for the id maps, setsid, the parent-death signal), then the steps, in
// the order of the Step constants (steps.go: each one's description;
// DocList prints them, and SECURITY.md lists the same, checked by
// TestStepListsAgree). Each step below starts with its number.
//
// The child is root of the sandbox's own user namespace only, never of
// the host's (the package doc, "What it trusts"), from its first
// instruction in the sandbox's cgroup (v2: born there; v1: step 12).
// Every step from 12 on changes the child's own state, which the tool
// inherits at the execve.
func compileDirect(cfg *Config, f DirectFiles, lastCap int, hardLimit func(resource int) (uint64, error)) (p *Program, err error) {
	p = &Program{}
	if cfg.PassFDs != len(f.Pass) {
		return p, fmt.Errorf("the plan passes %d descriptors, the launcher %d", cfg.PassFDs, len(f.Pass))
	}
	if p.mem, err = getChildMem(); err != nil {
		return p, err
	}
	// The lists of a released program are reused (a worker compiles one
	// per cold call: ~90 KB that would otherwise be garbage each time);
	// new ones are sized to the operations' count, roughly, so that they
	// grow once.
	if l, ok := opListPool.Get().(*opLists); ok {
		p.ops, p.descs = l.ops[:0], l.descs[:0]
	} else {
		n0 := 64 + lastCap + 10*len(cfg.Mounts) + 6*len(cfg.Listen)
		p.ops, p.descs = make([]op, 0, n0), make([]opDesc, 0, n0)
	}
	b := &builder{p: p, first: FirstTreeFD(len(f.Pass))}
	b.scratch = b.slot(0)
	n := len(f.Pass)

	// Slots that hold a descriptor start with the launcher's number;
	// step 1 moves each of moves above the tool's and stores the new one.
	var moves []slotID
	take := func(fds ...int) []slotID {
		for _, fd := range fds {
			moves = append(moves, b.slot(uintptr(fd)))
		}
		return moves[len(moves)-len(fds):]
	}
	syncR := b.slot(uintptr(f.Sync[0]))
	p.report = take(f.Report)[0]
	tools := take(append(f.Stdio[:], f.Pass...)...) // the tool's 0-2 and pass-list, in order
	trees := take(f.Trees...)

	// L4, the clone's child half (what Go's forkAndExecInChild does for
	// a child of its own): wait for the launcher's id maps, a new session
	// (no controlling terminal: CVE-2017-5226), root mode root of the new
	// user namespace (the leased block's first id), the parent-death
	// signal after that credential change (which clears it). Rootless
	// (SetGroups false: the namespace was made without privilege, only
	// the caller's own ids are mapped and setgroups is denied) the child
	// keeps the id it was mapped to: it holds the namespace's full
	// capability set from the clone, and no execve comes before the
	// tool's to take it away.
	b.step, b.who = StepLClone, "launcher"
	d := func(action, detail string) opDesc {
		return opDesc{action: "clone child: " + action, path: "(direct: the launcher's own child)", detail: detail}
	}
	b.sys(d("close", "the id-map pipe's write end"), unix.SYS_CLOSE, 0, noSlot, uintptr(f.Sync[1]))
	one := make([]byte, 1)
	rd := b.sys(opDesc{action: "clone child: wait for the id maps", path: "(direct: the launcher's own child)", check: "the launcher went away before writing the id maps"},
		unix.SYS_READ, 1, noSlot, uintptr(syncR), b.mem(one, unsafe.Pointer(&one[0])), 1)
	rd.check, rd.want = true, 1
	b.close(d("close", "the id-map pipe"), syncR)
	b.sys(d("setsid", ""), unix.SYS_SETSID, 0, noSlot)
	rootIDs := func() { // root mode; a join's after its fork (0a)
		b.sys(d("setgroups", "[]"), unix.SYS_SETGROUPS, 0, noSlot, 0, 0)
		b.sys(d("setresgid", "0"), unix.SYS_SETRESGID, 0, noSlot, 0, 0, 0)
		b.sys(d("setresuid", "0"), unix.SYS_SETRESUID, 0, noSlot, 0, 0, 0)
	}
	if cfg.SetGroups && cfg.Join == nil {
		rootIDs()
	}
	b.sys(d("prctl", "PR_SET_PDEATHSIG SIGKILL"), unix.SYS_PRCTL, 0, noSlot, unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL))

	// 0. The plan is this Program: nothing to read.
	b.who = "nsinit"

	// 0a. str bwrap's --userns, --pidns, in the order SECURITY.md ("Joining
	// namespaces") explains; the fork's child checks its parent lives
	// once its parent-death signal is armed (again at step 17).
	relay, relayCheck := slotID(noSlot), opDesc{action: "check the clone child", path: "its pidfd", check: "the clone child exited during setup"}
	if j := cfg.Join; j != nil {
		b.step = StepJoinNS
		b.sys(opDesc{action: "prctl", path: "PR_SET_DUMPABLE", detail: "0: no ptrace of the launcher's memory from the joined namespace"}, unix.SYS_PRCTL, 0, noSlot, unix.PR_SET_DUMPABLE, 0)
		b.sys(opDesc{action: "setns", path: fmt.Sprintf("fd %d", j.UserNS), detail: "CLONE_NEWUSER", hint: "not a user namespace, or the caller's own, or one not below it", hintErrno: unix.EINVAL},
			unix.SYS_SETNS, 0, noSlot, uintptr(j.UserNS), unix.CLONE_NEWUSER)
		b.sys(opDesc{action: "unshare", detail: fmt.Sprintf("%#x", j.Unshare)}, unix.SYS_UNSHARE, 0, noSlot, uintptr(j.Unshare))
		if j.PidNS >= 0 {
			b.sys(opDesc{action: "setns", path: fmt.Sprintf("fd %d", j.PidNS), detail: "CLONE_NEWPID"}, unix.SYS_SETNS, 0, noSlot, uintptr(j.PidNS), unix.CLONE_NEWPID)
		}
		pid := b.slot(0)
		relay = b.slot(0)
		b.sys(opDesc{action: "getpid"}, unix.SYS_GETPID, 0, pid)
		b.sys(opDesc{action: "pidfd_open", path: "the clone child"}, unix.SYS_PIDFD_OPEN, 1, relay, uintptr(pid), 0)
		b.special(opFork, nil, 0, 0, opDesc{action: "fork", detail: "into the sandbox's pid namespace"})
		if cfg.SetGroups {
			rootIDs() // before any mount: its files need an owner the joined namespace maps
		}
		b.sys(opDesc{action: "prctl", path: "PR_SET_PDEATHSIG", detail: "SIGKILL"}, unix.SYS_PRCTL, 0, noSlot, unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL))
		b.special(opCheckPoll, nil, uintptr(relay), unix.POLLIN, relayCheck).slotArgs = 1
		moves = append(moves, relay)
	}

	// 1. Every descriptor the child takes moves above the tool's (3+n
	// on), close-on-exec; then the tool's 0-2 and pass-list are put in
	// place without it, and everything from 3+n on is marked
	// close-on-exec: the tool gets exactly 0-2 and the pass-list (runc's
	// leaked descriptor, CVE-2024-21626, is the bug this prevents).
	b.step = StepCloseFDs
	for _, s := range moves {
		b.sys(opDesc{action: "move descriptor", path: fmt.Sprintf("fd %d", p.slots[s]), detail: fmt.Sprintf("F_DUPFD_CLOEXEC %d", 3+n)},
			unix.SYS_FCNTL, 1, s, uintptr(s), unix.F_DUPFD_CLOEXEC, uintptr(3+n))
	}
	// Every other descriptor the clone copied from the launcher (its
	// clients, other sandboxes' pipes and sockets) is closed now, not at
	// the execve: a pre-built sandbox waits long before it, and an end of
	// another sandbox's report socket held here would keep its EOF away.
	p.keep = append(p.keep, moves)
	b.special(opCloseOthers, unsafe.Pointer(&moves[0]), uintptr(3+n), uintptr(len(moves)),
		opDesc{action: "close the launcher's other descriptors", path: fmt.Sprintf("fd %d..", 3+n)})
	for i, s := range tools {
		b.sys(opDesc{action: "dup3", path: fmt.Sprintf("fd -> %d", i), detail: "the tool's descriptor"},
			unix.SYS_DUP3, 1, noSlot, uintptr(s), uintptr(i), 0)
	}
	b.sys(opDesc{action: "close_range", path: fmt.Sprintf("fd %d..", 3+n), detail: "CLOSE_RANGE_CLOEXEC"},
		unix.SYS_CLOSE_RANGE, 0, noSlot, uintptr(3+n), ^uintptr(0)>>32, unix.CLOSE_RANGE_CLOEXEC)

	// 2. Every mount private: nothing we mount may propagate to the
	// host's mount namespace, and host mount events must not reach us.
	b.step = StepMakePrivate
	b.sys(opDesc{action: "make private", path: "/", detail: "MS_REC|MS_PRIVATE", hint: hintUserns},
		unix.SYS_MOUNT, 0, noSlot, 0, b.cstr("/"), 0, unix.MS_REC|unix.MS_PRIVATE, 0)

	// 3. The bind sources: the launcher's trees (taken above), or, for a
	// mount with TreeFD 0 (rootless), a tree the child clones itself as
	// the caller's own host uid (cloneSource), now: step 4 hides the
	// host's staging dir. The cgroup v1 tasks files are opened now too,
	// for step 12.
	b.step = StepCloneSources
	ms, copied := cfg.Mounts, false
	mountTree := make([]slotID, len(ms))
	isDir := make([]bool, len(ms))
	for i, m := range ms {
		mountTree[i] = noSlot
		if m.Kind != MountBind && m.Kind != MountDevNode {
			continue
		}
		var st unix.Stat_t
		var err error
		switch k := m.TreeFD - b.first; {
		case m.TreeFD == SourceAbsent && !m.Optional:
			return p, stepErr(StepCloneSources, "take bind source", m.Source, "tree_fd -1", errors.New("the launcher skipped a source that is not optional"))
		case m.TreeFD == SourceAbsent:
			continue // optional, and the launcher found it missing (L3)
		case m.TreeFD == 0:
			// Rootless: the launcher only looks whether the source is a
			// directory (so is its mount point, made at step 5) and whether
			// it is optional and missing: then it is skipped, as L3 skips
			// it in root mode (and rootEntries). Any other error is left to
			// the child's own open, whose error is the step's.
			stat := unix.Stat
			if m.NoFollow {
				stat = unix.Lstat
			}
			if err = stat(m.Source, &st); err != nil && m.Optional && errors.Is(err, unix.ENOENT) {
				if !copied {
					ms, copied = slices.Clone(ms), true
				}
				ms[i].TreeFD = SourceAbsent
				continue
			}
			mountTree[i] = b.cloneSource(m)
		case k >= 0 && k < len(trees):
			mountTree[i] = trees[k]
			if err = unix.Fstat(f.Trees[k], &st); err != nil {
				return p, stepErr(StepCloneSources, "take bind source", m.Source, "fstat tree", err)
			}
		default:
			return p, stepErr(StepCloneSources, "take bind source", m.Source, fmt.Sprintf("tree_fd %d", m.TreeFD),
				fmt.Errorf("not one of the launcher's %d trees", len(trees)))
		}
		isDir[i] = err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR
	}
	tasks := make([]slotID, len(cfg.CgroupTasks))
	for i, t := range cfg.CgroupTasks {
		tasks[i] = b.slot(0)
		b.sys(opDesc{action: "open cgroup tasks file", path: t, detail: "O_WRONLY"},
			unix.SYS_OPENAT, 0, tasks[i], atFDCWD, b.cstr(t), unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}

	// 4. A fresh tmpfs becomes the new root: nothing of the host is in it
	// but what step 5 binds; nosuid,nodev like every mount we make. The
	// umask is fixed first: the directories and files the child creates
	// (mount points, /etc/passwd) must be 0755/0644 for the tool's uid
	// whatever umask the launcher runs with (systemd's UMask=0027 would
	// make them unreadable); the tool inherits the same 022.
	b.step = StepRootTmpfs
	b.sys(opDesc{action: "umask", detail: "022"}, unix.SYS_UMASK, 0, noSlot, 0o022)
	b.sys(opDesc{action: "mount tmpfs root", path: staging, detail: "MS_NOSUID|MS_NODEV"},
		unix.SYS_MOUNT, 0, noSlot, b.cstr("tmpfs"), b.cstr(staging), b.cstr("tmpfs"), unix.MS_NOSUID|unix.MS_NODEV, b.cstr("mode=0755,size=1m"))
	root := b.slot(0)
	b.sys(opDesc{action: "open new root", path: staging, detail: "O_PATH"},
		unix.SYS_OPENAT, 0, root, atFDCWD, b.cstr(staging), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)

	// 5. The planned mounts, in plan order (parents before children).
	b.step = StepMounts
	for i, m := range ms {
		b.mount(cfg, root, m, mountTree[i], isDir[i])
	}

	// 6. pivot_root into the new root and detach the old one. The
	// pivot_root(".", ".") form stacks the old root on top of the new
	// one; the lazy unmount then removes every host mount from our view.
	b.step = StepPivotRoot
	b.sys(opDesc{action: "chdir", path: staging}, unix.SYS_FCHDIR, 1, noSlot, uintptr(root))
	b.sys(opDesc{action: "pivot_root", path: staging}, unix.SYS_PIVOT_ROOT, 0, noSlot, b.cstr("."), b.cstr("."))
	b.sys(opDesc{action: "detach old root", path: "/", detail: "MNT_DETACH"}, unix.SYS_UMOUNT2, 0, noSlot, b.cstr("."), unix.MNT_DETACH)
	b.sys(opDesc{action: "chdir", path: "/"}, unix.SYS_CHDIR, 0, noSlot, b.cstr("/"))
	b.close(opDesc{action: "close", path: "new root"}, root)

	// 7. The root tmpfs is read-only from now on: the tool writes only to
	// the work dir and the planned tmpfs mounts. A bubblewrap line's root
	// (RootToCommand) stays writable instead, and the entries made on it
	// (rootEntries: nothing mounted there) are chowned to the command's
	// ids without a directory walk.
	b.step = StepRootReadOnly
	if cfg.RootToCommand {
		owner := fmt.Sprintf("%d:%d", cfg.UID, cfg.GID)
		for _, e := range rootEntries(ms) {
			b.sys(opDesc{action: "chown", path: e, detail: owner}, unix.SYS_FCHOWNAT, 0, noSlot,
				atFDCWD, b.cstr(e), uintptr(cfg.UID), uintptr(cfg.GID), unix.AT_SYMLINK_NOFOLLOW)
		}
	} else {
		b.sys(opDesc{action: "remount read-only", path: "/", detail: "MS_REMOUNT|MS_BIND|MS_RDONLY|MS_NOSUID|MS_NODEV"},
			unix.SYS_MOUNT, 0, noSlot, 0, b.cstr("/"), 0, unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, 0)
	}

	// 8. chdir into the work dir and check we are where we meant to be
	// (a path that resolves elsewhere is refused, not followed).
	b.step = StepChdir
	wd := cmp.Or(cfg.Workdir, "/")
	b.sys(opDesc{action: "chdir", path: wd, hint: hintWorkdir, hintErrno: unix.EACCES}, unix.SYS_CHDIR, 0, noSlot, b.cstr(wd))
	// The planned path, NUL-terminated, then as much room for getcwd's
	// answer: a longer one (ERANGE) is not the planned one either.
	want := make([]byte, 2*(len(wd)+1))
	copy(want, wd)
	p.keep = append(p.keep, want)
	b.special(opCheckCwd, unsafe.Pointer(&want[0]), 0, uintptr(len(wd)+1),
		opDesc{action: "getcwd after chdir", path: wd, check: "working directory is not the planned one"})

	// 9. The hostname (own UTS namespace).
	b.step = StepHostname
	if cfg.Hostname != "" {
		h := []byte(cfg.Hostname)
		b.sys(opDesc{action: "sethostname", path: cfg.Hostname}, unix.SYS_SETHOSTNAME, 0, noSlot, b.mem(h, unsafe.Pointer(&h[0])), uintptr(len(h)))
	}

	// 10. Loopback up in the sandbox's own network namespace, then the
	// egress listeners on it, handed to the launcher before any tool code
	// runs: the tool finds them bound (it cannot take their ports) and
	// every byte it sends there reaches the launcher's policy proxy.
	b.step = StepLoopback
	if cfg.LoopbackUp {
		b.loopback()
	}
	if len(cfg.Listen) > 0 {
		b.listeners(cfg.Listen)
	}

	// 10a. A pre-built sandbox waits here for its call (argv, the whole
	// environment, the paths to try for argv[0], its stdio, dup3'd onto
	// 0-2 and nothing else), from the launcher only (the report socket's
	// other end): nothing before depends on the call, and everything from
	// step 11 on runs as in a one-shot run (SECURITY.md, "The resident
	// launcher", says why there).
	var call *callArea
	ncands := slotID(noSlot)
	if cfg.AwaitCall {
		b.step = StepAwaitCall
		ev := awaitRecord[:]
		w := b.sys(opDesc{action: "announce", path: "report socket", detail: "await_call", check: "short write"}, unix.SYS_WRITE, 1, noSlot,
			uintptr(p.report), b.mem(ev, unsafe.Pointer(&ev[0])), uintptr(len(ev)))
		w.check, w.want = true, uintptr(len(ev))
		call = p.mem.call
		ncands = b.slot(0)
		o := b.special(opAwaitCall, unsafe.Pointer(call), uintptr(p.report), 0,
			opDesc{action: "receive call", path: "report socket", detail: "recvmsg",
				check: fmt.Sprintf("a call is one message of at most %d bytes with %d descriptors, %d arguments, %d variables and %d paths", MaxCallBytes, CallFDs, MaxCallArgs, MaxCallEnv, MaxCallPaths)})
		o.out, o.slotArgs = ncands, 1
	}

	// 11. Resolve the tool in its PATH, inside; argv and envp are ready.
	b.step = StepResolveTool
	path := b.slot(0)
	var argvP, envpP uintptr
	tool := callToolName
	if call != nil {
		o := b.special(opResolve, unsafe.Pointer(&call.paths[0]), 0, uintptr(ncands),
			opDesc{action: "resolve tool", path: tool, detail: "PATH of the tool's environment"})
		o.out, o.exit, o.slotArgs = path, exitResolve, 2
		// argv[0] is the resolved path, or the plan's Argv0 (bubblewrap's
		// --argv0 with --block-fd), over the call's own.
		from := path
		if cfg.Argv0 != "" {
			from = b.slot(b.cstr(cfg.Argv0))
		}
		b.special(opStorePtr, unsafe.Pointer(&call.argv[0]), uintptr(from), 0, opDesc{action: "prepare execve", path: tool})
		argvP, envpP = uintptr(unsafe.Pointer(&call.argv[0])), uintptr(unsafe.Pointer(&call.env[0]))
	} else {
		if len(cfg.Argv) == 0 {
			return p, stepErr(StepResolveTool, "resolve tool", "", "", errors.New("empty argv"))
		}
		tool = cfg.Argv[0]
		cands := b.cstrs(candidates(cfg.Argv[0], cfg.Env))
		o := b.special(opResolve, unsafe.Pointer(&cands[0]), 0, uintptr(len(cands)-1),
			opDesc{action: "resolve tool", path: cfg.Argv[0], detail: "PATH of the tool's environment"})
		o.out, o.exit = path, exitResolve
		argv, envp := b.cstrs(cfg.Argv), b.cstrs(cfg.Env)
		if cfg.Argv0 != "" {
			argv[0] = b.cstr(cfg.Argv0)
		} else {
			b.special(opStorePtr, unsafe.Pointer(&argv[0]), uintptr(path), 0, opDesc{action: "prepare execve", path: cfg.Argv[0]})
		}
		argvP, envpP = uintptr(unsafe.Pointer(&argv[0])), uintptr(unsafe.Pointer(&envp[0]))
	}
	// 12. cgroup v1: the child moves itself into the sandbox's cgroup,
	// before it drops anything and before any tool code can run. A thread
	// moving itself ("0" in tasks) takes no global lock; migrating the
	// process from the launcher waits for an RCU grace period.
	b.step = StepEnterCgroup
	zero := []byte("0")
	for i, t := range cfg.CgroupTasks {
		w := b.sys(opDesc{action: "enter cgroup", path: t, detail: "write 0 (this thread)", check: "short write"},
			unix.SYS_WRITE, 1, noSlot, uintptr(tasks[i]), b.mem(zero, unsafe.Pointer(&zero[0])), 1)
		w.check, w.want = true, 1
		b.close(opDesc{action: "close", path: t}, tasks[i])
	}

	// 13. Empty the bounding set (but the kept capabilities, cfg.Caps)
	// so no later exec (setuid or file-caps binary) can ever regain a
	// capability. Needs CAP_SETPCAP, so it comes before step 15.
	// A kept capability that is not inheritable (a root caller's own,
	// str bwrap) reaches the command only through the bounding set, at
	// its execve as uid 0: check it is there.
	b.step = StepDropBounding
	keep := cfg.Caps & (1<<(lastCap+1) - 1)
	inh := keep & cfg.Inheritable
	for c := 0; c <= lastCap; c++ {
		switch {
		case keep>>c&1 == 0:
			b.sys(opDesc{action: "drop bounding capability", path: "cap " + strconv.Itoa(c), detail: "PR_CAPBSET_DROP"},
				unix.SYS_PRCTL, 0, noSlot, unix.PR_CAPBSET_DROP, uintptr(c)).okErr = uint16(unix.EINVAL)
		case inh>>c&1 == 0:
			r := b.sys(opDesc{action: "read bounding capability", path: "cap " + strconv.Itoa(c), detail: "PR_CAPBSET_READ", check: "a kept capability is not in the bounding set"},
				unix.SYS_PRCTL, 0, noSlot, unix.PR_CAPBSET_READ, uintptr(c))
			r.check, r.want = true, 1
		}
	}

	// 14. Ambient capabilities would survive the exec: clear them.
	b.step = StepClearAmbient
	b.sys(opDesc{action: "clear ambient capabilities", detail: "PR_CAP_AMBIENT_CLEAR_ALL"},
		unix.SYS_PRCTL, 0, noSlot, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL)

	// 15. Identity: groups, then gid, then uid (after the uid change the
	// child could no longer change groups or gid).
	b.step = StepSetIDs
	if cfg.SetGroups {
		b.sys(opDesc{action: "setgroups", path: "[]"}, unix.SYS_SETGROUPS, 0, noSlot, 0, 0)
	}
	b.sys(opDesc{action: "setresgid", path: fmt.Sprint(cfg.GID)}, unix.SYS_SETRESGID, 0, noSlot, uintptr(cfg.GID), uintptr(cfg.GID), uintptr(cfg.GID))
	b.sys(opDesc{action: "setresuid", path: fmt.Sprint(cfg.UID)}, unix.SYS_SETRESUID, 0, noSlot, uintptr(cfg.UID), uintptr(cfg.UID), uintptr(cfg.UID))

	// 16. Effective and permitted sets: the kept ones, else empty (uid 0
	// inside, or a rootless child, relies on this step); the inheritable
	// ones (of the kept) also ambient, so that an execve keeps them for
	// any uid (uid 0 gets the bounding set's back at its execve anyway).
	b.step = StepClearCaps
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	lo, hi := uint32(keep), uint32(keep>>32)
	data := &[2]unix.CapUserData{{Effective: lo, Permitted: lo, Inheritable: uint32(inh)}, {Effective: hi, Permitted: hi, Inheritable: uint32(inh >> 32)}}
	b.sys(opDesc{action: "capset", path: fmt.Sprintf("kept %#x", keep)}, unix.SYS_CAPSET, 0, noSlot,
		b.mem(hdr, unsafe.Pointer(hdr)), b.mem(data, unsafe.Pointer(&data[0])))
	for k := inh; k != 0; k &= k - 1 {
		c := bits.TrailingZeros64(k)
		b.sys(opDesc{action: "raise ambient capability", path: "cap " + strconv.Itoa(c)}, unix.SYS_PRCTL, 0, noSlot, unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c))
	}

	// 17. The uid change of step 15 cleared the parent-death signal armed
	// at L4 (the kernel does so on every credential change): set it again,
	// then make sure the launcher did not die in between, or the tool
	// could outlive it. The report socket's other end is the launcher's:
	// POLLERR or POLLHUP on ours means it is gone.
	b.step = StepParentDeath
	b.sys(opDesc{action: "prctl", path: "PR_SET_PDEATHSIG", detail: "SIGKILL"}, unix.SYS_PRCTL, 0, noSlot, unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL))
	b.special(opCheckPoll, nil, uintptr(p.report), unix.POLLOUT,
		opDesc{action: "check launcher", path: "report socket", detail: "POLLERR", check: "the launcher exited during setup"}).slotArgs = 1
	if relay != noSlot {
		b.special(opCheckPoll, nil, uintptr(relay), unix.POLLIN, relayCheck).slotArgs = 1 // after a join: the parent too
	}

	// 18. no_new_privs: exec can never grant privileges again (setuid
	// bits, file capabilities), and it lets an unprivileged child load
	// seccomp.
	b.step = StepNoNewPrivs
	b.sys(opDesc{action: "prctl", path: "PR_SET_NO_NEW_PRIVS"}, unix.SYS_PRCTL, 0, noSlot, unix.PR_SET_NO_NEW_PRIVS, 1)

	// 19. seccomp, after every setup call above, so the filter need not
	// allow mount, pivot_root, capset or setresuid for us: the profile's
	// filter (when the plan has one: a str bwrap line's own filters may
	// replace it), then the caller's own, through prctl(PR_SET_SECCOMP)
	// as bubblewrap loads them (a filter before the last must allow
	// prctl, not seccomp); the kernel runs every filter and the strictest
	// answer wins. They must allow what steps 19a-21 need (sendmsg and
	// close for a template, prlimit64, execve). A per-tool template's
	// filter is loaded with a listener (seccomp(2)) that 19a hands over.
	b.step = StepSeccomp
	if cfg.SeccompListener && len(cfg.Seccomp) == 0 {
		return p, stepErr(StepSeccomp, "load seccomp", "", "SECCOMP_FILTER_FLAG_NEW_LISTENER", errors.New("a template's plan has no filter"))
	}
	progs, names := cfg.ExtraSeccomp, make([]string, len(cfg.ExtraSeccomp))
	for i := range names {
		names[i] = fmt.Sprintf("the caller's filter %d", i+1)
	}
	if len(cfg.Seccomp) > 0 {
		progs, names = append([][]byte{cfg.Seccomp}, progs...), append([]string{cfg.SeccompPolicy}, names...)
	}
	listener := slotID(noSlot)
	for i, prog := range progs {
		detail, nr, a0, a1 := "PR_SET_SECCOMP", uintptr(unix.SYS_PRCTL), uintptr(unix.PR_SET_SECCOMP), uintptr(unix.SECCOMP_MODE_FILTER)
		if i == 0 && cfg.SeccompListener {
			detail, nr, a0, a1 = "SECCOMP_SET_MODE_FILTER|SECCOMP_FILTER_FLAG_NEW_LISTENER", unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER
			listener = b.slot(0)
		}
		if err := checkFilter(prog); err != nil {
			return p, stepErr(StepSeccomp, "load seccomp", names[i], detail, err)
		}
		fp := &unix.SockFprog{Len: uint16(len(prog) / 8), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
		p.keep = append(p.keep, prog)
		o := b.sys(opDesc{action: "load seccomp", path: names[i], detail: detail}, nr, 0, noSlot, a0, a1, b.mem(fp, unsafe.Pointer(fp)))
		if nr == unix.SYS_SECCOMP {
			o.out = listener
		}
	}

	// 19a. A template's listener goes to the launcher before any tool
	// code runs, and the child's own descriptor is closed here, not left
	// to close-on-exec: the tool (the template's import-time code) must
	// never hold the listener that answers its own notifications.
	if listener != noSlot {
		b.step = StepHandListener
		b.sendFDs(seccompLstRecord[:], []slotID{listener},
			opDesc{action: "hand over seccomp listener", path: "report socket", detail: "SCM_RIGHTS"})
		b.close(opDesc{action: "close", path: "seccomp listener"}, listener)
	}

	// 20. The rlimits, as raw prlimit64 calls on the child itself right
	// before the execve: the tool never runs one instruction without them,
	// and no helper program sits in between. RLIMIT_AS last; each at most
	// the hard limit the child inherits (it cannot raise one, and lower
	// is tighter).
	b.step = StepRlimits
	for _, rl := range rlimitOrder(cfg.Rlimits) {
		max, err := hardLimit(rl.Resource)
		if err != nil {
			return p, stepErr(StepRlimits, "getrlimit", rl.Name, "the launcher's hard limit", err)
		}
		v := min(rl.Value, max)
		lim := &unix.Rlimit{Cur: v, Max: v}
		b.sys(opDesc{action: "prlimit64", path: rl.Name, detail: fmt.Sprint(v)},
			unix.SYS_PRLIMIT64, 0, noSlot, 0, uintptr(rl.Resource), b.mem(lim, unsafe.Pointer(lim)), 0)
	}

	// 21. execve: the tool becomes PID 1. The report socket is
	// close-on-exec, so the launcher sees EOF exactly when the tool starts
	// (or the child reports why not). The child is a session leader with
	// no controlling terminal (setsid at L4), so TIOCSTI cannot push input
	// into the caller's terminal (CVE-2017-5226).
	b.step = StepExec
	o := b.sys(opDesc{action: "execve", path: tool}, unix.SYS_EXECVE, 1, noSlot, uintptr(path), argvP, envpP)
	o.exit = exitExec
	return p, b.err // the first operation that could not be built, if any
}

// str's own exit codes, the same for `str run` and the init: a tool's own
// status is passed through unchanged, so these are the only values str
// adds (with 124, timed out, which only the launcher knows).
const (
	ExitSetupFailed = 125 // a setup step failed; the report socket says which
	ExitCannotExec  = 126 // the tool exists but could not be executed
	ExitNotFound    = 127 // the tool was not found inside the sandbox
)

// staging is where the new root is assembled before pivot_root. It is
// inside the child's private mount namespace, so the host never sees it;
// every bind source is taken (step 3) before the staging tmpfs is
// mounted, so host paths under /tmp stay reachable.
const staging = "/tmp"

// rlimitOrder is the order step 20 sets rls in: the plan's, with
// RLIMIT_AS moved last (after it, the process could not even map a page).
func rlimitOrder(rls []Rlimit) []Rlimit {
	isAS := func(rl Rlimit) bool { return rl.Resource == unix.RLIMIT_AS }
	out := slices.DeleteFunc(slices.Clone(rls), isAS)
	for _, rl := range rls {
		if isAS(rl) {
			out = append(out, rl)
		}
	}
	return out
}

// checkFilter: filter is 1 to maxBPFInsns whole sock_filter records (the
// one check of a Program's step 19).
func checkFilter(filter []byte) error {
	if len(filter) == 0 || len(filter)%8 != 0 || len(filter)/8 > maxBPFInsns {
		return fmt.Errorf("seccomp program of %d bytes is not 1-%d sock_filter records", len(filter), maxBPFInsns)
	}
	return nil
}

// maxBPFInsns is the kernel's BPF_MAXINSNS.
const maxBPFInsns = 4096

// atFDCWD is AT_FDCWD as a system call argument.
const atFDCWD = ^uintptr(99) // -100

// candidates are the paths to try for argv0, in order: argv0 itself when
// it has a slash, else each directory of the environment's PATH (the
// last PATH= wins; /usr/local/bin:/usr/bin:/bin without one) joined
// with it. The child tries them in order on the prepared list
// (opResolve).
func candidates(argv0 string, env []string) []string {
	if strings.Contains(argv0, "/") {
		return []string{argv0}
	}
	pathEnv := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathEnv = v
		}
	}
	var out []string
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir != "" {
			out = append(out, filepath.Join(dir, argv0))
		}
	}
	if len(out) == 0 {
		out = []string{""} // an empty PATH: nothing found (ENOENT)
	}
	return out
}

// mkdirAll is the init's mkdirAll as operations: every component created
// (EEXIST is fine) and opened O_PATH|O_NOFOLLOW|O_DIRECTORY from the one
// before; the last gets mode exactly when it was created here. It
// returns the slot of the last component's descriptor (root for "/").
func (b *builder) mkdirAll(root slotID, path string, mode uint32, target string) slotID {
	mode = cmp.Or(mode, 0o755)
	comps, err := components(path)
	if err != nil {
		b.fail(stepErr(b.step, "mkdir", target, "", err))
		return root
	}
	cur := root
	for i, c := range comps {
		last := i == len(comps)-1
		m := parentMode(mode)
		if last {
			m = mode
		}
		existed := b.scratch
		mk := b.sys(opDesc{action: "mkdir", path: target, prefix: "mkdir " + c + ": "}, unix.SYS_MKDIRAT, 1, noSlot, uintptr(cur), b.cstr(c), uintptr(m))
		mk.okErr, mk.hit = uint16(unix.EEXIST), existed
		next := b.slot(0)
		b.sys(opDesc{action: "mkdir", path: target, prefix: "open " + c + ": "}, unix.SYS_OPENAT, 1, next,
			uintptr(cur), b.cstr(c), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		b.closeSlot(cur, root, target)
		cur = next
		if last && m&^0o755 != 0 {
			// Bits the umask removed, or sticky/setgid: through the
			// descriptor just opened, only on a directory made here.
			buf := b.fdPath(cur, opDesc{action: "mkdir", path: target})
			b.p.ops[len(b.p.ops)-1].cond = existed
			ch := b.sys(opDesc{action: "mkdir", path: target, prefix: fmt.Sprintf("chmod %s %#o: ", c, m)},
				unix.SYS_FCHMODAT, 0, noSlot, atFDCWD, buf, uintptr(m), 0)
			ch.cond = existed
		}
	}
	return cur
}

// fdPathPrefix is what opFdPath's buffer starts with; the child writes
// the descriptor's number after it.
const fdPathPrefix = "/proc/self/fd/"

// fdPath adds the operation that names the descriptor in slot fd as
// /proc/self/fd/N and returns the name's address.
func (b *builder) fdPath(fd slotID, d opDesc) uintptr {
	buf := make([]byte, 32)
	copy(buf, fdPathPrefix)
	b.p.keep = append(b.p.keep, buf)
	b.special(opFdPath, unsafe.Pointer(&buf[len(fdPathPrefix)]), uintptr(fd), 0, d)
	return uintptr(unsafe.Pointer(&buf[0]))
}

// closeSlot closes a descriptor the program opened (never root's).
func (b *builder) closeSlot(s, root slotID, what string) {
	if s != root {
		b.close(opDesc{action: "close", path: what}, s)
	}
}

// openNoFollow is the init's openNoFollow: each component O_PATH|
// O_NOFOLLOW from the one before, a symlink refused.
func (b *builder) openNoFollow(root slotID, path string) slotID {
	cur := root
	comps, err := components(path)
	if err != nil {
		b.fail(stepErr(b.step, "open", path, "O_PATH|O_NOFOLLOW", err))
		return root
	}
	for _, c := range comps {
		next, d := b.slot(0), opDesc{action: "open", path: path, detail: "O_PATH|O_NOFOLLOW", prefix: "open " + c + ": "}
		b.sys(d, unix.SYS_OPENAT, 1, next, uintptr(cur), b.cstr(c), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		b.closeSlot(cur, root, path)
		d.check = "open " + c + ": " + errSymlinkOnPath.Error()
		b.special(opCheckLink, nil, uintptr(next), 0, d)
		cur = next
	}
	return cur
}

// mount is one planned mount (step 5), under the new root (slot root).
// Targets are created inside our own fresh tmpfs with a walk that never
// follows a symlink (mkdirAll, openNoFollow), so no path we create can
// redirect a mount. A bind's tree (slot tree) is a directory when dir.
func (b *builder) mount(cfg *Config, root slotID, m Mount, tree slotID, dir bool) {
	if !filepath.IsAbs(m.Target) || filepath.Clean(m.Target) != m.Target {
		b.fail(stepErr(StepMounts, "check target", m.Target, "", errors.New("target must be absolute and clean")))
		return
	}
	parent, name := filepath.Split(m.Target)
	switch m.Kind {
	case MountDir:
		b.closeSlot(b.mkdirAll(root, m.Target, m.Mode, m.Target), root, m.Target)

	case MountSymlink:
		dfd := b.mkdirAll(root, parent, 0o755, parent)
		b.sys(opDesc{action: "symlink", path: m.Target, detail: "-> " + m.Source}, unix.SYS_SYMLINKAT, 2, noSlot, b.cstr(m.Source), uintptr(dfd), b.cstr(name))
		b.closeSlot(dfd, root, parent)

	case MountFile:
		dfd := b.mkdirAll(root, parent, 0o755, parent)
		mode := cmp.Or(m.Mode, 0o644)
		fd := b.slot(0)
		b.sys(opDesc{action: "create file", path: m.Target, detail: "O_CREAT|O_EXCL"}, unix.SYS_OPENAT, 1, fd,
			uintptr(dfd), b.cstr(name), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uintptr(mode))
		wd := opDesc{action: "write file", path: m.Target, detail: fmt.Sprintf("mode %#o", mode), check: "short write"}
		b.sys(wd, unix.SYS_FCHMOD, 1, noSlot, uintptr(fd), uintptr(mode))
		if cfg.RootToCommand {
			// The command's, now: a read-only one is bound onto itself
			// below, where step 7's chown does not reach.
			b.sys(wd, unix.SYS_FCHOWN, 1, noSlot, uintptr(fd), uintptr(cfg.UID), uintptr(cfg.GID))
		}
		if len(m.Contents) > 0 {
			c := []byte(m.Contents)
			w := b.sys(wd, unix.SYS_WRITE, 1, noSlot, uintptr(fd), b.mem(c, unsafe.Pointer(&c[0])), uintptr(len(c)))
			w.check, w.want = true, uintptr(len(c))
		}
		b.close(wd, fd)
		if m.ReadOnly {
			rd := opDesc{action: "bind read-only", path: m.Target, detail: "open_tree|mount_setattr MOUNT_ATTR_RDONLY|move_mount"}
			t := b.slot(0)
			b.sys(rd, unix.SYS_OPEN_TREE, 1, t, uintptr(dfd), b.cstr(name), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
			attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
			b.sys(rd, unix.SYS_MOUNT_SETATTR, 1, noSlot, uintptr(t), b.cstr(""), unix.AT_EMPTY_PATH, b.mem(attr, unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
			b.sys(rd, unix.SYS_MOVE_MOUNT, 1|4, noSlot, uintptr(t), b.cstr(""), uintptr(dfd), b.cstr(name), unix.MOVE_MOUNT_F_EMPTY_PATH)
			b.close(rd, t)
		}
		b.closeSlot(dfd, root, parent)

	case MountRemountRO:
		fd := b.openNoFollow(root, m.Target)
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
		b.sys(opDesc{action: "remount read-only", path: m.Target, detail: "mount_setattr MOUNT_ATTR_RDONLY"},
			unix.SYS_MOUNT_SETATTR, 1, noSlot, uintptr(fd), b.cstr(""), unix.AT_EMPTY_PATH, b.mem(attr, unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
		b.closeSlot(fd, root, m.Target)

	case MountChmod:
		fd := b.openNoFollow(root, m.Target)
		d := opDesc{action: "chmod", path: m.Target, detail: fmt.Sprintf("%#o", m.Mode)}
		buf := b.fdPath(fd, d)
		b.sys(d, unix.SYS_FCHMODAT, 0, noSlot, atFDCWD, buf, uintptr(m.Mode), 0)
		b.closeSlot(fd, root, m.Target)

	case MountBind, MountDevNode:
		if tree == noSlot {
			return // optional and absent on the host
		}
		var target slotID
		if dir {
			target = b.mkdirAll(root, m.Target, 0o755, m.Target)
		} else {
			dfd := b.mkdirAll(root, parent, 0o755, m.Target)
			// 0444: a file mount point is never written through (the bind
			// hides it); one left on a bound host directory says so.
			mp := opDesc{action: "create mount point", path: m.Target}
			f := b.slot(0)
			b.sys(mp, unix.SYS_OPENAT, 1, f, uintptr(dfd), b.cstr(name), unix.O_RDONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o444)
			b.close(mp, f)
			target = b.slot(0)
			b.sys(mp, unix.SYS_OPENAT, 1, target, uintptr(dfd), b.cstr(name), unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			b.closeSlot(dfd, root, parent)
		}
		// Recursive attributes on the detached tree before it is attached:
		// there is never a moment where the bind is visible writable.
		// Then move_mount attaches it here with no host privilege; it has
		// no MNT_LOCKED flags, which is safe because the child never
		// unmounts or clears a flag and the tool has no capability (steps
		// 13-16) and no mount syscalls (SECURITY.md, "The init's sequence").
		a, what := bindAttr(m)
		attr := &a
		b.sys(opDesc{action: "mount_setattr", path: m.Source, detail: what + " AT_RECURSIVE"}, unix.SYS_MOUNT_SETATTR, 1, noSlot,
			uintptr(tree), b.cstr(""), unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, b.mem(attr, unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
		b.sys(opDesc{action: "bind-mount", path: m.Source + " -> " + m.Target, detail: "move_mount"}, unix.SYS_MOVE_MOUNT, 1|4, noSlot,
			uintptr(tree), b.cstr(""), uintptr(target), b.cstr(""), unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		b.closeSlot(target, root, m.Target)
		b.close(opDesc{action: "close", path: m.Source}, tree)

	case MountTmpfs, MountDevpts, MountMqueue, MountProc:
		// A fresh instance of the filesystem the kind names, never one of
		// the host's, mounted through /proc/self/fd (the host's /proc,
		// before pivot_root) on the target's O_PATH descriptor.
		target := b.mkdirAll(root, m.Target, 0o755, m.Target)
		d := opDesc{action: "mount " + string(m.Kind), path: m.Target, detail: m.Data}
		flags, data := uintptr(unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC), ""
		switch m.Kind {
		case MountTmpfs:
			flags, data = unix.MS_NOSUID|unix.MS_NODEV, m.Data
			if m.ReadOnly {
				flags |= unix.MS_RDONLY
			}
		case MountDevpts:
			flags, data = unix.MS_NOSUID|unix.MS_NOEXEC, m.Data
		case MountMqueue:
			d.detail = "MS_NOSUID|MS_NODEV|MS_NOEXEC"
		case MountProc:
			d.detail, d.hint = "fresh procfs for the new pid namespace", hintProc
		}
		buf, dp := b.fdPath(target, d), uintptr(0) // no data: NULL
		if data != "" {
			dp = b.cstr(data)
		}
		o := b.sys(d, unix.SYS_MOUNT, 0, noSlot, b.cstr(string(m.Kind)), buf, b.cstr(string(m.Kind)), flags, dp)
		if m.Kind == MountProc && cfg.BestEffort {
			// Best effort, loudly: no /proc at all rather than the host's
			// (a warning record, and the program goes on).
			o.kind = opSysWarn
			b.p.descs[len(b.p.descs)-1].warning = "best_effort: no fresh " + m.Target + " (%v); the tool runs without " + m.Target
		}
		b.closeSlot(target, root, m.Target)

	default:
		b.fail(stepErr(StepMounts, "mount", m.Target, string(m.Kind), errors.New("unknown mount kind")))
	}
}

// rootEntries are "/" and every entry the mounts make on the root tmpfs
// itself, parents before children: what giveRootEntries would find on
// the root's own mount. An entry that is a mount target, or lies below
// one, is not the root's (what is mounted there is left as it is, and an
// entry made under a mount point, before or after its mount, is not on
// the root's mount either); a file bound read-only onto itself is such a
// target too (MountFile chowns it at its creation).
func rootEntries(ms []Mount) []string {
	targets := map[string]bool{}
	for _, m := range ms {
		switch m.Kind {
		case MountBind, MountDevNode, MountTmpfs, MountProc, MountMqueue, MountDevpts:
			targets[m.Target] = targets[m.Target] || m.TreeFD != SourceAbsent // an absent bind is never mounted
		case MountFile:
			targets[m.Target] = targets[m.Target] || m.ReadOnly
		}
	}
	covered := func(p string) bool {
		for q := p; q != "/"; q = filepath.Dir(q) {
			if targets[q] {
				return true
			}
		}
		return false
	}
	seen := map[string]bool{"/": true}
	out := []string{"/"}
	for _, m := range ms {
		if m.Kind == MountChmod || m.Kind == MountRemountRO || m.TreeFD == SourceAbsent {
			continue // they make nothing (an absent bind not even its mount point)
		}
		// Its missing parents, then the target itself.
		comps := strings.Split(strings.Trim(m.Target, "/"), "/")
		for i := range comps {
			if p := "/" + strings.Join(comps[:i+1], "/"); !seen[p] && !covered(p) {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

// loopback brings lo up: SIOCGIFFLAGS, IFF_UP added, SIOCSIFFLAGS.
func (b *builder) loopback() {
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		b.fail(err)
		return
	}
	// unix.Ifreq is the kernel's struct ifreq: the name, then the union
	// whose first 16 bits are ifr_flags.
	raw := (*[unix.IFNAMSIZ + 24]byte)(unsafe.Pointer(ifr))
	d := opDesc{action: "bring up", path: "lo", detail: "SIOCSIFFLAGS IFF_UP"}
	s := b.slot(0)
	b.sys(d, unix.SYS_SOCKET, 0, s, unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	p := b.mem(ifr, unsafe.Pointer(raw))
	b.sys(opDesc{action: "bring up", path: "lo", detail: "SIOCSIFFLAGS IFF_UP", prefix: "SIOCGIFFLAGS lo: "}, unix.SYS_IOCTL, 1, noSlot, uintptr(s), unix.SIOCGIFFLAGS, p)
	b.special(opOr16, unsafe.Pointer(&raw[unix.IFNAMSIZ]), 0, unix.IFF_UP, d)
	b.sys(opDesc{action: "bring up", path: "lo", detail: "SIOCSIFFLAGS IFF_UP", prefix: "SIOCSIFFLAGS lo: "}, unix.SYS_IOCTL, 1, noSlot, uintptr(s), unix.SIOCSIFFLAGS, p)
	b.close(d, s)
}

// listeners is openListeners and the hand-over of step 10 as
// operations: each socket bound (and listening), then one "listeners"
// event with their descriptors (SCM_RIGHTS), then closed here.
func (b *builder) listeners(ls []Listener) {
	d := func(prefix string) opDesc { return opDesc{action: "open egress listeners", path: "lo", prefix: prefix} }
	fds := make([]slotID, len(ls))
	for i, l := range ls {
		typ, err := ListenerSocketType(l)
		ap, aerr := ListenerAddr(l)
		if err = cmp.Or(err, aerr); err != nil {
			b.fail(stepErr(StepLoopback, "open egress listeners", "lo", "", err))
			return
		}
		fds[i] = b.slot(0)
		b.sys(d("listener "+l.Name+": socket: "), unix.SYS_SOCKET, 0, fds[i], unix.AF_INET, uintptr(typ|unix.SOCK_CLOEXEC), 0)
		sa := &unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: ap.Addr().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
		b.sys(d(fmt.Sprintf("listener %s: bind %s: ", l.Name, l.Addr)), unix.SYS_BIND, 1, noSlot, uintptr(fds[i]), b.mem(sa, unsafe.Pointer(sa)), unix.SizeofSockaddrInet4)
		if l.Network == "tcp" {
			b.sys(d(fmt.Sprintf("listener %s: listen %s: ", l.Name, l.Addr)), unix.SYS_LISTEN, 1, noSlot, uintptr(fds[i]), 128)
		}
	}
	// The event is one fixed record, not JSON: the launcher that compiled
	// the program knows the listeners' names and order (Event).
	b.p.listen = ls
	b.sendFDs(listenersRecord[:], fds, opDesc{action: "hand over egress listeners", path: "report socket", detail: "SCM_RIGHTS"})
	for i := range ls {
		b.close(opDesc{action: "close", path: "egress listener " + ls[i].Name}, fds[i])
	}
}

// sendFDs sends record on the report socket with the descriptors in
// slots fds (SCM_RIGHTS): the message is built here, and the child
// stores each descriptor's number into it before the sendmsg.
func (b *builder) sendFDs(record []byte, fds []slotID, d opDesc) {
	oob := unix.UnixRights(make([]int, len(fds))...)
	for i, fd := range fds {
		b.special(opStore32, unsafe.Pointer(&oob[unix.CmsgLen(0)+4*i]), uintptr(fd), 0, d)
	}
	iov := &unix.Iovec{Base: &record[0]}
	iov.SetLen(len(record))
	msg := &unix.Msghdr{Iov: iov, Iovlen: 1, Control: &oob[0]}
	msg.SetControllen(len(oob))
	b.p.keep = append(b.p.keep, record, oob, iov)
	b.sys(d, unix.SYS_SENDMSG, 1, noSlot, uintptr(b.p.report), b.mem(msg, unsafe.Pointer(msg)), 0)
}

// Event is what one of the child's records on the report socket says
// (Program.Event). The socket is close-on-exec: the launcher sees EOF
// when the child has become the tool (execve) or has exited.
type Event struct {
	Type    string     // "warning", "error", "listeners", "seccomp_listener" (sub-step 19a), "await_call" (sub-step 10a)
	Message string     // a warning's text
	Error   *StepError // an error's
	// Listeners names the descriptors of a "listeners" event, in the order
	// they travel as SCM_RIGHTS with it.
	Listeners []Listener
}

// Event is what a message read from the report socket says when it is
// one of this program's records (a failure is an "error" event with the
// StepError of the operation that failed); anything else is not the
// child's (ok false).
func (p *Program) Event(msg []byte) (ev Event, ok bool) {
	if len(msg) < 8 {
		return Event{}, false
	}
	switch magic := [8]byte(msg); {
	case len(msg) == 8 && magic == listenersRecord && p.listen != nil:
		return Event{Type: "listeners", Listeners: p.listen}, true
	case len(msg) == 8 && magic == seccompLstRecord:
		return Event{Type: "seccomp_listener"}, true
	case len(msg) == 8 && magic == awaitRecord:
		return Event{Type: "await_call"}, true
	case len(msg) != failureLen || (magic != failureMagic && magic != warningMagic):
		return Event{}, false
	}
	i := int(binary.LittleEndian.Uint32(msg[8:]))
	errno := syscall.Errno(binary.LittleEndian.Uint32(msg[12:]))
	if i < 0 || i >= len(p.descs) {
		return Event{}, false
	}
	d := p.descs[i]
	if [8]byte(msg) == warningMagic {
		if d.warning == "" {
			return Event{}, false
		}
		return Event{Type: "warning", Message: fmt.Sprintf(d.warning, errno)}, true
	}
	if t := p.callTool.Load(); t != nil && d.path == callToolName {
		d.path = *t
	}
	se := &StepError{Who: d.who, Step: d.step, Action: d.action, Path: d.path, Detail: d.detail}
	if errno == 0 {
		se.Msg, se.Err = d.check, errors.New(d.check)
	} else {
		se.Msg, se.Err, se.Errno = d.prefix+errno.Error(), errno, int(errno)
	}
	if d.hint != "" && (d.hintErrno == 0 || d.hintErrno == errno) {
		se.Hint = d.hint
	}
	return Event{Type: "error", Error: se}, true
}

// callToolName stands for a pre-built sandbox's argv[0] in its
// operations' descriptions until SetCallTool names it.
const callToolName = "the call's argv[0]"

// SetCallTool records a pre-built sandbox's argv[0], sent in its call.
func (p *Program) SetCallTool(argv0 string) { p.callTool.Store(&argv0) }

// opLists are a program's operations and their descriptions, kept for
// the next program once Release has run.
type opLists struct {
	ops   []op
	descs []opDesc
}

var opListPool sync.Pool

// A pre-built sandbox's call (sub-step 10a) is one message on the report
// socket with exactly CallFDs descriptors, in a form raw code can take
// apart: three little-endian uint32 counts (argv,
// environment, the paths to try for argv[0]), then that many
// NUL-terminated strings in that order. The paths are the launcher's
// (candidates: the PATH of the call's environment),
// so the child never parses PATH.
const (
	CallFDs      = 3         // descriptors that travel with it: stdin, stdout, stderr
	MaxCallBytes = 128 << 10 // its size at most: a larger call is not poolable (the caller runs one-shot)
	MaxCallArgs  = 4096      // argv entries of one call
	MaxCallEnv   = 4096      // environment entries of one call
	MaxCallPaths = 256       // paths tried for argv[0]
	callHeader   = 12
)

// callArea is where a pre-built sandbox receives its call: the
// message, its descriptors and the arrays execve takes, prepared before
// the fork (the pointers in msg and iov are set here, never in the child).
type callArea struct {
	buf   [MaxCallBytes]byte
	cmsg  [64]byte // CmsgSpace(4*(CallFDs+1)) and more: a fourth descriptor is seen, and refused
	iov   unix.Iovec
	msg   unix.Msghdr
	argv  [MaxCallArgs + 1]uintptr
	env   [MaxCallEnv + 1]uintptr
	paths [MaxCallPaths]uintptr
}

// init points the area's message at its own buffers: once, when its
// mapping is made (a child writes only the buffers and the counts).
func (c *callArea) init() {
	c.iov.Base = &c.buf[0]
	c.iov.SetLen(len(c.buf))
	c.msg.Iov, c.msg.Iovlen, c.msg.Control = &c.iov, 1, &c.cmsg[0]
}

// EncodeCall is a call's message for a pre-built sandbox.
func EncodeCall(argv, env []string) ([]byte, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty argv")
	}
	paths := candidates(argv[0], env)
	if len(argv) > MaxCallArgs || len(env) > MaxCallEnv || len(paths) > MaxCallPaths {
		return nil, fmt.Errorf("a call carries at most %d arguments, %d variables and %d PATH entries (%d, %d, %d)",
			MaxCallArgs, MaxCallEnv, MaxCallPaths, len(argv), len(env), len(paths))
	}
	b := make([]byte, callHeader, callHeader+64)
	for k, list := range [][]string{argv, env, paths} {
		binary.LittleEndian.PutUint32(b[4*k:], uint32(len(list)))
		for _, s := range list {
			if strings.IndexByte(s, 0) >= 0 {
				return nil, fmt.Errorf("%q contains a NUL byte", s)
			}
			b = append(append(b, s...), 0)
		}
	}
	if len(b) > MaxCallBytes {
		return nil, fmt.Errorf("argv, environment and paths are %d bytes, a call carries at most %d", len(b), MaxCallBytes)
	}
	return b, nil
}
