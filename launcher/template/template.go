package template

// A per-tool template ("zygote"): one Python per tool, started in a
// sandbox of the tool's profile, imports the tool once; each call is a
// clone of it into namespaces of its own (user, mount, pid, network, ipc,
// uts, cgroup), with a fresh host uid/gid pair, fresh writable mounts, a
// cgroup of its own with the profile's limits, and the profile's seccomp
// filter. The supervisor here runs in the launcher's process (the
// worker's, or a test's) and owns the template's seccomp listener.
//
// The template's life, in order (T1-T4), and each call's (C1-C12):
//
//	T1. plan the profile's sandbox, without its egress listeners (the
//	    template's own network namespace has lo only: import-time code
//	    reaches nothing; each call gets them in its own, C5); its filter is seccomp.TemplatePolicy
//	    (the profile's plus the notified call clone), loaded with a
//	    listener (nsinit step 19, handed over at 19a); its /proc is an
//	    empty read-only tmpfs (the template never reaches a child's
//	    /proc/PID/mem: it owns each child's user namespace, so the kernel
//	    would let it), its /tmp and /dev/shm read-only (nothing writable
//	    is shared with a child); Slots host id pairs are leased
//	    with it and mapped into its user namespace (Plan.ExtraIDMaps)
//	T2. start it; take the listener; wait for "ready" on the control
//	    socket (the tool is imported, gc.freeze done)
//	T3. refuse it unless, read from the host: one thread, no descriptor
//	    but 0-2 and the control socket, no shared or memfd mapping
//	T4. answer notifications (serveNotifications) until it ends
//
//	C1.  take a free id pair (Slots calls live at once)
//	C2.  re-check the template is single-threaded; order one fork with
//	     the call's socket (SCM_RIGHTS); the notified clone from the
//	     template's pid with exactly seccomp.CallClone is let through
//	     (SECCOMP_USER_NOTIF_FLAG_CONTINUE) once per order; anything
//	     else gets EPERM
//	C3.  the child's hello carries its pid (SCM_CREDENTIALS, translated
//	     by the kernel); it must be the template's child, in 7
//	     namespaces none of which is the template's; pidfd_open pins it
//	C4.  setgroups deny, gid_map and uid_map: the profile's gid and uid
//	     (a cold sandbox's tool's) -> the pair's host id; the profile's
//	     RLIMIT_NPROC set on the child from here (prlimit)
//	C5.  lo up in its network namespace and the egress listeners
//	     opened there (netns.go: the ones nsinit step 10 opens
//	     in a cold sandbox, at the same addresses), served by an egress
//	     session of the call's own with the template's policy (the
//	     tool's, tightened as for a cold run): the call's traffic and
//	     denials are the call's (CallResult.Network)
//	C6.  its slot's cgroup with the profile's limits (made with the
//	     template, reused one call at a time); the child moved in
//	C7.  fresh /tmp, /dev/shm (tmpfs sized as the profile's) and a /proc
//	     of its own pid namespace (fsconfig pidns=), as detached mounts,
//	     and its work dir (CallOptions.WorkDir), cloned; attached by the
//	     supervisor in the child's mount namespace (netns.go,
//	     attachMounts: one locked thread joins it)
//	C8.  send the setup (ids, the call filter); the child does what only
//	     it can do to itself: chdir /, drops the bounding set, sets its
//	     ids, clears its capabilities, re-arms its parent-death signal,
//	     makes itself dumpable, puts /dev/null on 0-2 and closes every
//	     other descriptor, reseeds its RNGs, stacks seccomp.CallPolicy,
//	     and says "ready"
//	C9.  verify from the host (verify): ids, capabilities, no_new_privs,
//	     seccomp, threads, namespaces, descriptors, cwd, cgroup,
//	     RLIMIT_NPROC, its fresh mounts (each the top mount at its
//	     target), and no other process in its pid namespace; a child that
//	     fails is killed and the template retired
//	C10. send the call (the runner arguments a cold run reads)
//	C11. read the answer; the wall clock kills through the pidfd and the
//	     cgroup
//	C12. wait for the exit (pidfd), empty the slot's cgroup, return the pair
//
// The template is retired after MaxCalls calls or MaxAge
// (one address-space layout for all its children; "From Zygote to
// Morula", NDSS 2014), or when its tool's source hash changes (Stale).

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/helper"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/workdir"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp"
)

// Recycling: a template serves at most MaxCalls calls and lives at
// most MaxAge; then it is retired and a new one (a new address
// space layout, a new import) takes over. Constants for now; per-tool
// settings later.
const (
	MaxCalls = 500
	MaxAge   = 10 * time.Minute
	// Slots is how many calls of one template live at once: the
	// host id pairs leased with it.
	Slots = 8
)

// templateSlotInside is the id, inside the template's user namespace, of
// its slot i's host id (Plan.ExtraIDMaps).
func templateSlotInside(i int) int { return 100000 + i }

// templateDeadline bounds every wait on a template or a child that is not
// the call itself (start, hello, setup): generous, never a measure.
const templateDeadline = 60 * time.Second

// ErrRefused: the template holds something a child would share
// (a thread, a descriptor, a shared mapping) or did not start.
var ErrRefused = errors.New("template refused")

// ErrCallOutOfMemory: the call was killed at its cgroup's memory limit.
var ErrCallOutOfMemory = errors.New("killed: out of memory")

// ErrCallNetwork: the call's egress listeners or its egress session could
// not be made (C5). Nothing of the call had reached its child (its work
// dir and data come later), and the template is not retired: the call
// may run elsewhere (the worker runs it in a sandbox of its own).
var ErrCallNetwork = errors.New("the call's network could not be set up")

// ErrRetired: the template may not take more calls (recycled,
// failed a check, or ended); start a new one.
var ErrRetired = errors.New("template retired")

// Request describes a template: Request is the sandbox (profile,
// binds, environment), whose Argv starts the template runner with its
// control socket at fd 3 (Start makes it the first ExtraFile);
// SourceHash identifies the tool's source (Stale).
type Request struct {
	Request    launcher.Request
	SourceHash string
	// WorkDirTarget, when set, is where each call's work dir
	// (CallOptions.WorkDir) is mounted in the call: an empty directory
	// made on the template's root, outside every fresh mount and outside
	// /proc and /dev.
	WorkDirTarget string
	// ReadyTimeout bounds the wait for the template runner's "ready"
	// (T2: the tool imported); 0 is templateDeadline. A tool whose import
	// takes longer is refused (ErrRefused).
	ReadyTimeout time.Duration
}

// CallWorkDir makes a template call's work dir as a sandbox's is made
// (launcher step L9): under spec, capped by the profile's work_dir (root
// mode: its own tmpfs), filled, owned by uid and gid (the call's pair:
// CallOptions.WorkDir's arguments). workdir.Dir.Remove removes it.
func (t *Template) CallWorkDir(spec workdir.Spec, uid, gid int) (*workdir.Dir, error) {
	return workdir.Make(spec, &t.plan.WorkDir, uid, gid)
}

