package initbin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "the cached init is root mode only (open_tree, a root-owned copy)")
	}
}

// The copy's name carries the embedded init's hash: go generate wrote
// str-init.sha256 after building str-init.
func TestHashIsTheEmbeddedInits(t *testing.T) {
	sum := sha256.Sum256(Binary)
	if got := HashHex(); got != hex.EncodeToString(sum[:]) {
		t.Fatalf("str-init.sha256 says %s, the embedded init hashes to %x: run go generate ./launcher/initbin", got, sum)
	}
}

// The cached init: a root-owned 0555 copy, executed from a read-only
// mount: a write through its descriptor's /proc path (what /proc/PID/exe
// of a running init names) fails with EROFS, even for root, whom the
// file's mode does not stop. The content is the embedded init, and it
// executes.
func TestCachedInitReadOnly(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	f, err := openCached(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := os.Stat(filepath.Join(dir, CachedName()))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o555 || st.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Fatalf("the copy is %v uid %d, want 0555 of root", st.Mode(), st.Sys().(*syscall.Stat_t).Uid)
	}
	p := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if w, err := os.OpenFile(p, os.O_WRONLY, 0); !errors.Is(err, unix.EROFS) {
		if err == nil {
			w.Close()
		}
		t.Fatalf("open for writing through the init's descriptor: %v, want EROFS", err)
	}
	data, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(data, Binary) {
		t.Fatalf("the copy differs from the embedded init (%v)", err)
	}
	// It executes from the descriptor (the init refuses a bad argument and
	// says so: its own exit, not an exec error).
	cmd := exec.Command("/proc/self/fd/3", "not-a-number")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || len(out) == 0 {
		t.Fatalf("exec of the cached init: %v, output %q; want the init's own failure", err, out)
	}
	// A second open reuses the copy.
	f2, err := openCached(dir)
	if err != nil {
		t.Fatal(err)
	}
	f2.Close()
}

// Anything else under the copy's name is refused: a mode others may
// write, another owner, another size; and a directory others may write.
func TestCachedInitRefusesOthers(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, dir, file string)
		want  string
	}{
		{"group writable", func(t *testing.T, dir, file string) { must(t, os.Chmod(file, 0o575)) }, "not str's copy"},
		{"setuid", func(t *testing.T, dir, file string) { must(t, unix.Chmod(file, 0o4555)) }, "not str's copy"},
		{"not root's", func(t *testing.T, dir, file string) { must(t, os.Chown(file, 65534, 65534)) }, "not str's copy"},
		{"short", func(t *testing.T, dir, file string) { must(t, os.Truncate(file, 10)) }, "not str's copy"},
		{"symlink", func(t *testing.T, dir, file string) {
			must(t, os.Remove(file))
			must(t, os.Symlink("/bin/true", file))
		}, "not str's copy"},
		{"directory writable by others", func(t *testing.T, dir, file string) { must(t, os.Chmod(dir, 0o777)) }, "no one else may write"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			f, err := openCached(dir)
			if err != nil {
				t.Fatal(err)
			}
			f.Close()
			c.setup(t, dir, filepath.Join(dir, CachedName()))
			if f, err := openCached(dir); err == nil || !strings.Contains(err.Error(), c.want) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("openCached: %v, want an error containing %q", err, c.want)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
