// Package profileyaml is the one decoder of profile YAML: the embedded
// profiles' files (go generate stores what it makes of them in
// profiles/predecoded) and an operator's profile directory (str-worker
// decodes it in-process; bin/str has it decoded by `str-worker
// decode-profiles DIR`, package launcher's Decoder). Package profiles
// reads only the decoded form (profiles.ReadDecoded, Set.AddDecoded), so
// the programs that sandbox (bin/str) link no YAML.
//
// Decoding is strict: unknown fields, a second document and bad
// quantities are errors, and every problem of every file is reported
// with its file and line.
package profileyaml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/seccomp/policyyaml"
	"gopkg.in/yaml.v3"
)

// Decode strictly decodes one profile file and validates it. Unknown
// fields, a second YAML document and bad quantities are decode errors;
// otherwise every validation problem is returned (each a
// *profiles.FieldError with Source set). source names the file in errors.
func Decode(data []byte, source string) (*profiles.Profile, error) {
	out, err := decodeJSON(data, source)
	if err != nil {
		return nil, err
	}
	// 3. Read the decoded form as str does, validating it and naming the
	// file in every problem.
	return profiles.ReadDecoded(out, source)
}

// decodeJSON decodes one profile file into its decoded form (JSON of a
// profiles.Profile), not validated yet.
func decodeJSON(data []byte, source string) ([]byte, error) {
	// 1. Decode exactly one document, rejecting unknown fields.
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var p Profile
	if err := dec.Decode(&p); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("profiles: decode %s: empty file", source)
		}
		return nil, fmt.Errorf("profiles: decode %s: %w", source, typeNames(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, fmt.Errorf("profiles: decode %s: after the first document: %w", source, typeNames(err))
		}
		return nil, fmt.Errorf("profiles: decode %s: more than one YAML document (line %d); a file holds one profile", source, extra.Line)
	}
	// 2. The decoded form: this package's types have the field names and
	// the (int64) representations of package profiles' (TestSameFields).
	out, err := json.Marshal(&p)
	if err != nil {
		return nil, fmt.Errorf("profiles: decode %s: %w", source, err)
	}
	return out, nil
}

// typeNames names package profiles' types in yaml.v3's messages ("field
// x not found in type profiles.Mounts", "cannot unmarshal !!seq into
// profiles.Mounts"): this package's Profile, Rlimits, Cgroup, Mounts,
// TmpfsSpec and WorkDir are theirs as YAML sees them, and the messages
// stay what they were when the decoder was in package profiles. yaml.v3
// puts the type last in each message.
func typeNames(err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err
	}
	const ours, theirs = "profileyaml.", "profiles."
	msgs := make([]string, len(te.Errors))
	for i, m := range te.Errors {
		if k := strings.LastIndex(m, ours); k >= 0 && !strings.ContainsAny(m[k+len(ours):], " `") {
			m = m[:k] + theirs + m[k+len(ours):]
		}
		msgs[i] = m
	}
	return &yaml.TypeError{Errors: msgs}
}

// DecodeDir decodes every *.yaml file of dir (not recursive) into the
// decoded form profiles.Set.AddDecoded reads: a JSON list of
// profiles.Decoded. Every problem of every file is collected, and so is a
// name or alias that collides with an embedded profile's or another
// file's (what AddDecoded would refuse), in one error; a file must hold
// the profile it is named after.
func DecodeDir(dir string) ([]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("profiles: read directory %s: %w", dir, err)
	}
	var errs []error
	var files []profiles.Decoded
	for _, e := range entries { // os.ReadDir sorts by name
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		source := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(source)
		if err != nil {
			errs = append(errs, fmt.Errorf("profiles: read %s: %w", source, err))
			continue
		}
		p, err := Decode(data, source)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if want := strings.TrimSuffix(e.Name(), ".yaml"); p.Name != want {
			errs = append(errs, fmt.Errorf("profiles: %s: holds profile %q; the file must be named %s.yaml", source, p.Name, p.Name))
			continue
		}
		files = append(files, profiles.Decoded{Source: source, Profile: p})
	}
	// The collisions, against the embedded profiles and among the files.
	set, err := profiles.Embedded()
	if err == nil {
		err = set.Add(files)
	}
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if files == nil {
		files = []profiles.Decoded{}
	}
	out, err := json.Marshal(files)
	if err != nil {
		return nil, fmt.Errorf("profiles: encode the profiles of %s: %w", dir, err)
	}
	return out, nil
}

// LoadDir adds every *.yaml file of dir to set (DecodeDir, then
// set.AddDecoded): all of them, or none when anything is wrong.
func LoadDir(set *profiles.Set, dir string) error {
	out, err := DecodeDir(dir)
	if err != nil {
		return err
	}
	return set.AddDecoded(out)
}

// Decoder is the in-process launcher.Decoder (str-worker; tests): this
// package for profile directories, package policyyaml for policy files.
type Decoder struct{}

// DecodeProfileDir is DecodeDir.
func (Decoder) DecodeProfileDir(dir string) ([]byte, error) { return DecodeDir(dir) }

// DecodePolicyFile is policyyaml.DecodeFile.
func (Decoder) DecodePolicyFile(file string) ([]byte, error) { return policyyaml.DecodeFile(file) }
