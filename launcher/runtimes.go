package launcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/launcher/gvisor"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// Runtime classes (issue 33; docs/runtimes.md): a profile's runtime says
// which technology isolates its tools, namespaces (str's own, the rest
// of this package), gvisor (package launcher/gvisor) or microvm. A class
// this host cannot run is a refusal with its reason (RuntimeError), never
// a run under a weaker class.

// ErrRuntimeUnavailable is wrapped by every *RuntimeError: the worker
// answers TOOL_NOT_AVAILABLE with the reason and lists the tool on
// /readyz; str run says it and exits as for a launcher error.
var ErrRuntimeUnavailable = errors.New("runtime class unavailable")

// RuntimeError is a sandbox whose runtime class cannot run here, and why.
type RuntimeError struct {
	Class  string // profiles.RuntimeGVisor, ...
	Reason string
}

func (e *RuntimeError) Error() string {
	return fmt.Sprintf("runtime %s cannot run this sandbox here: %s (never run under a weaker class; see str runtimes)", e.Class, e.Reason)
}

// Unwrap makes errors.Is(err, ErrRuntimeUnavailable) true.
func (e *RuntimeError) Unwrap() error { return ErrRuntimeUnavailable }

// RuntimeStatus is one class as this host offers it (str runtimes).
type RuntimeStatus struct {
	Class     string `json:"class"`
	Available bool   `json:"available"`
	Detail    string `json:"detail"`            // what runs it: "runsc 0.0~20221219.0 (/usr/bin/runsc)"
	Problem   string `json:"problem,omitempty"` // why it cannot run here
}

// Runtimes lists every class, weakest first, with whether it runs here,
// and the version of what runs it.
func Runtimes() []RuntimeStatus { return runtimes(gvisor.Probe) }

// runtimes is Runtimes with gVisor's probe: gvisor.Find for a run's check
// (CheckRuntime), which needs no version.
func runtimes(probe func() gvisor.Status) []RuntimeStatus {
	out := []RuntimeStatus{{Class: profiles.RuntimeNamespaces, Available: true,
		Detail: "str's own namespaces, seccomp and cgroups (nsinit); its kernel features: str doctor"}}
	g := probe()
	gs := RuntimeStatus{Class: profiles.RuntimeGVisor, Available: g.Problem == "", Problem: g.Problem,
		Detail: "runsc " + g.Version + " (" + g.Path + "), --platform=ptrace, isolated network only"}
	if g.Problem == "" && os.Geteuid() != 0 {
		gs.Available, gs.Problem = false, "a caller that is not root (runsc --rootless is not wired yet)"
	}
	out = append(out, gs)
	m := RuntimeStatus{Class: profiles.RuntimeMicroVM, Problem: "not implemented in this str yet (issue 33)"}
	if _, err := os.Stat("/dev/kvm"); err == nil {
		m.Detail = "/dev/kvm present (KVM)"
	} else {
		m.Detail = "no /dev/kvm (TCG emulation only)"
	}
	if q, err := exec.LookPath("qemu-system-x86_64"); err == nil {
		m.Detail += "; " + q
	} else {
		m.Detail += "; qemu-system-x86_64 not found in PATH"
	}
	return append(out, m)
}

// CheckRuntime is the refusal of a class this host cannot run; nil for
// one it can. cold: the sandbox is run once, from its start to its end
// (str run: Launcher.Run; the worker's cold calls: RunClass through
// launcher/provider); the other paths (the worker's warm pool and
// templates, str serve, str bwrap: CreateFromPlan) run only namespaces
// in this str.
func CheckRuntime(class string, cold bool) error {
	if class == "" || class == profiles.RuntimeNamespaces {
		return nil
	}
	for _, st := range runtimes(gvisor.Find) {
		switch {
		case st.Class != class:
		case !st.Available:
			return &RuntimeError{Class: class, Reason: st.Problem}
		case !cold:
			return &RuntimeError{Class: class, Reason: "only a sandbox run once (str run, the worker's cold calls) runs it in this str: not a pre-built one (the warm pool, templates, str serve) nor str bwrap"}
		default:
			return nil
		}
	}
	return &RuntimeError{Class: class, Reason: "unknown runtime class"}
}

// CheckClass is RunClass's refusals before anything runs: the class
// cannot run here, or the request has what this str does not run under
// it yet (passed descriptors, credentials, a network other than
// isolated). The worker's provider checks at Create, so a call it cannot
// run is refused before its sandbox starts.
func CheckClass(pl *Plan, req Request) error {
	if err := CheckRuntime(pl.Runtime, true); err != nil {
		return err
	}
	if len(req.ExtraFiles) > 0 || len(req.Credentials) > 0 {
		return &RuntimeError{Class: pl.Runtime, Reason: "descriptors passed to the tool and credentials are not supported yet"}
	}
	if _, _, _, err := gvisor.Bundle(classSpec(pl), "check"); err != nil {
		return &RuntimeError{Class: pl.Runtime, Reason: err.Error()}
	}
	return nil
}

func classSpec(pl *Plan) gvisor.Spec {
	return gvisor.Spec{Child: pl.Child, Network: pl.Network, Timeout: pl.Timeout, Rootless: pl.Rootless,
		Limits: gvisor.Limits{Enforce: pl.Cgroup.Mode != CgroupNone, MemoryMax: pl.Cgroup.MemoryMax,
			CPUQuotaUs: pl.Cgroup.CPUQuotaUs, CPUPeriodUs: pl.Cgroup.CPUPeriodUs, PidsMax: pl.Cgroup.PidsMax}}
}

// RunClass runs a plan once under its runtime class other than
// namespaces: Run's one dispatch point, and the worker's cold calls
// (launcher/provider). ctx's end is a cancel (SIGINT, then SIGKILL after
// CancelGrace); the plan's timeout kills it (TimedOut).
func (l *Launcher) RunClass(ctx context.Context, pl *Plan, req Request) (*Result, error) {
	if err := CheckClass(pl, req); err != nil {
		return nil, err
	}
	spec := classSpec(pl)
	ex, err := gvisor.Run(ctx, spec, newCgroupID(), gvisor.Stdio{Stdin: req.Stdin, Stdout: req.Stdout, Stderr: req.Stderr})
	if errors.Is(err, gvisor.ErrUnsupported) {
		return nil, &RuntimeError{Class: pl.Runtime, Reason: err.Error()}
	}
	if err != nil {
		return nil, err
	}
	r := &Result{ExitCode: ex.Code, Signal: ex.Signal, TimedOut: ex.TimedOut, Cancelled: ex.Cancelled,
		WallTimeMs: float64(ex.Wall) / float64(time.Millisecond),
		Timings:    []Phase{{Name: "gvisor-bundle", Ms: float64(ex.Setup) / float64(time.Millisecond)}},
		SetupTime:  ex.Setup}
	if r.Signal != 0 {
		r.SignalName = unix.SignalName(syscall.Signal(r.Signal))
	}
	if w := pl.Cgroup.Warning(); w != "" {
		r.Warnings = append(r.Warnings, w)
	}
	r.Warnings = append(r.Warnings, gvisor.Warnings(spec)...)
	return r, nil
}
