package initbin

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The committed init is what its sources build to; run `go generate
// ./launcher/initbin` (or `make build`) after changing nsinit or
// cmd/str-init.
func TestEmbeddedInitUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/str-init")
	}
	out := filepath.Join(t.TempDir(), "str-init")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, "../../cmd/str-init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, b)
	}
	fresh, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(fresh, Binary) {
		t.Fatalf("launcher/initbin/str-init is stale (%d bytes committed, %d built): run go generate ./launcher/initbin", len(Binary), len(fresh))
	}
	if bytes.Contains(Binary, []byte("libseccomp")) || bytes.Contains(Binary, []byte("yaml.v3")) {
		t.Fatal("the init links libseccomp or YAML: it must stay a small static program")
	}
}

// The memfd is sealed: neither a write nor a resize gets through, also not
// through a fresh open of its /proc path (what /proc/PID/exe would give).
func TestMemfdSealed(t *testing.T) {
	f, err := File()
	if err != nil {
		t.Fatal(err)
	}
	if f2, _ := File(); f2 != f {
		t.Fatalf("a second memfd: %s then %s", f.Name(), f2.Name())
	}
	p := ExecPath(int(f.Fd()))
	w, err := os.OpenFile(p, os.O_RDWR, 0)
	if err == nil {
		defer w.Close()
		if _, err := w.WriteAt([]byte("x"), 0); !errors.Is(err, unix.EPERM) {
			t.Fatalf("write to the init's memfd: %v, want EPERM", err)
		}
		if err := w.Truncate(1); !errors.Is(err, unix.EPERM) {
			t.Fatalf("truncate of the init's memfd: %v, want EPERM", err)
		}
	}
	data, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(data, Binary) {
		t.Fatalf("memfd content differs from the embedded init (%v)", err)
	}
}
