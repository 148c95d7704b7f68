// Package policyyaml is the one decoder of seccomp policy YAML: the
// embedded policies' files (go generate stores what it makes of them in
// seccomp/predecoded) and an operator's policy file (str-worker decodes it
// in-process; bin/str has it decoded by `str-worker decode-seccomp FILE`).
// Package seccomp reads only the decoded form (seccomp.ReadDecoded,
// seccomp.Load), so the programs that sandbox (bin/str) link no YAML.
//
// Decoding is strict: unknown fields and a second document are errors;
// extends is resolved and the result validated (seccomp.Resolve), every
// problem reported.
package policyyaml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/securetoolruntime/str/seccomp"
	"gopkg.in/yaml.v3"
)

// maxExtends bounds a chain of extends (standard extends restrictive,
// permissive extends standard: 2).
const maxExtends = 4

// LoadFile decodes and validates a policy file.
func LoadFile(file string) (*seccomp.Policy, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("seccomp: read policy file %s: %w", file, err)
	}
	return Decode(data, file)
}

// DecodeFile is LoadFile's result in the decoded form seccomp.ReadDecoded
// reads (what `str-worker decode-seccomp FILE` prints).
func DecodeFile(file string) ([]byte, error) {
	p, err := LoadFile(file)
	if err != nil {
		return nil, err
	}
	return Encode(p)
}

// Encode writes a decoded policy in its decoded form: JSON of the Policy.
func Encode(p *seccomp.Policy) ([]byte, error) {
	out, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("seccomp: policy %s: encode: %w", p.Source(), err)
	}
	return out, nil
}

// Decode parses one policy document strictly (unknown fields and trailing
// documents are errors), resolves its extends (inherit) and validates the
// result. source names the document in error messages. Every validation
// problem is reported, joined with errors.Join.
func Decode(data []byte, source string) (*seccomp.Policy, error) {
	return decode(data, source, nil)
}

// load decodes and validates the embedded policy called name from its
// YAML (the base of a policy that extends it, and go generate; str itself
// reads the decoded form, seccomp.Load). chain: the names being loaded
// around it, outer first, so that a chain that comes back to itself is an
// error.
func load(name string, chain []string) (*seccomp.Policy, error) {
	data, err := seccomp.EmbeddedFile(name)
	if err != nil {
		return nil, err
	}
	source := "embedded:" + name + ".yaml"
	p, err := decode(data, source, append(chain, name))
	if err != nil {
		return nil, err
	}
	if p.Name != name {
		return nil, fmt.Errorf("seccomp: policy %s: name %q does not match its file name %q", source, p.Name, name)
	}
	return p, nil
}

func decode(data []byte, source string, chain []string) (*seccomp.Policy, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var p seccomp.Policy
	if err := dec.Decode(&p); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("seccomp: policy %s: empty document", source)
		}
		return nil, fmt.Errorf("seccomp: policy %s: decode: %w", source, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("seccomp: policy %s: more than one YAML document (or trailing garbage after the first)", source)
	}
	// A chain of extends that comes back to a policy in it, or is too
	// long, is refused before its base is loaded.
	if p.Extends != "" {
		bad := func(format string, a ...any) error {
			return errors.Join(&seccomp.ValidationError{Policy: source, Rule: -1, Field: "extends", Msg: fmt.Sprintf(format, a...)})
		}
		for _, n := range chain {
			if n == p.Extends {
				return nil, bad("%q extends itself (chain %s -> %s)", p.Extends, strings.Join(chain, " -> "), p.Extends)
			}
		}
		if len(chain) >= maxExtends {
			return nil, bad("chain %s -> %s is longer than %d", strings.Join(chain, " -> "), p.Extends, maxExtends)
		}
	}
	base := func(name string) (*seccomp.Policy, error) { return load(name, chain) }
	if err := seccomp.Resolve(&p, source, base); err != nil {
		return nil, err
	}
	return &p, nil
}
