package seccomp

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// SchemaVersion is the only policy schema version this package reads.
const SchemaVersion = 1

//go:embed policies/*.yaml
var embedded embed.FS

// Policy is one seccomp policy as written in its YAML file. It is plain
// data: package policyyaml decodes the YAML (Resolve), ReadDecoded and
// Load read its decoded form (JSON of this struct), Validate checks it,
// Compile turns it into BPF.
type Policy struct {
	Version     int    `yaml:"version"`
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Extends names an embedded policy this one starts from; Replaces
	// lists syscalls whose rules in that base are dropped, so that this
	// policy's own rules decide them. Resolve resolves both once (inherit):
	// after it, Rules and DefaultAction are the whole, effective policy.
	Extends       string   `yaml:"extends,omitempty"`
	Replaces      []string `yaml:"replaces,omitempty"`
	DefaultAction Action   `yaml:"default_action"`
	Rules         []Rule   `yaml:"rules"`

	// source is where the policy came from ("embedded:standard.yaml",
	// a file path, or the caller's label); errors name it.
	source string
}

// Action is what the kernel does when a rule matches.
//
//	action: allow | errno | kill_process | kill_thread | log | notify
//	errno:  EPERM | ENOSYS | ...   (required with action errno, forbidden otherwise)
//
// notify (SECCOMP_RET_USER_NOTIF) hands the syscall to a supervisor that
// holds the filter's listener (a per-tool template, seccomp/template.go);
// it is valid only on clone with exactly one condition, "arg0 eq FLAGS"
// (the flags are a register, so the supervisor's answer cannot be raced).
type Action struct {
	Kind  string `yaml:"action"`
	Errno string `yaml:"errno,omitempty"`
}

// Rule gives one action for a list of syscalls, optionally only when every
// argument condition in Args holds. Reason is mandatory: it is what a
// reviewer reads and what `str profile show --plan` prints.
type Rule struct {
	Names  []string `yaml:"names"`
	Action `yaml:",inline"`
	Args   []Arg  `yaml:"args,omitempty"`
	Reason string `yaml:"reason"`
}

// Arg is one condition on a syscall argument. Value is required (a pointer
// so that a forgotten value is an error, not 0). Mask is required for
// masked_eq and forbidden for every other op.
//
//	{index: 1, op: masked_eq, mask: 0xffffffff, value: 0x5412}
type Arg struct {
	Index uint    `yaml:"index"`
	Op    string  `yaml:"op"`
	Mask  *uint64 `yaml:"mask,omitempty"`
	Value *uint64 `yaml:"value"`
}

// Action kinds.
const (
	ActionAllow       = "allow"
	ActionErrno       = "errno"
	ActionKillProcess = "kill_process"
	ActionKillThread  = "kill_thread"
	ActionLog         = "log"
	ActionNotify      = "notify"
)

var actionKinds = map[string]bool{
	ActionAllow: true, ActionErrno: true, ActionKillProcess: true, ActionKillThread: true, ActionLog: true, ActionNotify: true,
}

// Argument comparison operators (64-bit, unsigned, like libseccomp's).
const (
	OpEq       = "eq"
	OpNe       = "ne"
	OpLt       = "lt"
	OpLe       = "le"
	OpGt       = "gt"
	OpGe       = "ge"
	OpMaskedEq = "masked_eq"
)

var argOps = map[string]bool{OpEq: true, OpNe: true, OpLt: true, OpLe: true, OpGt: true, OpGe: true, OpMaskedEq: true}

// errnos are the errno values a policy may name. The list is short on
// purpose: a policy author picks between "not permitted" (EPERM, a known
// dangerous call) and "does not exist" (ENOSYS, so callers fall back).
var errnos = map[string]unix.Errno{
	"EPERM":        unix.EPERM,
	"EACCES":       unix.EACCES,
	"ENOSYS":       unix.ENOSYS,
	"EINVAL":       unix.EINVAL,
	"EAFNOSUPPORT": unix.EAFNOSUPPORT,
	"EOPNOTSUPP":   unix.EOPNOTSUPP,
	"ENOTTY":       unix.ENOTTY,
}

