package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"os"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unicode"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// SchemaVersion is the only manifest version str reads.
const SchemaVersion = 1

// DefaultTimeoutSeconds is a tool's timeout bound when the manifest gives
// none (or 0), spec §5.
const DefaultTimeoutSeconds = 300

// MaxTimeoutSeconds is the largest timeout_seconds accepted (one day).
const MaxTimeoutSeconds = 86400

// MaxManifestBytes bounds the manifest file Load reads.
const MaxManifestBytes = 4 << 20

// maxToolNameBytes keeps an invoke topic within Solace's topic length.
const maxToolNameBytes = 128

// RuntimePython is the only runtime (and the default).
const RuntimePython = "python"

// Tool is one manifest entry (spec §5).
type Tool struct {
	Name           string // the key under tools:, one topic level
	Runtime        string // always "python"
	Module         string // dotted Python module, e.g. "example_tools" or "pkg.sub"
	Function       string // attribute of the module; with ClassName optional (see runner)
	ClassName      string // class-based tool: the class to instantiate
	Package        string // pip distribution to install when the module is not importable
	Version        string // version specifiers for Package, e.g. ">=1.0,<2.0"
	Description    string
	SandboxProfile string // the ceiling of a call's profile (a request may only tighten it); "" = the worker default
	SHA256         string // lowercase hex sha256 of the module's source file, "" = not checked
	TimeoutSeconds int    // upper bound for a request's timeout; always > 0 after Parse
	// Warm is how many pre-started sandboxes the worker keeps for this
	// tool (0..MaxWarm), when WarmSet; otherwise the worker's default
	// (STR_WARM_DEFAULT) applies.
	Warm    int
	WarmSet bool
	// Template (`warm: template`, opt-in) serves the tool's calls from a
	// per-tool template (launcher/template): one pre-imported Python
	// forking each call into namespaces of its own. Calls whose network
	// is not isolated, and workers that cannot make templates (rootless,
	// SANDBOX_MODE=none), run cold.
	Template bool
	// Network narrows the profile's network policy for this tool (nil:
	// the profile's): `network: {policy: restricted, allowed_hosts: [...]}`.
	// It may only tighten; the launcher refuses a looser one.
	Network *egress.Policy
	// Credentials are secrets the tool's calls use without seeing them
	// (credentials.go); a request can neither add nor widen them. nil:
	// none. A pointer keeps Tool comparable (the warm pool's key).
	Credentials *Credentials
	// UserScope is what the tool may do with user-scoped ("user:")
	// artifacts, shared across all of the user's sessions:
	// `artifacts: {user_scope: read|write|none}`; "" (absent) is read.
	UserScope UserScope
	// The newer reference's description fields, announced in the tool's
	// init broadcast (spec §14) and not otherwise used by str, kept as
	// compact JSON text ("" = absent): Parameters, a mapping (the
	// parameters' schema); ArtifactParams, {param: {is_list, is_optional}};
	// ConfigSchema, a list. Instructions is plain text.
	Parameters     string
	ArtifactParams string
	Instructions   string
	ConfigSchema   string
}

// UserScope is a tool's permission on user-scoped ("user:") artifacts.
type UserScope string

// The user_scope values. read (the default, also the zero value) lets a
// call's inputs name "user:" artifacts but not its outputs; write allows
// both; none neither.
const (
	UserScopeNone  UserScope = "none"
	UserScopeRead  UserScope = "read"
	UserScopeWrite UserScope = "write"
)

// CanRead reports whether a call's inputs may reference "user:" artifacts.
func (u UserScope) CanRead() bool { return u != UserScopeNone }

// String is the permission's name ("read" for the zero value).
func (u UserScope) String() string {
	if u == "" {
		return string(UserScopeRead)
	}
	return string(u)
}

// CanWrite reports whether a call's outputs may be saved as "user:" artifacts.
func (u UserScope) CanWrite() bool { return u == UserScopeWrite }

