package launcher

import (
	"bytes"
	"crypto/rand"
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
// Each sandbox cgroup has an opaque random name and a lock file held by
// its launcher for the sandbox's life (cgroupLockDir): a later launcher
// removes only cgroups whose lock nobody holds, so a SIGKILLed launcher's
// leftovers go and a live one's never do (the first sandbox of a launcher
// sweeps: by the lock files, and through the cgroup directories at most
// every sweepEvery, see sweepEvery).

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

// DetectCgroup says which hierarchy limits go through: v2 if the unified
// hierarchy is mounted at /sys/fs/cgroup, else v1 if our own cgroup in its
// memory and pids hierarchies is writable (root, or a subtree delegated
// to this user), else none.
func DetectCgroup() CgroupMode {
	var st unix.Statfs_t
	if unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return CgroupV2
	}
	own, _ := OwnCgroups()
	for _, c := range []string{"memory", "pids"} {
		p, ok := own[c]
		if !ok || unix.Access(filepath.Join(cgroupRoot, c, p), unix.W_OK) != nil {
			return CgroupNone
		}
	}
	return CgroupV1
}

// OwnCgroups reads /proc/self/cgroup: the calling process's cgroup path
// per v1 controller name, and under "" its cgroup v2 path (the "0::" line).
func OwnCgroups() (map[string]string, error) {
	return ProcCgroups("self")
}

// ProcCgroups is OwnCgroups for the process pid ("self", or a number):
// /proc/PID/cgroup as a map from v1 controller name (or "name=..." of a
// named hierarchy) to cgroup path, the v2 path under "".
func ProcCgroups(pid string) (map[string]string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return nil, err
	}
	cgs := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				cgs[c] = parts[2]
			}
		}
	}
	return cgs, nil
}

// newCgroupID is an opaque sandbox cgroup name: nothing about the worker
// (no pid) shows inside or outside.
func newCgroupID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "s" + hex.EncodeToString(b[:])
}

// cgroupLockDir holds one lock file per live sandbox cgroup: cgroups/ of
// the state directory.
func cgroupLockDir() string {
	return filepath.Join(statedir.Dir(os.Getenv), "cgroups")
}

// cgroupLock is created and locked before the cgroup's directories exist
// and removed after they are gone, so an unlocked (or missing) lock file
// next to an existing directory means its launcher died.
type cgroupLock struct{ f *os.File }