// Template is one running template and its supervisor.
type Template struct {
	l          *launcher.Launcher
	sb         *launcher.Sandbox
	plan       *launcher.Plan
	ctrl       *os.File // our end of the control socket
	listener   *os.File // the template filter's listener
	pid        int      // the template's host pid
	ns         map[string]uint64
	filters    int    // the template's Seccomp_filters
	callFilter []byte // seccomp.CallPolicy of the profile, for each child
	fresh      []freshMount
	workTarget string            // Request.WorkDirTarget
	callListen []nsinit.Listener // each call's egress listeners (C5)
	nproc      uint64            // the profile's RLIMIT_NPROC, set on each call by the supervisor (C4; 0: none)
	hash       string
	mapper     *idMapper // opens the calls' id maps from the template's user namespace
	started    time.Time
	slots      chan int
	// slotsOnce, releaseOnce: Close and Drain end the template once.
	slotsOnce, releaseOnce sync.Once
	leases                 []*launcher.HostIDLease
	base                   []int              // host id of each slot
	cgs                    []*launcher.Cgroup // the cgroup of each slot (nil entries: no cgroup), one call at a time

	orderMu sync.Mutex // one fork order at a time
	mu      sync.Mutex
	pending bool // a fork is ordered and its clone not yet seen
	calls   int
	retired error
	why     RetireReason // with retired
	done    chan struct{}
}

// freshMount is one writable mount each call gets new.
type freshMount struct {
	target string
	fs     string // "tmpfs" or "proc"
	data   string // tmpfs options (size=,mode=)
}

// Provider is l's Provider with templates: StartTemplate is Start (root
// mode only).
func Provider(l *launcher.Launcher) provider.Provider { return withTemplates{provider.New(l), l} }

type withTemplates struct {
	provider.Provider
	l *launcher.Launcher
}

// Templates: in root mode (Start leases the calls' host ids).
func (p withTemplates) Templates() bool { return p.l.Host().Root }

func (p withTemplates) StartTemplate(ctx context.Context, spec provider.TemplateSpec) (provider.Template, error) {
	t, err := Start(ctx, p.l, Request{Request: spec.Spec.Request(), SourceHash: spec.SourceHash,
		WorkDirTarget: spec.WorkDirTarget, ReadyTimeout: spec.ReadyTimeout})
	if err != nil {
		return nil, err // never a typed nil in the interface
	}
	return t, nil
}

// Start performs T1-T3 with l and starts T4. Root mode only: the calls'
// host ids are leased. ctx is the template's lifetime (its end kills the
// template as a cancelled sandbox), not a deadline for the start.
func Start(ctx context.Context, l *launcher.Launcher, tr Request) (*Template, error) {
	if !l.Host().Root {
		return nil, errors.New("template: root mode only (each call gets leased host ids)")
	}
	req := tr.Request
	ours, theirs, err := launcher.SeqpacketPair("template control", "template control-peer")
	if err != nil {
		return nil, fmt.Errorf("template: control socket: %w", err)
	}
	defer theirs.Close()
	req.ExtraFiles = append([]*os.File{theirs}, req.ExtraFiles...)
	req.Idle = MaxAge + time.Minute // its wall clock: it is never armed

	// T1. The plan.
	pl, err := l.Plan(req)
	if err != nil {
		ours.Close()
		return nil, err
	}
	t := &Template{l: l, plan: pl, ctrl: ours, hash: tr.SourceHash, done: make(chan struct{}), slots: make(chan int, Slots)}
	// The egress listeners move from the template to each call: served
	// in the template's namespace, import-time code would have the
	// tool's network with nobody's call to attribute it to. The proxy
	// variables, resolv.conf and CA bundle stay in the plan: the same
	// loopback addresses in every call's namespace, nothing per call.
	t.callListen, pl.Child.Listen = pl.Child.Listen, nil
	fail := func(err error) (*Template, error) {
		t.kill()
		t.takeSlots()
		t.release()
		return nil, err
	}
	if err := t.derivePolicies(l.Profiles(), req.Profile); err != nil {
		return fail(err)
	}
	t.planMounts()
	t.planNproc()
	if err := t.checkBinds(); err != nil {
		return fail(err)
	}
	if err := t.planWorkDir(tr.WorkDirTarget); err != nil {
		return fail(err)
	}
	for i := 0; i < Slots; i++ {
		// Each slot's cgroup is made once and reused by its calls, one at
		// a time, emptied in between: a fresh cgroup per call cost a
		// mkdir and rmdir in each hierarchy plus the kernel's deferred
		// teardown (spawn-anatomy §4c: 2.0-2.8x bwrap with fresh cgroups,
		// 3.2-3.4x reused). What a call leaves charged (page cache) is
		// charged to the next call of the slot; no data of it is.
		cg, err := l.NewCgroup(pl)
		if err != nil {
			return fail(fmt.Errorf("template: create the calls' cgroups: %w", err))
		}
		t.cgs = append(t.cgs, cg)
		lease, err := l.LeaseHostIDs()
		if err != nil {
			return fail(fmt.Errorf("template: lease the calls' host ids: %w", err))
		}
		t.leases = append(t.leases, lease)
		t.base = append(t.base, lease.Base())
		pl.ExtraIDMaps = append(pl.ExtraIDMaps, launcher.IDMap{Inside: templateSlotInside(i), Outside: lease.Base(), Size: 1})
		t.slots <- i
	}

	// T2. Start; the listener; "ready".
	sb, err := l.CreateFromPlan(ctx, pl, req)
	if err != nil {
		return fail(err)
	}
	t.sb = sb
	if err := sb.Start(); err != nil {
		return fail(err)
	}
	t.started = time.Now()
	t.pid = sb.Pid()
	select {
	case l := <-sb.SeccompListener():
		if t.listener, err = pollable(l); err != nil {
			return fail(fmt.Errorf("template: seccomp listener: %w", err))
		}
	case <-sb.Ended():
		return fail(fmt.Errorf("%w: the template ended before its step 19a: %s", ErrRefused, t.endText()))
	case <-time.After(templateDeadline):
		return fail(fmt.Errorf("%w: no seccomp listener from the template within %s", ErrRefused, templateDeadline))
	}
	// The supervisor answers from now on: import-time code that tries
	// the notified clone before any order gets EPERM, not a wait.
	go t.serveNotifications()
	var ready struct {
		Type string `json:"type"`
	}
	readyTimeout := tr.ReadyTimeout
	if readyTimeout <= 0 {
		readyTimeout = templateDeadline
	}
	if _, err := t.readCtrl(&ready, readyTimeout); err != nil || ready.Type != "ready" {
		return fail(fmt.Errorf("%w: no \"ready\" from the template runner (%v): %s", ErrRefused, err, t.endText()))
	}

	// T3. Nothing a child would share.
	if err := checkTemplateProcess(t.pid); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrRefused, err))
	}
	if t.ns, err = procfs.NamespaceInodes(t.pid); err != nil {
		return fail(fmt.Errorf("%w: %w", ErrRefused, err))
	}
	st, err := readStatus(t.pid)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrRefused, err))
	}
	t.filters, _ = strconv.Atoi(st["Seccomp_filters"])
	if t.mapper, err = startMapper(fmt.Sprintf("/proc/%d/ns/user", t.pid)); err != nil {
		return fail(err)
	}

	// T4. The supervisor (serving since T2); the end of the sandbox
	// retires the template.
	go func() {
		<-sb.Ended()
		t.retire(RetiredEnded, fmt.Errorf("%w: the template ended", ErrRetired))
	}()
	return t, nil
}

