package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher"
	"golang.org/x/sys/unix"
)

// --userns and --pidns (bubblewrap's test-specifying-userns.sh and
// test-specifying-pidns.sh, as its users write them), side by side with
// bubblewrap, as root and as uid 65534: a first sandbox with its own user
// and pid namespaces reports them and waits; a second one joins them
// through /proc/PID/ns/user and /proc/PID/ns/pid (PID from --info-fd)
// and must see the same two namespaces. As root, str refuses --userns
// without --pidns (the joined ids are the first sandbox's lease) where
// bubblewrap runs it; as uid 65534 both run it.
func TestBwrapJoinNamespaces(t *testing.T) {
	needRoot(t) // to drop to uid 65534 as well
	bw, err := exec.LookPath("bwrap")
	if err != nil {
		mustwork.Skip(t, "no bwrap on this machine to compare with")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		mustwork.Skip(t, "needs setpriv (util-linux) to drop to an unprivileged uid")
	}
	// A copy of str that uid 65534 may execute (t.TempDir's parent is 0700).
	dir, err := os.MkdirTemp("/var/tmp", "str-bwrap-join-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	_ = os.Chmod(dir, 0o755)
	str := strCopyIn(t, dir)
	base := []string{"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
		"--symlink", "usr/lib64", "/lib64", "--proc", "/proc"} // no --dev: bubblewrap then nests a second user namespace
	for _, uid := range []int{0, 65534} {
		for _, side := range []string{"bwrap", "str bwrap"} {
			command := func(args ...string) *exec.Cmd {
				cmd := exec.Command(bw, append(base, args...)...)
				if side == "str bwrap" {
					cmd = exec.Command(str, append([]string{"bwrap"}, append(base, args...)...)...)
				}
				cmd.Dir = "/"
				if uid != 0 {
					cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid), Groups: []uint32{}}}
				}
				return cmd
			}
			t.Run(fmt.Sprintf("uid%d/%s", uid, side), func(t *testing.T) {
				// The first sandbox: its namespaces on stdout, then it
				// waits for its stdin to close.
				first := command("--unshare-user", "--unshare-pid", "--info-fd", "3", "--",
					"/bin/sh", "-c", "readlink /proc/self/ns/user /proc/self/ns/pid; exec cat")
				infoR, infoW, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				first.ExtraFiles = []*os.File{infoW}
				stdin, err := first.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				out, err := first.StdoutPipe()
				if err != nil {
					t.Fatal(err)
				}
				var errb bytes.Buffer
				first.Stderr = &errb
				if err := first.Start(); err != nil {
					t.Fatal(err)
				}
				infoW.Close()
				defer func() {
					stdin.Close()
					if err := first.Wait(); err != nil {
						t.Errorf("first sandbox: %v; stderr %s", err, errb.String())
					}
				}()
				sc := bufio.NewScanner(out)
				var want []string
				for len(want) < 2 && sc.Scan() {
					want = append(want, sc.Text())
				}
				info, err := readAllClose(infoR)
				var doc struct {
					ChildPid int `json:"child-pid"`
				}
				if len(want) != 2 || err != nil || json.Unmarshal([]byte(info), &doc) != nil || doc.ChildPid <= 0 {
					t.Fatalf("first sandbox: namespaces %q, --info-fd %q %v; stderr %s", want, info, err, errb.String())
				}
				open := func(ns string) *os.File {
					f, err := os.Open(fmt.Sprintf("/proc/%d/ns/%s", doc.ChildPid, ns))
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { f.Close() })
					return f
				}
				userns, pidns := open("user"), open("pid")

				// --userns and --pidns: the same two namespaces.
				second := command("--userns", "3", "--pidns", "4", "--", "/bin/sh", "-c", "readlink /proc/self/ns/user /proc/self/ns/pid")
				second.ExtraFiles = []*os.File{userns, pidns}
				var errs bytes.Buffer
				second.Stderr = &errs
				got, err := second.Output()
				if err != nil || strings.Join(strings.Fields(string(got)), " ") != strings.Join(want, " ") {
					t.Errorf("--userns --pidns: %q %v, want %q; stderr %s", got, err, want, errs.String())
				}

				// str killed: the joined command dies with it (its parent,
				// str's clone child, has str's parent-death signal, it has
				// its parent's); its pidfd becomes readable when it exits.
				if side == "str bwrap" {
					victim := command("--userns", "3", "--pidns", "4", "--", "sleep", "3600")
					victim.ExtraFiles = []*os.File{userns, pidns}
					if err := victim.Start(); err != nil {
						t.Fatal(err)
					}
					pid := awaitProcess(t, want[1])
					pidfd, err := unix.PidfdOpen(pid, 0)
					if err != nil {
						t.Fatal(err)
					}
					_ = victim.Process.Kill()
					_ = victim.Wait()
					fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
					for {
						if _, err := unix.Poll(fds, -1); err != unix.EINTR {
							break
						}
					}
					unix.Close(pidfd)
				}

				// --userns alone: the user namespace. As root, str holds the
				// joined sandbox's id block too while the command runs (a
				// marker the lease honours: launcher.joinLease), and drops
				// it at the end.
				alone := command("--userns", "3", "--", "/bin/sh", "-c", "readlink /proc/self/ns/user")
				alone.ExtraFiles = []*os.File{userns}
				errs.Reset()
				alone.Stderr = &errs
				got, err = alone.Output()
				if err != nil || strings.TrimSpace(string(got)) != want[0] {
					t.Errorf("--userns alone: %q %v, want %q; stderr %s", got, err, want[0], errs.String())
				}
				if side == "str bwrap" && uid == 0 {
					held := command("--userns", "3", "--", "sleep", "3600")
					held.ExtraFiles = []*os.File{userns}
					if err := held.Start(); err != nil {
						t.Fatal(err)
					}
					awaitInUserNS(t, want[0], want[1])
					marks, _ := filepath.Glob(fmt.Sprintf("%s/*.join/%d", launcher.IDLeaseDir, held.Process.Pid))
					_ = held.Process.Signal(unix.SIGTERM)
					_ = held.Wait()
					if len(marks) != 1 {
						t.Errorf("--userns alone as root: the joined block's markers for str (pid %d): %q, want one", held.Process.Pid, marks)
					}
					if left, _ := filepath.Glob(fmt.Sprintf("%s/*.join/%d", launcher.IDLeaseDir, held.Process.Pid)); len(left) != 0 {
						t.Errorf("--userns alone as root: markers left after str ended: %q", left)
					}
				}
			})
		}
	}
}

// awaitInUserNS waits until a "sleep 3600" runs in user namespace userns
// ("user:[N]") outside pid namespace notPidns (no bound but the test's
// own timeout).
func awaitInUserNS(t *testing.T, userns, notPidns string) {
	t.Helper()
	for {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			uns, _ := os.Readlink("/proc/" + e.Name() + "/ns/user")
			pns, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid")
			if uns == userns && pns != notPidns && strings.Contains(string(cmdline), "sleep\x003600") {
				return
			}
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a deadline
	}
}

// awaitProcess is the host pid of "sleep 3600" in pid namespace pidns
// ("pid:[N]"), once it runs (no bound but the test's own timeout).
func awaitProcess(t *testing.T, pidns string) int {
	t.Helper()
	for {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			var pid int
			if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
				continue
			}
			cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
			if ns == pidns && strings.Contains(string(cmdline), "sleep\x003600") {
				return pid
			}
		}
		time.Sleep(10 * time.Millisecond) // a poll interval, not a deadline
	}
}
