package profiles

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/securetoolruntime/str/internal/predecoded"
)

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
	p, ok := fromPredecoded(predecodedFS, "restrictive", data)
	if !ok {
		t.Fatal("restrictive's predecoded profile is not served")
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
	if err := os.WriteFile(filepath.Join(dir, filepath.FromSlash(predecoded.Path("restrictive"))), bad, 0o644); err != nil {
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
	b, err := json.MarshalIndent(Predecoded{YAMLSHA256: hex.EncodeToString(sum[:]), Profile: p}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
