package profiles

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestPredecodedUpToDate decodes every embedded profile's YAML afresh and
// requires predecoded/NAME.json to be exactly its encoding, and what
// lookupSingle serves from it to equal the YAML's profile.
// STR_UPDATE_PREDECODED=1 (go generate) rewrites the files.
func TestPredecodedUpToDate(t *testing.T) {
	update := os.Getenv("STR_UPDATE_PREDECODED") == "1"
	files, err := fs.Glob(embedded, "*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("embedded profiles: %v (%d files)", err, len(files))
	}
	for _, file := range files {
		name := strings.TrimSuffix(file, ".yaml")
		data, err := embedded.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Decode(data, file)
		if err != nil {
			t.Fatal(err)
		}
		want, err := encodePredecoded(p, data)
		if err != nil {
			t.Fatal(err)
		}
		if update {
			if err := os.WriteFile(filepath.FromSlash(predecodedPath(name)), want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(filepath.FromSlash(predecodedPath(name)))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: predecoded file missing or different from decoding %s now (%v): run go generate ./profiles", predecodedPath(name), file, err)
		}
		pre, ok := fromPredecoded(predecodedFS, name, data)
		if !ok || !reflect.DeepEqual(pre, p) {
			t.Fatalf("%s: the embedded predecoded profile is missing or differs from the YAML's:\n%+v\n%+v", name, pre, p)
		}
		s, _ := Embedded()
		got1, err := s.Lookup(name)
		if err != nil || !reflect.DeepEqual(got1, p) {
			t.Fatalf("Lookup(%q) = %+v, %v; want the YAML's profile %+v", name, got1, err, p)
		}
	}
}

// TestPredecodedRefusesStale: a predecoded profile is not served for YAML
// other than the one it was made from, nor when it does not validate.
func TestPredecodedRefusesStale(t *testing.T) {
	data, err := embedded.ReadFile("restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fromPredecoded(predecodedFS, "restrictive", append(append([]byte(nil), data...), '\n')); ok {
		t.Error("served for YAML with one more byte than the one it was made from")
	}
	if _, ok := fromPredecoded(predecodedFS, "standard", data); ok {
		t.Error("standard's file served for restrictive's YAML")
	}
	p, err := Decode(data, "restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p.Rlimits.Core = 1 // the validation refuses a core size other than 0
	bad, err := encodePredecoded(p, data)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "predecoded"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(predecodedPath("restrictive"))), bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := fromPredecoded(os.DirFS(dir), "restrictive", data); ok {
		t.Error("served a predecoded profile that fails validation")
	}
}

// encodePredecoded is the content of predecoded/NAME.json for a profile
// decoded from yamlData.
func encodePredecoded(p *Profile, yamlData []byte) ([]byte, error) {
	sum := sha256.Sum256(yamlData)
	b, err := json.MarshalIndent(predecodedFile{YAMLSHA256: hex.EncodeToString(sum[:]), Profile: p}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
