package profileyaml

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/profiles"
	"gopkg.in/yaml.v3"
)

const (
	mi = 1 << 20
	gi = 1 << 30
)

func mustEmbedded(t *testing.T) *profiles.Set {
	t.Helper()
	s, err := profiles.Embedded()
	if err != nil {
		t.Fatalf("Embedded(): %v", err)
	}
	return s
}

func mustLookup(t *testing.T, s *profiles.Set, name string) *profiles.Profile {
	t.Helper()
	p, err := s.Lookup(name)
	if err != nil {
		t.Fatalf("Lookup(%q): %v", name, err)
	}
	return p
}

// fieldErrors flattens an errors.Join tree into its *FieldError leaves.
func fieldErrors(err error) []*profiles.FieldError {
	var out []*profiles.FieldError
	var walk func(error)
	walk = func(e error) {
		if fe, ok := e.(*profiles.FieldError); ok {
			out = append(out, fe)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, c := range u.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			if c := u.Unwrap(); c != nil {
				walk(c)
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func fieldsOf(err error) []string {
	var fs []string
	for _, fe := range fieldErrors(err) {
		fs = append(fs, fe.Field)
	}
	return fs
}

// marshal prints a profile as YAML (what `str profile show` prints is
// the profile's own text; this is the decoder's inverse, for round
// trips): profiles.Profile's JSON read into this package's types.
func marshal(p *profiles.Profile) ([]byte, error) {
	data, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	var y Profile
	if err := json.Unmarshal(data, &y); err != nil {
		return nil, err
	}
	return yaml.Marshal(&y)
}

// clone is a deep copy of a profile.
func clone(p *profiles.Profile) *profiles.Profile {
	data, err := json.Marshal(p)
	if err != nil {
		panic(err)
	}
	var q profiles.Profile
	if err := json.Unmarshal(data, &q); err != nil {
		panic(err)
	}
	return &q
}

func describeNetwork(n egress.Policy) string {
	data, _ := json.Marshal(n)
	return string(data)
}

// embeddedFiles are the embedded profiles' files (profiles/*.yaml).
func embeddedFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded profiles: %v (%d files)", err, len(files))
	}
	for i, f := range files {
		files[i] = filepath.Base(f)
	}
	return files
}

func readEmbedded(t *testing.T, file string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", file))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// encodePredecoded is the content of profiles/predecoded/NAME.json for a
// profile decoded from yamlData.
func encodePredecoded(p *profiles.Profile, yamlData []byte) ([]byte, error) {
	sum := sha256.Sum256(yamlData)
	b, err := json.MarshalIndent(profiles.Predecoded{YAMLSHA256: hex.EncodeToString(sum[:]), Profile: p}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
