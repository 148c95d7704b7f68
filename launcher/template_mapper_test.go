package launcher

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// The template mapper, started in a user namespace that maps its root to
// a host id (as a template's does): it is this test program executed
// again as mapperArgv0 (the package's init serves it), runs as that host
// id with no descriptor but its socket and /dev/null, opens a map path
// it may write, refuses any other path and any map it may not open, and
// is gone once closed.
func TestTemplateMapper(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a user namespace mapping root to a leased host id needs root")
	}
	const hostID = 300000
	userns, action, err := idMapUserNS(0, hostID, 0, hostID)
	if err != nil {
		t.Fatalf("%s: %v", action, err)
	}
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
