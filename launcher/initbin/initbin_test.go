package initbin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The committed init is what its sources build to with go.mod's
// toolchain (exactly that one, as go generate builds it, so the result
// does not depend on which Go runs the test); run `go generate
// ./launcher/initbin` (or `make build`) after changing nsinit or
// cmd/str-init.
func TestEmbeddedInitUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/str-init")
	}
	toolchain := goModToolchain(t)
	out := filepath.Join(t.TempDir(), "str-init")
	cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, "../../cmd/str-init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN="+toolchain)
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

// goModToolchain is go.mod's toolchain line ("go1.26.8"): the one Go the
// committed init is built with.
func goModToolchain(t *testing.T) string {
	t.Helper()
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mod), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "toolchain" {
			return f[1]
		}
	}
	t.Fatal("go.mod has no toolchain line: the committed init's bytes depend on the Go that builds it, so go.mod names it")
	return ""
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
	p := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
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
