package broker

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// dirSwapperEnv makes this test binary the swapper of
// TestTokenFileDirectorySwap: run as uid 1234 in its own directory $1, it
// exchanges root's directory $1/t with its own $1/decoy, forever.
const dirSwapperEnv = "STR_TEST_DIR_SWAPPER"

func init() {
	if os.Getenv(dirSwapperEnv) != "1" {
		return
	}
	a := os.Args[len(os.Args)-1]
	t, decoy := filepath.Join(a, "t"), filepath.Join(a, "decoy")
	os.Stdout.WriteString("swapping\n")
	for {
		// Atomically: $1/t is always one of the two directories.
		_ = unix.Renameat2(unix.AT_FDCWD, t, unix.AT_FDCWD, decoy, unix.RENAME_EXCHANGE)
	}
}

// TestTokenFileDirectorySwap: issue 29, item 2's audit of the token file.
// The token's directory is root's (0700) but sits in a directory uid 1234
// owns, which swaps it for a directory of its own and back while root
// writes the token. The token must never land in uid 1234's directory:
// the check and the writes name the same directory (a descriptor), not a
// path checked once and used again.
func TestTokenFileDirectorySwap(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "needs root: the token's directory is root's and the swapper is uid 1234")
	}
	const uid = 1234
	mkdir := func(p string, owner int, perm os.FileMode) {
		t.Helper()
		if err := os.Mkdir(p, perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, owner, owner); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, perm); err != nil {
			t.Fatal(err)
		}
	}
	base, err := os.MkdirTemp("", "str-token-swap-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	a := filepath.Join(base, "a")
	mkdir(a, uid, 0o755)
	mkdir(filepath.Join(a, "t"), 0, 0o700)
	mkdir(filepath.Join(a, "decoy"), uid, 0o777)
	bin := filepath.Join(base, "swapper")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	sw := exec.Command(bin, "-test.run=^$", a)
	sw.Env = append(os.Environ(), dirSwapperEnv+"=1")
	sw.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}}
	out, err := sw.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			_ = sw.Process.Kill()
			_ = sw.Wait()
			stopped = true
		}
	}
	t.Cleanup(stop)
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "swapping\n" {
		t.Fatalf("the swapper did not start: %q %v", line, err)
	}
	tok := NewToken()
	written := 0
	for i := 0; i < 2000; i++ {
		if WriteTokenFile(filepath.Join(a, "t", "b.token"), tok) == nil {
			written++
		}
	}
	stop()
	// Every token file (or temporary) must be in a directory root owns.
	_ = filepath.WalkDir(a, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !(d.Name() == "b.token" || strings.HasPrefix(d.Name(), ".broker-token-")) {
			return nil
		}
		var st syscall.Stat_t
		if syscall.Lstat(filepath.Dir(p), &st) == nil && st.Uid != 0 {
			t.Errorf("root wrote %s into a directory of uid %d", p, st.Uid)
		}
		return nil
	})
	t.Logf("%d of 2000 writes succeeded (the others found the swapper's directory and refused it)", written)
}
