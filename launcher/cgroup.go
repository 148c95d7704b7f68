package launcher

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/cgroups/v3/cgroup1"
	"github.com/containerd/cgroups/v3/cgroup2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

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
	// Delete removes the cgroup; it must be empty.
	Delete() error
}

// DetectCgroup says which hierarchy limits go through: v2 if the unified
// hierarchy is mounted at /sys/fs/cgroup with the memory and pids
// controllers available to us, else v1 if its memory and pids controllers
// are mounted and writable, else none.
func DetectCgroup() CgroupMode {
	var st unix.Statfs_t
	if unix.Statfs(cgroupRoot, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return CgroupV2
	}
	// v1: our own cgroup in the memory and pids hierarchies must be
	// writable (root, or a subtree delegated to this user).
	own, _ := OwnCgroups()
	for _, c := range []string{"memory", "pids"} {
		p, ok := own[c]
		if !ok || unix.Access(filepath.Join(cgroupRoot, c, p), unix.W_OK) != nil {
			return CgroupNone
		}
	}
	return CgroupV1
}

// ---- cgroup v2 ----------------------------------------------------------

type cgroupV2 struct {
	mgr  *cgroup2.Manager
	path string // absolute, under /sys/fs/cgroup
	fd   int
}

// v2Parent returns the cgroup under which sandboxes are created. With an
// explicit parent it is used as is. Otherwise it is "str" below our own
// cgroup; because cgroup v2 forbids processes in a cgroup whose children
// have controllers enabled, a launcher that is not in the root cgroup first
// moves itself into a leaf "<own>/str-supervisor". This is what a
// delegated subtree (systemd Delegate=yes) needs.
func v2Parent(explicit string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	own, err := ownCgroupV2()
	if err != nil {
		return "", err
	}
	if own != "/" {
		procs, err := os.ReadFile(filepath.Join(cgroupRoot, own, "cgroup.procs"))
		if err != nil {
			return "", err
		}
		if len(bytes.Fields(procs)) > 0 && filepath.Base(own) != "str-supervisor" {
			leaf := filepath.Join(own, "str-supervisor")
			if err := os.Mkdir(filepath.Join(cgroupRoot, leaf), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return "", fmt.Errorf("create supervisor cgroup %s: %w", leaf, err)
			}
			pid := strconv.Itoa(os.Getpid())
			if err := os.WriteFile(filepath.Join(cgroupRoot, leaf, "cgroup.procs"), []byte(pid), 0); err != nil {
				return "", fmt.Errorf("move launcher into %s: %w", leaf, err)
			}
		} else if filepath.Base(own) == "str-supervisor" {
			own = filepath.Dir(own)
		}
	}
	return filepath.Join(own, "str"), nil
}

func ownCgroupV2() (string, error) {
	own, err := OwnCgroups()
	if err != nil {
		return "", err
	}
	p, ok := own[""]
	if !ok {
		return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
	}
	return p, nil
}

// OwnCgroups reads /proc/self/cgroup: the calling process's cgroup path
// per v1 controller name, and under "" its cgroup v2 path (the "0::" line).
func OwnCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				own[c] = parts[2]
			}
		}
	}
	return own, nil
}

func newCgroupV2(parent, id string, pl CgroupPlan) (*cgroupV2, error) {
	group := filepath.Join(parent, id)
	res := &cgroup2.Resources{}
	if pl.MemoryMax > 0 {
		mem, swap := pl.MemoryMax, pl.SwapMax
		res.Memory = &cgroup2.Memory{Max: &mem, Swap: &swap}
	}
	if pl.PidsMax > 0 {
		res.Pids = &cgroup2.Pids{Max: pl.PidsMax}
	}
	if pl.CPUQuotaUs > 0 {
		q, per := pl.CPUQuotaUs, uint64(pl.CPUPeriodUs)
		res.CPU = &cgroup2.CPU{Max: cgroup2.NewCPUMax(&q, &per)}
	}
	mgr, err := cgroup2.NewManager(cgroupRoot, group, res)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(cgroupRoot, group)
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = mgr.Delete()
		return nil, err
	}
	return &cgroupV2{mgr: mgr, path: path, fd: fd}, nil
}

