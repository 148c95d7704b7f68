package launcher

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/launcher/procfs"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/launcher/statedir"
)

// The cgroup code is str's own, a few files written and read per sandbox:
//
//	v2: mkdir; memory.max, memory.swap.max, pids.max, cpu.max; the
//	    directory fd for CLONE_INTO_CGROUP; cgroup.kill; memory.peak,
//	    memory.events, pids.events, cpu.stat; rmdir.
//	v1: mkdir in the memory, pids, cpu, cpuacct and freezer hierarchies;
//	    memory.limit_in_bytes (+memsw), pids.max, cpu.cfs_*; the tasks
//	    files opened to the init (self-entry); freezer.state around the
//	    kill; memory.max_usage_in_bytes, memory.oom_control, cpuacct.usage,
//	    pids.events; rmdir.
//
// Each sandbox cgroup has an opaque random name behind its state
// directory's prefix and a lock file held by its launcher for the
// sandbox's life (cgroupSpace): a later launcher of the same state
// directory removes only cgroups whose lock nobody holds, so a SIGKILLed
// launcher's leftovers go and a live one's never do, and no str touches
// the cgroups of another state directory (see sweepDue for when).

const cgroupRoot = "/sys/fs/cgroup"

// cgroupStats is what the result reports from the sandbox's cgroup.
type cgroupStats struct {
	PeakMemory int64
	CPUNanos   int64
	OOMKills   int64
	PidsMax    int64 // times a fork failed at pids.max
}

// sandboxCgroup is one sandbox's cgroup, v1 or v2.
type sandboxCgroup interface {
	// Path names the cgroup for error messages.
	Path() string
	// CloneFD returns a directory fd for CLONE_INTO_CGROUP (v2 only).
	CloneFD() (int, bool)
	// SelfEntry (v1) makes the "tasks" file of every controller writable
	// by the init's host ids and returns their paths: the init's exec
	// thread moves itself in (nsinit step 12). v2 returns nil: the init is
	// born in its cgroup.
	SelfEntry(uid, gid int) ([]string, error)
	// Empty reports whether no process is left.
	Empty() bool
	// Kill kills every process of the cgroup.
	Kill() error
	Stats() cgroupStats
	// Delete removes the cgroup (it must be empty) and drops its lock.
	Delete() error
}

// DetectCgroup says which hierarchy limits go through for this process
// with no explicit v2 parent (detectCgroup).
func DetectCgroup() CgroupMode { return detectCgroup(procfs.RootMode(), "") }

// detectCgroup says which hierarchy limits go through: v2 if the unified
// hierarchy is mounted at /sys/fs/cgroup and, rootless (not root mode),
// the cgroup sandbox cgroups would be made in was delegated to it (see
// v2Delegated); else v1 if our own cgroup in its memory and pids
// hierarchies is writable (root, or a subtree delegated to this user);
// else none. Root mode on v2 is v2 whatever the mode bits say: a cgroup
// root cannot write is a host misconfiguration, reported by Create.
func detectCgroup(root bool, v2parent string) CgroupMode {
	var st unix.Statfs_t
	if unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		if root || v2Delegated(v2parent) {
			return CgroupV2
		}
		return CgroupNone
	}
	own, _ := procfs.Cgroups("self")
	for _, c := range []string{"memory", "pids"} {
		p, ok := own[c]
		if !ok || unix.Access(filepath.Join(cgroupRoot, c, p), unix.W_OK) != nil {
			return CgroupNone
		}
	}
	return CgroupV1
}

// v2Delegated reports whether this process may make sandbox cgroups
// where v2Base would: in the explicit parent (a directory it may create
// entries in, or one it may create), or in its own cgroup (its parent when it is a
// str-supervisor leaf), whose directory and cgroup.procs it must be
// able to write (the launcher moves itself into a leaf there). A
// systemd user manager's units with Delegate=yes, and a subtree chowned
// to the user, are; a login session's scope is not.
func v2Delegated(parent string) bool {
	if parent != "" {
		dir := filepath.Join(cgroupRoot, parent)
		if err := unix.Access(dir, unix.W_OK); err != unix.ENOENT {
			return err == nil
		}
		return unix.Access(filepath.Dir(dir), unix.W_OK) == nil // prepareV2Base makes it
	}
	own, err := procfs.Cgroups("self")
	p, ok := own[""]
	if err != nil || !ok {
		return false
	}
	if filepath.Base(p) == "str-supervisor" {
		p = filepath.Dir(p)
	}
	dir := filepath.Join(cgroupRoot, p)
	return unix.Access(dir, unix.W_OK) == nil && unix.Access(filepath.Join(dir, "cgroup.procs"), unix.W_OK) == nil
}

