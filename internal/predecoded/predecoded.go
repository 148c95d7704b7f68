// Package predecoded reads the decoded form that go generate stores
// beside an embedded YAML file (the profiles, the seccomp policies), so
// that str reads no YAML at run time: predecoded/NAME.json holds the
// SHA-256 of the NAME.yaml it was made from and the decoded value. A file
// is used only when that hash equals the embedded YAML's own: an edit
// without regeneration is never a stale value.
package predecoded

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
)

// Path is NAME's decoded form, relative to its package directory.
func Path(name string) string { return "predecoded/" + name + ".json" }

// File is a package's predecoded/NAME.json type; YAMLSum is its
// yaml_sha256 (hex).
type File interface{ YAMLSum() string }

// Read decodes fsys's Path(name) into f, strictly (an unknown field is
// an error), and reports whether it was read and made from exactly
// yamlData. The caller then checks the value itself (present, its name,
// valid).
func Read(fsys fs.FS, name string, yamlData []byte, f File) bool {
	data, err := fs.ReadFile(fsys, Path(name))
	if err != nil {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if dec.Decode(f) != nil {
		return false
	}
	sum := sha256.Sum256(yamlData)
	return f.YAMLSum() == hex.EncodeToString(sum[:])
}