func errnoName(e unix.Errno) string {
	for n, v := range errnos {
		if v == e {
			return n
		}
	}
	return fmt.Sprintf("%d", int(e))
}

// String renders the action the way the plan prints it: "allow",
// "errno EPERM", "kill_process".
func (a Action) String() string {
	if a.Kind == ActionErrno {
		return a.Kind + " " + a.Errno
	}
	return a.Kind
}

// String renders the condition the way the plan prints it:
// "arg1 & 0xffffffff == 0x5412".
func (c Arg) String() string {
	val := "?"
	if c.Value != nil {
		val = fmt.Sprintf("%#x", *c.Value)
	}
	switch c.Op {
	case OpMaskedEq:
		mask := "?"
		if c.Mask != nil {
			mask = fmt.Sprintf("%#x", *c.Mask)
		}
		return fmt.Sprintf("arg%d & %s == %s", c.Index, mask, val)
	case OpEq:
		return fmt.Sprintf("arg%d == %s", c.Index, val)
	case OpNe:
		return fmt.Sprintf("arg%d != %s", c.Index, val)
	case OpLt:
		return fmt.Sprintf("arg%d < %s", c.Index, val)
	case OpLe:
		return fmt.Sprintf("arg%d <= %s", c.Index, val)
	case OpGt:
		return fmt.Sprintf("arg%d > %s", c.Index, val)
	case OpGe:
		return fmt.Sprintf("arg%d >= %s", c.Index, val)
	}
	return fmt.Sprintf("arg%d %s %s", c.Index, c.Op, val)
}

// Source says where the policy was read from.
func (p *Policy) Source() string { return p.source }