func lockCgroup(id string) (*cgroupLock, error) {
	dir, err := statedir.Sub(statedir.Dir(os.Getenv), "cgroups")
	if err != nil {
		return nil, err
	}
	// A sweep (cgroupHeld) that opens the new file between its creation
	// and our flock finds it unlocked and removes it: our lock would then
	// be on a file nobody else can find, and a later sweep would take the
	// cgroup for a dead launcher's. So the lock counts only while its
	// file is still linked; a removed one is created again. The flock
	// waits: the file is new (O_EXCL), so the only other holder can be
	// such a sweep, for the moment it takes to remove it (a LOCK_NB
	// failed then, EWOULDBLOCK, and a worker refused to start).
	for range 3 {
		f, err := os.OpenFile(filepath.Join(dir, id), os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, &statedir.Error{Dir: dir, Err: err}
		}
		if err := flockEINTR(int(f.Fd())); err != nil {
			f.Close()
			return nil, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			f.Close()
			return nil, err
		}
		if st.Nlink > 0 {
			return &cgroupLock{f: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("lock file %s was removed under us three times (a sweep of another str process)", filepath.Join(dir, id))
}

// flockEINTR takes fd's exclusive lock, waiting for it.
func flockEINTR(fd int) error {
	for {
		if err := unix.Flock(fd, unix.LOCK_EX); err != unix.EINTR {
			return err
		}
	}
}

func (l *cgroupLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = os.Remove(l.f.Name())
	l.f.Close()
	l.f = nil
}

// held reports whether a live launcher holds the lock of cgroup id.
func cgroupHeld(id string) bool {
	f, err := os.OpenFile(filepath.Join(cgroupLockDir(), id), os.O_RDWR|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return true
	}
	_ = os.Remove(f.Name())
	return false
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
	lock *cgroupLock
}

// v2Controllers are enabled for sandbox cgroups.
var v2Controllers = []string{"memory", "pids", "cpu"}

// v2Parent returns the cgroup under which sandboxes are created. With an
// explicit parent it is used as is. Otherwise it is "str" below our own
// cgroup; because cgroup v2 forbids processes in a cgroup whose children
// have controllers enabled, a launcher that is not in the root cgroup first
// moves itself into a leaf "<own>/str-supervisor". This is what a
// delegated subtree (systemd Delegate=yes) needs. It runs at the first
// Create, never for commands that start no sandbox.
func v2Parent(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	own, err := OwnCgroups()
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
	return filepath.Join(p, "str"), nil
}

// prepareV2Parent creates the parent and enables the controllers for its
// children, along the way from the launcher's own cgroup.
func prepareV2Parent(parent string) error {
	dir := filepath.Join(cgroupRoot, parent)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	for _, d := range []string{filepath.Dir(dir), dir} {
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

func newCgroupV2(parent, id string, pl CgroupPlan) (*cgroupV2, error) {
	lock, err := lockCgroup(id)
	if err != nil {
		return nil, fmt.Errorf("lock cgroup %s: %w", id, err)
	}
	path := filepath.Join(cgroupRoot, parent, id)
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

func (c *cgroupV2) Empty() bool {
	b, err := os.ReadFile(filepath.Join(c.path, "cgroup.procs"))
	return err != nil || len(bytes.TrimSpace(b)) == 0
}

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
	lock  *cgroupLock
	spare *v1Spare // the reused hierarchies' cgroups, when taken from a resident launcher's spares (cgroupreuse.go)
}

// v1Controllers are the only v1 hierarchies str touches: fewer
// hierarchies, fewer mkdirs per sandbox.
var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// v1Dirs is "<root>/<controller>/<own cgroup>/str" per mounted controller.
func v1Dirs() map[string]string {
	own, err := OwnCgroups()
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
			dirs[c] = filepath.Join(cgroupRoot, c, p, "str")
		}
	}
	return dirs
}

func newCgroupV1(id string, pl CgroupPlan, spare *v1Spare) (*cgroupV1, error) {
	lock, err := lockCgroup(id)
	if err != nil {
		spare.remove()
		return nil, fmt.Errorf("lock cgroup %s: %w", id, err)
	}
	c := &cgroupV1{paths: map[string]string{}, lock: lock, spare: spare}
	dirs := v1Dirs()
	for _, ctl := range v1Controllers {
		parent, ok := dirs[ctl]
		if !ok {
			continue
		}
		if p, ok := spare.path(ctl); ok {
			// Made for the same plan, its limits set: reused as it is.
			c.paths[ctl] = p
			c.order = append(c.order, ctl)
			continue
		}
		dir := filepath.Join(parent, id)
		// One mkdir; the parent "str" only when it is missing (MkdirAll
		// would stat both first, in cgroupfs, for every sandbox).
		err := os.Mkdir(dir, 0o755)
		if errors.Is(err, os.ErrNotExist) {
			err = os.MkdirAll(dir, 0o755)
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			_ = c.Delete()
			return nil, fmt.Errorf("create %s: %w", dir, err)
		}
		// Modes set explicitly, never through the umask (a worker under
		// UMask=0027 would make them 0750): the init, an unprivileged uid,
		// must reach its tasks file.
		for _, d := range []string{parent, dir} {
			if err := os.Chmod(d, 0o755); err != nil {
				_ = c.Delete()
				return nil, fmt.Errorf("chmod %s: %w", d, err)
			}
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
		// The first bytes say it: a listed pid is never blank.
		b, err := readSmall(filepath.Join(p, "cgroup.procs"), 64)
		if err == nil && len(bytes.TrimSpace(b)) > 0 {
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

// sweepEvery spaces the full sweeps (sweepStale) of all str processes of
// the host: a one-shot `str run` is a launcher's first sandbox every time,
// and a full sweep (a readdir in five cgroupfs hierarchies, a lock try
// per live sandbox) cost 3.7 % of its CPU (perf). In between, a launcher
// sweeps by the lock files alone (sweepLocks): a SIGKILLed launcher's
// cgroups still go at the next launcher's first sandbox; only a directory
// that lost its lock file (a removal that failed after its lock was
// taken, a state directory wiped) waits for the next full sweep.
const sweepEvery = 10 * time.Second

// sweepDue reports whether this launcher does the full sweep: no str
// process of the host did one in the last sweepEvery (the mtime of
// cgroups/.swept in the state directory), and marks it as done now. A
// stamp that cannot be read or written means a full sweep.
func sweepDue(now time.Time) bool {
	stamp := filepath.Join(cgroupLockDir(), ".swept")
	if st, err := os.Stat(stamp); err == nil && now.Sub(st.ModTime()).Abs() < sweepEvery {
		return false
	}
	if err := os.Chtimes(stamp, now, now); errors.Is(err, os.ErrNotExist) {
		if f, err := os.OpenFile(stamp, os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o600); err == nil {
			f.Close()
		}
	}
	return true
}

// sweepLocks is the sweep between full ones: every lock file of the state
// directory that nobody holds (cgroupHeld removes it) names a dead
// launcher's cgroup, which is emptied and removed in every directory
// dirs() returns (read only when there is one: a readdir of the tmpfs
// lock directory and a lock try per live sandbox is all it costs
// otherwise).
func sweepLocks(dirs func() []string) {
	ents, err := os.ReadDir(cgroupLockDir())
	if err != nil {
		return
	}
	var parents []string
	for _, e := range ents {
		if !e.Type().IsRegular() || !strings.HasPrefix(e.Name(), "s") || cgroupHeld(e.Name()) {
			continue
		}
		if parents == nil {
			parents = dirs()
		}
		for _, d := range parents {
			p := filepath.Join(d, e.Name())
			killProcs(p)
			_ = retryBusy(func() error { return unix.Rmdir(p) })
		}
	}
}

// sweepStale removes sandbox cgroups left by launchers that died without
// tearing down (SIGKILL of str run: Pdeathsig killed the sandbox, but
// nobody was left to rmdir its cgroup): a directory whose lock file nobody
// holds is emptied (any survivor is killed) and removed. A live
// launcher's cgroups are never touched.
//
// Each name's lock is tried once, not once per hierarchy: a v1 sandbox has
// a directory in five of them, and the sweep runs at every one-shot str
// run, so it costs one open and flock per live sandbox, no more.
func sweepStale(dirs []string) {
	held := map[string]bool{}
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if !e.IsDir() || !strings.HasPrefix(e.Name(), "s") {
				continue
			}
			h, tried := held[e.Name()]
			if !tried {
				h = cgroupHeld(e.Name())
				held[e.Name()] = h
			}
			if h {
				continue
			}
			p := filepath.Join(dir, e.Name())
			killProcs(p)
			_ = retryBusy(func() error { return unix.Rmdir(p) })
		}
	}
}

// staleDirs returns the directories holding this launcher's kind of
// sandbox cgroups: "<own cgroup>/str" in every v1 controller str uses, or
// the v2 parent.
func staleDirs(mode CgroupMode, v2parent string) []string {
	switch mode {
	case CgroupV2:
		if v2parent == "" {
			return nil
		}
		return []string{filepath.Join(cgroupRoot, v2parent)}
	case CgroupV1:
		var dirs []string
		for _, d := range v1Dirs() {
			dirs = append(dirs, d)
		}
		return dirs
	}
	return nil
}