// derivePolicies compiles the template's filter (profile's, of set) into
// the plan and keeps the calls' filter.
func (t *Template) derivePolicies(set *profiles.Set, profile string) error {
	if profile == "" {
		profile = "standard"
	}
	prof, err := set.Lookup(profile)
	if err != nil {
		return fmt.Errorf("%w: %w", launcher.ErrInvalidRequest, err)
	}
	base, err := t.l.SeccompPolicy(prof.Seccomp)
	if err != nil {
		return fmt.Errorf("template: profile %s: %w", prof.Name, err)
	}
	tp, err := seccomp.TemplatePolicy(base)
	if err != nil {
		return err
	}
	cp, err := seccomp.CallPolicy(base)
	if err != nil {
		return err
	}
	tprog, err := tp.Compile()
	if err != nil {
		return err
	}
	cprog, err := cp.Compile()
	if err != nil {
		return err
	}
	t.plan.Child.SeccompPolicy = tprog.Policy
	t.plan.Child.Seccomp = seccomp.EncodeFilter(tprog.Filter)
	t.plan.Child.SeccompListener = true
	t.plan.Seccomp, t.plan.SeccompDefault = tprog.Rules, tprog.DefaultAction
	t.callFilter = seccomp.EncodeFilter(cprog.Filter)
	return nil
}

// planMounts makes the template's /proc an empty read-only tmpfs and its
// writable tmpfs mounts read-only, and records what each call gets fresh
// instead: the same tmpfs mounts, writable, and its own /proc.
//
// A mask under a fresh mount (an empty read-only tmpfs: plan step 7's
// over /var/run/secrets, under the permissive profile's writable /var)
// is left out: the template could not make its mount point in the
// read-only tmpfs there, and it would hide nothing, in the template or
// in a call: what lies under a fresh mount is that empty tmpfs's, never
// the host's (a bind there is refused: checkBinds).
func (t *Template) planMounts() {
	ms := t.plan.Child.Mounts
	for i, m := range ms {
		switch {
		case m.Kind == nsinit.MountProc:
			ms[i] = nsinit.Mount{Kind: nsinit.MountTmpfs, Target: m.Target, ReadOnly: true, Data: "size=4k,mode=0555"}
			t.fresh = append(t.fresh, freshMount{target: m.Target, fs: "proc"})
		case m.Kind == nsinit.MountTmpfs && !m.ReadOnly && m.Target != "/dev":
			ms[i].ReadOnly = true
			t.fresh = append(t.fresh, freshMount{target: m.Target, fs: "tmpfs", data: m.Data})
		}
	}
	t.plan.Child.Mounts = slices.DeleteFunc(ms, func(m nsinit.Mount) bool {
		return m.Kind == nsinit.MountTmpfs && m.ReadOnly && t.underFresh(m.Target)
	})
}

// underFresh: target lies strictly under a mount each call gets fresh.
func (t *Template) underFresh(target string) bool {
	for _, f := range t.fresh {
		if target != f.target && launcher.PathUnder(target, f.target) {
			return true
		}
	}
	return false
}

// planNproc takes RLIMIT_NPROC off the template and gives it to each
// call. The kernel counts a user namespace's processes against every
// ancestor namespace's owner too (ucounts): with the profile's limit on
// the template, all its calls together would be held to it (one call's
// fork bomb starving the others: TestHostile/concurrent_process_limits).
// Without it on the template, the supervisor sets it on each call (C4:
// prlimit) before its data (verified at C9), and its cgroup's pids.max
// still bounds it. As nsinit step 20 does, it is at most the launcher's
// own hard limit, which the template and its calls inherit (lower is
// tighter).
func (t *Template) planNproc() {
	rl := t.plan.Child.Rlimits[:0]
	for _, r := range t.plan.Child.Rlimits {
		if r.Resource == unix.RLIMIT_NPROC {
			t.nproc = r.Value
			var hard unix.Rlimit
			if err := unix.Getrlimit(unix.RLIMIT_NPROC, &hard); err == nil {
				t.nproc = min(t.nproc, hard.Max)
			}
			continue
		}
		rl = append(rl, r)
	}
	t.plan.Child.Rlimits = rl
}

// checkBinds refuses a bind under a mount each call gets fresh: the
// call's fresh mount would hide it (a tools dir under /tmp).
func (t *Template) checkBinds() error {
	for _, m := range t.plan.Child.Mounts {
		if m.Kind != nsinit.MountBind {
			continue
		}
		for _, f := range t.fresh {
			if launcher.PathUnder(m.Target, f.target) {
				return fmt.Errorf("%w: template: bind %s is under %s, which each call gets fresh (it would not see the bind)", launcher.ErrInvalidRequest, m.Target, f.target)
			}
		}
	}
	return nil
}

// planWorkDir adds the empty directory each call's work dir is mounted
// on (Request.WorkDirTarget).
func (t *Template) planWorkDir(target string) error {
	if target == "" {
		return nil
	}
	bad := !filepath.IsAbs(target) || filepath.Clean(target) != target || target == "/" ||
		launcher.PathUnder(target, "/proc") || launcher.PathUnder(target, "/dev")
	for _, f := range t.fresh {
		bad = bad || launcher.PathUnder(target, f.target) || launcher.PathUnder(f.target, target)
	}
	if bad {
		return fmt.Errorf("%w: template work dir target %q: an absolute clean path outside /proc, /dev and the calls' fresh mounts", launcher.ErrInvalidRequest, target)
	}
	t.workTarget = target
	t.plan.Child.Mounts = append(t.plan.Child.Mounts, nsinit.Mount{Kind: nsinit.MountDir, Target: target, Mode: 0o755})
	return nil
}

// Pid is the template's host pid.
func (t *Template) Pid() int { return t.pid }

// Stale reports whether the template was made from another source than
// hash (the tool changed: retire it).
func (t *Template) Stale(hash string) bool { return t.hash != hash }

// Done is closed once the template is retired (Why says why).
func (t *Template) Done() <-chan struct{} { return t.done }

// Retired is non-nil once the template takes no more calls.
func (t *Template) Retired() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.retired
}

// The template's types a caller's interface names are the launcher's
// (provider.Template: the Provider boundary).
type (
	CallOptions  = provider.TemplateCallOptions
	CallResult   = provider.TemplateCallResult
	ChildCheck   = provider.TemplateChildCheck
	RetireReason = provider.TemplateRetireReason
)

// The reasons, in the words of the worker's
// str_worker_templates_retired_total{reason}.
const (
	RetiredCalls       RetireReason = "calls"        // it served MaxCalls calls
	RetiredAge         RetireReason = "age"          // it is MaxAge old
	RetiredFailedCheck RetireReason = "failed_check" // a check at a fork order, of a child or of a slot's cgroup failed
	RetiredEnded       RetireReason = "ended"        // the template's process ended
	RetiredClosed      RetireReason = "closed"       // Close
	RetiredDrained     RetireReason = "drained"      // Drain (replaced by its user)
)

// Why is the reason the template was retired ("" while it takes calls).
func (t *Template) Why() RetireReason {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.why
}

// recycleReason is why a template that has taken calls calls and is age
// old takes no more ("" if it may take the next): its address-space
// layout has been shared long enough (MaxCalls, MaxAge).
func recycleReason(calls int, age time.Duration) RetireReason {
	switch {
	case calls >= MaxCalls:
		return RetiredCalls
	case age >= MaxAge:
		return RetiredAge
	}
	return ""
}

// retire records the first reason only: a template retired for a failed
// check that then ends stays retired for the check.
func (t *Template) retire(reason RetireReason, why error) {
	t.mu.Lock()
	if t.retired == nil {
		t.retired, t.why = why, reason
		close(t.done)
	}
	t.mu.Unlock()
}