// newCgroupID is an opaque sandbox id: nothing about the worker (no pid)
// shows inside or outside. It names the sandbox's lock file; its cgroup
// is the id behind its state directory's prefix (cgroupSpace.name).
func newCgroupID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "s" + hex.EncodeToString(b[:])
}

// cgroupSpace is what one state directory owns of the cgroup tree. Every
// str process of a host may run with its own state directory (a worker,
// str serve, an admin's str run, CI beside them), and each one sweeps
// what its launchers left when they were SIGKILLed: a sweep must find
// only what it can prove its own (issue 29: a sweep that took every
// unlocked "s*" cgroup for a dead launcher's SIGKILLed the sandboxes of
// every str with another state directory). So:
//
//   - every sandbox cgroup of a state directory is named prefix+id, the
//     prefix derived from the directory's path, and a sweep looks at no
//     other name;
//   - its lock file (lockDir/id) is created and locked before the cgroup
//     exists and lists the cgroup's directories, so a sweep finds a dead
//     launcher's cgroups from its own lock files, wherever they are (a v1
//     memory cgroup below another session's cgroup, say).
//
// Sandbox cgroups sit directly in the launcher's own cgroup (per v1
// hierarchy, or its v2 cgroup: see v2Base), not below a common parent: a
// sandbox weighs for the CPU scheduler what one process of its launcher's
// cgroup weighs (cpu.shares 1024, cpu.weight 100), as the same command
// under bubblewrap would. Below one "str" parent, all the sandboxes of a
// host together had the weight of one process (issue 29, item 3).
type cgroupSpace struct {
	lockDir string // <state dir>/cgroups
	prefix  string // "str-" + 12 hex digits of sha256(state dir) + "-"
}

func newCgroupSpace(stateDir string) cgroupSpace {
	sum := sha256.Sum256([]byte(filepath.Clean(stateDir)))
	return cgroupSpace{
		lockDir: filepath.Join(stateDir, "cgroups"),
		prefix:  "str-" + hex.EncodeToString(sum[:6]) + "-",
	}
}

// name is the cgroup directory name of sandbox id.
func (sp cgroupSpace) name(id string) string { return sp.prefix + id }

// own reports whether dir is a sandbox cgroup of this state directory:
// below /sys/fs/cgroup and named with its prefix. A lock file's list is
// checked with it before a sweep kills or removes anything it names.
func (sp cgroupSpace) own(dir string) bool {
	return strings.HasPrefix(dir, cgroupRoot+"/") && filepath.Clean(dir) == dir &&
		strings.HasPrefix(filepath.Base(dir), sp.prefix)
}

// lockFile is a file this process holds an flock on for as long as it
// holds what the file stands for: a sandbox's cgroups (lockCgroup) or
// its host id block (HostIDLease).
type lockFile struct {
	fd   int
	path string
}

// release removes the lock file, then drops the lock (in this order: a
// sweep or a lease that opened the file before it was removed finds it
// unlinked).
func (l *lockFile) release() {
	if l == nil || l.fd < 0 {
		return
	}
	_ = unix.Unlink(l.path)
	unix.Close(l.fd)
	l.fd = -1
}

