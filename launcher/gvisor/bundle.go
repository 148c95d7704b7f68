package gvisor

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/nsinit"
)

// ErrUnsupported marks a plan this package cannot run yet: the launcher
// refuses it (its runtime class is unavailable for it), it never runs it
// under a weaker class.
var ErrUnsupported = errors.New("not supported under gvisor yet")

// Spec is what a gVisor sandbox is made from: the launcher Plan's parts.
type Spec struct {
	Child    nsinit.Config // mounts, environment, argv, work dir, ids, rlimits, hostname
	Network  egress.Policy
	Timeout  time.Duration // 0: none
	Limits   Limits
	Rootless bool // the caller is not root
}

// Limits are the plan's cgroup limits; runsc applies them to the
// container's cgroup (Enforce), or the run has none (--ignore-cgroups).
type Limits struct {
	Enforce     bool
	MemoryMax   int64
	CPUQuotaUs  int64
	CPUPeriodUs int64
	PidsMax     int64
}

// SentryTasks is what the container's pids.max allows above the
// profile's pids: the cgroup holds gVisor's own processes and threads
// too (the Sentry's and the gofer's Go threads, one ptrace stub per tool
// thread), 34 at the peak of `python3 -c pass` here; at the profile's
// bare number runsc cannot start.
const SentryTasks = 64

// Config is the part of an OCI runtime spec (config.json) str writes;
// the field names are the specification's.
type Config struct {
	OCIVersion string   `json:"ociVersion"`
	Process    Process  `json:"process"`
	Root       Root     `json:"root"`
	Hostname   string   `json:"hostname"`
	Mounts     []Mount  `json:"mounts"`
	Linux      LinuxCfg `json:"linux"`
}

// Process is the tool's process.
type Process struct {
	User            User       `json:"user"`
	Args            []string   `json:"args"`
	Env             []string   `json:"env"`
	Cwd             string     `json:"cwd"`
	Rlimits         []Rlimit   `json:"rlimits"`
	NoNewPrivileges bool       `json:"noNewPrivileges"`
	Capabilities    Capability `json:"capabilities"`
}

// User is the tool's ids inside gVisor.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Capability sets: all empty, the tool keeps none.
type Capability struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

// Rlimit is one resource limit (soft = hard, as the plan's).
type Rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

// Root is the container's root: an empty directory of the bundle,
// read-only; everything the tool sees is mounted on it.
type Root struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

// Mount is one OCI mount.
type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

// LinuxCfg is the spec's linux section.
type LinuxCfg struct {
	Namespaces  []Namespace `json:"namespaces"`
	CgroupsPath string      `json:"cgroupsPath,omitempty"`
	Resources   *Resources  `json:"resources,omitempty"`
}

// Namespace is one namespace runsc makes for the sandbox.
type Namespace struct {
	Type string `json:"type"`
}

// Resources are the cgroup limits runsc applies.
type Resources struct {
	Memory *struct {
		Limit int64 `json:"limit"`
		Swap  int64 `json:"swap"` // memory+swap: the limit itself, so no swap
	} `json:"memory,omitempty"`
	CPU *struct {
		Quota  int64  `json:"quota"`
		Period uint64 `json:"period"`
	} `json:"cpu,omitempty"`
	Pids *struct {
		Limit int64 `json:"limit"`
	} `json:"pids,omitempty"`
}

// File is a file Bundle generates in the bundle directory (the plan's
// generated /etc/passwd, /etc/hosts, ...), bound read-only at its
// target; Name is relative to the bundle.
type File struct {
	Name     string
	Contents string
	Mode     uint32
}