// Close retires the template, kills it and waits for it; the calls in
// flight are killed with it (their parent-death signal). For a shutdown;
// a template replaced while serving is drained (Drain). Close and Drain
// may both be called, in any order and at once.
func (t *Template) Close() {
	t.retire(RetiredClosed, fmt.Errorf("%w: closed", ErrRetired))
	t.kill()
	t.takeSlots()
	t.release()
}

// Drain retires the template, waits until every call in flight has
// answered and cleaned up (each gives its slot back; a call is bounded by
// its own timeout), then ends the template as Close does. A template is
// recycled (MaxCalls, MaxAge) or replaced while calls run
// in it: killing it then would kill those calls (their parent-death
// signal), and a call must never fail because its template was recycled.
// A call that took its slot runs to its end (one racing the retirement
// may still take a slot: it is waited for like the others); a call that
// starts after the retirement is refused (ErrRetired).
func (t *Template) Drain() {
	t.retire(RetiredDrained, fmt.Errorf("%w: drained", ErrRetired))
	t.takeSlots()
	t.kill()
	t.release()
}

// kill ends the template's sandbox and waits for it (the calls in flight
// die with it).
func (t *Template) kill() {
	if t.sb == nil {
		return
	}
	select {
	case <-t.sb.Ended():
	default:
		_ = t.sb.Kill()
		_, _ = t.sb.Wait()
	}
}

// takeSlots takes every slot back, once: no call holds the template's
// ids or cgroups after it. Each call empties its slot's cgroup before it
// returns the slot.
func (t *Template) takeSlots() {
	t.slotsOnce.Do(func() {
		for i := 0; i < len(t.leases); i++ {
			<-t.slots
		}
	})
}

// release frees what the template holds, once, after kill and takeSlots.
func (t *Template) release() {
	t.releaseOnce.Do(t.releaseAll)
}

func (t *Template) releaseAll() {
	if t.ctrl != nil {
		t.ctrl.Close()
	}
	if t.listener != nil {
		t.listener.Close() // ends serveNotifications
	}
	// The ids and cgroups go back only when no call can still hold them
	// (takeSlots came first).
	for _, l := range t.leases {
		l.Release()
	}
	t.leases = nil
	for _, cg := range t.cgs {
		if cg != nil {
			if !cg.Empty() {
				_ = cg.Kill()
			}
			_ = cg.Delete()
		}
	}
	t.cgs = nil
	if t.mapper != nil {
		t.mapper.close()
		t.mapper = nil
	}
}

func (t *Template) endText() string {
	select {
	case <-t.sb.Ended():
		r, err := t.sb.Wait()
		if err != nil {
			return err.Error()
		}
		if r.SetupError != nil {
			return r.SetupError.Error()
		}
		return fmt.Sprintf("exit %d", r.ExitCode)
	default:
		return "still running"
	}
}

// readCtrl reads one JSON message from the control socket.
func (t *Template) readCtrl(v any, d time.Duration) (int, error) {
	_ = t.ctrl.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	n, err := t.ctrl.Read(buf)
	if err != nil {
		return 0, err
	}
	return n, json.Unmarshal(buf[:n], v)
}

// seccompNotif and seccompNotifResp are the kernel's struct seccomp_notif
// and struct seccomp_notif_resp.
type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Nr    int32
	Arch  uint32
	IP    uint64
	Args  [6]uint64
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// serveNotifications is T4: every notification of the template's filter
// is the notified clone (the filter sends nothing else); it continues
// only when a fork is ordered and not yet seen, from the template's own
// main thread (the pid of a notification is the caller's thread id, so
// another thread of the template never matches), with exactly
// seccomp.CallClone. Everything else is answered EPERM. The flags are
// the syscall's register, copied by the kernel into the notification:
// nothing the template does after the notification can change what
// continues, so no SECCOMP_IOCTL_NOTIF_ID_VALID check is needed (that
// check guards reads of the caller's memory, and none is made).
func (t *Template) serveNotifications() {
	raw, err := t.listener.SyscallConn()
	if err != nil {
		return
	}
	for {
		var n seccompNotif
		var e syscall.Errno
		hup := false
		// The listener is non-blocking and in Go's poller: a
		// notification wakes this loop, Close ends it (no raw descriptor
		// outlives the file). The receive runs only when one is pending
		// (POLLIN): it would block, whatever O_NONBLOCK says, and a
		// filter whose tasks are gone reports only POLLHUP.
		err := raw.Read(func(fd uintptr) bool {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if _, err := unix.Poll(p, 0); err != nil {
				return false
			}
			if p[0].Revents&unix.POLLIN == 0 {
				hup = p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0
				return hup
			}
			n = seccompNotif{}
			_, _, e = unix.Syscall(unix.SYS_IOCTL, fd, unix.SECCOMP_IOCTL_NOTIF_RECV, uintptr(unsafe.Pointer(&n)))
			return true
		})
		if err != nil || hup {
			return // closed, or the template is gone
		}
		if e == unix.EINTR || e == unix.ENOENT {
			continue // interrupted, or the caller died before we read it
		}
		if e != 0 {
			return
		}
		resp := seccompNotifResp{ID: n.ID, Error: -int32(unix.EPERM)}
		// The order is taken only when the answer reached the kernel: a
		// clone interrupted by a signal (the template's SIGCHLD) before
		// the answer withdraws its notification (SEND: ENOENT) and comes
		// again, restarted, as a new one, which must still find the order.
		t.mu.Lock()
		ordered := t.pending && int(n.Pid) == t.pid && n.Nr == unix.SYS_CLONE && n.Args[0] == seccomp.CallClone
		if ordered {
			resp = seccompNotifResp{ID: n.ID, Flags: unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE}
		}
		var se syscall.Errno
		_ = raw.Control(func(fd uintptr) {
			_, _, se = unix.Syscall(unix.SYS_IOCTL, fd, unix.SECCOMP_IOCTL_NOTIF_SEND, uintptr(unsafe.Pointer(&resp)))
		})
		if ordered && se == 0 {
			t.pending = false
		}
		t.mu.Unlock()
	}
}

