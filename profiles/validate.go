package profiles

import (
	"errors"
	"fmt"
	"math"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// SchemaVersion is the only profile schema version this package reads.
const SchemaVersion = 1

// FieldError is one validation problem of one profile. Validate returns
// all of them joined with errors.Join; use errors.As to get one.
type FieldError struct {
	Source  string // file the profile came from ("" when not known)
	Profile string // profile name ("" when the name itself is missing)
	Field   string // YAML path of the field, e.g. "cgroup.memory", "mounts.tmpfs[0].mode"
	Problem string // what is wrong, with the value found
}

func (e *FieldError) Error() string {
	name := e.Profile
	if name == "" {
		name = "(unnamed)"
	}
	msg := fmt.Sprintf("profile %s: %s: %s", name, e.Field, e.Problem)
	if e.Source != "" {
		msg = e.Source + ": " + msg
	}
	return msg
}

// check is one named validation rule. It reports every problem it finds
// through add and never stops early.
type check struct {
	name string
	run  func(p *Profile, add func(field, format string, args ...any))
}

// checks is the whole validation: every profile passes each of these, in
// this order, and every problem of every check is reported.
var checks = []check{
	{"version", checkVersion},
	{"name", checkName},
	{"aliases", checkAliases},
	{"description", checkDescription},
	{"user_namespace", checkUserNamespace},
	{"network", checkNetwork},
	{"share_caller_network", checkShareCallerNetwork},
	{"root_capabilities", checkRootCapabilities},
	{"hostname", checkHostname},
	{"ids", checkIDs},
	{"rlimits", checkRlimits},
	{"cgroup", checkCgroup},
	{"timeout", checkTimeout},
	{"mount paths", checkMountPaths},
	{"mount targets unique", checkMountTargetsUnique},
	{"tmpfs", checkTmpfs},
	{"dev_shm", checkDevShm},
	{"work_dir", checkWorkDir},
	{"env", checkEnv},
	{"seccomp", checkSeccomp},
	{"caller_seccomp", checkCallerSeccomp},
	{"runtime", checkRuntime},
}

// Validate runs every check and returns all problems found, joined with
// errors.Join (each a *FieldError), or nil when the profile is valid.
func (p *Profile) Validate() error {
	return joinFieldErrors(p.validate())
}

func (p *Profile) validate() []*FieldError {
	if p == nil {
		return []*FieldError{{Field: "(profile)", Problem: "nil profile"}}
	}
	var errs []*FieldError
	for _, c := range checks {
		c.run(p, func(field, format string, args ...any) {
			errs = append(errs, &FieldError{Profile: p.Name, Field: field, Problem: fmt.Sprintf(format, args...)})
		})
	}
	return errs
}

func joinFieldErrors(fes []*FieldError) error {
	if len(fes) == 0 {
		return nil
	}
	errs := make([]error, len(fes))
	for i, fe := range fes {
		errs[i] = fe
	}
	return errors.Join(errs...)
}

func checkVersion(p *Profile, add func(string, string, ...any)) {
	if p.Version != SchemaVersion {
		add("version", "must be %d, got %d", SchemaVersion, p.Version)
	}
}

// validName reports why s is not a valid profile, alias or policy name
// (lowercase letters, digits and '-', 1..63 characters, no leading or
// trailing '-'), or "" when it is valid.
func validName(s string) string {
	switch {
	case s == "":
		return "must not be empty"
	case len(s) > 63:
		return fmt.Sprintf("%q is longer than 63 characters", s)
	case strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") != "":
		return fmt.Sprintf("%q may contain only a-z, 0-9 and '-'", s)
	case s[0] == '-' || s[len(s)-1] == '-':
		return fmt.Sprintf("%q must not start or end with '-'", s)
	}
	return ""
}

func checkName(p *Profile, add func(string, string, ...any)) {
	if why := validName(p.Name); why != "" {
		add("name", "%s", why)
	}
}

func checkAliases(p *Profile, add func(string, string, ...any)) {
	seen := map[string]bool{}
	for i, a := range p.Aliases {
		f := fmt.Sprintf("aliases[%d]", i)
		if why := validName(a); why != "" {
			add(f, "%s", why)
		}
		if a == p.Name {
			add(f, "%q is the profile's own name", a)
		}
		if seen[a] {
			add(f, "%q is listed twice", a)
		}
		seen[a] = true
	}
}

func checkDescription(p *Profile, add func(string, string, ...any)) {
	if strings.TrimSpace(p.Description) == "" {
		add("description", "must say what the profile is for")
	}
}

func checkUserNamespace(p *Profile, add func(string, string, ...any)) {
	switch p.UserNamespace {
	case "auto", "always", "never":
	default:
		add("user_namespace", "%q is not one of auto, always, never", p.UserNamespace)
	}
}

func checkNetwork(p *Profile, add func(string, string, ...any)) {
	if p.Network.Mode == "" {
		add("network", "policy must be set: isolated, restricted or allow_egress")
		return
	}
	if err := p.Network.Validate(); err != nil {
		add("network", "%v", err)
	}
}

func checkShareCallerNetwork(p *Profile, add func(string, string, ...any)) {
	switch p.ShareCallerNetwork {
	case "", Allow, Deny:
	default:
		add("share_caller_network", "%q is not one of allow, deny", p.ShareCallerNetwork)
	}
}

func checkRootCapabilities(p *Profile, add func(string, string, ...any)) {
	switch p.RootCapabilities {
	case "", Allow, Deny:
	default:
		add("root_capabilities", "%q is not one of allow, deny", p.RootCapabilities)
	}
}

// checkHostname accepts an RFC 1123 host name: dot-separated labels of
// letters, digits and '-', each 1..63 characters, 253 in all.
func checkHostname(p *Profile, add func(string, string, ...any)) {
	h := p.Hostname
	if h == "" {
		add("hostname", "must not be empty")
		return
	}
	if len(h) > 253 {
		add("hostname", "%q is longer than 253 characters", h)
		return
	}
	for _, label := range strings.Split(h, ".") {
		lower := strings.ToLower(label)
		if label == "" || len(label) > 63 ||
			strings.Trim(lower, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" ||
			label[0] == '-' || label[len(label)-1] == '-' {
			add("hostname", "%q is not a valid host name (RFC 1123)", h)
			return
		}
	}
}

// checkIDs refuses uid/gid 0 (the tool never runs as root) and the
// invalid id 2^32-1 ((uid_t)-1 means "unchanged" to setresuid).
func checkIDs(p *Profile, add func(string, string, ...any)) {
	for _, id := range []struct {
		field string
		v     uint32
	}{{"uid", p.UID}, {"gid", p.GID}} {
		switch id.v {
		case 0:
			add(id.field, "must be set and not 0 (the tool never runs as root)")
		case math.MaxUint32:
			add(id.field, "%d is not a valid id", id.v)
		}
	}
}

func checkRlimits(p *Profile, add func(string, string, ...any)) {
	r := p.Rlimits
	for _, q := range []struct {
		field string
		v     Quantity
	}{{"rlimits.as", Quantity(r.AS)}, {"rlimits.fsize", r.FSize}, {"rlimits.stack", r.Stack}} {
		if q.v <= 0 {
			add(q.field, "must be set and > 0, got %s", FormatBytes(q.v))
		}
	}
	if r.AS == UnlimitedAS && p.BestEffort {
		add("rlimits.as", "unlimited needs memory.max to bound the sandbox, and a best_effort profile may run without a cgroup")
	}
	switch cpu := time.Duration(r.CPU); {
	case cpu <= 0:
		add("rlimits.cpu", "must be set and > 0, got %s", cpu)
	case cpu%time.Second != 0:
		add("rlimits.cpu", "must be whole seconds (RLIMIT_CPU counts seconds), got %s", cpu)
	}
	for _, c := range []struct {
		field string
		v     int64
	}{{"rlimits.nofile", r.NoFile}, {"rlimits.nproc", r.NProc}} {
		if c.v <= 0 {
			add(c.field, "must be set and > 0, got %d", c.v)
		}
	}
	if r.Core != 0 {
		add("rlimits.core", "must be 0 (core dumps could write the tool's memory to disk), got %s", FormatBytes(r.Core))
	}
}

// checkCgroup requires all three limits. memory is not compared with
// rlimits.as: RLIMIT_AS caps each process's address space, memory.max the
// resident memory of the whole sandbox; neither bounds the other.
func checkCgroup(p *Profile, add func(string, string, ...any)) {
	c := p.Cgroup
	if c.Memory <= 0 {
		add("cgroup.memory", "must be set and > 0, got %s", FormatBytes(c.Memory))
	}
	if c.CPUs <= 0 {
		add("cgroup.cpus", "must be set and > 0, got %s", FormatCPUs(c.CPUs))
	}
	if c.Pids <= 0 {
		add("cgroup.pids", "must be set and > 0, got %d", c.Pids)
	}
}

func checkTimeout(p *Profile, add func(string, string, ...any)) {
	if p.Timeout < 0 {
		add("timeout", "must be >= 0 (0 = none), got %s", p.Timeout)
	}
}

// reservedTargets are paths the launcher provides itself; a profile mount
// there would hide or replace them.
var reservedTargets = []string{"/proc", "/dev", "/sys", "/var/run/secrets", "/run/secrets", "/etc/resolv.conf", "/etc/hosts"}

// badPath reports why target is not usable as a mount target, or "".
func badPath(target string) string {
	switch {
	case target == "":
		return "must not be empty"
	case !strings.HasPrefix(target, "/"):
		return fmt.Sprintf("%q is not absolute", target)
	case target == "/":
		return `"/" is the sandbox root, which the launcher provides`
	}
	for _, part := range strings.Split(target, "/") {
		if part == ".." {
			return fmt.Sprintf("%q contains '..'", target)
		}
	}
	if path.Clean(target) != target {
		return fmt.Sprintf("%q is not clean (would be %q)", target, path.Clean(target))
	}
	for _, r := range reservedTargets {
		if target == r || strings.HasPrefix(target, r+"/") {
			return fmt.Sprintf("%q is under %s, which the launcher provides", target, r)
		}
	}
	return ""
}

func checkMountPaths(p *Profile, add func(string, string, ...any)) {
	for i, b := range p.Mounts.ReadOnly {
		if why := badPath(b.Path); why != "" {
			add(fmt.Sprintf("mounts.ro_binds[%d].path", i), "%s", why)
		}
	}
	for i, t := range p.Mounts.Tmpfs {
		if why := badPath(t.Path); why != "" {
			add(fmt.Sprintf("mounts.tmpfs[%d].path", i), "%s", why)
		}
	}
}

func checkMountTargetsUnique(p *Profile, add func(string, string, ...any)) {
	seen := map[string]string{}
	note := func(field, target string) {
		if target == "" {
			return
		}
		if first, ok := seen[target]; ok {
			add(field, "%q is already a target (%s)", target, first)
			return
		}
		seen[target] = field
	}
	for i, b := range p.Mounts.ReadOnly {
		note(fmt.Sprintf("mounts.ro_binds[%d].path", i), b.Path)
	}
	for i, t := range p.Mounts.Tmpfs {
		note(fmt.Sprintf("mounts.tmpfs[%d].path", i), t.Path)
	}
}

// ParseMode parses a tmpfs mode: 1 to 4 octal digits, at most 1777. The
// setuid and setgid bits are refused; the sticky bit is allowed (/tmp).
func ParseMode(s string) (uint32, error) {
	if len(s) == 0 || len(s) > 4 {
		return 0, fmt.Errorf("mode %q: must be 1 to 4 octal digits", s)
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("mode %q: not octal", s)
	}
	if v&^0o1777 != 0 {
		return 0, fmt.Errorf("mode %q: setuid/setgid bits are not allowed (at most 1777)", s)
	}
	return uint32(v), nil
}

func checkTmpfs(p *Profile, add func(string, string, ...any)) {
	for i, t := range p.Mounts.Tmpfs {
		if t.Size <= 0 {
			add(fmt.Sprintf("mounts.tmpfs[%d].size", i), "must be set and > 0 (an uncapped tmpfs can fill the host's memory), got %s", FormatBytes(t.Size))
		}
		if _, err := ParseMode(t.Mode); err != nil {
			add(fmt.Sprintf("mounts.tmpfs[%d].mode", i), "%v", err)
		}
	}
}

func checkDevShm(p *Profile, add func(string, string, ...any)) {
	if p.Mounts.DevShm < 0 {
		add("mounts.dev_shm", "must be >= 0 (0 = no /dev/shm), got %d", p.Mounts.DevShm)
	}
}

// checkWorkDir requires both caps of the work dir: an uncapped work dir
// is a host directory a tool can fill (bytes or inodes) for every other
// task on the host.
func checkWorkDir(p *Profile, add func(string, string, ...any)) {
	if p.WorkDir.Size <= 0 {
		add("work_dir.size", "must be set and > 0 (an uncapped work dir can fill the host's disk), got %s", FormatBytes(p.WorkDir.Size))
	}
	if p.WorkDir.Inodes <= 0 {
		add("work_dir.inodes", "must be set and > 0 (an uncapped work dir can exhaust the host's inodes), got %d", p.WorkDir.Inodes)
	}
}

// validEnvName: a POSIX-style environment variable name.
func validEnvName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	return strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") == ""
}

func checkEnv(p *Profile, add func(string, string, ...any)) {
	for _, k := range sortedKeys(p.Env.Set) {
		v := p.Env.Set[k]
		if !validEnvName(k) {
			add("env.set", "%q is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if strings.ContainsRune(v, 0) {
			add("env.set."+k, "value contains a NUL byte")
		}
	}
	seen := map[string]bool{}
	for i, k := range p.Env.Passthrough {
		f := fmt.Sprintf("env.passthrough[%d]", i)
		if !validEnvName(k) {
			add(f, "%q is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)", k)
		}
		if _, ok := p.Env.Set[k]; ok {
			add(f, "%q is also in env.set; a variable is either fixed or passed through", k)
		}
		if seen[k] {
			add(f, "%q is listed twice", k)
		}
		seen[k] = true
	}
}

// checkSeccomp: the name of an embedded policy, or the absolute path of a
// policy file (an operator's own, compiled by the seccomp package when the
// launcher first needs it). Only the form is checked here; the launcher
// checks that the policy exists and compiles.
func checkSeccomp(p *Profile, add func(string, string, ...any)) {
	if strings.HasPrefix(p.Seccomp, "/") {
		if filepath.Clean(p.Seccomp) != p.Seccomp || !strings.HasSuffix(p.Seccomp, ".yaml") {
			add("seccomp", "policy file %q must be an absolute, clean path ending in .yaml", p.Seccomp)
		}
		return
	}
	if why := validName(p.Seccomp); why != "" {
		add("seccomp", "%s", why)
	}
}

// checkCallerSeccomp: empty (replace), replace or stack.
func checkCallerSeccomp(p *Profile, add func(string, string, ...any)) {
	switch p.CallerSeccomp {
	case "", CallerSeccompReplace, CallerSeccompStack:
	default:
		add("caller_seccomp", "%q is not one of %s, %s", p.CallerSeccomp, CallerSeccompReplace, CallerSeccompStack)
	}
}

func checkRuntime(p *Profile, add func(string, string, ...any)) {
	if p.Runtime != "" && !slices.Contains(RuntimeClasses, p.Runtime) {
		add("runtime", "%q is not one of %s", p.Runtime, strings.Join(RuntimeClasses, ", "))
	}
}