// lockCgroup creates and locks sandbox id's lock file in sp.lockDir and
// writes dirs into it, one a line, before any of them exists; the file
// is removed after they are gone, so an unlocked (or missing) lock file
// next to an existing directory means its launcher died.
func lockCgroup(sp cgroupSpace, id string, dirs []string) (*lockFile, error) {
	dir, err := statedir.Sub(filepath.Dir(sp.lockDir), filepath.Base(sp.lockDir))
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, id)
	// A sweep (sweepLocks) that opens the new file between its creation
	// and our flock finds it unlocked and removes it: our lock would then
	// be on a file nobody else can find, and a later sweep would take the
	// cgroup for a dead launcher's. So the lock counts only while its
	// file is still linked; a removed one is created again. The flock
	// waits: the file is new (O_EXCL), so the only other holder can be
	// such a sweep, for the moment it takes to remove it (a LOCK_NB
	// failed then, EWOULDBLOCK, and a worker refused to start).
	content := []byte(strings.Join(dirs, "\n") + "\n")
	for range 3 {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, &statedir.Error{Dir: dir, Err: &os.PathError{Op: "create", Path: path, Err: err}}
		}
		if err := flockEINTR(fd); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("flock %s: %w", path, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("fstat %s: %w", path, err)
		}
		if st.Nlink == 0 {
			unix.Close(fd)
			continue
		}
		// The list before the first mkdir: a launcher killed after it
		// leaves a lock that names every directory it may have made.
		if _, err := unix.Pwrite(fd, content, 0); err != nil {
			_ = unix.Unlink(path)
			unix.Close(fd)
			return nil, &statedir.Error{Dir: dir, Err: &os.PathError{Op: "write", Path: path, Err: err}}
		}
		return &lockFile{fd: fd, path: path}, nil
	}
	return nil, fmt.Errorf("lock file %s was removed under us three times (a sweep of another str process)", path)
}

// flockEINTR takes fd's exclusive lock, waiting for it.
func flockEINTR(fd int) error {
	for {
		if err := unix.Flock(fd, unix.LOCK_EX); err != unix.EINTR {
			return err
		}
	}
}

// writeFiles writes name=value pairs into dir, in order, naming the file
// in any error.
func writeFiles(dir string, kv [][2]string) error {
	for _, e := range kv {
		if err := os.WriteFile(filepath.Join(dir, e[0]), []byte(e[1]), 0); err != nil {
			return fmt.Errorf("write %s=%s: %w", filepath.Join(dir, e[0]), e[1], err)
		}
	}
	return nil
}

// ---- cgroup v2 ----------------------------------------------------------

type cgroupV2 struct {
	path string // absolute, under /sys/fs/cgroup
	fd   int
	lock *lockFile
}

// v2Controllers are enabled for sandbox cgroups.
var v2Controllers = []string{"memory", "pids", "cpu"}

// v2Base returns the cgroup in which sandbox cgroups are created. With an
// explicit parent it is used as is. Otherwise it is our own cgroup;
// because cgroup v2 forbids processes in a cgroup whose children have
// controllers enabled, a launcher that is not in the root cgroup first
// moves itself into a leaf "<own>/str-supervisor". This is what a
// delegated subtree (systemd Delegate=yes) needs. It runs at the first
// Create, never for commands that start no sandbox.
func v2Base(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	own, err := procfs.Cgroups("self")
	if err != nil {
		return "", err
	}
	p, ok := own[""]
	if !ok {
		return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
	}
	if p != "/" {
		procs, err := os.ReadFile(filepath.Join(cgroupRoot, p, "cgroup.procs"))
		if err != nil {
			return "", err
		}
		if len(bytes.Fields(procs)) > 0 && filepath.Base(p) != "str-supervisor" {
			leaf := filepath.Join(p, "str-supervisor")
			if err := os.Mkdir(filepath.Join(cgroupRoot, leaf), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return "", fmt.Errorf("create supervisor cgroup %s: %w", leaf, err)
			}
			pid := strconv.Itoa(os.Getpid())
			if err := os.WriteFile(filepath.Join(cgroupRoot, leaf, "cgroup.procs"), []byte(pid), 0); err != nil {
				return "", fmt.Errorf("move launcher into %s: %w", leaf, err)
			}
		} else if filepath.Base(p) == "str-supervisor" {
			p = filepath.Dir(p)
		}
	}
	return p, nil
}

