package policyyaml

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/securetoolruntime/str/internal/predecoded"
	"github.com/securetoolruntime/str/seccomp"
)

// encodePredecoded is the content of seccomp/predecoded/NAME.json for the
// policy p decoded from yamlData.
func encodePredecoded(p *seccomp.Policy, yamlData []byte) ([]byte, error) {
	sum := sha256.Sum256(yamlData)
	out, err := json.Marshal(seccomp.Predecoded{YAMLSHA256: hex.EncodeToString(sum[:]), Policy: p})
	return append(out, '\n'), err
}

// TestPredecodedUpToDate decodes every embedded policy's YAML afresh and
// requires seccomp/predecoded/NAME.json to be exactly its encoding, and
// what seccomp.Load serves from it to equal the YAML's policy.
// STR_UPDATE_PREDECODED=1 (go generate ./seccomp) rewrites the files.
func TestPredecodedUpToDate(t *testing.T) {
	update := os.Getenv("STR_UPDATE_PREDECODED") == "1"
	names := seccomp.Names()
	if len(names) == 0 {
		t.Fatal("no embedded policies")
	}
	for _, name := range names {
		data, err := seccomp.EmbeddedFile(name)
		if err != nil {
			t.Fatal(err)
		}
		p, err := load(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := encodePredecoded(p, data)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join("..", filepath.FromSlash(predecoded.Path(name)))
		if update {
			if err := os.WriteFile(file, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(file)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: predecoded file missing or different from decoding the YAML now (%v): run go generate ./seccomp", file, err)
		}
		pre, err := seccomp.Load(name)
		if err != nil || !reflect.DeepEqual(pre, p) {
			t.Fatalf("%s: seccomp.Load serves %+v, %v; want the YAML's policy %+v", name, pre, err, p)
		}
	}
}