func (c *cgroupV2) Path() string                             { return c.path }
func (c *cgroupV2) CloneFD() (int, bool)                     { return c.fd, true }
func (c *cgroupV2) SelfEntry(uid, gid int) ([]string, error) { return nil, nil }

func (c *cgroupV2) Empty() bool {
	b, err := os.ReadFile(filepath.Join(c.path, "cgroup.procs"))
	return err != nil || len(bytes.TrimSpace(b)) == 0
}

// Kill uses cgroup.kill (5.14+), which kills the whole subtree atomically,
// forks in flight included; containerd falls back to freeze+kill.
func (c *cgroupV2) Kill() error { return c.mgr.Kill() }

func (c *cgroupV2) Stats() cgroupStats {
	var s cgroupStats
	s.PeakMemory = readInt(filepath.Join(c.path, "memory.peak"))
	kv := readKV(filepath.Join(c.path, "cpu.stat"))
	s.CPUNanos = kv["usage_usec"] * 1000
	s.OOMKills = readKV(filepath.Join(c.path, "memory.events"))["oom_kill"]
	s.PidsMax = readKV(filepath.Join(c.path, "pids.events"))["max"]
	return s
}

func (c *cgroupV2) Delete() error {
	unix.Close(c.fd)
	return retryBusy(c.mgr.Delete)
}

// ---- cgroup v1 ----------------------------------------------------------

type cgroupV1 struct {
	cg    cgroup1.Cgroup
	paths map[string]string // controller -> absolute dir
}

// v1Controllers are the only v1 hierarchies str touches: fewer
// hierarchies, fewer mkdirs per sandbox.
var v1Controllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

func newCgroupV1(id string, pl CgroupPlan) (*cgroupV1, error) {
	var subs []cgroup1.Subsystem
	for _, c := range v1Controllers {
		if _, err := os.Stat(filepath.Join(cgroupRoot, c)); err != nil {
			continue
		}
		switch c {
		case "memory":
			subs = append(subs, cgroup1.NewMemory(cgroupRoot))
		case "pids":
			subs = append(subs, cgroup1.NewPids(cgroupRoot))
		case "cpu":
			subs = append(subs, cgroup1.NewCpu(cgroupRoot))
		case "cpuacct":
			subs = append(subs, cgroup1.NewCpuacct(cgroupRoot))
		case "freezer":
			subs = append(subs, cgroup1.NewFreezer(cgroupRoot))
		}
	}
	hier := func() ([]cgroup1.Subsystem, error) { return subs, nil }
	res := &specs.LinuxResources{}
	if pl.MemoryMax > 0 {
		mem := pl.MemoryMax
		res.Memory = &specs.LinuxMemory{Limit: &mem}
		// memory+swap equal to memory: no swap. Only where the kernel
		// accounts swap (memsw files exist).
		if _, err := os.Stat(filepath.Join(cgroupRoot, "memory", "memory.memsw.limit_in_bytes")); err == nil {
			sw := pl.MemoryMax + pl.SwapMax
			res.Memory.Swap = &sw
		}
	}
	if pl.PidsMax > 0 {
		lim := pl.PidsMax
		res.Pids = &specs.LinuxPids{Limit: &lim}
	}
	if pl.CPUQuotaUs > 0 {
		q, per := pl.CPUQuotaUs, uint64(pl.CPUPeriodUs)
		res.CPU = &specs.LinuxCPU{Quota: &q, Period: &per}
	}
	path := cgroup1.NestedPath(filepath.Join("str", id))
	cg, err := cgroup1.New(path, res, cgroup1.WithHierarchy(hier))
	if err != nil {
		return nil, err
	}
	c := &cgroupV1{cg: cg, paths: map[string]string{}}
	for _, s := range cg.Subsystems() {
		p, err := path(s.Name())
		if err == nil {
			c.paths[string(s.Name())] = filepath.Join(cgroupRoot, string(s.Name()), p)
		}
	}
	return c, nil
}

