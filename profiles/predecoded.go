package profiles

import (
	"embed"
	"io/fs"

	"github.com/securetoolruntime/str/internal/predecoded"
)

//go:generate env STR_UPDATE_PREDECODED=1 go test -count=1 -run TestPredecodedUpToDate ./profileyaml

// The embedded profiles are stored decoded (go generate, package
// profileyaml), as JSON: str reads no YAML at run time and links no YAML
// decoder, and a one-shot `str run` reads its profile in ~0.15 ms instead
// of decoding YAML in ~0.6-1.1 ms (go test -bench, this machine kind).
// predecoded/NAME.json holds the SHA-256 of the NAME.yaml it was made
// from and the decoded profile. It is used only when that hash equals the
// embedded YAML's own (an edit without regeneration is an error that says
// to run go generate, never a stale profile), and it is validated like
// the YAML would be. profileyaml's TestPredecodedUpToDate fails unless
// every file is exactly what decoding the YAML now gives.

//go:embed predecoded/*.json
var predecodedFS embed.FS

// Predecoded is the content of predecoded/NAME.json.
type Predecoded struct {
	YAMLSHA256 string   `json:"yaml_sha256"`
	Profile    *Profile `json:"profile"`
}

// YAMLSum is the file's yaml_sha256 (predecoded.File).
func (f *Predecoded) YAMLSum() string { return f.YAMLSHA256 }

// fromPredecoded returns the profile of fsys's predecoded/NAME.json if it
// was made from exactly yamlData and is valid.
func fromPredecoded(fsys fs.FS, name string, yamlData []byte) (*Profile, bool) {
	var f Predecoded
	if !predecoded.Read(fsys, name, yamlData, &f) || f.Profile == nil || f.Profile.Name != name || len(f.Profile.validate()) > 0 {
		return nil, false
	}
	return f.Profile, true
}