// prepareV2Base enables the controllers for the base's children: in the
// base's cgroup.subtree_control, and first in its parent's when the base
// does not have them (an explicit parent made for str).
func prepareV2Base(base string) error {
	dir := filepath.Join(cgroupRoot, base)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	steps := []string{dir}
	if have, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers")); len(v2MissingControllers(have, v2Controllers)) > 0 {
		steps = []string{filepath.Dir(dir), dir}
	}
	for _, d := range steps {
		if !strings.HasPrefix(d, cgroupRoot) {
			continue
		}
		cur, _ := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
		missing := v2MissingControllers(cur, v2Controllers)
		if len(missing) == 0 {
			continue
		}
		enable := "+" + strings.Join(missing, " +")
		if err := os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), []byte(enable), 0); err != nil {
			return fmt.Errorf("enable %s in %s/cgroup.subtree_control: %w", enable, d, err)
		}
	}
	return nil
}

// v2MissingControllers returns the controllers of want that a
// cgroup.subtree_control (or cgroup.controllers) file does not list, in
// want's order. The file is a space-separated list of names, compared
// whole: "cpuset" enabled does not make "cpu" look enabled.
func v2MissingControllers(file []byte, want []string) []string {
	have := strings.Fields(string(file))
	var missing []string
	for _, c := range want {
		if !slices.Contains(have, c) {
			missing = append(missing, c)
		}
	}
	return missing
}

func newCgroupV2(sp cgroupSpace, base, id string, pl CgroupPlan) (*cgroupV2, error) {
	path := filepath.Join(cgroupRoot, base, sp.name(id))
	lock, err := lockCgroup(sp, id, []string{path})
	if err != nil {
		return nil, fmt.Errorf("lock cgroup %s: %w", id, err)
	}
	if err := os.Mkdir(path, 0o755); err != nil {
		lock.release()
		return nil, fmt.Errorf("create %s: %w", path, err)
	}
	c := &cgroupV2{path: path, fd: -1, lock: lock}
	kv := [][2]string{}
	if pl.MemoryMax > 0 {
		kv = append(kv, [2]string{"memory.max", strconv.FormatInt(pl.MemoryMax, 10)})
		if _, err := os.Stat(filepath.Join(path, "memory.swap.max")); err == nil {
			kv = append(kv, [2]string{"memory.swap.max", strconv.FormatInt(pl.SwapMax, 10)})
		}
	}
	if pl.PidsMax > 0 {
		kv = append(kv, [2]string{"pids.max", strconv.FormatInt(pl.PidsMax, 10)})
	}
	if pl.CPUQuotaUs > 0 {
		kv = append(kv, [2]string{"cpu.max", fmt.Sprintf("%d %d", pl.CPUQuotaUs, pl.CPUPeriodUs)})
	}
	if err := writeFiles(path, kv); err != nil {
		_ = c.Delete()
		return nil, err
	}
	if c.fd, err = unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		_ = c.Delete()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return c, nil
}

func (c *cgroupV2) Path() string                             { return c.path }
func (c *cgroupV2) CloneFD() (int, bool)                     { return c.fd, true }
func (c *cgroupV2) SelfEntry(uid, gid int) ([]string, error) { return nil, nil }

func (c *cgroupV2) Empty() bool { return procsEmpty(c.path) }

// Kill uses cgroup.kill (5.14+), which kills the whole subtree atomically,
// forks in flight included.
func (c *cgroupV2) Kill() error {
	return os.WriteFile(filepath.Join(c.path, "cgroup.kill"), []byte("1"), 0)
}

func (c *cgroupV2) Stats() cgroupStats {
	var s cgroupStats
	s.PeakMemory = readInt(filepath.Join(c.path, "memory.peak"))
	s.CPUNanos = readKV(filepath.Join(c.path, "cpu.stat"))["usage_usec"] * 1000
	s.OOMKills = readKV(filepath.Join(c.path, "memory.events"))["oom_kill"]
	s.PidsMax = readKV(filepath.Join(c.path, "pids.events"))["max"]
	return s
}

func (c *cgroupV2) Delete() error {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
	err := retryBusy(func() error { return unix.Rmdir(c.path) })
	if err == nil {
		c.lock.release()
	}
	return err
}

// ---- cgroup v1 ----------------------------------------------------------

type cgroupV1 struct {
	paths map[string]string // controller -> absolute dir
	order []string          // controllers in v1Controllers order
	lock  *lockFile
	spare *KeptCgroups // the reused hierarchies' cgroups, when taken from a resident launcher's (cgroupreuse.go)
}

