package profileyaml

import (
	"errors"
	"fmt"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/profiles"
	"gopkg.in/yaml.v3"
)

// The types below are package profiles' as the YAML spells them: the same
// type and field names and keys, with the quantities (memory sizes, CPU
// counts, durations) read from their Kubernetes notation ("512Mi", "500m",
// "1m30s") into the int64 package profiles stores. Their JSON is
// profiles.Profile's; TestSameFields keeps the two in step.

// Profile is profiles.Profile as written in a file (schema version 1).
type Profile struct {
	Version       int           `yaml:"version"`
	Name          string        `yaml:"name"`
	Description   string        `yaml:"description"`
	Aliases       []string      `yaml:"aliases"`
	BestEffort    bool          `yaml:"best_effort"`
	UserNamespace string        `yaml:"user_namespace"`
	Network       egress.Policy `yaml:"network"`
	// ShareCallerNetwork: "allow" or "deny" (profiles.Profile's).
	ShareCallerNetwork string `yaml:"share_caller_network"`
	// RootCapabilities: "allow" or "deny" (profiles.Profile's).
	RootCapabilities string       `yaml:"root_capabilities" json:",omitempty"`
	Hostname         string       `yaml:"hostname"`
	UID              uint32       `yaml:"uid"`
	GID              uint32       `yaml:"gid"`
	Rlimits          Rlimits      `yaml:"rlimits"`
	Cgroup           Cgroup       `yaml:"cgroup"`
	Timeout          Duration     `yaml:"timeout"`
	Mounts           Mounts       `yaml:"mounts"`
	Env              profiles.Env `yaml:"env"`
	WorkDir          WorkDir      `yaml:"work_dir"`
	Seccomp          string       `yaml:"seccomp"`
	CallerSeccomp    string       `yaml:"caller_seccomp" json:",omitempty"`
	// Runtime: namespaces (the default), gvisor or microvm (profiles.Profile's).
	Runtime string `yaml:"runtime" json:",omitempty"`
}

// Rlimits is profiles.Rlimits.
type Rlimits struct {
	AS     AddressSpace `yaml:"as"`
	CPU    Duration     `yaml:"cpu"`
	FSize  Quantity     `yaml:"fsize"`
	NoFile int64        `yaml:"nofile"`
	NProc  int64        `yaml:"nproc"`
	Stack  Quantity     `yaml:"stack"`
	Core   Quantity     `yaml:"core"`
}

// Cgroup is profiles.Cgroup; CPUs is in CPU notation ("2", "500m").
type Cgroup struct {
	Memory Quantity    `yaml:"memory"`
	CPUs   cpuQuantity `yaml:"cpus"`
	Pids   int64       `yaml:"pids"`
}

// Mounts is profiles.Mounts.
type Mounts struct {
	ReadOnly       []profiles.PathSpec `yaml:"ro_binds"`
	Tmpfs          []TmpfsSpec         `yaml:"tmpfs"`
	DevShm         Quantity            `yaml:"dev_shm"`
	GeneratePasswd bool                `yaml:"generate_passwd"`
}

// TmpfsSpec is profiles.TmpfsSpec.
type TmpfsSpec struct {
	Path string   `yaml:"path"`
	Size Quantity `yaml:"size"`
	Mode string   `yaml:"mode"`
}

// WorkDir is profiles.WorkDir.
type WorkDir struct {
	Size   Quantity `yaml:"size"`
	Inodes int64    `yaml:"inodes"`
}

// Quantity is a byte size (profiles.ParseBytes).
type Quantity profiles.Quantity

// Duration is a duration (profiles.ParseDuration).
type Duration profiles.Duration

// AddressSpace is a byte size or "unlimited" (profiles.AddressSpace).
type AddressSpace profiles.AddressSpace

// cpuQuantity is a CPU count in milli-CPUs (profiles.ParseCPUs).
type cpuQuantity profiles.Quantity

// scalarText returns the text of a YAML scalar, or a decode error naming
// the line when the node is a mapping or sequence.
func scalarText(n *yaml.Node, what string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", &yaml.TypeError{Errors: []string{
			fmt.Sprintf("line %d: %s must be a scalar", n.Line, what)}}
	}
	return n.Value, nil
}

// UnmarshalYAML decodes a byte size (see profiles.ParseBytes).
func (q *Quantity) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarText(n, "a byte size")
	if err != nil {
		return err
	}
	v, err := profiles.ParseBytes(s)
	if err != nil {
		// A TypeError lets yaml.v3 carry on and report every bad field.
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*q = Quantity(v)
	return nil
}

// MarshalYAML prints a byte size as profiles.FormatBytes does.
func (q Quantity) MarshalYAML() (any, error) { return profiles.FormatBytes(profiles.Quantity(q)), nil }

// UnmarshalYAML decodes a duration (see profiles.ParseDuration).
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarText(n, "a duration")
	if err != nil {
		return err
	}
	v, err := profiles.ParseDuration(s)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML prints a duration as Go does ("1m0s").
func (d Duration) MarshalYAML() (any, error) { return profiles.Duration(d).String(), nil }

// UnmarshalYAML decodes a CPU count (see profiles.ParseCPUs).
func (c *cpuQuantity) UnmarshalYAML(n *yaml.Node) error {
	s, err := scalarText(n, "a CPU count")
	if err != nil {
		return err
	}
	v, err := profiles.ParseCPUs(s)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", n.Line, err)}}
	}
	*c = cpuQuantity(v)
	return nil
}

// MarshalYAML prints a CPU count in CPU notation.
func (c cpuQuantity) MarshalYAML() (any, error) {
	return profiles.FormatCPUs(profiles.Quantity(c)), nil
}

// cgroupYAML is Cgroup without its UnmarshalYAML, for decoding the block.
type cgroupYAML Cgroup

var cgroupKeys = map[string]bool{"memory": true, "cpus": true, "pids": true}

// UnmarshalYAML decodes the cgroup block. yaml.v3 does not pass
// KnownFields to custom unmarshalers, so unknown keys are rejected here by
// hand. It exists because CPUs is a Quantity in milli-CPUs, not bytes.
func (c *Cgroup) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: cgroup must be a mapping", n.Line)}}
	}
	var problems []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !cgroupKeys[k.Value] {
			problems = append(problems, fmt.Sprintf("line %d: field %s not found in type profiles.Cgroup", k.Line, k.Value))
		}
	}
	var raw cgroupYAML
	if err := n.Decode(&raw); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return err
		}
		problems = append(problems, te.Errors...)
	}
	if len(problems) > 0 {
		return &yaml.TypeError{Errors: problems}
	}
	*c = Cgroup(raw)
	return nil
}

// UnmarshalYAML decodes a byte size or "unlimited".
func (a *AddressSpace) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Value == "unlimited" {
		*a = AddressSpace(profiles.UnlimitedAS)
		return nil
	}
	var q Quantity
	if err := q.UnmarshalYAML(n); err != nil {
		return err
	}
	*a = AddressSpace(q)
	return nil
}

// MarshalYAML prints "unlimited" or the byte size.
func (a AddressSpace) MarshalYAML() (any, error) { return profiles.AddressSpace(a).String(), nil }