// pollable replaces f by a non-blocking duplicate in Go's poller.
func pollable(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	name := f.Name()
	f.Close()
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Call runs one call (C1-C12): runnerArgs is what a cold runner reads.
func (t *Template) Call(ctx context.Context, runnerArgs []byte, opts CallOptions) (*CallResult, error) {
	if err := t.Retired(); err != nil {
		return nil, err
	}
	// C1. A free id pair.
	var slot int
	select {
	case slot = <-t.slots:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.done:
		return nil, t.Retired()
	}
	t.mu.Lock()
	t.calls++
	calls, age := t.calls, time.Since(t.started)
	t.mu.Unlock()
	if reason := recycleReason(calls, age); reason != "" {
		// This call is its last.
		t.retire(reason, fmt.Errorf("%w: %d calls, %s old", ErrRetired, calls, age.Round(time.Second)))
	}
	c := &templateCall{t: t, slot: slot, hostID: t.base[slot], pidfd: -1}
	// The answer goes back before the child is gone: its exit, the
	// emptying of its cgroup and the slot's return run after (C12), off
	// the caller's path; Close waits for them (it takes back every slot).
	defer func() {
		go func() {
			c.cleanup()
			t.slots <- slot
		}()
	}()
	res, err := c.run(ctx, runnerArgs, opts)
	if err != nil {
		var fe *childFailure
		if errors.As(err, &fe) {
			// A child that is not what the supervisor made is the
			// template's doing: no more calls from it.
			t.retire(RetiredFailedCheck, fmt.Errorf("%w: %w", ErrRetired, err))
		}
		return nil, err
	}
	return res, nil
}

// childFailure is a child that failed a check (C3 or C9).
type childFailure struct{ msg string }

func (e *childFailure) Error() string { return "template call: " + e.msg }

func failChild(format string, a ...any) error { return &childFailure{fmt.Sprintf(format, a...)} }

type templateCall struct {
	t      *Template
	slot   int
	hostID int
	sock   *os.File // our end of the call's socket
	pid    int
	pidfd  int
	cg     *launcher.Cgroup
	procFD int // the child's /proc root (our detached mount fd's dup)
	// mounts are the unique mount ids (statx STATX_MNT_ID_UNIQUE) of the
	// fresh mounts attached at C7, by target: C9 checks each is the top
	// mount there.
	mounts map[string]uint64

	egress     *helper.Session // the call's egress proxy (C5)
	policyKill atomic.Bool     // its on_violation: kill killed the call
}

func (c *templateCall) cleanup() {
	c.stopEgress() // first: its OnKill uses the pidfd
	if c.pidfd >= 0 {
		_ = unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
		c.waitExit(templateDeadline)
		unix.Close(c.pidfd)
	}
	if c.sock != nil {
		c.sock.Close()
	}
	if c.procFD > 0 {
		unix.Close(c.procFD)
	}
	if c.cg != nil {
		if !c.cg.Empty() {
			_ = c.cg.Kill()
		}
		deadline := time.Now().Add(templateDeadline)
		for !c.cg.Empty() && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !c.cg.Empty() {
			// Never handed to another call while anything of this one
			// is left in it.
			c.t.retire(RetiredFailedCheck, fmt.Errorf("%w: cgroup %s not empty after its call", ErrRetired, c.cg.Path()))
		}
	}
}

// waitExit waits until the child has exited (its pidfd is readable).
func (c *templateCall) waitExit(d time.Duration) bool {
	fds := []unix.PollFd{{Fd: int32(c.pidfd), Events: unix.POLLIN}}
	deadline := time.Now().Add(d)
	for {
		ms := int(time.Until(deadline).Milliseconds())
		if ms <= 0 {
			return false
		}
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		return err == nil && n > 0
	}
}

func (c *templateCall) run(ctx context.Context, runnerArgs []byte, opts CallOptions) (*CallResult, error) {
	timeout := opts.Timeout
	t := c.t
	start := time.Now()
	ours, theirs, err := launcher.SeqpacketPair("template call", "template call-peer")
	if err != nil {
		return nil, fmt.Errorf("template call: socket: %w", err)
	}
	c.sock = ours
	var theirStat unix.Stat_t
	if err := unix.Fstat(int(theirs.Fd()), &theirStat); err != nil {
		theirs.Close()
		return nil, fmt.Errorf("template call: socket: %w", err)
	}
	if err := setPassCred(ours); err != nil {
		theirs.Close()
		return nil, err
	}

	// C2. The order.
	if err := c.order(theirs); err != nil {
		return nil, err
	}

	// C3. Who said hello.
	var hello struct {
		Type string `json:"type"`
	}
	pid, _, err := recvJSON(ours, &hello, templateDeadline, true)
	if err != nil || hello.Type != "hello" {
		return nil, failChild("no hello from the child: %v", err)
	}
	if err := c.adopt(pid); err != nil {
		return nil, err
	}

	// C4. Its ids: setgroups from here (CAP_SYS_ADMIN over the call's
	// user namespace), the maps through files the mapper opened.
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/setgroups", pid), []byte("deny"), 0); err != nil {
		return nil, fmt.Errorf("template call: write /proc/%d/setgroups deny: %w", pid, err)
	}
	// The map's lower id is read in the parent user namespace, the
	// template's, where the pair's host id is templateSlotInside(slot).
	// Inside, the call is the profile's uid and gid, as a cold sandbox's
	// tool is (the template's /etc/passwd names them): the only ids its
	// namespace maps.
	outside := " " + strconv.Itoa(templateSlotInside(c.slot)) + " 1\n"
	for _, m := range []struct {
		name string
		id   uint32
	}{{"gid_map", t.plan.Child.GID}, {"uid_map", t.plan.Child.UID}} {
		path := fmt.Sprintf("/proc/%d/%s", pid, m.name)
		f, err := t.mapper.open(path)
		if err != nil {
			return nil, fmt.Errorf("template call: %w", err)
		}
		id := strconv.FormatUint(uint64(m.id), 10) + outside
		_, err = f.Write([]byte(id))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("template call: write %s %q: %w", path, strings.TrimSpace(id), err)
		}
	}
	// Its process limit, set from here (host root may set another
	// process's limits, and raise the hard one, which the child could
	// not), after C3 (the pid is the ordered child's) and before the
	// setup (C8): the child's data comes after C9, which checks it.
	if t.nproc > 0 {
		if err := unix.Prlimit(pid, unix.RLIMIT_NPROC, &unix.Rlimit{Cur: t.nproc, Max: t.nproc}, nil); err != nil {
			return nil, fmt.Errorf("template call: prlimit %d RLIMIT_NPROC %d: %w", pid, t.nproc, err)
		}
	}
	// The maps and the limit went to this child only if it is still the
	// process its pidfd names (a pid is not reused while its process
	// lives).
	if err := unix.PidfdSendSignal(c.pidfd, 0, nil, 0); err != nil {
		return nil, failChild("pid %d ended while its ids were mapped: %v", pid, err)
	}
	t.leases[c.slot].Record(pid)

	// C5. lo and the egress listeners, in the child's network namespace;
	// served before any call data (C10), as a cold sandbox's are before
	// its tool runs.
	// Not the template's doing (it is not retired): the caller may run
	// the call elsewhere (ErrCallNetwork; the worker runs it cold).
	if err := c.startEgress(ctx, fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil {
		return nil, fmt.Errorf("template call: %w: %w", ErrCallNetwork, err)
	}

	// C6. Its cgroup: the slot's, empty (cleanup emptied it after the
	// slot's previous call), with the profile's limits.
	if cg := t.cgs[c.slot]; cg != nil {
		c.cg = cg
		if err := cg.Enter(pid); err != nil {
			return nil, fmt.Errorf("template call: move pid %d into %s: %w", pid, cg.Path(), err)
		}
	}

	// C7. Its mounts, made on the host and attached in its mount
	// namespace from here: after C3 (the proc mount needs the child's pid
	// namespace, and the pidfd that joins its mount namespace must be the
	// ordered child's), before the setup (C8: the child's chdir / and, for
	// the call, into its work dir must land on them), checked at C9.
	mfds, targets, err := c.freshMounts()
	if err != nil {
		return nil, err
	}
	cwd := "" // the call's cwd once its data has come: its work dir, if any
	if opts.WorkDir != nil && t.workTarget != "" {
		tree, err := c.workDirTree(opts.WorkDir)
		if err != nil {
			launcher.CloseFDs(mfds)
			return nil, err
		}
		mfds, targets, cwd = append(mfds, tree), append(targets, t.workTarget), t.workTarget
	}
	c.mounts, err = mountIDs(mfds, targets)
	if err == nil {
		err = attachMounts(c.pidfd, mfds, targets)
	}
	launcher.CloseFDs(mfds)
	if err != nil {
		return nil, fmt.Errorf("template call: attach the fresh mounts of pid %d: %w", pid, err)
	}

	// C8. The setup: what the child does to itself.
	setup := map[string]any{
		"type": "setup", "uid": t.plan.Child.UID, "gid": t.plan.Child.GID, "cwd": cwd,
		"call_filter": hex.EncodeToString(t.callFilter), "result_chunk": templateChunk,
		"nr": map[string]int{"capset": unix.SYS_CAPSET, "close_range": unix.SYS_CLOSE_RANGE},
	}
	if err := sendJSON(ours, setup, nil); err != nil {
		return nil, fmt.Errorf("template call: send setup: %w", err)
	}
	var ready struct {
		Type string `json:"type"`
	}
	if _, _, err := recvJSON(ours, &ready, templateDeadline, false); err != nil || ready.Type != "ready" {
		return nil, failChild("the child did not set itself up: %v", err)
	}

	// C9. Verify before any call data.
	check, err := c.verify(theirStat.Ino)
	if err != nil {
		return nil, err
	}

	// C10. The call.
	if opts.Args != nil {
		if runnerArgs, err = opts.Args(); err != nil {
			return nil, fmt.Errorf("template call: the runner arguments: %w", err)
		}
	}
	if err := sendJSON(ours, json.RawMessage(runnerArgs), nil); err != nil {
		return nil, fmt.Errorf("template call: send the call: %w", err)
	}

	// C11. The answer, within the wall clock.
	if timeout <= 0 {
		timeout = t.plan.Timeout
	}
	res := &CallResult{Child: *check}
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stop := context.AfterFunc(callCtx, func() {
		_ = unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
		if c.cg != nil {
			_ = c.cg.Kill()
		}
	})
	var oom0 int64
	if c.cg != nil {
		oom0 = c.cg.OOMKills()
	}
	doc, err := recvDocument(ours, timeout+templateDeadline)
	stop()
	res.Wall = time.Since(start)
	// The report so far, as a cold call's is taken before its teardown:
	// the session is closed by cleanup, off the caller's path.
	res.Network = c.networkReport()
	if callCtx.Err() != nil && ctx.Err() == nil {
		res.TimedOut = true
		return res, nil
	}
	if c.policyKill.Load() {
		res.KilledForViolation = true
		return res, nil
	}
	if err != nil {
		if c.cg != nil && c.cg.OOMKills() > oom0 {
			return nil, fmt.Errorf("template call: %w (the slot's cgroup %s)", ErrCallOutOfMemory, c.cg.Path())
		}
		return nil, fmt.Errorf("template call: no answer from the child: %w", err)
	}
	res.Document = doc

	// C12. The exit (cleanup empties the slot's cgroup and returns the pair).
	return res, nil
}