// v1Controllers are the only v1 hierarchies str touches: fewer
// hierarchies, fewer mkdirs per sandbox.
var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// v1Bases is "<root>/<controller>/<own cgroup>" per mounted controller:
// where this launcher's sandbox cgroups go (cgroupSpace).
func v1Bases() map[string]string {
	own, err := procfs.Cgroups("self")
	if err != nil {
		return nil
	}
	dirs := map[string]string{}
	for _, c := range v1Controllers {
		p, ok := own[c]
		if !ok {
			continue
		}
		// A hierarchy mounted with several controllers (cpu,cpuacct) has
		// one directory under either name.
		if _, err := os.Stat(filepath.Join(cgroupRoot, c)); err == nil {
			dirs[c] = filepath.Join(cgroupRoot, c, p)
		}
	}
	return dirs
}

func newCgroupV1(sp cgroupSpace, id string, pl CgroupPlan, spare *KeptCgroups) (*cgroupV1, error) {
	bases := v1Bases()
	var made []string // the directories this lock guards (a spare's have their own)
	for _, ctl := range v1Controllers {
		if _, ok := bases[ctl]; ok {
			if _, reused := spare.path(ctl); !reused {
				made = append(made, filepath.Join(bases[ctl], sp.name(id)))
			}
		}
	}
	lock, err := lockCgroup(sp, id, made)
	if err != nil {
		spare.Remove()
		return nil, fmt.Errorf("lock cgroup %s: %w", id, err)
	}
	c := &cgroupV1{paths: map[string]string{}, lock: lock, spare: spare}
	for _, ctl := range v1Controllers {
		base, ok := bases[ctl]
		if !ok {
			continue
		}
		if p, ok := spare.path(ctl); ok {
			// Made for the same plan, its limits set: reused as it is.
			c.paths[ctl] = p
			c.order = append(c.order, ctl)
			continue
		}
		dir := filepath.Join(base, sp.name(id))
		// A co-mounted hierarchy (cpu,cpuacct) has it made already.
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			_ = c.Delete()
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		// The mode set explicitly, never through the umask (a worker under
		// UMask=0027 would make it 0750): the init, an unprivileged uid,
		// must reach its tasks file.
		if err := os.Chmod(dir, 0o755); err != nil {
			_ = c.Delete()
			return nil, fmt.Errorf("chmod %s: %w", dir, err)
		}
		c.paths[ctl] = dir
		c.order = append(c.order, ctl)
	}
	if _, ok := c.paths["memory"]; !ok {
		_ = c.Delete()
		return nil, errors.New("no v1 memory hierarchy")
	}
	set := func(ctl string, kv [][2]string) error {
		if _, reused := spare.path(ctl); reused {
			return nil
		}
		if dir, ok := c.paths[ctl]; ok {
			return writeFiles(dir, kv)
		}
		return nil
	}
	var errs []error
	if pl.MemoryMax > 0 {
		kv := [][2]string{{"memory.limit_in_bytes", strconv.FormatInt(pl.MemoryMax, 10)}}
		// memory+swap equal to memory: no swap, where the kernel accounts
		// swap. After the memory limit: memsw may never be below it.
		if _, err := os.Stat(filepath.Join(c.paths["memory"], "memory.memsw.limit_in_bytes")); err == nil {
			kv = append(kv, [2]string{"memory.memsw.limit_in_bytes", strconv.FormatInt(pl.MemoryMax+pl.SwapMax, 10)})
		}
		errs = append(errs, set("memory", kv))
	}
	if pl.PidsMax > 0 {
		errs = append(errs, set("pids", [][2]string{{"pids.max", strconv.FormatInt(pl.PidsMax, 10)}}))
	}
	if pl.CPUQuotaUs > 0 {
		errs = append(errs, set("cpu", [][2]string{{"cpu.cfs_period_us", strconv.FormatInt(pl.CPUPeriodUs, 10)},
			{"cpu.cfs_quota_us", strconv.FormatInt(pl.CPUQuotaUs, 10)}}))
	}
	if err := errors.Join(errs...); err != nil {
		_ = c.Delete()
		return nil, err
	}
	return c, nil
}

func (c *cgroupV1) Path() string         { return c.paths["memory"] }
func (c *cgroupV1) CloneFD() (int, bool) { return -1, false }

