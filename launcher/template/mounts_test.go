package template

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// C7 and C9 for real: the supervisor attaches a detached tmpfs in another
// process's mount namespace (nothing of it reaches the host's), and the
// mount check finds it there, then refuses it once another mount covers
// it, and refuses a target with no fresh mount.
func TestAttachAndCheckMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "needs root: joins another process's mount namespace and makes mounts")
	}
	dir := t.TempDir()
	// Go's child makes its new mount namespace private (MS_REC|MS_PRIVATE)
	// before it executes sleep: nothing attached there propagates back.
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	pid := cmd.Process.Pid
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	// The child's mount namespace is its own once it runs sleep.
	waitExec(t, pid)

	attach := func() map[string]uint64 {
		t.Helper()
		fd := testTmpfs(t)
		defer unix.Close(fd)
		ids, err := mountIDs([]int{fd}, []string{dir})
		if err != nil {
			t.Fatal(err)
		}
		if err := attachMounts(pidfd, []int{fd}, []string{dir}); err != nil {
			t.Fatal(err)
		}
		return ids
	}
	first := attach()
	if err := checkMounts(pid, first); err != nil {
		t.Fatalf("the attached mount: %v", err)
	}
	var host unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_MNT_ID_UNIQUE, &host); err != nil {
		t.Fatal(err)
	}
	if host.Mnt_id == first[dir] {
		t.Fatalf("the mount attached in the child's namespace is on the host's %s", dir)
	}
	second := attach()
	if err := checkMounts(pid, first); err == nil || !strings.Contains(err.Error(), "not the fresh mount") {
		t.Errorf("a covered fresh mount: %v, want refused", err)
	}
	if err := checkMounts(pid, second); err != nil {
		t.Errorf("the top mount: %v", err)
	}
	if err := checkMounts(pid, map[string]uint64{filepath.Join(dir, "absent"): second[dir]}); err == nil {
		t.Error("a target without its fresh mount passed")
	}
}

// waitExec waits until pid runs sleep (its own mount namespace is made
// before the exec).
func waitExec(t *testing.T, pid int) {
	t.Helper()
	for i := 0; i < 5000; i++ {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil && strings.TrimSpace(string(b)) == "sleep" {
			return
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	t.Fatalf("pid %d never ran sleep", pid)
}

// testTmpfs is a detached tmpfs (fsopen, fsconfig, fsmount).
func testTmpfs(t *testing.T) int {
	t.Helper()
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetString(fs, "size", "64k"); err != nil {
		t.Fatal(err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}