// Equal reports whether t and u are the same manifest entry, every field
// compared by value: the network policy by its content (two loads of one
// file give two pointers), so a reload that only changes a tool's
// network policy or its artifacts permission is a change, and a reload
// that changes nothing of a tool is none. Two nils are equal.
func (t *Tool) Equal(u *Tool) bool {
	if t == nil || u == nil {
		return t == u
	}
	a, b := *t, *u
	a.Network, b.Network = nil, nil
	a.Credentials, b.Credentials = nil, nil
	return a == b && reflect.DeepEqual(t.Network, u.Network) && reflect.DeepEqual(t.Credentials, u.Credentials)
}

// MaxWarm is the largest warm pool size one tool may ask for.
const MaxWarm = 16

// Manifest is the parsed manifest file.
type Manifest struct {
	Version int
	// Tools holds the entries that passed every check: the tools served.
	Tools map[string]*Tool
	// Unavailable maps the name of each entry that failed a check to its
	// problems (with line numbers, "; "-separated). One bad entry never
	// rejects the manifest: the worker reports it (log, /readyz) and
	// answers its calls TOOL_NOT_AVAILABLE with the reason, and serves
	// the others. A name is never in both maps.
	Unavailable map[string]string
}

// Error lists every problem found in a manifest.
type Error struct {
	Source   string
	Problems []string
}

func (e *Error) Error() string {
	return fmt.Sprintf("manifest %s: %d problem(s):\n  %s", e.Source, len(e.Problems), strings.Join(e.Problems, "\n  "))
}

