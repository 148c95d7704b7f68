package seccomp

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"io/fs"
)

// The embedded policies are also stored decoded (go generate, package
// policyyaml), as JSON: str reads no YAML at run time and links no YAML
// decoder. predecoded/NAME.json holds the SHA-256 of the NAME.yaml it was
// made from and the decoded policy (extends resolved). It is used only
// when that hash equals the embedded YAML's own (an edit without
// regeneration is an error that says to run go generate, never a stale
// policy), and it is validated like the YAML's would be.
// policyyaml's TestPredecodedUpToDate fails unless every file is exactly
// what decoding the YAML now gives.

//go:embed predecoded/*.json
var predecodedFS embed.FS

// Predecoded is the content of predecoded/NAME.json.
type Predecoded struct {
	YAMLSHA256 string  `json:"yaml_sha256"`
	Policy     *Policy `json:"policy"`
}

// PredecodedPath is NAME's decoded form, relative to the package directory.
func PredecodedPath(name string) string { return "predecoded/" + name + ".json" }

// fromPredecoded returns the policy of fsys's predecoded/NAME.json if it
// was made from exactly yamlData and is valid.
func fromPredecoded(fsys fs.FS, name string, yamlData []byte) (*Policy, bool) {
	data, err := fs.ReadFile(fsys, PredecodedPath(name))
	if err != nil {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f Predecoded
	if dec.Decode(&f) != nil || f.Policy == nil {
		return nil, false
	}
	sum := sha256.Sum256(yamlData)
	p := f.Policy
	p.source = "embedded:" + name + ".yaml"
	if f.YAMLSHA256 != hex.EncodeToString(sum[:]) || p.Name != name || p.Validate() != nil {
		return nil, false
	}
	return p, true
}
