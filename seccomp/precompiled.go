package seccomp

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The decoded forms first (package policyyaml), then the programs compiled
// from them.
//go:generate env STR_UPDATE_PREDECODED=1 go test -count=1 -run TestPredecodedUpToDate ./policyyaml
//go:generate env STR_UPDATE_PRECOMPILED=1 go test -count=1 -run TestPrecompiledUpToDate .

// The embedded policies are compiled ahead of time (go generate): the
// self-check that proves a compiled program equals the policy's meaning
// (selfCheck, ~150-250 ms) runs once, at generation, instead of in every
// `str run`. TestPrecompiledUpToDate compiles every embedded policy afresh
// with the full check and fails unless the result is byte-identical to
// the file here, so a policy edit without regeneration cannot pass CI.
// A precompiled program is used only when its recorded content key equals
// the policy's own; policies loaded from files always compile at run time.
//
// A binary embeds only its own architecture's files (precompiledFS is
// declared in precompiled_amd64.go and precompiled_arm64.go).

// A precompiled policy is two files under precompiled/:
//
//   - POLICY_ARCH.bpf: the program, read by every `str run`: 32 bytes of
//     embeddedSum (the policy's name and every embedded policy file, so
//     that an edit to a base policy also makes it stale), then the
//     struct sock_filter records (EncodeFilter). CompileEmbedded matches
//     the hash without decoding the YAML and decodes no JSON.
//   - POLICY_ARCH.json: precompiled, the reviewer's view (rules with
//     their reasons, default action) and the content key, read only to
//     show a plan or for policies loaded by Load.
type precompiled struct {
	Policy string `json:"policy"`
	Arch   string `json:"arch"`
	// Key is the hex SHA-256 of the policy's content key (cacheKey).
	Key string `json:"key"`
	// FilterSHA256 is the hex SHA-256 of the .bpf file.
	FilterSHA256  string     `json:"filter_sha256"`
	DefaultAction string     `json:"default_action"`
	Rules         []RuleView `json:"rules"`
}

func precompiledPath(policy, arch, ext string) string {
	return fmt.Sprintf("precompiled/%s_%s.%s", policy, arch, ext)
}

// readBPF returns the source hash and the program of a .bpf file.
func readBPF(fsys fs.FS, policy, arch string) (src [32]byte, filter []byte, ok bool) {
	data, err := fs.ReadFile(fsys, precompiledPath(policy, arch, "bpf"))
	if err != nil || len(data) < 32+8 || (len(data)-32)%8 != 0 {
		return src, nil, false
	}
	copy(src[:], data)
	return src, data[32:], true
}

func readMeta(fsys fs.FS, policy, arch string) (*precompiled, [32]byte, bool) {
	var sum [32]byte
	data, err := fs.ReadFile(fsys, precompiledPath(policy, arch, "json"))
	if err != nil {
		return nil, sum, false
	}
	var pc precompiled
	if json.Unmarshal(data, &pc) != nil || pc.Arch != arch {
		return nil, sum, false
	}
	bpf, err := fs.ReadFile(fsys, precompiledPath(policy, arch, "bpf"))
	if err != nil {
		return nil, sum, false
	}
	sum = sha256.Sum256(bpf)
	if hex.EncodeToString(sum[:]) != pc.FilterSHA256 {
		return nil, sum, false
	}
	return &pc, sum, true
}

func hexKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// fromPrecompiled returns the precompiled program for p when one exists
// for this architecture and matches p's content exactly.
func fromPrecompiled(p *Policy, key string) (*Program, bool) {
	arch, err := native()
	if err != nil {
		return nil, false
	}
	return fromPrecompiledFor(precompiledFS, p, key, arch)
}

