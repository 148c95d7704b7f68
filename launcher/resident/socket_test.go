package resident

import (
	"bufio"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher/statedir"
)

// symlinkRacerEnv makes this test binary the racer of
// TestResidentSocketSymlinkRace: run as an unprivileged uid, it replaces
// the socket at $1 by a symlink to $2 whenever a socket appears there.
const symlinkRacerEnv = "STR_TEST_SYMLINK_RACER"

func init() {
	if os.Getenv(symlinkRacerEnv) != "1" {
		return
	}
	sock, target := os.Args[len(os.Args)-2], os.Args[len(os.Args)-1]
	tmp := sock + ".racer"
	os.Stdout.WriteString("racing\n")
	for {
		if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(tmp)
			if os.Symlink(target, tmp) == nil {
				_ = os.Rename(tmp, sock)
			}
		}
	}
}

const racerUID = 1234

// needRootHere skips (or fails with STR_MUST_WORK=1) a test that acts as
// root on files and as another uid.
func needRootHere(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "needs root: str serve's socket is root's, and the test acts as uid 1234")
	}
}

// reachableDir is a fresh directory that any uid can search, owned by
// uid with mode perm.
func reachableDir(t *testing.T, uid int, perm os.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "str-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, perm); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestResidentSocketSymlinkRace: issue 29, item 2. A user who can write
// the socket's directory (here uid 1234, its owner) swaps each new socket
// for a symlink to a root-only file; str serve must never give that file
// another mode or owner. Before the fix, root chmodded the symlink's
// target (0600 -> 0666 with --allow-uid) within a few hundred starts; now
// the directory is refused at the first, with the error naming it.
func TestResidentSocketSymlinkRace(t *testing.T) {
	needRootHere(t)
	secretDir := t.TempDir()
	target := filepath.Join(secretDir, "root-only")
	if err := os.WriteFile(target, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := reachableDir(t, racerUID, 0o755)
	sock := filepath.Join(dir, "serve.sock")
	// The test binary, where uid 1234 can run it.
	bin := filepath.Join(reachableDir(t, 0, 0o755), "racer")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	racer := exec.Command(bin, "-test.run=^$", sock, target)
	racer.Env = append(os.Environ(), symlinkRacerEnv+"=1")
	racer.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: racerUID, Gid: racerUID, Groups: []uint32{}}}
	out, err := racer.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := racer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = racer.Process.Kill(); _ = racer.Wait() })
	// Its loop runs before the first start.
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "racing\n" {
		t.Fatalf("the racer did not start: %q %v", line, err)
	}

	opts := Options{Socket: sock, AllowUIDs: []int{racerUID}, AllowGID: -1}
	const starts = 2000
	var refusals int
	for i := 0; i < starts; i++ {
		ln, rs, err := listenResident(opts)
		if err == nil {
			ln.Close()
			rs.close()
		} else if strings.Contains(err.Error(), "directory "+dir+" is owned by uid 1234 with mode 0755") {
			refusals++
		}
		// A symlink the racer swapped in after a start ended is cleared,
		// so that every start races afresh (the old code refused a
		// symlink found before its bind).
		if fi, err := os.Lstat(sock); err == nil && fi.Mode()&os.ModeSymlink != 0 {
			_ = os.Remove(sock)
		}
		fi, serr := os.Stat(target)
		if serr != nil {
			t.Fatal(serr)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o600 || st.Uid != 0 || st.Gid != 0 {
			t.Fatalf("start %d: the root-only file is now mode %o owner %d:%d (was 0600 0:0): root acted on the racer's symlink", i+1, fi.Mode().Perm(), st.Uid, st.Gid)
		}
	}
	if refusals != starts {
		t.Errorf("%d of %d starts refused the directory uid 1234 may write, want all", refusals, starts)
	}
}

// TestResidentSocketDirectoryRefused: a --socket whose directory is not
// root's, or that group or others may write (sticky or not), or that is
// a symlink, is refused with an error naming the directory, its owner
// and its mode; nothing is created there.
func TestResidentSocketDirectoryRefused(t *testing.T) {
	needRootHere(t)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(reachableDir(t, 0, 0o755), link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		dir  string
		want string
	}{
		{reachableDir(t, 0, 0o777|os.ModeSticky), "is owned by uid 0 with mode 1777"},
		{reachableDir(t, 0, 0o777), "is owned by uid 0 with mode 0777"},
		{reachableDir(t, 0, 0o775), "is owned by uid 0 with mode 0775"},
		{reachableDir(t, racerUID, 0o700), "is owned by uid 1234 with mode 0700"},
		{link, "is not a directory"},
	} {
		sock := filepath.Join(c.dir, "serve.sock")
		ln, rs, err := listenResident(Options{Socket: sock, AllowGID: -1})
		if err == nil {
			ln.Close()
			rs.close()
			t.Errorf("%s: served", sock)
			continue
		}
		var ue *statedir.UnsafeDirError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.dir+" "+c.want) || !strings.Contains(err.Error(), "socket "+sock) {
			t.Errorf("%s: %v, want an UnsafeDirError naming %s and %q", sock, err, c.dir, c.want)
		}
		if ents, _ := os.ReadDir(c.dir); len(ents) != 0 {
			t.Errorf("%s: left %v", c.dir, ents)
		}
	}
}

// TestResidentSocketFile: in a root-only directory the socket appears
// finished (owner and mode of check 1, no setup directory left), replaces
// a stale socket, refuses a live one and any other file, and is removed
// at close only while it is still the one published.
func TestResidentSocketFile(t *testing.T) {
	needRootHere(t)
	dir := reachableDir(t, 0, 0o755)
	sock := filepath.Join(dir, "serve.sock")
	// A stale socket (its listener gone, the name left).
	stale, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()

	ln, rs, err := listenResident(Options{Socket: sock, AllowGID: 4321})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 || st.Uid != 0 || st.Gid != 4321 {
		t.Errorf("socket: %v owner %d:%d, want a socket 0660 0:4321", fi.Mode(), st.Uid, st.Gid)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %v, want the socket only", ents)
	}
	// It accepts at its published name.
	go func(ln *net.UnixListener) { // ln is assigned again below
		if c, err := ln.Accept(); err == nil {
			c.Close()
		}
	}(ln)
	c, err := net.DialTimeout("unixpacket", sock, 30*time.Second)
	if err != nil {
		t.Fatalf("dial the published socket: %v", err)
	}
	c.Close()
	// A second server is refused while this one listens.
	if _, _, err := listenResident(Options{Socket: sock, AllowGID: -1}); err == nil || !strings.Contains(err.Error(), "another str serve listens there") {
		t.Errorf("a second server: %v", err)
	}
	ln.Close()
	rs.close()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after close: %v, want the socket removed", err)
	}

	// Not a socket: refused, untouched.
	if err := os.WriteFile(sock, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := listenResident(Options{Socket: sock, AllowGID: -1}); err == nil || !strings.Contains(err.Error(), "exists and is not a socket") {
		t.Errorf("a regular file at the name: %v", err)
	}
	os.Remove(sock)

	// Replaced after publication: close leaves the other file alone.
	ln, rs, err = listenResident(Options{Socket: sock, AllowGID: -1})
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sock, []byte("other"), 0o644); err != nil {
		t.Fatal(err)
	}
	rs.close()
	if b, err := os.ReadFile(sock); err != nil || string(b) != "other" {
		t.Errorf("close removed a file that was not its socket: %q %v", b, err)
	}
}
