package seccomp

import (
	"embed"
	"io/fs"

	"github.com/securetoolruntime/str/internal/predecoded"
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

// YAMLSum is the file's yaml_sha256 (predecoded.File).
func (f *Predecoded) YAMLSum() string { return f.YAMLSHA256 }

// fromPredecoded returns the policy of fsys's predecoded/NAME.json if it
// was made from exactly yamlData and is valid.
func fromPredecoded(fsys fs.FS, name string, yamlData []byte) (*Policy, bool) {
	var f Predecoded
	if !predecoded.Read(fsys, name, yamlData, &f) || f.Policy == nil {
		return nil, false
	}
	p := f.Policy
	p.source = "embedded:" + name + ".yaml"
	if p.Name != name || p.Validate() != nil {
		return nil, false
	}
	return p, true
}
