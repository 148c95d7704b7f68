package template

import (
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

// The template mapper, started in a user namespace that maps its root to
// a host id (as a template's does): it is this test program executed
// again as mapperArgv0 (this package's init serves it), runs as that host
// id with no descriptor but its socket and /dev/null, opens a map path
// it may write, refuses any other path and any map it may not open, and
// is gone once closed.
func TestTemplateMapper(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a user namespace mapping root to a leased host id needs root")
	}
	const hostID = 300000
	userns := userNSRootAt(t, hostID)
	defer unix.Close(userns)
	mp, err := startMapper(fmt.Sprintf("/proc/self/fd/%d", userns))
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			mp.close()
		}
	}()

	// Its own uid_map (owned by its host id): opened, so it serves.
	own := fmt.Sprintf("/proc/%d/uid_map", mp.pid)
	f, err := mp.open(own)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	// A map of a host root process: not the mapper's to open.
	if f, err := mp.open("/proc/1/uid_map"); err == nil {
		f.Close()
		t.Error("the mapper opened /proc/1/uid_map for writing: it is host root")
	}
	for _, p := range []string{"/etc/passwd", fmt.Sprintf("/proc/%d/../%d/uid_map", mp.pid, mp.pid), own + "x", "/proc/self/uid_map"} {
		if f, err := mp.open(p); err == nil || !strings.Contains(err.Error(), "refused") {
			if f != nil {
				f.Close()
			}
			t.Errorf("open %s: %v, want refused", p, err)
		}
	}

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", mp.pid))
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Uid:\t%d\t%d\t%d\t%d\n", hostID, hostID, hostID, hostID)
	if !strings.Contains(string(status), want) {
		t.Errorf("the mapper's ids, want %q:\n%s", want, status)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", mp.pid))
	if string(cmdline) != mapperArgv0+"\x00" {
		t.Errorf("the mapper's cmdline %q, want %s", cmdline, mapperArgv0)
	}
	fds, err := filepath.Glob(fmt.Sprintf("/proc/%d/fd/*", mp.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, _ := os.Readlink(fd)
		if !(filepath.Base(fd) == "3" && strings.HasPrefix(target, "socket:")) && target != "/dev/null" {
			t.Errorf("the mapper holds descriptor %s -> %s", filepath.Base(fd), target)
		}
	}

	pid := mp.pid
	mp.close()
	closed = true
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		t.Errorf("mapper %d still exists after close", pid)
	}
}

// userNSRootAt is a descriptor of a new user namespace whose root is
// hostID on the host (uid and gid), made by a process started in it and
// then killed: the descriptor keeps the namespace.
func userNSRootAt(t *testing.T, hostID int) int {
	t.Helper()
	cmd := exec.Command("/bin/sleep", "infinity")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: hostID, Size: 1}},
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("a process in a user namespace rooted at host id %d: %v", hostID, err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	path := fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid)
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return fd
}