func (c *cgroupV1) Path() string         { return c.paths["memory"] }
func (c *cgroupV1) CloneFD() (int, bool) { return -1, false }
func (c *cgroupV1) SelfEntry(uid, gid int) ([]string, error) {
	var tasks []string
	for _, ctl := range v1Controllers {
		dir, ok := c.paths[ctl]
		if !ok {
			continue
		}
		t := filepath.Join(dir, "tasks")
		if err := os.Lchown(t, uid, gid); err != nil {
			return nil, fmt.Errorf("chown %s to the init's host ids %d:%d: %w", t, uid, gid, err)
		}
		tasks = append(tasks, t)
	}
	return tasks, nil
}
func (c *cgroupV1) Empty() bool {
	for _, p := range c.paths {
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err == nil && len(bytes.TrimSpace(b)) > 0 {
			return false
		}
	}
	return true
}

// Kill freezes the cgroup so nothing can fork while we kill, SIGKILLs every
// process, then thaws so the kills are delivered (v1 has no cgroup.kill).
func (c *cgroupV1) Kill() error {
	if err := c.cg.Freeze(); err != nil {
		return fmt.Errorf("freeze %s: %w", c.Path(), err)
	}
	procs, err := c.cg.Processes(cgroup1.Freezer, true)
	for _, p := range procs {
		_ = unix.Kill(p.Pid, unix.SIGKILL)
	}
	if terr := c.cg.Thaw(); err == nil && terr != nil {
		err = terr
	}
	return err
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

func (c *cgroupV1) Delete() error { return retryBusy(c.cg.Delete) }

// ---- helpers ------------------------------------------------------------

// retryBusy retries a cgroup removal for a short while: the kernel may
// still be tearing down the last killed task.
func retryBusy(f func() error) error {
	var err error
	for i := 0; i < 200; i++ {
		if err = f(); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) && !strings.Contains(err.Error(), "still contains running tasks") {
			return err
		}
		time.Sleep(5 * time.Millisecond)
	}
	return err
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func readKV(path string) map[string]int64 {
	m := map[string]int64{}
	b, err := os.ReadFile(path)
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

// sweepStale removes sandbox cgroups left by launchers that died without
// tearing down (SIGKILL of str run: Pdeathsig killed the sandbox, but
// nobody was left to rmdir its cgroup). Sandbox cgroups are named
// "<launcher pid>-<random>"; a directory whose launcher is gone is emptied
// (any survivor is killed) and removed. A live launcher's cgroups are
// never touched.
func sweepStale(dirs []string) {
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			pidStr, _, ok := strings.Cut(e.Name(), "-")
			pid, err := strconv.Atoi(pidStr)
			if !ok || err != nil || !e.IsDir() || pid <= 0 {
				continue
			}
			if unix.Kill(pid, 0) != unix.ESRCH {
				continue // launcher alive (or not ours to judge)
			}
			p := filepath.Join(dir, e.Name())
			if b, err := os.ReadFile(filepath.Join(p, "cgroup.procs")); err == nil {
				for _, f := range bytes.Fields(b) {
					if n, err := strconv.Atoi(string(f)); err == nil {
						_ = unix.Kill(n, unix.SIGKILL)
					}
				}
			}
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
		own, err := OwnCgroups()
		if err != nil {
			return nil
		}
		var dirs []string
		for _, c := range v1Controllers {
			if p, ok := own[c]; ok {
				dirs = append(dirs, filepath.Join(cgroupRoot, c, p, "str"))
			}
		}
		return dirs
	}
	return nil
}