func (c *cgroupV1) SelfEntry(uid, gid int) ([]string, error) {
	var tasks []string
	for _, ctl := range c.order {
		t := filepath.Join(c.paths[ctl], "tasks")
		if err := os.Lchown(t, uid, gid); err != nil {
			return nil, fmt.Errorf("chown %s to the init's host ids %d:%d: %w", t, uid, gid, err)
		}
		tasks = append(tasks, t)
	}
	return tasks, nil
}

func (c *cgroupV1) Empty() bool {
	for _, p := range c.paths {
		if !procsEmpty(p) {
			return false
		}
	}
	return true
}

// Kill freezes the cgroup so nothing can fork while we kill, SIGKILLs every
// process, then thaws so the kills are delivered (v1 has no cgroup.kill).
// An empty cgroup is left alone: the freeze, its polling and the thaw cost
// 0.6-1.5 ms, and a worker kills every sandbox after its reply, when the
// tool has mostly exited already. Empty is the same check the freeze
// would make safe: a fork in flight keeps its parent listed in
// cgroup.procs until the child is, and nothing outside the sandbox but
// host root can move a process in (its tasks files belong to the
// sandbox's own host ids, and every process with those ids is inside it).
func (c *cgroupV1) Kill() error {
	if c.Empty() {
		return nil
	}
	fz, ok := c.paths["freezer"]
	if ok {
		if err := os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("FROZEN"), 0); err != nil {
			return fmt.Errorf("freeze %s: %w", fz, err)
		}
		for i := 0; i < 200; i++ {
			if st, _ := os.ReadFile(filepath.Join(fz, "freezer.state")); strings.TrimSpace(string(st)) == "FROZEN" {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	for _, p := range c.paths {
		killProcs(p)
	}
	if ok {
		if err := os.WriteFile(filepath.Join(fz, "freezer.state"), []byte("THAWED"), 0); err != nil {
			return fmt.Errorf("thaw %s: %w", fz, err)
		}
	}
	return nil
}

func (c *cgroupV1) Stats() cgroupStats {
	var s cgroupStats
	if p, ok := c.paths["memory"]; ok {
		s.PeakMemory = readInt(filepath.Join(p, "memory.max_usage_in_bytes"))
		s.OOMKills = readKV(filepath.Join(p, "memory.oom_control"))["oom_kill"]
	}
	if p, ok := c.paths["cpuacct"]; ok {
		s.CPUNanos = readInt(filepath.Join(p, "cpuacct.usage"))
	}
	if p, ok := c.paths["pids"]; ok {
		s.PidsMax = readKV(filepath.Join(p, "pids.events"))["max"]
	}
	return s
}

func (c *cgroupV1) Delete() error {
	var errs []error
	for ctl, p := range c.paths {
		if err := retryBusy(func() error { return unix.Rmdir(p) }); err != nil {
			errs = append(errs, fmt.Errorf("rmdir %s: %w", p, err))
			continue
		}
		delete(c.paths, ctl)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	c.lock.release()
	if c.spare != nil {
		c.spare.lock.release()
		c.spare = nil
	}
	return nil
}

// ---- helpers ------------------------------------------------------------

// procsEmpty reports whether dir/cgroup.procs lists no process (or
// cannot be read). The first bytes say it: a listed pid is never blank.
func procsEmpty(dir string) bool {
	b, err := readSmall(filepath.Join(dir, "cgroup.procs"), 64)
	return err != nil || len(bytes.TrimSpace(b)) == 0
}

// killProcs SIGKILLs every process listed in dir/cgroup.procs.
func killProcs(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range bytes.Fields(b) {
		if n, err := strconv.Atoi(string(f)); err == nil && n > 0 {
			_ = unix.Kill(n, unix.SIGKILL)
		}
	}
}

// retryBusy retries a cgroup removal for a short while: the kernel may
// still be tearing down the last killed task.
func retryBusy(f func() error) error {
	var err error
	for i := 0; i < 400; i++ {
		if err = f(); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(time.Duration(min(i+1, 10)) * 500 * time.Microsecond)
	}
	return err
}

// readSmall reads at most max bytes of a cgroup file: open, read until
// EOF or max, close (os.ReadFile adds an fstat and a read past the end,
// per file, several files per sandbox).
func readSmall(path string, max int) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	b := make([]byte, max)
	n := 0
	for n < max {
		m, err := unix.Read(fd, b[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			break
		}
		n += m
	}
	return b[:n], nil
}

// cgroupStatMax bounds the statistics files read (a few lines each).
const cgroupStatMax = 4096

func readInt(path string) int64 {
	b, err := readSmall(path, cgroupStatMax)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func readKV(path string) map[string]int64 {
	m := map[string]int64{}
	b, err := readSmall(path, cgroupStatMax)
	if err != nil {
		return m
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			m[f[0]] = n
		}
	}
	return m
}

// sweepEvery spaces the sweeps of one state directory's str processes:
// a one-shot `str run` is a launcher's first sandbox every time, and a
// sweep (a lock try per live sandbox, a readdir per hierarchy) cost a
// one-shot run 3.7 % of its CPU, ~700 of its 3,400 system calls with 100
// live sandboxes on the host (issue 29, item 4). So a launcher sweeps
// only when no str process of its state directory did in the last
// sweepEvery, except a long-lived one (a worker, str serve:
// Options.LongLived), which also sweeps at its first sandbox: a worker
// restarted after a SIGKILL removes what the killed one left at once.
const sweepEvery = 10 * time.Second

// sweepDue reports whether this launcher sweeps now: no str process of
// its state directory did in the last sweepEvery (the mtime of
// cgroups/.swept), and marks it as done now. A stamp that cannot be read
// or written means a sweep.
func sweepDue(sp cgroupSpace, now time.Time) bool {
	stamp := filepath.Join(sp.lockDir, ".swept")
	var st unix.Stat_t
	if unix.Stat(stamp, &st) == nil && now.Sub(time.Unix(st.Mtim.Unix())).Abs() < sweepEvery {
		return false
	}
	ts := []unix.Timespec{unix.NsecToTimespec(now.UnixNano()), unix.NsecToTimespec(now.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, stamp, ts, unix.AT_SYMLINK_NOFOLLOW); errors.Is(err, unix.ENOENT) {
		if fd, err := unix.Open(stamp, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600); err == nil {
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, stamp, ts, unix.AT_SYMLINK_NOFOLLOW)
			unix.Close(fd)
		}
	}
	return true
}

// sweep removes what launchers of this state directory left when they
// died without tearing down (SIGKILL of str run: Pdeathsig killed the
// sandbox, but nobody was left to rmdir its cgroup). Two passes, neither
// of which looks at anything but this state directory's own:
//
//  1. sweepLocks: every lock file nobody holds lists a dead launcher's
//     directories, wherever they are;
//  2. sweepNames: a directory in bases named with this state directory's
//     prefix whose lock file is gone (the state directory was wiped, a
//     lock write failed).
//
// A live launcher's cgroups are never touched: their lock is held.
func sweep(sp cgroupSpace, bases []string) {
	sweepLocks(sp)
	sweepNames(sp, bases)
}

// sweepLocks is pass 1. Each lock file is tried once, on a raw fd (open,
// flock, close for a live sandbox's).
func sweepLocks(sp cgroupSpace) {
	ents, err := os.ReadDir(sp.lockDir)
	if err != nil {
		return
	}
	buf := make([]byte, 4096)
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), "s") {
			continue
		}
		path := filepath.Join(sp.lockDir, e.Name())
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		// Held: a live launcher's. Unlinked: its holder released it
		// between our readdir and our open (the directories are gone).
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil || unix.Fstat(fd, &st) != nil || st.Nlink == 0 {
			unix.Close(fd)
			continue
		}
		n, _ := unix.Pread(fd, buf, 0)
		gone := true
		for _, dir := range strings.Split(string(buf[:max(n, 0)]), "\n") {
			if !sp.own(dir) {
				continue // blank, or not a sandbox cgroup of this state directory
			}
			if killAndRemove(dir) != nil {
				gone = false
			}
		}
		if gone {
			_ = unix.Unlink(path)
		}
		unix.Close(fd)
	}
}