// The patterns are compiled when first used, not at init: every `str run`
// links this package but only the worker checks manifests.
var (
	identRE   = lazyRegexp(`^[A-Za-z_][A-Za-z0-9_]*$`)
	packageRE = lazyRegexp(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$`)
	profileRE = lazyRegexp(`^[a-z][a-z0-9_-]{0,63}$`)
	sha256RE  = lazyRegexp(`^[0-9a-fA-F]{64}$`)
)

func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// Load reads and parses the manifest at path (at most MaxManifestBytes,
// no symlink restrictions: the operator owns the manifest's path).
func Load(path string) (*Manifest, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

func readLimited(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("manifest %s: open: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("manifest %s: stat: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("manifest %s: not a regular file (%s)", path, st.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("manifest %s: read: %w", path, err)
	}
	if len(data) > MaxManifestBytes {
		return nil, fmt.Errorf("manifest %s: larger than %d bytes", path, MaxManifestBytes)
	}
	return data, nil
}

// Parse decodes a manifest strictly, in two tiers.
//
// Whole-file problems reject the manifest, every one collected into one
// *Error (with line numbers): not YAML, empty, more than one document,
// not a mapping, an unknown top-level key, a "version" other than 1 (a
// missing one reads as 1: manifests written for the reference often omit
// it), "tools" missing or not a mapping, and, among the tools, duplicate
// names, keys that are not strings, YAML anchors, aliases and merge keys.
//
// An entry's own problems (an unknown or mistyped field, a value that
// fails a check, a name that cannot be a topic level) make only that
// entry unavailable: it goes to Manifest.Unavailable with its reasons and
// the other entries load.
func Parse(data []byte, source string) (*Manifest, error) {
	p := &parser{}
	m := &Manifest{Version: SchemaVersion, Tools: map[string]*Tool{}, Unavailable: map[string]string{}}

	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Source: source, Problems: []string{"the manifest is empty"}}
		}
		return nil, &Error{Source: source, Problems: []string{"not valid YAML: " + err.Error()}}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		p.add(&extra, "more than one YAML document")
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}

	fields := p.mapping(root, "the manifest", map[string]bool{"version": true, "tools": true})
	if v, ok := fields["version"]; ok {
		if n, ok := p.integer(v, "version"); ok && n != SchemaVersion {
			p.add(v, fmt.Sprintf("version: %d is not supported (want %d)", n, SchemaVersion))
		}
	}
	tools, ok := fields["tools"]
	var entryProblems []string
	switch {
	case !ok:
		if root.Kind == yaml.MappingNode {
			p.add(root, `"tools" is required`)
		}
	case tools.Tag == "!!null":
		// "tools:" with nothing under it: no tools
	default:
		for _, entry := range p.pairs(tools, "tools") {
			name, ok := p.str(entry[0], "tool name")
			if !ok {
				continue
			}
			// The entry's problems are its own: collected apart, they
			// make this entry unavailable, not the manifest invalid.
			ep := &parser{}
			t := ep.tool(name, entry[0], entry[1])
			if len(ep.problems) > 0 {
				m.Unavailable[name] = strings.Join(ep.problems, "; ")
				entryProblems = append(entryProblems, ep.problems...)
				continue
			}
			m.Tools[name] = t
		}
	}
	if len(p.problems) > 0 {
		// The file is rejected; its entries' problems are listed too, so
		// that one fix-up round sees them all.
		return nil, &Error{Source: source, Problems: append(p.problems, entryProblems...)}
	}
	return m, nil
}

var toolFields = map[string]bool{
	"runtime": true, "module": true, "function": true, "class_name": true, "package": true, "version": true,
	"description": true, "timeout_seconds": true, "sandbox_profile": true, "sha256": true, "warm": true,
	"network": true, "artifacts": true, "credentials": true,
	"parameters": true, "artifact_params": true, "instructions": true, "config_schema": true,
}

var artifactsFields = map[string]bool{"user_scope": true}

var networkFields = map[string]bool{
	"policy": true, "allowed_hosts": true, "allowed_ports": true, "allowed_cidrs": true, "dns_servers": true, "on_violation": true,
	"http_rules": true,
}

// tool decodes one entry; every problem it finds is p's (the caller gives
// each entry a parser of its own). The result is meaningless when p has
// problems.
func (p *parser) tool(name string, nameNode, node *yaml.Node) *Tool {
	where := fmt.Sprintf("tools.%s", name)
	if reason := checkToolName(name); reason != "" {
		p.add(nameNode, fmt.Sprintf("tool name %q %s", name, reason))
	}
	t := &Tool{Name: name, Runtime: RuntimePython, TimeoutSeconds: DefaultTimeoutSeconds}
	fields := p.mapping(node, where, toolFields)
	strField := func(key string, dst *string) {
		if v, ok := fields[key]; ok && v.Tag != "!!null" {
			if s, ok := p.str(v, where+"."+key); ok {
				*dst = s
			}
		}
	}
	strField("runtime", &t.Runtime)
	strField("module", &t.Module)
	strField("function", &t.Function)
	strField("class_name", &t.ClassName)
	strField("package", &t.Package)
	strField("version", &t.Version)
	strField("description", &t.Description)
	strField("sandbox_profile", &t.SandboxProfile)
	strField("sha256", &t.SHA256)
	strField("instructions", &t.Instructions)
	t.Parameters = p.jsonField(fields, where, "parameters", yaml.MappingNode)
	t.ArtifactParams = p.jsonField(fields, where, "artifact_params", yaml.MappingNode)
	t.ConfigSchema = p.jsonField(fields, where, "config_schema", yaml.SequenceNode)
	if t.ArtifactParams != "" {
		dec := json.NewDecoder(strings.NewReader(t.ArtifactParams))
		dec.DisallowUnknownFields()
		var ap map[string]struct {
			IsList     bool `json:"is_list"`
			IsOptional bool `json:"is_optional"`
		}
		if err := dec.Decode(&ap); err != nil {
			p.add(fields["artifact_params"], fmt.Sprintf("%s.artifact_params: want {param: {is_list: bool, is_optional: bool}}: %v", where, err))
		}
	}
	if v, ok := fields["timeout_seconds"]; ok {
		if n, ok := p.integer(v, where+".timeout_seconds"); ok {
			switch {
			case n < 0:
				p.add(v, fmt.Sprintf("%s.timeout_seconds: %d is negative", where, n))
			case n > MaxTimeoutSeconds:
				p.add(v, fmt.Sprintf("%s.timeout_seconds: %d is more than %d", where, n, MaxTimeoutSeconds))
			case n > 0:
				t.TimeoutSeconds = n
			}
		}
	}

	if v, ok := fields["warm"]; ok && v.Kind == yaml.ScalarNode && v.Tag == "!!str" {
		if v.Value == "template" {
			t.Template = true
		} else {
			p.add(v, fmt.Sprintf("%s.warm: %q is neither a number of sandboxes (0..%d) nor template", where, v.Value, MaxWarm))
		}
	} else if ok {
		if n, ok := p.integer(v, where+".warm"); ok {
			if n < 0 || n > MaxWarm {
				p.add(v, fmt.Sprintf("%s.warm: %d is not between 0 and %d", where, n, MaxWarm))
			} else {
				t.Warm, t.WarmSet = n, true
			}
		}
	}

	if v, ok := fields["network"]; ok && v.Tag != "!!null" {
		p.mapping(v, where+".network", networkFields) // unknown keys are problems
		var n egress.Policy
		dec := v.Decode(&n)
		switch {
		case dec != nil:
			p.add(v, fmt.Sprintf("%s.network: %v", where, dec))
		case n.Mode == "":
			p.add(v, where+".network.policy is required (isolated, restricted or allow_egress)")
		default:
			if err := n.Validate(); err != nil {
				p.add(v, fmt.Sprintf("%s.%v", where, err))
			} else {
				t.Network = &n
			}
		}
	}

	if v, ok := fields["credentials"]; ok && v.Tag != "!!null" {
		p.credentials(t, where, v) // after network: the hosts are checked against it
	}

	if v, ok := fields["artifacts"]; ok && v.Tag != "!!null" {
		af := p.mapping(v, where+".artifacts", artifactsFields)
		if us, ok := af["user_scope"]; ok {
			if s, ok := p.str(us, where+".artifacts.user_scope"); ok {
				switch UserScope(s) {
				case UserScopeNone, UserScopeRead, UserScopeWrite:
					t.UserScope = UserScope(s)
				default:
					p.add(us, fmt.Sprintf("%s.artifacts.user_scope: %q is not one of read, write, none", where, s))
				}
			}
		}
	}

	// Named checks over the decoded entry; each adds its own problem.
	if node.Kind == yaml.MappingNode {
		if t.Runtime != RuntimePython {
			p.add(fieldOr(fields, "runtime", node), fmt.Sprintf("%s.runtime: %q is not supported (only %q)", where, t.Runtime, RuntimePython))
		}
		if t.Module == "" {
			if absent(fields, "module") {
				p.add(node, where+".module is required")
			}
		} else if !validDotted(t.Module) {
			p.add(fields["module"], fmt.Sprintf("%s.module: %q is not a dotted Python identifier", where, t.Module))
		}
		if t.Function == "" {
			// A class-based tool (class_name) is called through the
			// class's own method, as the reference calls it: no function.
			if absent(fields, "function") && t.ClassName == "" {
				p.add(node, where+".function is required (or class_name for a class-based tool)")
			}
		} else if !identRE().MatchString(t.Function) {
			p.add(fields["function"], fmt.Sprintf("%s.function: %q is not a Python identifier", where, t.Function))
		}
		if t.ClassName != "" && !identRE().MatchString(t.ClassName) {
			p.add(fields["class_name"], fmt.Sprintf("%s.class_name: %q is not a Python identifier", where, t.ClassName))
		}
		if t.Package != "" && !packageRE().MatchString(t.Package) {
			p.add(fields["package"], fmt.Sprintf("%s.package: %q is not a valid distribution name", where, t.Package))
		}
		if t.Version != "" {
			if t.Package == "" {
				p.add(fields["version"], where+".version is set without package")
			} else if _, err := ParseSpecifiers(t.Version); err != nil {
				p.add(fields["version"], fmt.Sprintf("%s.version: %v", where, err))
			}
		}
		if t.SandboxProfile != "" && !profileRE().MatchString(t.SandboxProfile) {
			p.add(fields["sandbox_profile"], fmt.Sprintf("%s.sandbox_profile: %q is not a profile name", where, t.SandboxProfile))
		}
		if t.SHA256 != "" {
			if !sha256RE().MatchString(t.SHA256) {
				p.add(fields["sha256"], fmt.Sprintf("%s.sha256: want 64 hex characters, got %q", where, t.SHA256))
			}
			t.SHA256 = strings.ToLower(t.SHA256)
		}
	}
	return t
}

// jsonField returns the value of key, which must be a node of kind (or
// null), as compact JSON text; "" when absent. Anchors and aliases are
// refused anywhere inside it, as everywhere in the manifest.
func (p *parser) jsonField(fields map[string]*yaml.Node, where, key string, kind yaml.Kind) string {
	n, ok := fields[key]
	if !ok || n.Tag == "!!null" {
		return ""
	}
	what := where + "." + key
	if n.Kind != kind {
		p.add(n, fmt.Sprintf("%s must be %s, not %s", what, map[yaml.Kind]string{yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list"}[kind], kindName(n)))
		return ""
	}
	var walk func(*yaml.Node) bool
	walk = func(n *yaml.Node) bool {
		if n.Kind == yaml.AliasNode || n.Anchor != "" || n.Tag == "!!merge" {
			p.add(n, what+": YAML anchors, aliases and merge keys are not allowed")
			return false
		}
		for _, c := range n.Content {
			if !walk(c) {
				return false
			}
		}
		return true
	}
	if !walk(n) {
		return ""
	}
	var v any
	if err := n.Decode(&v); err != nil {
		p.add(n, fmt.Sprintf("%s: %v", what, err))
		return ""
	}
	b, err := json.Marshal(v)
	if err != nil {
		p.add(n, fmt.Sprintf("%s is not representable as JSON (keys must be strings): %v", what, err))
		return ""
	}
	return string(b)
}

// absent reports whether key is missing, null or an empty string (a
// mistyped value has already been reported).
func absent(fields map[string]*yaml.Node, key string) bool {
	n, ok := fields[key]
	return !ok || n.Tag == "!!null" || (n.Tag == "!!str" && n.Value == "")
}

func fieldOr(fields map[string]*yaml.Node, key string, fallback *yaml.Node) *yaml.Node {
	if n, ok := fields[key]; ok {
		return n
	}
	return fallback
}

// ValidToolName reports whether name can be one broker topic level (the
// check every entry's name passes; an entry whose name fails it is
// unavailable and no topic can be subscribed for it).
func ValidToolName(name string) bool { return checkToolName(name) == "" }

// checkToolName returns why name cannot be one topic level, or "".
func checkToolName(name string) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > maxToolNameBytes:
		return fmt.Sprintf("is longer than %d bytes", maxToolNameBytes)
	case !utf8.ValidString(name):
		return "is not valid UTF-8"
	case strings.HasPrefix(name, "#"):
		return `starts with "#" (reserved by Solace)`
	}
	for _, r := range name {
		switch {
		case r == '/':
			return `contains "/" (a topic level separator)`
		case r == '*' || r == '>':
			return fmt.Sprintf("contains the topic wildcard %q", r)
		case unicode.IsSpace(r) || unicode.IsControl(r):
			return fmt.Sprintf("contains whitespace or a control character (%U)", r)
		}
	}
	return ""
}

func validDotted(s string) bool {
	for _, part := range strings.Split(s, ".") {
		if !identRE().MatchString(part) {
			return false
		}
	}
	return true
}

// parser walks yaml.Nodes and collects problems with their positions.
type parser struct {
	problems []string
}

func (p *parser) add(n *yaml.Node, msg string) {
	if n != nil && n.Line > 0 {
		msg = fmt.Sprintf("line %d: %s", n.Line, msg)
	}
	p.problems = append(p.problems, msg)
}

// pairs returns the key/value nodes of a mapping, reporting duplicates,
// aliases and merge keys (and dropping them).
func (p *parser) pairs(n *yaml.Node, what string) [][2]*yaml.Node {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		p.add(n, what+": YAML anchors and aliases are not allowed")
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.add(n, fmt.Sprintf("%s must be a mapping, not %s", what, kindName(n)))
		return nil
	}
	seen := map[string]bool{}
	var out [][2]*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.AliasNode || v.Kind == yaml.AliasNode || k.Anchor != "" || v.Anchor != "" {
			p.add(k, fmt.Sprintf("%s.%s: YAML anchors and aliases are not allowed", what, k.Value))
			continue
		}
		if k.Tag == "!!merge" {
			p.add(k, what+": YAML merge keys (<<) are not allowed")
			continue
		}
		if seen[k.Value] {
			p.add(k, fmt.Sprintf("%s: duplicate key %q", what, k.Value))
			continue
		}
		seen[k.Value] = true
		out = append(out, [2]*yaml.Node{k, v})
	}
	return out
}

// mapping returns the fields of a mapping with known keys, reporting
// unknown ones.
func (p *parser) mapping(n *yaml.Node, what string, known map[string]bool) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	for _, kv := range p.pairs(n, what) {
		if !known[kv[0].Value] {
			p.add(kv[0], fmt.Sprintf("%s: unknown field %q (known: %s)", what, kv[0].Value, strings.Join(sortedKeys(known), ", ")))
			continue
		}
		out[kv[0].Value] = kv[1]
	}
	return out
}

func (p *parser) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		hint := ""
		if n.Kind == yaml.ScalarNode {
			hint = " (quote it)"
		}
		p.add(n, fmt.Sprintf("%s must be a string, not %s%s", what, kindName(n), hint))
		return "", false
	}
	return n.Value, true
}

func (p *parser) integer(n *yaml.Node, what string) (int, bool) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!int" {
		p.add(n, fmt.Sprintf("%s must be an integer, not %s", what, kindName(n)))
		return 0, false
	}
	v, err := strconv.ParseInt(n.Value, 0, 32)
	if err != nil {
		p.add(n, fmt.Sprintf("%s: %q is not a usable integer", what, n.Value))
		return 0, false
	}
	return int(v), true
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		return fmt.Sprintf("%s %q", strings.TrimPrefix(n.Tag, "!!"), n.Value)
	}
	return "an empty document"
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Names returns the tool names in sorted order.
func (m *Manifest) Names() []string {
	if m == nil {
		return nil
	}
	return sortedKeys(m.Tools)
}

// Entries returns the names of every entry, served or unavailable, in
// sorted order.
func (m *Manifest) Entries() []string {
	if m == nil {
		return nil
	}
	names := make([]string, 0, len(m.Tools)+len(m.Unavailable))
	names = append(names, sortedKeys(m.Tools)...)
	names = append(names, sortedKeys(m.Unavailable)...)
	sort.Strings(names)
	return names
}

// has reports whether name is an entry of m, served or unavailable.
func (m *Manifest) has(name string) bool {
	if m == nil {
		return false
	}
	_, ok := m.Tools[name]
	_, bad := m.Unavailable[name]
	return ok || bad
}

// sameEntry reports whether name is the same entry in a and b: the same
// tool (Tool.Equal), or unavailable in both for the same reasons.
func sameEntry(a, b *Manifest, name string) bool {
	at, bt := a.Tools[name], b.Tools[name]
	if at != nil || bt != nil {
		return at.Equal(bt)
	}
	return a.Unavailable[name] == b.Unavailable[name]
}

// Diff compares two manifests by entry name, served or unavailable: an
// entry that goes from one to the other, or changes its definition or its
// reasons, is changed. old may be nil (everything in new is added). Each
// list is sorted.
func Diff(old, new *Manifest) (added, removed, changed []string) {
	for _, name := range new.Entries() {
		switch {
		case !old.has(name):
			added = append(added, name)
		case !sameEntry(old, new, name):
			changed = append(changed, name)
		}
	}
	for _, name := range old.Entries() {
		if !new.has(name) {
			removed = append(removed, name)
		}
	}
	return added, removed, changed
}