// makeCallNetwork is callNetwork; a test replaces it to make the
// listeners fail (export_test.go).
var makeCallNetwork = callNetwork

// startEgress is C5: the call's listeners, opened in its network
// namespace (nsPath), served with the template's policy by a session of
// the call's own. A failure here fails the call before any of its data
// is sent (ErrCallNetwork); a helper that fails later (the listeners go
// to it at their first traffic) closes them: the call's network fails
// closed, never open.
func (c *templateCall) startEgress(ctx context.Context, nsPath string) error {
	t := c.t
	fds, err := makeCallNetwork(nsPath, t.callListen)
	if err != nil {
		return fmt.Errorf("the child's network namespace: %w", err)
	}
	files := map[string]*os.File{}
	for i, l := range t.callListen {
		files[l.Name] = os.NewFile(uintptr(fds[i]), l.Name)
	}
	sess, err := t.sb.ServeEgress(ctx, files, func(egress.Event) {
		c.policyKill.Store(true)
		_ = unix.PidfdSendSignal(c.pidfd, unix.SIGKILL, nil, 0)
		// The slot's cgroup, not c.cg: set at C6, after this session
		// starts serving.
		if cg := t.cgs[c.slot]; cg != nil {
			_ = cg.Kill()
		}
	})
	if err != nil {
		return err
	}
	c.egress = sess
	return nil
}

// networkReport is the call's egress session's record of denials so far.
func (c *templateCall) networkReport() provider.NetworkReport {
	var r provider.NetworkReport
	if c.egress != nil {
		r.Violations, r.Dropped = c.egress.Violations()
		r.Summary = c.egress.Summary()
	}
	return r
}

// stopEgress closes the call's egress session, if any (cleanup).
func (c *templateCall) stopEgress() {
	if c.egress != nil {
		_ = c.egress.Close()
		c.egress = nil
	}
}

// order is C2.
func (c *templateCall) order(theirs *os.File) error {
	t := c.t
	defer theirs.Close()
	if n, err := countTasks(t.pid); err != nil || n != 1 {
		t.retire(RetiredFailedCheck, fmt.Errorf("%w: the template has %d threads (%v): a fork copies one", ErrRetired, n, err))
		return t.Retired()
	}
	t.orderMu.Lock()
	defer t.orderMu.Unlock()
	t.mu.Lock()
	t.pending = true
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.pending = false
		t.mu.Unlock()
	}()
	order := map[string]any{"type": "fork", "nr": unix.SYS_CLONE, "flags": seccomp.CallClone}
	if err := sendJSON(t.ctrl, order, []int{int(theirs.Fd())}); err != nil {
		t.retire(RetiredFailedCheck, fmt.Errorf("%w: send fork order: %w", ErrRetired, err))
		return t.Retired()
	}
	var rep struct {
		Type  string `json:"type"`
		Error string `json:"error"`
	}
	if _, err := t.readCtrl(&rep, templateDeadline); err != nil {
		t.retire(RetiredFailedCheck, fmt.Errorf("%w: no answer to the fork order: %w", ErrRetired, err))
		return t.Retired()
	}
	if rep.Type != "forked" {
		// The ordered clone failed: either the kernel refused it, or
		// another clone from the template's thread took the order (code
		// of the tool's in a hook): retire the template either way.
		t.retire(RetiredFailedCheck, fmt.Errorf("%w: the template could not fork: %s", ErrRetired, rep.Error))
		return t.Retired()
	}
	return nil
}

// adopt is C3's checks: pid is a child of the template in namespaces of
// its own; its pidfd pins it (checked again after the open, so a pid
// reused in between is caught).
func (c *templateCall) adopt(pid int) error {
	t := c.t
	check := func() error {
		st, err := readStatus(pid)
		if err != nil {
			return failChild("pid %d: %v", pid, err)
		}
		if st["PPid"] != strconv.Itoa(t.pid) {
			return failChild("pid %d has parent %s, not the template %d", pid, st["PPid"], t.pid)
		}
		ns, err := procfs.NamespaceInodes(pid)
		if err != nil {
			return failChild("pid %d: %v", pid, err)
		}
		for k, v := range ns {
			if t.ns[k] == v {
				return failChild("pid %d shares the template's %s namespace (%d)", pid, k, v)
			}
		}
		return nil
	}
	if err := check(); err != nil {
		return err
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return failChild("pidfd_open %d: %v", pid, err)
	}
	c.pid, c.pidfd = pid, fd
	return check()
}