// sweepNames is pass 2.
func sweepNames(sp cgroupSpace, bases []string) {
	for _, base := range bases {
		ents, err := os.ReadDir(base)
		if err != nil {
			continue
		}
		for _, e := range ents {
			id, ok := strings.CutPrefix(e.Name(), sp.prefix)
			if !e.IsDir() || !ok || strings.Contains(id, "/") {
				continue
			}
			if _, err := os.Lstat(filepath.Join(sp.lockDir, id)); !errors.Is(err, os.ErrNotExist) {
				continue // a lock file: pass 1 decided (held, or removal failed)
			}
			// No lock file: a lock is created before its directories and
			// removed after them, so its launcher is gone.
			_ = killAndRemove(filepath.Join(base, e.Name()))
		}
	}
}

// killAndRemove empties a dead launcher's cgroup directory (SIGKILL to
// whatever is left in it) and removes it.
func killAndRemove(dir string) error {
	killProcs(dir)
	return retryBusy(func() error { return unix.Rmdir(dir) })
}

// cgroupBases returns the directories holding this launcher's sandbox
// cgroups: its own cgroup in every v1 hierarchy str uses, or the v2 base.
func cgroupBases(mode CgroupMode, v2base string) []string {
	switch mode {
	case CgroupV2:
		if v2base == "" {
			return nil
		}
		return []string{filepath.Join(cgroupRoot, v2base)}
	case CgroupV1:
		var dirs []string
		for _, d := range v1Bases() {
			if !slices.Contains(dirs, d) {
				dirs = append(dirs, d)
			}
		}
		return dirs
	}
	return nil
}

