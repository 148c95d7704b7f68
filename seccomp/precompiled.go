package seccomp

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

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
//go:embed precompiled/*.json
var precompiledFS embed.FS

// precompiled is one file under precompiled/.
type precompiled struct {
	Policy string `json:"policy"`
	Arch   string `json:"arch"`
	// Key is the hex SHA-256 of the policy's content key (cacheKey).
	Key string `json:"key"`
	// Filter is the program as struct sock_filter records, 8 bytes each.
	Filter []byte `json:"filter"`
	// SourceSHA256 is the hex SHA-256 of the embedded YAML file's bytes:
	// CompileEmbedded matches on it without decoding the YAML (which costs
	// milliseconds in every `str run`).
	SourceSHA256  string     `json:"source_sha256"`
	DefaultAction string     `json:"default_action"`
	Rules         []RuleView `json:"rules"`
}

func precompiledPath(policy, arch string) string {
	return fmt.Sprintf("precompiled/%s_%s.json", policy, arch)
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
	data, err := precompiledFS.ReadFile(precompiledPath(p.Name, arch.name))
	if err != nil {
		return nil, false
	}
	var pc precompiled
	if json.Unmarshal(data, &pc) != nil || pc.Key != hexKey(key) || pc.Arch != arch.name {
		return nil, false
	}
	filter, err := decodeSockFilters(pc.Filter)
	if err != nil {
		return nil, false
	}
	plan := planRules(p, arch)
	return &Program{Policy: p.Name, Arch: arch.name, DefaultAction: p.DefaultAction.String(), Rules: plan.views, Filter: filter}, true
}

// writePrecompiled compiles p with the full self-check and writes its
// precompiled file into dir (the package directory). Used by go generate.
func writePrecompiled(p *Policy, dir string) error {
	key, err := cacheKey(p)
	if err != nil {
		return err
	}
	prog, err := p.compile()
	if err != nil {
		return err
	}
	src, err := embedded.ReadFile(path.Join("policies", p.Name+".yaml"))
	if err != nil {
		return err
	}
	sum := sha256.Sum256(src)
	data, err := json.MarshalIndent(precompiled{Policy: p.Name, Arch: prog.Arch, Key: hexKey(key), Filter: EncodeFilter(prog.Filter),
		SourceSHA256: hex.EncodeToString(sum[:]), DefaultAction: prog.DefaultAction, Rules: prog.Rules}, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, precompiledPath(p.Name, prog.Arch)), append(data, '\n'), 0o644)
}

// EncodeFilter packs a program as struct sock_filter records (8 bytes
// each, little-endian fields): the form nsinit receives and installs.
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
// from: no YAML decode, no compile.
func embeddedPrecompiled(name string) (*Program, bool) {
	arch, err := native()
	if err != nil {
		return nil, false
	}
	src, err := embedded.ReadFile(path.Join("policies", name+".yaml"))
	if err != nil {
		return nil, false
	}
	data, err := precompiledFS.ReadFile(precompiledPath(name, arch.name))
	if err != nil {
		return nil, false
	}
	var pc precompiled
	sum := sha256.Sum256(src)
	if json.Unmarshal(data, &pc) != nil || pc.SourceSHA256 != hex.EncodeToString(sum[:]) || pc.Arch != arch.name || len(pc.Rules) == 0 {
		return nil, false
	}
	filter, err := decodeSockFilters(pc.Filter)
	if err != nil {
		return nil, false
	}
	return &Program{Policy: name, Arch: arch.name, DefaultAction: pc.DefaultAction, Rules: pc.Rules, Filter: filter}, true
}
