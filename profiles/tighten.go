package profiles

import (
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"maps"
	"slices"
	"time"
)

// ErrLoosening is wrapped by every *LoosenError.
var ErrLoosening = errors.New("overrides may only tighten")

// Overrides are the limits a request may set. nil = the profile's value.
// Each may only tighten the profile.
type Overrides struct {
	Timeout *time.Duration
	Memory  *Quantity      // bytes; tightens cgroup.memory (rlimits.as is left as is)
	CPUs    *Quantity      // milli-CPUs; tightens cgroup.cpus
	Pids    *int64         // tightens cgroup.pids
	Network *egress.Policy // narrows the network policy (mode, hosts, ports, CIDRs)
	// WorkDirSize and WorkDirInodes tighten work_dir.size and .inodes.
	WorkDirSize   *Quantity
	WorkDirInodes *int64
	// Runtime asks a runtime class at least as strong as the profile's
	// (profiles.RuntimeClasses' order); "" is the profile's.
	Runtime string
}

// LoosenError is one override that would loosen the profile.
type LoosenError struct {
	Profile string
	Field   string // "runtime", "memory", "cpus", "pids", "timeout", "network", "work_dir.size", "work_dir.inodes"
	Asked   string
	Allowed string // e.g. "at most 512Mi", `only "none"`
}

func (e *LoosenError) Error() string {
	return fmt.Sprintf("profile %s: %s %s asked, %s allowed (overrides may only tighten)", e.Profile, e.Field, e.Asked, e.Allowed)
}

// Unwrap makes errors.Is(err, ErrLoosening) true.
func (e *LoosenError) Unwrap() error { return ErrLoosening }

// Tighten returns a deep copy of p with the overrides applied. Every
// override that would loosen p is a *LoosenError and every invalid value
// (zero, negative, unknown network) a *FieldError; all are collected and
// joined. p itself is never changed.
func (p *Profile) Tighten(o Overrides) (*Profile, error) {
	t := p.clone()
	var errs []error
	loosen := func(field, asked, allowed string) {
		errs = append(errs, &LoosenError{Profile: p.Name, Field: field, Asked: asked, Allowed: allowed})
	}
	invalid := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Profile: p.Name, Field: field + " (override)", Problem: fmt.Sprintf(format, args...)})
	}

	if o.Timeout != nil {
		switch d := *o.Timeout; {
		case d <= 0:
			invalid("timeout", "must be > 0, got %s", d)
		case p.Timeout > 0 && d > time.Duration(p.Timeout):
			loosen("timeout", d.String(), "at most "+p.Timeout.String())
		default:
			t.Timeout = Duration(d)
		}
	}
	if o.Memory != nil {
		switch m := *o.Memory; {
		case m <= 0:
			invalid("memory", "must be > 0, got %d", m)
		case m > p.Cgroup.Memory:
			loosen("memory", FormatBytes(m), "at most "+FormatBytes(p.Cgroup.Memory))
		default:
			t.Cgroup.Memory = m
		}
	}
	if o.CPUs != nil {
		switch c := *o.CPUs; {
		case c <= 0:
			invalid("cpus", "must be > 0, got %dm", c)
		case c > p.Cgroup.CPUs:
			loosen("cpus", FormatCPUs(c), "at most "+FormatCPUs(p.Cgroup.CPUs))
		default:
			t.Cgroup.CPUs = c
		}
	}
	if o.Pids != nil {
		switch n := *o.Pids; {
		case n <= 0:
			invalid("pids", "must be > 0, got %d", n)
		case n > p.Cgroup.Pids:
			loosen("pids", fmt.Sprint(n), fmt.Sprintf("at most %d", p.Cgroup.Pids))
		default:
			t.Cgroup.Pids = n
		}
	}
	if o.WorkDirSize != nil {
		switch q := *o.WorkDirSize; {
		case q <= 0:
			invalid("work_dir.size", "must be > 0, got %d", q)
		case q > p.WorkDir.Size:
			loosen("work_dir.size", FormatBytes(q), "at most "+FormatBytes(p.WorkDir.Size))
		default:
			t.WorkDir.Size = q
		}
	}
	if o.WorkDirInodes != nil {
		switch n := *o.WorkDirInodes; {
		case n <= 0:
			invalid("work_dir.inodes", "must be > 0, got %d", n)
		case n > p.WorkDir.Inodes:
			loosen("work_dir.inodes", fmt.Sprint(n), fmt.Sprintf("at most %d", p.WorkDir.Inodes))
		default:
			t.WorkDir.Inodes = n
		}
	}
	if o.Network != nil {
		asked, have := slices.Index(networkModes, o.Network.Mode), slices.Index(networkModes, p.Network.Mode)
		if asked >= 0 && have >= 0 && asked > have {
			// A looser mode reads like the other limits.
			loosen("network", string(o.Network.Mode), "at most "+string(p.Network.Mode))
		} else if n, err := p.Network.Tighten(*o.Network); err != nil {
			loosen("network", describeNetwork(*o.Network), fmt.Sprintf("a narrowing of %s (%v)", describeNetwork(p.Network), err))
		} else {
			t.Network = n
		}
	}
	if o.Runtime != "" {
		asked, have := slices.Index(RuntimeClasses, o.Runtime), slices.Index(RuntimeClasses, p.RuntimeClass())
		switch {
		case asked < 0:
			invalid("runtime", "%q is not one of %v", o.Runtime, RuntimeClasses)
		case asked < have:
			loosen("runtime", o.Runtime, fmt.Sprintf("%s or stronger", p.RuntimeClass()))
		default:
			t.Runtime = o.Runtime
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	// The result must still be a valid profile; with the checks above this
	// only fails if p itself was invalid.
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("profiles: tightened profile %s is invalid: %w", p.Name, err)
	}
	return t, nil
}

// networkModes are the network modes from the strictest to the loosest.
var networkModes = []egress.Mode{egress.Isolated, egress.Restricted, egress.AllowEgress}

// describeNetwork is a policy in one line for messages.
func describeNetwork(n egress.Policy) string {
	s := string(n.Mode)
	if len(n.AllowedHosts) > 0 {
		s += fmt.Sprintf(" hosts %v", n.AllowedHosts)
	}
	if len(n.AllowedPorts) > 0 {
		s += fmt.Sprintf(" ports %v", n.AllowedPorts)
	}
	if len(n.AllowedCIDRs) > 0 {
		s += fmt.Sprintf(" cidrs %v", n.AllowedCIDRs)
	}
	return fmt.Sprintf("%q", s)
}

// clone returns a deep copy of p: no slice or map is shared.
func (p *Profile) clone() *Profile {
	c := *p
	c.Aliases = slices.Clone(p.Aliases)
	c.Mounts.ReadOnly = slices.Clone(p.Mounts.ReadOnly)
	c.Mounts.Tmpfs = slices.Clone(p.Mounts.Tmpfs)
	c.Env.Set = maps.Clone(p.Env.Set)
	c.Env.Passthrough = slices.Clone(p.Env.Passthrough)
	c.Network.AllowedHosts = slices.Clone(p.Network.AllowedHosts)
	c.Network.AllowedPorts = slices.Clone(p.Network.AllowedPorts)
	c.Network.AllowedCIDRs = slices.Clone(p.Network.AllowedCIDRs)
	c.Network.DNSServers = slices.Clone(p.Network.DNSServers)
	return &c
}