// fromPrecompiledFor is fromPrecompiled for arch, reading fsys (the
// embedded files, or the package directory in the staleness test).
func fromPrecompiledFor(fsys fs.FS, p *Policy, key string, arch archSpec) (*Program, bool) {
	pc, _, ok := readMeta(fsys, p.Name, arch.name)
	if !ok || pc.Key != hexKey(key) {
		return nil, false
	}
	_, raw, ok := readBPF(fsys, p.Name, arch.name)
	if !ok {
		return nil, false
	}
	filter, err := decodeSockFilters(raw)
	if err != nil {
		return nil, false
	}
	plan := planRules(p, arch)
	return &Program{Policy: p.Name, Arch: arch.name, DefaultAction: p.DefaultAction.String(), Rules: plan.views, Filter: filter}, true
}

// writePrecompiled compiles p for arch with the full self-check and
// writes its two precompiled files into dir (the package directory). Used
// by go generate.
func writePrecompiled(p *Policy, arch archSpec, dir string) error {
	key, err := cacheKey(p)
	if err != nil {
		return err
	}
	prog, err := p.compileFor(arch)
	if err != nil {
		return err
	}
	srcSum, err := embeddedSum(p.Name)
	if err != nil {
		return err
	}
	bpf := append(srcSum[:], EncodeFilter(prog.Filter)...)
	bpfSum := sha256.Sum256(bpf)
	data, err := json.MarshalIndent(precompiled{Policy: p.Name, Arch: prog.Arch, Key: hexKey(key), FilterSHA256: hex.EncodeToString(bpfSum[:]),
		DefaultAction: prog.DefaultAction, Rules: prog.Rules}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, precompiledPath(p.Name, prog.Arch, "bpf")), bpf, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, precompiledPath(p.Name, prog.Arch, "json")), append(data, '\n'), 0o644)
}

// embeddedSum is the SHA-256 of name and of every embedded policy file
// (names and contents, in order). A policy's program depends on its own
// file and on the files of the policies it extends; hashing them all is
// simpler than following extends without decoding YAML, and go generate
// rewrites every precompiled file anyway.
func embeddedSum(name string) ([32]byte, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", name)
	for _, n := range Names() {
		data, err := embedded.ReadFile(path.Join("policies", n+".yaml"))
		if err != nil {
			return [32]byte{}, err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", n, len(data))
		h.Write(data)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, nil
}

// EncodeFilter packs a program as struct sock_filter records (8 bytes
// each, little-endian fields, which is the machine's order on every
// architecture str builds for): str's one byte format of a program.
func EncodeFilter(f []unix.SockFilter) []byte {
	out := make([]byte, 0, 8*len(f))
	for _, ins := range f {
		out = append(out, byte(ins.Code), byte(ins.Code>>8), ins.Jt, ins.Jf,
			byte(ins.K), byte(ins.K>>8), byte(ins.K>>16), byte(ins.K>>24))
	}
	return out
}

// embeddedPrecompiled returns the precompiled program of an embedded
// policy when the embedded YAML is byte-for-byte the one it was generated
// from: no YAML decode, no compile, no JSON. Rules and DefaultAction are
// left empty: EmbeddedViews reads them when a plan is shown.
func embeddedPrecompiled(name string) (*Program, bool) {
	arch, err := native()
	if err != nil {
		return nil, false
	}
	sum, err := embeddedSum(name)
	if err != nil {
		return nil, false
	}
	want, raw, ok := readBPF(precompiledFS, name, arch.name)
	if !ok || sum != want {
		return nil, false
	}
	filter, err := decodeSockFilters(raw)
	if err != nil {
		return nil, false
	}
	return &Program{Policy: name, Arch: arch.name, Filter: filter}, true
}

// EmbeddedViews returns the reviewer's view of an embedded policy's
// precompiled program: its rules with their reasons and its default
// action.
func EmbeddedViews(name string) ([]RuleView, string, error) {
	arch, err := native()
	if err != nil {
		return nil, "", err
	}
	pc, _, ok := readMeta(precompiledFS, name, arch.name)
	if !ok {
		return nil, "", fmt.Errorf("seccomp: no precompiled view of policy %q for %s: run go generate ./seccomp", name, arch.name)
	}
	return pc.Rules, pc.DefaultAction, nil
}