// Cgroup is a cgroup with a plan's limits that no sandbox is born in: a
// per-tool template's call slot (package launcher/template, C6), into
// which its supervisor moves each call, one at a time.
type Cgroup struct{ cg sandboxCgroup }

// NewCgroup creates a cgroup with pl's limits as L1 does for a sandbox,
// under an opaque name and a lock held until Delete; nil when the plan
// has no cgroup (CgroupNone).
func (l *Launcher) NewCgroup(pl *Plan) (*Cgroup, error) {
	if pl.Cgroup.Mode == CgroupNone {
		return nil, nil
	}
	cg, err := l.createCgroup(newCgroupID(), pl)
	if err != nil {
		return nil, err
	}
	return &Cgroup{cg}, nil
}

// Path names the cgroup (v1: its memory hierarchy's directory).
func (c *Cgroup) Path() string { return c.cg.Path() }

// Empty reports whether no process is left in it.
func (c *Cgroup) Empty() bool { return c.cg.Empty() }

// Kill kills every process in it.
func (c *Cgroup) Kill() error { return c.cg.Kill() }

// Delete removes it (it must be empty) and drops its lock.
func (c *Cgroup) Delete() error { return c.cg.Delete() }

// OOMKills is how many of its processes the kernel killed at its
// memory limit so far.
func (c *Cgroup) OOMKills() int64 { return c.cg.Stats().OOMKills }

// Enter moves pid into every hierarchy of the cgroup.
func (c *Cgroup) Enter(pid int) error {
	p := []byte(strconv.Itoa(pid))
	switch cg := c.cg.(type) {
	case *cgroupV1:
		for _, ctl := range cg.order {
			if err := os.WriteFile(filepath.Join(cg.paths[ctl], "cgroup.procs"), p, 0); err != nil {
				return err
			}
		}
		return nil
	case *cgroupV2:
		return os.WriteFile(filepath.Join(cg.path, "cgroup.procs"), p, 0)
	}
	return errors.New("unknown cgroup kind")
}

// Holds checks that /proc/PID/cgroup names the cgroup in every
// hierarchy of it.
func (c *Cgroup) Holds(pid int) error {
	cgs, err := procfs.Cgroups(strconv.Itoa(pid))
	if err != nil {
		return err
	}
	id := filepath.Base(c.cg.Path())
	ctls := []string{""} // v2: the unified hierarchy
	if v1, ok := c.cg.(*cgroupV1); ok {
		ctls = v1.order
	}
	for _, ctl := range ctls {
		if !strings.HasSuffix(cgs[ctl], "/"+id) {
			return fmt.Errorf("not in cgroup %s in hierarchy %q (in %q)", id, ctl, cgs[ctl])
		}
	}
	return nil
}