// freshMounts is C7's first half: each as a detached mount made on the host
// (attachMounts puts them in the call's mount namespace).
func (c *templateCall) freshMounts() ([]int, []string, error) {
	var fds []int
	var targets []string
	fail := func(err error) ([]int, []string, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, nil, err
	}
	for _, m := range c.t.fresh {
		fs, err := unix.Fsopen(m.fs, unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fail(fmt.Errorf("template call: fsopen %s for %s: %w", m.fs, m.target, err))
		}
		var opts [][2]string
		if m.data != "" {
			for _, kv := range strings.Split(m.data, ",") {
				k, v, _ := strings.Cut(kv, "=")
				opts = append(opts, [2]string{k, v})
			}
		}
		if m.fs == "proc" {
			// The child's own pid namespace: the kernel takes it as
			// fsconfig's pidns (Linux 6.18), so the mount is made here,
			// never by the child (whose filter refuses fsopen).
			ns, err := unix.Open(fmt.Sprintf("/proc/%d/ns/pid", c.pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err == nil {
				err = unix.FsconfigSetFd(fs, "pidns", ns)
				unix.Close(ns)
			}
			if err != nil {
				unix.Close(fs)
				return fail(fmt.Errorf("template call: proc pidns= for %s: %w (kernel older than 6.18?)", m.target, err))
			}
		}
		for _, o := range opts {
			if err := unix.FsconfigSetString(fs, o[0], o[1]); err != nil {
				unix.Close(fs)
				return fail(fmt.Errorf("template call: fsconfig %s %s=%s: %w", m.target, o[0], o[1], err))
			}
		}
		if err := unix.FsconfigCreate(fs); err != nil {
			unix.Close(fs)
			return fail(fmt.Errorf("template call: fsconfig create %s for %s: %w", m.fs, m.target, err))
		}
		attr := unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
		if m.fs == "proc" {
			attr |= unix.MOUNT_ATTR_NOEXEC
		}
		mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attr)
		unix.Close(fs)
		if err != nil {
			return fail(fmt.Errorf("template call: fsmount %s for %s: %w", m.fs, m.target, err))
		}
		if m.fs == "proc" {
			if c.procFD, err = unix.Dup(mfd); err != nil {
				unix.Close(mfd)
				return fail(err)
			}
			unix.CloseOnExec(c.procFD)
		}
		fds = append(fds, mfd)
		targets = append(targets, m.target)
	}
	return fds, targets, nil
}

// workDirTree is the call's work dir as a detached tree: made by the
// caller for the call's host ids, cloned here (root clones a mount of
// the host's namespace; attachMounts attaches it in the call's),
// its last component not a symlink, nosuid and nodev, private.
func (c *templateCall) workDirTree(mk func(uid, gid int) (string, error)) (int, error) {
	dir, err := mk(c.hostID, c.hostID)
	if err != nil {
		return -1, fmt.Errorf("template call: make the work dir: %w", err)
	}
	tree, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("template call: open_tree %s: %w", dir, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		unix.Close(tree)
		return -1, fmt.Errorf("template call: mount_setattr %s nosuid,nodev,private: %w", dir, err)
	}
	return tree, nil
}

// verify is C9: everything the child was told to do, read from the host.
func (c *templateCall) verify(sockIno uint64) (*ChildCheck, error) {
	t, pid := c.t, c.pid
	st, err := readStatus(pid)
	if err != nil {
		return nil, failChild("pid %d: %v", pid, err)
	}
	id := strconv.Itoa(c.hostID)
	want := map[string]string{
		"Uid": id + "\t" + id + "\t" + id + "\t" + id, "Gid": id + "\t" + id + "\t" + id + "\t" + id,
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1", "Seccomp": "2", "Seccomp_filters": strconv.Itoa(t.filters + 1), "Threads": "1",
		"PPid": strconv.Itoa(t.pid),
	}
	for k, v := range want {
		if st[k] != v {
			return nil, failChild("pid %d: %s is %q, want %q", pid, k, st[k], v)
		}
	}
	ns, err := procfs.NamespaceInodes(pid)
	if err != nil {
		return nil, failChild("pid %d: %v", pid, err)
	}
	for k, v := range ns {
		if t.ns[k] == v {
			return nil, failChild("pid %d shares the template's %s namespace", pid, k)
		}
	}
	// Descriptors: 0-2 /dev/null, 3 the call's socket, nothing else.
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, failChild("pid %d: %v", pid, err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"0", "1", "2", "3"}) {
		return nil, failChild("pid %d holds descriptors %v, want 0-3", pid, names)
	}
	for fd, target := range map[string]string{"0": "/dev/null", "1": "/dev/null", "2": "/dev/null", "3": fmt.Sprintf("socket:[%d]", sockIno)} {
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd)); err != nil || got != target {
			return nil, failChild("pid %d: fd %s is %q (%v), want %s", pid, fd, got, err, target)
		}
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil || cwd != "/" {
		return nil, failChild("pid %d: cwd %q (%v), want /", pid, cwd, err)
	}
	// The call's cgroup.
	if c.cg != nil {
		if err := c.cg.Holds(pid); err != nil {
			return nil, failChild("pid %d: %v", pid, err)
		}
	}
	// No other process in its pid namespace (one forked before the drop
	// would keep the capabilities): its /proc, through our own fd of it.
	if c.procFD > 0 {
		n, err := countPids(c.procFD)
		if err != nil || n != 1 {
			return nil, failChild("pid %d: %d processes in its pid namespace (%v), want 1", pid, n, err)
		}
	}
	if t.nproc > 0 {
		if got := maxProcesses(pid); got != strconv.FormatUint(t.nproc, 10) {
			return nil, failChild("pid %d: RLIMIT_NPROC %q, want %d", pid, got, t.nproc)
		}
	}
	// Its fresh mounts: each the one seen at its target in its root.
	if err := checkMounts(pid, c.mounts); err != nil {
		return nil, failChild("pid %d: %v", pid, err)
	}
	// Everything above was read through /proc/PID: it was this child's
	// only if the child is still the process its pidfd names (a pid is
	// not reused while its process lives).
	if err := unix.PidfdSendSignal(c.pidfd, 0, nil, 0); err != nil {
		return nil, failChild("pid %d ended during its verification: %v", pid, err)
	}
	return &ChildCheck{Pid: pid, HostUID: c.hostID, MappedID: templateSlotInside(c.slot), Namespaces: ns, Filters: t.filters + 1}, nil
}

// mountIDs are the unique mount ids of the detached mounts fds, by
// their targets (C7, for C9).
func mountIDs(fds []int, targets []string) (map[string]uint64, error) {
	ids := make(map[string]uint64, len(fds))
	for i, fd := range fds {
		var st unix.Statx_t
		if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID_UNIQUE, &st); err != nil {
			return nil, fmt.Errorf("statx the mount for %s: %w", targets[i], err)
		}
		if st.Mask&unix.STATX_MNT_ID_UNIQUE == 0 {
			return nil, fmt.Errorf("statx the mount for %s: no unique mount id (kernel older than 6.8?)", targets[i])
		}
		ids[targets[i]] = st.Mnt_id
	}
	return ids, nil
}