// Names returns the names of the embedded policies, sorted.
func Names() []string {
	ents, err := embedded.ReadDir("policies")
	if err != nil {
		// The directory is part of the binary; failing to read it is a
		// build defect, not a runtime condition.
		panic("seccomp: embedded policies missing: " + err.Error())
	}
	var names []string
	for _, e := range ents {
		if n, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// policyName is compiled when first used, not at every str start.
var policyName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9_-]*$`) })

// EmbeddedFile returns the YAML file of the embedded policy called name
// (package policyyaml decodes it; go generate stores the decoded form).
func EmbeddedFile(name string) ([]byte, error) {
	if !policyName().MatchString(name) {
		return nil, fmt.Errorf("seccomp: load policy %q: not a valid policy name (known: %s)", name, strings.Join(Names(), ", "))
	}
	data, err := embedded.ReadFile(path.Join("policies", name+".yaml"))
	if err != nil {
		return nil, fmt.Errorf("seccomp: load policy %q: no such embedded policy (known: %s): %w", name, strings.Join(Names(), ", "), err)
	}
	return data, nil
}

// Load returns the embedded policy called name, validated. It reads the
// policy's decoded form (predecoded/NAME.json, written by go generate from
// NAME.yaml through package policyyaml): str decodes no YAML at run time.
func Load(name string) (*Policy, error) {
	data, err := EmbeddedFile(name)
	if err != nil {
		return nil, err
	}
	p, ok := fromPredecoded(predecodedFS, name, data)
	if !ok {
		return nil, fmt.Errorf("seccomp: embedded policy %s: its decoded form predecoded/%s.json is missing, stale or invalid: run go generate ./seccomp", name, name)
	}
	return p, nil
}

// ReadDecoded reads a policy in its decoded form: the JSON encoding of a
// Policy whose extends is already resolved (Rules and DefaultAction are
// the whole policy; Extends and Replaces only record where it came
// from), as package policyyaml writes it for an operator's policy file.
// Unknown fields are refused, and the policy is validated like any other.
// source names it in errors (the policy file's path).
func ReadDecoded(data []byte, source string) (*Policy, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Policy
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("seccomp: policy %s: decoded form: %w", source, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("seccomp: policy %s: decoded form: more than one policy", source)
	}
	p.source = source
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// Resolve ends the decoding of a policy file (package policyyaml calls it
// once the YAML is decoded): it records source, resolves extends with the
// embedded policy base returns (inherit) and validates the result. Every
// validation problem is reported, joined with errors.Join.
func Resolve(p *Policy, source string, base func(name string) (*Policy, error)) error {
	p.source = source
	if p.Extends != "" || len(p.Replaces) > 0 {
		if err := p.inherit(base); err != nil {
			return err
		}
	}
	return p.Validate()
}

// inherit resolves extends, once, when the policy is decoded:
//
//  1. replaces needs extends; the base is an embedded policy, loaded (and
//     itself resolved) by loadBase (package policyyaml has refused a chain
//     of extends that comes back to itself or is too long before)
//  2. every name in replaces is a syscall the base has rules for, and one
//     this policy's own rules name: a replacement, never a silent removal
//  3. the rules are the base's, without the replaced syscalls (a base rule
//     left with no names is dropped), then this policy's own, in order:
//     a syscall's conditional rules from the base are tried before the
//     ones this policy adds
//  4. default_action, when this policy does not give one, is the base's
//
// Validate then checks the result like any stand-alone policy: a rule
// here that repeats a syscall the base already decides unconditionally,
// without replacing it, is an error there.
func (p *Policy) inherit(loadBase func(name string) (*Policy, error)) error {
	var errs []error
	add := func(field, format string, a ...any) {
		errs = append(errs, &ValidationError{Policy: p.source, Rule: -1, Field: field, Msg: fmt.Sprintf(format, a...)})
	}
	// 1. the base
	if p.Extends == "" {
		add("replaces", "needs extends: there is no base policy to replace rules of")
		return errors.Join(errs...)
	}
	base, err := loadBase(p.Extends)
	if err != nil {
		add("extends", "base policy %q: %v", p.Extends, err)
		return errors.Join(errs...)
	}
	// 2. replaces
	named := func(rules []Rule) map[string]bool {
		m := map[string]bool{}
		for _, r := range rules {
			for _, n := range r.Names {
				m[n] = true
			}
		}
		return m
	}
	inBase, inOwn := named(base.Rules), named(p.Rules)
	replaced := map[string]bool{}
	for i, n := range p.Replaces {
		f := fmt.Sprintf("replaces[%d]", i)
		switch {
		case replaced[n]:
			add(f, "%q listed twice", n)
		case !inBase[n]:
			add(f, "%q has no rule in base policy %s: there is nothing to replace", n, base.Name)
		case !inOwn[n]:
			add(f, "%q is replaced by no rule of this policy: removing a base rule silently is not allowed", n)
		}
		replaced[n] = true
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// 3. rules
	var rules []Rule
	for _, r := range base.Rules {
		var names []string
		for _, n := range r.Names {
			if !replaced[n] {
				names = append(names, n)
			}
		}
		if len(names) > 0 {
			r.Names = names
			rules = append(rules, r)
		}
	}
	p.Rules = append(rules, p.Rules...)
	// 4. default action
	if p.DefaultAction == (Action{}) {
		p.DefaultAction = base.DefaultAction
	}
	return nil
}

// ValidationError is one problem found by Validate. Rule is -1 for
// policy-level fields.
type ValidationError struct {
	Policy string // source of the policy
	Rule   int
	Field  string // "names[2]", "errno", "args[0].mask", ...
	Msg    string
}

func (e *ValidationError) Error() string {
	if e.Rule < 0 {
		return fmt.Sprintf("seccomp: policy %s: %s: %s", e.Policy, e.Field, e.Msg)
	}
	return fmt.Sprintf("seccomp: policy %s: rules[%d].%s: %s", e.Policy, e.Rule, e.Field, e.Msg)
}

// Validate runs every check and returns all problems joined with
// errors.Join (nil when the policy is valid). The checks:
//
//  1. version is 1
//  2. name is a lower-case identifier; description is set
//  3. default_action is a valid action and is not allow (default deny)
//     nor notify
//  4. there is at least one rule
//  5. per rule: names non-empty, each a syscall of amd64
//     or arm64, no name twice in a rule; action known; errno given iff
//     action is errno and from the allowed list; reason non-empty;
//     args: index 0..5 at most once, op known, value given, mask given
//     iff op is masked_eq; notify only on [clone] with exactly the one
//     condition arg0 eq FLAGS
//  6. across rules: a syscall has at most one unconditional rule; a
//     syscall with an unconditional rule has no conditional rule with the
//     same action (it would be dead); two conditional rules for a syscall
//     never repeat the same conditions; a rule whose action equals the
//     default action is documentation only, so its syscalls appear in no
//     other rule (where it would silently change nothing).
func (p *Policy) Validate() error {
	src := p.source
	if src == "" {
		src = p.Name
	}
	var errs []error
	add := func(rule int, field, format string, a ...any) {
		errs = append(errs, &ValidationError{Policy: src, Rule: rule, Field: field, Msg: fmt.Sprintf(format, a...)})
	}

	// 1. version
	if p.Version != SchemaVersion {
		add(-1, "version", "is %d, want %d", p.Version, SchemaVersion)
	}
	// 2. name, description
	if !policyName().MatchString(p.Name) {
		add(-1, "name", "%q is not a lower-case identifier ([a-z][a-z0-9_-]*)", p.Name)
	}
	if strings.TrimSpace(p.Description) == "" {
		add(-1, "description", "is empty")
	}
	// 3. default action
	for _, m := range checkAction(p.DefaultAction) {
		add(-1, "default_action."+m.field, "%s", m.msg)
	}
	if p.DefaultAction.Kind == ActionAllow {
		add(-1, "default_action.action", "allow is not permitted: policies are default-deny")
	}
	if p.DefaultAction.Kind == ActionNotify {
		add(-1, "default_action.action", "notify is only for one clone rule, never the default")
	}
	// 4. rules
	if len(p.Rules) == 0 {
		add(-1, "rules", "no rules")
	}

	type seen struct {
		rule   int
		action string
	}
	uncond := map[string]seen{}
	cond := map[string][]seen{}
	condKeys := map[string]int{}

	for i, r := range p.Rules {
		// 5. per rule
		if len(r.Names) == 0 {
			add(i, "names", "empty")
		}
		inRule := map[string]bool{}
		for j, n := range r.Names {
			if inRule[n] {
				add(i, fmt.Sprintf("names[%d]", j), "%q listed twice in this rule", n)
				continue
			}
			inRule[n] = true
			if !knownSyscall(n) {
				add(i, fmt.Sprintf("names[%d]", j), "unknown syscall %q (not a syscall of amd64 or arm64)", n)
			}
		}
		for _, m := range checkAction(r.Action) {
			add(i, m.field, "%s", m.msg)
		}
		if r.Kind == ActionNotify && !notifyShape(r) {
			add(i, "action", "notify is only for [clone] with exactly one condition {index: 0, op: eq}: a supervisor answers one exact flags value, never a family of calls")
		}
		if strings.TrimSpace(r.Reason) == "" {
			add(i, "reason", "missing: every rule must say why")
		}
		argIdx := map[uint]bool{}
		for j, c := range r.Args {
			f := fmt.Sprintf("args[%d]", j)
			if c.Index > 5 {
				add(i, f+".index", "%d out of range 0..5", c.Index)
			} else if argIdx[c.Index] {
				add(i, f+".index", "argument %d already has a condition in this rule", c.Index)
			}
			argIdx[c.Index] = true
			if !argOps[c.Op] {
				add(i, f+".op", "unknown op %q (want one of %s)", c.Op, keys(argOps))
			}
			if c.Value == nil {
				add(i, f+".value", "missing")
			}
			switch {
			case c.Op == OpMaskedEq && c.Mask == nil:
				add(i, f+".mask", "required with op masked_eq")
			case c.Op != OpMaskedEq && c.Mask != nil:
				add(i, f+".mask", "only allowed with op masked_eq")
			case c.Op == OpMaskedEq && c.Value != nil && *c.Value&^*c.Mask != 0:
				add(i, f+".value", "%#x has bits outside mask %#x: the condition can never match", *c.Value, *c.Mask)
			}
		}

		// 6. across rules
		act := r.Action.String()
		for _, n := range r.Names {
			if len(r.Args) == 0 {
				if prev, ok := uncond[n]; ok {
					add(i, "names", "%q already has an unconditional rule (rules[%d], %s)", n, prev.rule, prev.action)
					continue
				}
				uncond[n] = seen{i, act}
			} else {
				key := n + "\x00" + argsKey(r.Args)
				if prev, ok := condKeys[key]; ok {
					add(i, "args", "%q already has a rule with the same conditions (rules[%d])", n, prev)
				} else {
					condKeys[key] = i
				}
				cond[n] = append(cond[n], seen{i, act})
			}
		}
	}
	rulesOf := map[string][]int{}
	for i, r := range p.Rules {
		for _, n := range r.Names {
			rulesOf[n] = append(rulesOf[n], i)
		}
	}
	for i, r := range p.Rules {
		if r.Action != p.DefaultAction {
			continue
		}
		for _, n := range r.Names {
			if len(rulesOf[n]) > 1 {
				add(i, "action", "%q: a rule with the default action (%s) only documents a decision, so %q must not appear in other rules (it is in rules%v)", n, r.Action, n, rulesOf[n])
			}
		}
	}
	for n, cs := range cond {
		u, ok := uncond[n]
		if !ok {
			continue
		}
		for _, c := range cs {
			if c.action == u.action {
				add(c.rule, "args", "%q has an unconditional rule with the same action (rules[%d], %s): this conditional rule is dead", n, u.rule, u.action)
			}
		}
	}
	sort.SliceStable(errs, func(a, b int) bool {
		ea, eb := errs[a].(*ValidationError), errs[b].(*ValidationError)
		if ea.Rule != eb.Rule {
			return ea.Rule < eb.Rule
		}
		return ea.Error() < eb.Error()
	})
	return errors.Join(errs...)
}

// notifyShape: the only rule notify may have, clone with exactly one
// condition "arg0 eq FLAGS".
func notifyShape(r Rule) bool {
	return len(r.Names) == 1 && r.Names[0] == "clone" && len(r.Args) == 1 &&
		r.Args[0].Index == 0 && r.Args[0].Op == OpEq && r.Args[0].Value != nil
}

type fieldMsg struct{ field, msg string }

func checkAction(a Action) []fieldMsg {
	var out []fieldMsg
	if !actionKinds[a.Kind] {
		out = append(out, fieldMsg{"action", fmt.Sprintf("unknown action %q (want one of %s)", a.Kind, keys(actionKinds))})
	}
	switch {
	case a.Kind == ActionErrno && a.Errno == "":
		out = append(out, fieldMsg{"errno", "required with action errno"})
	case a.Kind == ActionErrno:
		if _, ok := errnos[a.Errno]; !ok {
			out = append(out, fieldMsg{"errno", fmt.Sprintf("unknown errno %q (want one of %s)", a.Errno, keys(errnos))})
		}
	case a.Errno != "":
		out = append(out, fieldMsg{"errno", fmt.Sprintf("only allowed with action errno (action is %q)", a.Kind)})
	}
	return out
}

func argsKey(args []Arg) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = a.String()
	}
	sort.Strings(parts)
	return strings.Join(parts, "&&")
}

func keys[V any](m map[string]V) string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ", ")
}