// Bundle is the OCI bundle of spec: config.json's value, the files to
// write next to it (files/N) and the top-level symlinks to make in its
// root (rootfs/lib -> usr/lib). id names the container's cgroup.
// It refuses (ErrUnsupported) what this package cannot run yet.
func Bundle(spec Spec, id string) (*Config, []File, map[string]string, error) {
	var problems []error
	unsupported := func(format string, a ...any) {
		problems = append(problems, fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, a...)...))
	}
	c := spec.Child
	if spec.Network.Mode != egress.Isolated {
		unsupported("network policy %s (gVisor's network stack does not reach str's egress proxy yet): only isolated", spec.Network.Mode)
	}
	if spec.Rootless {
		unsupported("a caller that is not root (runsc --rootless is not wired yet)")
	}
	if c.PassFDs > 0 || c.AwaitCall || len(c.ExtraSeccomp) > 0 || c.SeccompListener || c.Caps != 0 {
		unsupported("passed descriptors, pre-built sandboxes, caller seccomp filters and kept capabilities")
	}
	if len(c.Argv) == 0 {
		unsupported("a sandbox without a command")
	}

	cfg := &Config{
		OCIVersion: "1.0.2",
		Root:       Root{Path: "rootfs", Readonly: true},
		Hostname:   c.Hostname,
		Process: Process{
			User: User{UID: c.UID, GID: c.GID}, Args: slices.Clone(c.Argv), Env: slices.Clone(c.Env),
			Cwd: c.Workdir, NoNewPrivileges: true,
			Capabilities: Capability{Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{}},
		},
		// runsc makes the namespaces of its sandbox processes (the
		// Sentry's and the gofer's); these are the tool's, in gVisor's
		// kernel. network: --network=none leaves it only lo.
		Linux: LinuxCfg{Namespaces: []Namespace{{"pid"}, {"network"}, {"ipc"}, {"uts"}, {"mount"}}},
	}
	if c.Argv0 != "" {
		unsupported("argv0 different from argv[0]")
	}
	for _, r := range c.Rlimits {
		cfg.Process.Rlimits = append(cfg.Process.Rlimits, Rlimit{Type: r.Name, Hard: r.Value, Soft: r.Value})
	}
	if l := spec.Limits; l.Enforce {
		res := &Resources{}
		res.Memory = &struct {
			Limit int64 `json:"limit"`
			Swap  int64 `json:"swap"`
		}{l.MemoryMax, l.MemoryMax}
		res.CPU = &struct {
			Quota  int64  `json:"quota"`
			Period uint64 `json:"period"`
		}{l.CPUQuotaUs, uint64(l.CPUPeriodUs)}
		res.Pids = &struct {
			Limit int64 `json:"limit"`
		}{l.PidsMax + SentryTasks}
		cfg.Linux.Resources = res
		cfg.Linux.CgroupsPath = "/str-gvisor/" + id
	}

	var files []File
	links := map[string]string{}
	for _, m := range c.Mounts {
		switch m.Kind {
		case nsinit.MountBind:
			opts := []string{"rbind", "rw"}
			if m.ReadOnly {
				opts = []string{"rbind", "ro"}
			}
			cfg.Mounts = append(cfg.Mounts, Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: opts})
		case nsinit.MountFile:
			name := "files/" + strconv.Itoa(len(files))
			files = append(files, File{Name: name, Contents: m.Contents, Mode: m.Mode})
			cfg.Mounts = append(cfg.Mounts, Mount{Destination: m.Target, Type: "bind", Source: name, Options: []string{"bind", "ro"}})
		case nsinit.MountTmpfs:
			if m.Target == "/dev" {
				continue // gVisor's own /dev: null, zero, full, random, urandom, tty, pts, ptmx, fd, std*
			}
			opts := []string{"nosuid", "nodev"}
			if m.Data != "" {
				opts = append(opts, strings.Split(m.Data, ",")...)
			}
			if m.ReadOnly {
				opts = append(opts, "ro")
			}
			cfg.Mounts = append(cfg.Mounts, Mount{Destination: m.Target, Type: "tmpfs", Source: "tmpfs", Options: opts})
		case nsinit.MountProc:
			cfg.Mounts = append(cfg.Mounts, Mount{Destination: "/proc", Type: "proc", Source: "proc"})
		case nsinit.MountDevNode, nsinit.MountDevpts:
			// gVisor's /dev has its own nodes and devpts.
		case nsinit.MountSymlink:
			switch {
			case strings.HasPrefix(m.Target, "/dev/"):
				// /dev/fd, /dev/ptmx, /dev/std*: gVisor's /dev has them.
			case path.Dir(m.Target) == "/":
				links[m.Target[1:]] = m.Source
			default:
				unsupported("symlink %s below the root", m.Target)
			}
		default:
			unsupported("mount kind %s at %s", m.Kind, m.Target)
		}
	}
	if len(problems) > 0 {
		return nil, nil, nil, errors.Join(problems...)
	}
	return cfg, files, links, nil
}

// Warnings are what a gvisor run keeps of the plan less than the
// namespaces class would, said in the result (str run prints them): a
// work dir the namespaces class would cap (write-back) or map to its
// owner is bound live, and the tool writes there as its own uid.
func Warnings(spec Spec) []string {
	var w []string
	for _, m := range spec.Child.Mounts {
		if m.Kind != nsinit.MountBind {
			continue
		}
		if m.WriteBack {
			w = append(w, "gvisor: work dir "+m.Source+" bound live: the profile's work_dir does not cap what the tool writes there (docs/runtimes.md)")
		}
		if m.IDMapOwner {
			w = append(w, "gvisor: work dir "+m.Source+" not mapped to its owner: the tool writes there as uid "+strconv.Itoa(int(spec.Child.UID))+" (docs/runtimes.md)")
		}
	}
	return w
}