// checkMounts is C9's check of the fresh mounts: each target, resolved in
// the root of pid (through /proc/PID/root, without following a symlink,
// never above that root), is the mount attached there at C7: the top one,
// so nothing was mounted over it and it was not detached.
func checkMounts(pid int, want map[string]uint64) error {
	if len(want) == 0 {
		return nil
	}
	root, err := unix.Open(fmt.Sprintf("/proc/%d/root", pid), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open its root: %w", err)
	}
	defer unix.Close(root)
	how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS}
	for target, id := range want {
		fd, err := unix.Openat2(root, strings.TrimPrefix(target, "/"), how)
		if err != nil {
			return fmt.Errorf("its fresh mount %s: %w", target, err)
		}
		var st unix.Statx_t
		err = unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID_UNIQUE, &st)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("its fresh mount %s: statx: %w", target, err)
		}
		if st.Mnt_id != id {
			return fmt.Errorf("%s is mount %d, not the fresh mount %d attached there", target, st.Mnt_id, id)
		}
	}
	return nil
}

// checkTemplateProcess is T3: one thread, descriptors 0-3 only (3 the
// control socket), no MAP_SHARED mapping, no memfd, nothing of /dev/shm.
func checkTemplateProcess(pid int) error {
	if n, err := countTasks(pid); err != nil || n != 1 {
		return fmt.Errorf("the template has %d threads (%v): a fork copies one, and a lock another held stays locked", n, err)
	}
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return err
	}
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		if n > 3 {
			link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name()))
			return fmt.Errorf("the template holds descriptor %d (%s) opened by the tool's import: every call would share it", n, link)
		}
	}
	// smaps, not maps: a read-only MAP_SHARED mapping of a file opened
	// read-only (glibc's gconv-modules.cache) can never be written through
	// (no VM_MAYWRITE, "mw"), so it carries nothing between calls; one
	// that may be written ("sh" and "mw") would.
	smaps, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return err
	}
	return checkSmaps(smaps)
}

// checkSmaps refuses a mapping that is shared and may be written
// (VmFlags "sh" and "mw") or is a memfd or /dev/shm file.
func checkSmaps(smaps []byte) error {
	head := ""
	for _, line := range strings.Split(string(smaps), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			head = line
			path := ""
			if len(f) >= 6 {
				path = strings.Join(f[5:], " ")
			}
			if strings.HasPrefix(path, "/memfd:") || strings.HasPrefix(path, "/dev/shm/") {
				return fmt.Errorf("the template maps %s %s: a memory file every call would share", f[1], path)
			}
			continue
		}
		if flags, ok := strings.CutPrefix(line, "VmFlags:"); ok {
			fl := strings.Fields(flags)
			if slices.Contains(fl, "sh") && slices.Contains(fl, "mw") {
				return fmt.Errorf("the template maps shared and writable %q: a mapping every call would share", head)
			}
		}
	}
	return nil
}

// maxProcesses is the soft "Max processes" of /proc/PID/limits ("" if
// unreadable).
func maxProcesses(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max processes"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[0]
			}
		}
	}
	return ""
}

func countTasks(pid int) (int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	return len(ents), err
}

// countPids counts the numbered entries of a procfs root.
func countPids(procFD int) (int, error) {
	fd, err := unix.Openat(procFD, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), "proc")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	n := 0
	for _, name := range names {
		if _, e := strconv.Atoi(name); e == nil {
			n++
		}
	}
	return n, err
}

// readStatus is /proc/PID/status as key -> value (tabs kept).
func readStatus(pid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out, nil
}

func setPassCred(f *os.File) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1) }); err != nil {
		return err
	}
	return serr
}

// sendJSON sends v as one message, with fds as SCM_RIGHTS.
func sendJSON(f *os.File, v any, fds []int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), b, oob, nil, 0)
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return serr
}

// maxTemplateMessage bounds one message from a template or a call (the
// answer carries the call's result document).
const maxTemplateMessage = 64 << 20

// templateChunk is the most bytes of a result document one message
// carries (sent to the child in its setup): a SOCK_SEQPACKET message must fit
// the socket's send buffer (wmem_default, ~208 KiB), so a larger document
// is sent in pieces.
const templateChunk = 64 << 10

// AnswerTooLargeError: a call announced an answer of Size bytes, more than
// the Max a template call's answer may have (the tool's doing: its
// result is too large, as a cold call's result file can be).
type AnswerTooLargeError struct{ Size, Max int64 }

func (e *AnswerTooLargeError) Error() string {
	return fmt.Sprintf("the answer announces %d bytes, more than the %d a template call's answer may have", e.Size, e.Max)
}

// recvDocument reads a call's answer (C11) within d: a header message
// {"type": "result", "size": N}, 1 <= N <= maxTemplateMessage, then the N
// bytes of the result document in messages of at most templateChunk
// bytes. A piece longer than what is left of N, or the socket closing
// before N bytes, is an error naming both counts.
func recvDocument(f *os.File, d time.Duration) (json.RawMessage, error) {
	deadline := time.Now().Add(d)
	var head struct {
		Type string `json:"type"`
		Size int    `json:"size"`
	}
	if _, _, err := recvJSON(f, &head, d, false); err != nil {
		return nil, err
	}
	if head.Type == "result" && head.Size > maxTemplateMessage {
		return nil, &AnswerTooLargeError{Size: int64(head.Size), Max: maxTemplateMessage}
	}
	if head.Type != "result" || head.Size < 1 {
		return nil, fmt.Errorf("the answer's header is %q of %d bytes: want \"result\" of 1 to %d bytes", head.Type, head.Size, maxTemplateMessage)
	}
	_ = f.SetReadDeadline(deadline)
	defer f.SetReadDeadline(time.Time{})
	raw, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	doc := make([]byte, head.Size)
	for off := 0; off < len(doc); {
		var n, flags int
		var rerr error
		if err := raw.Read(func(fd uintptr) bool {
			n, _, flags, _, rerr = unix.Recvmsg(int(fd), doc[off:], nil, 0)
			return rerr != unix.EAGAIN
		}); err != nil {
			return nil, err
		}
		switch {
		case rerr != nil:
			return nil, rerr
		case n == 0:
			return nil, fmt.Errorf("the other end closed after %d of the %d bytes announced", off, len(doc))
		case flags&unix.MSG_TRUNC != 0:
			return nil, fmt.Errorf("a piece of the answer runs past the %d bytes announced (%d received before it)", len(doc), off)
		}
		off += n
	}
	return doc, nil
}

// recvJSON reads one message into v within d; with creds it returns the
// sender's pid (SCM_CREDENTIALS, translated into our pid namespace by
// the kernel). Descriptors that come with it are closed.
func recvJSON(f *os.File, v any, d time.Duration, creds bool) (int, int, error) {
	_ = f.SetReadDeadline(time.Now().Add(d))
	defer f.SetReadDeadline(time.Time{})
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred)+unix.CmsgSpace(4*8))
	raw, err := f.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var buf []byte
	n, oobn, flags, err := launcher.RecvMessage(raw, &buf, oob, maxTemplateMessage)
	if err != nil {
		return 0, 0, err
	}
	pid := 0
	if oobn > 0 {
		cms, _ := unix.ParseSocketControlMessage(oob[:oobn])
		for _, cm := range cms {
			if fds, err := unix.ParseUnixRights(&cm); err == nil {
				launcher.CloseFDs(fds)
			}
			if uc, err := unix.ParseUnixCredentials(&cm); err == nil {
				pid = int(uc.Pid)
			}
		}
	}
	if n == 0 {
		return 0, 0, errors.New("the other end closed")
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return 0, 0, errors.New("message truncated")
	}
	if creds && pid == 0 {
		return 0, 0, errors.New("no SCM_CREDENTIALS")
	}
	return pid, n, json.Unmarshal(bytes.TrimSpace(buf[:n]), v)
}
