package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var profilesAll = []string{"restrictive", "standard", "permissive", "confidential"}

// Only the sandbox's own processes are visible, and the tool is PID 1 (the
// init executed it in its own place: nothing of str stays inside).
func TestOnlySandboxProcessesVisible(t *testing.T) {
	needRoot(t)
	r := sh(t, "restrictive", `tr '\0' ' ' </proc/1/cmdline; echo; echo self=$$; ls /proc | grep -c '^[0-9]'`)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "/bin/sh -c") || lines[1] != "self=1" {
		t.Fatalf("PID 1 is not the tool: %q", r.Stdout)
	}
	n, _ := strconv.Atoi(lines[2])
	// The shell and ls (and grep): a handful, never the host's.
	if n < 2 || n > 4 {
		t.Fatalf("%d processes visible in the sandbox, want the sandbox's own only:\n%s", n, r.Stdout)
	}
}

// Host files outside the binds are absent; /etc holds generated accounts.
func TestHostFilesAbsent(t *testing.T) {
	needRoot(t)
	marker := filepath.Join("/var/tmp", "str-marker-"+strconv.Itoa(os.Getpid()))
	if err := os.WriteFile(marker, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(marker)
	r := sh(t, "standard", `for p in `+marker+` /root /home /etc/shadow /var/lib /sys /boot /etc/hostname; do test -e $p && echo "VISIBLE $p"; done; wc -l </etc/passwd; ls /`)
	if strings.Contains(r.Stdout, "VISIBLE") {
		t.Fatalf("host paths visible in the sandbox:\n%s", r.Stdout)
	}
	if !strings.HasPrefix(r.Stdout, "2\n") {
		t.Fatalf("/etc/passwd should be the generated 2-line file, got:\n%s", r.Stdout)
	}
}

// Read-only binds refuse writes; the root itself is read-only.
func TestReadOnlyBindsRefuseWrites(t *testing.T) {
	needRoot(t)
	r := sh(t, "standard", `for p in /usr/str-x /etc/str-x /str-x /bin/str-x /lib/str-x; do touch $p 2>/dev/null && echo "WROTE $p"; done; echo x >>/etc/passwd 2>/dev/null && echo WROTE-passwd; echo done`)
	if strings.Contains(r.Stdout, "WROTE") || !strings.Contains(r.Stdout, "done") {
		t.Fatalf("a read-only path was writable:\n%s", r.Stdout)
	}
	if _, err := os.Stat("/usr/str-x"); err == nil {
		os.Remove("/usr/str-x")
		t.Fatal("a write inside the sandbox reached the host's /usr")
	}
}

// The work dir and /tmp are writable; work dir writes reach the host.
func TestWorkdirAndTmpWritable(t *testing.T) {
	needRoot(t)
	wd := worldDir(t)
	sh(t, "restrictive", `echo hi >out.txt && echo tmp >/tmp/t && cat /tmp/t && pwd`, "--workdir", wd)
	b, err := os.ReadFile(filepath.Join(wd, "out.txt"))
	if err != nil || string(b) != "hi\n" {
		t.Fatalf("work dir write did not reach the host: %q %v", b, err)
	}
}

// Every profile has its own network namespace with only lo (up): no
// profile shares the host's network any more.
func TestNetworkNamespace(t *testing.T) {
	needRoot(t)
	for _, p := range profilesAll {
		r := sh(t, p, `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
		if strings.TrimSpace(r.Stdout) != "lo" {
			t.Fatalf("%s sees interfaces %q, want only lo", p, r.Stdout)
		}
	}
	r := sh(t, "restrictive", `/usr/bin/python3 -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
c = socket.create_connection(s.getsockname()); print("lo-ok")'`)
	if !strings.Contains(r.Stdout, "lo-ok") {
		t.Fatalf("loopback not usable in restrictive: %s", r.Stdout)
	}
}

// The tool runs as 65534 with every capability set empty, no_new_privs and
// a seccomp filter.
func TestIdentityAndPrivileges(t *testing.T) {
	needRoot(t)
	for _, p := range profilesAll {
		r := sh(t, p, `id -u; id -g; id -G; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status`)
		want := []string{"65534", "65534", "65534",
			"CapInh:\t0000000000000000", "CapPrm:\t0000000000000000", "CapEff:\t0000000000000000",
			"CapBnd:\t0000000000000000", "CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"}
		got := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("profile %s:\ngot  %q\nwant %q", p, got, want)
		}
	}
}

// Dangerous syscalls fail with the configured errno, from inside.
func TestSeccompDenials(t *testing.T) {
	needRoot(t)
	script := `
import ctypes, errno, fcntl, os, termios
libc = ctypes.CDLL(None, use_errno=True)
def sc(nr, *a):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
    return "ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]
res = {}
res["mount"] = "ok" if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0 else errno.errorcode[ctypes.get_errno()]
res["unshare_user"] = sc(272, 0x10000000)
res["keyctl"] = sc(250, 0, 0, 0, 0, 0)
res["bpf"] = sc(321, 0, 0, 0)
res["ptrace"] = sc(101, 0, 1, 0, 0)
fd = os.open("/dev/tty", os.O_RDWR) if False else 0
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x"); res["tiocsti"] = "ok"
except OSError as e:
    res["tiocsti"] = errno.errorcode[e.errno]
res["clone3"] = sc(435, 0, 0)
print(" ".join(k + "=" + v for k, v in sorted(res.items())))
`
	for _, p := range profilesAll {
		r := str(t, "--profile", p, "--", "/usr/bin/python3", "-c", script)
		if r.Exit != 0 {
			t.Fatalf("profile %s: exit %d: %s", p, r.Exit, r.Stderr)
		}
		want := "bpf=EPERM clone3=ENOSYS keyctl=EPERM mount=EPERM ptrace=EPERM tiocsti=EPERM unshare_user=EPERM"
		if strings.TrimSpace(r.Stdout) != want {
			t.Fatalf("profile %s:\ngot  %s\nwant %s", p, r.Stdout, want)
		}
	}
}

// A memory hog ends with oom_killed.
func TestMemoryHogIsOOMKilled(t *testing.T) {
	needRoot(t)
	r := str(t, "--profile", "standard", "--memory", "48Mi", "--",
		"/usr/bin/python3", "-c", "x = bytearray(300 << 20); print('survived')")
	if !r.Res.OOMKilled || r.Exit == 0 || strings.Contains(r.Stdout, "survived") {
		t.Fatalf("memory hog not OOM-killed: exit %d result %+v stderr %s", r.Exit, r.Res, r.Stderr)
	}
	if r.Res.PeakMemoryBytes < 40<<20 || r.Res.PeakMemoryBytes > 49<<20 {
		t.Fatalf("peak memory %d outside the 48Mi limit's neighbourhood", r.Res.PeakMemoryBytes)
	}
}

// A fork bomb stops at pids.max.
func TestForkBombStopsAtPidsMax(t *testing.T) {
	needRoot(t)
	r := str(t, "--profile", "standard", "--pids", "16", "--timeout", "30s", "--", "/usr/bin/python3", "-c", `
import os, time
kids = []
for i in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
print(len(kids))`)
	if !r.Res.PidsLimit {
		t.Fatalf("pids limit not reported: %+v\nstdout %s stderr %s", r.Res, r.Stdout, r.Stderr)
	}
	// pids.max is 16, the request (the init is one task, the tool
	// itself): the tool forks fewer than 16 times, never unbounded.
	n, _ := strconv.Atoi(strings.TrimSpace(r.Stdout))
	if n == 0 || n >= 16 {
		t.Fatalf("%d children forked, pids.max is 16", n)
	}
}

// A CPU spinner is stopped by RLIMIT_CPU (a profile with a 1 s limit).
func TestCPUSpinnerStoppedByRlimit(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	prof, err := os.ReadFile("../../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(prof), "name: restrictive", "name: cpu1s", 1)
	y = strings.Replace(y, "aliases: [untrusted]", "aliases: []", 1)
	y = replaceKey(y, "cpu:", "  cpu: 1s", "rlimits:")
	if err := os.WriteFile(filepath.Join(dir, "cpu1s.yaml"), []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	r := str(t, "--profile-dir", dir, "--profile", "cpu1s", "--timeout", "60s", "--", "/usr/bin/python3", "-c", "while True: pass")
	if r.Res.TimedOut || (r.Res.Signal != int(syscall.SIGXCPU) && r.Res.Signal != int(syscall.SIGKILL)) {
		t.Fatalf("spinner not stopped by RLIMIT_CPU: %+v stderr %s", r.Res, r.Stderr)
	}
}

// replaceKey replaces the first line starting with key (after trimming)
// that follows the section line.
func replaceKey(y, key, with, section string) string {
	lines := strings.Split(y, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(l, section) {
			in = true
			continue
		}
		if in && strings.HasPrefix(strings.TrimSpace(l), key) {
			lines[i] = with
			break
		}
	}
	return strings.Join(lines, "\n")
}

// The timeout kills a tree that includes a double-forked daemon.
func TestTimeoutKillsDoubleForkedDaemon(t *testing.T) {
	needRoot(t)
	marker := "1" + strconv.Itoa(os.Getpid()%100000) + "7"
	r := str(t, "--profile", "standard", "--timeout", "1s", "--", "/bin/sh", "-c",
		`/bin/sh -c "setsid sleep `+marker+` >/dev/null 2>&1 &"; sleep `+marker)
	if !r.Res.TimedOut || r.Exit != 124 {
		t.Fatalf("timeout not reported: exit %d %+v", r.Exit, r.Res)
	}
	if pids := findProcs("sleep " + marker); len(pids) > 0 {
		t.Fatalf("processes survived the timeout: %v", pids)
	}
}

// SIGKILL of str run leaves no sandbox process, cgroup or mount behind.
func TestSIGKILLLeavesNothingBehind(t *testing.T) {
	needRoot(t)
	mountsBefore, _ := os.ReadFile("/proc/self/mountinfo")
	cgroupsBefore := strCgroups()
	marker := "2" + strconv.Itoa(os.Getpid()%100000) + "3"
	cmd := exec.Command(strBin, "run", "--profile", "restrictive", "--", "/bin/sh", "-c",
		`/bin/sh -c "setsid sleep `+marker+` &"; sleep `+marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !eventually(30*time.Second, func() bool { return len(findProcs("sleep "+marker)) >= 2 }) {
		_ = cmd.Process.Kill()
		t.Fatal("sandbox processes never appeared")
	}
	// The killed launcher's sandbox cgroups: the new ones that hold the
	// sandbox's processes (other packages' tests create sandboxes
	// meanwhile; theirs are not this launcher's).
	var killed []string
	own := sandboxCgroupNames(findProcs("sleep " + marker))
	for _, c := range strCgroups() {
		if !slices.Contains(cgroupsBefore, c) && own[filepath.Base(c)] {
			killed = append(killed, c)
		}
	}
	if len(killed) == 0 {
		t.Fatalf("the running sandbox has no sandbox cgroup (its processes' cgroups: %v)", own)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	if !eventually(10*time.Second, func() bool { return len(findProcs("sleep "+marker)) == 0 }) {
		t.Fatalf("sandbox processes survived SIGKILL of str run: %v", findProcs("sleep "+marker))
	}
	// The next launcher of the state directory to create a sandbox once a
	// sweep is due removes the cgroups of dead launchers (their lock files
	// are free). The stamp set back by sweepEvery (10 s) stands for the
	// time passing.
	stamp := "/run/str/cgroups/.swept"
	old := time.Now().Add(-time.Minute)
	if err := os.Chtimes(stamp, old, old); err != nil {
		t.Fatalf("set the sweep stamp back: %v", err)
	}
	sh(t, "restrictive", "true")
	for _, c := range strCgroups() {
		if slices.Contains(killed, c) {
			t.Fatalf("cgroup of the killed str run left behind: %s", c)
		}
	}
	mountsAfter, _ := os.ReadFile("/proc/self/mountinfo")
	if added := addedMounts(string(mountsBefore), string(mountsAfter)); len(added) > 0 {
		t.Fatalf("host mount table gained:\n%s", strings.Join(added, "\n"))
	}
}

// sandboxCgroupNames is the set of sandbox cgroup names
// (isSandboxCgroup) that the processes pids are in.
func sandboxCgroupNames(pids []string) map[string]bool {
	names := map[string]bool{}
	for _, pid := range pids {
		data, _ := os.ReadFile("/proc/" + pid + "/cgroup")
		for _, line := range strings.Split(string(data), "\n") {
			_, path, ok := strings.Cut(line, ":/")
			for _, c := range strings.Split(path, "/") {
				if ok && isSandboxCgroup(c) {
					names[c] = true
				}
			}
		}
	}
	return names
}

// addedMounts are the mount table's lines in after and not in before,
// less those other tests running meanwhile make on the host by design:
// the worker's work dirs (tmpfs "str-workdir"), network namespaces
// (nsfs) and the container engine's (overlay, /var/lib/docker, /run/docker).
func addedMounts(before, after string) []string {
	seen := map[string]bool{}
	for _, l := range strings.Split(before, "\n") {
		seen[l] = true
	}
	var added []string
	for _, l := range strings.Split(after, "\n") {
		// " str-test ": a fixture of another test package running beside
		// this one (internal/testfs mounts its tmpfs under that source
		// name), not str's.
		if l == "" || seen[l] || strings.Contains(l, " str-workdir ") || strings.Contains(l, " - nsfs ") || strings.Contains(l, " str-test ") ||
			strings.Contains(l, " - overlay ") || strings.Contains(l, "/var/lib/docker") || strings.Contains(l, "/run/docker") {
			continue
		}
		added = append(added, l)
	}
	return added
}

// strCgroups lists the sandbox cgroup directories (isSandboxCgroup).
func strCgroups() []string {
	var found []string
	_ = filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		if isSandboxCgroup(d.Name()) {
			found = append(found, p)
			return filepath.SkipDir
		}
		return nil
	})
	return found
}

// sandboxCgroupRE is a sandbox cgroup's name: "str-", 12 hex digits of
// its launcher's state directory, "-s" and 16 hex digits of its own
// (launcher/cgroup.go, cgroupSpace).
var sandboxCgroupRE = regexp.MustCompile(`^str-[0-9a-f]{12}-s[0-9a-f]{16}$`)

func isSandboxCgroup(name string) bool { return sandboxCgroupRE.MatchString(name) }

// No fd of str run or its caller leaks into the tool.
func TestNoFDLeak(t *testing.T) {
	needRoot(t)
	f, err := os.Open("/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Make the fd inheritable by str run itself.
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, f.Fd(), syscall.F_SETFD, 0); e != 0 {
		t.Fatal(e)
	}
	r := sh(t, "restrictive", `ls /proc/self/fd | sort -n | tr '\n' ' '`)
	// 0-2 and the fd ls uses to read the directory.
	if got := strings.TrimSpace(r.Stdout); got != "0 1 2 3" {
		t.Fatalf("tool fds: %q, want 0 1 2 (+ ls's own 3)", got)
	}
}

// Python runs a small script under every profile.
func TestPythonUnderEveryProfile(t *testing.T) {
	needRoot(t)
	script := `
import json, os, socket, subprocess, sys, tempfile, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
assert subprocess.run(["/bin/true"]).returncode == 0
a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"
with tempfile.NamedTemporaryFile() as f: f.write(os.urandom(16))
print(json.dumps({"ok": True, "py": sys.version_info[:2]}))
`
	for _, p := range profilesAll {
		r := str(t, "--profile", p, "--", "/usr/bin/python3", "-c", script)
		if r.Exit != 0 || !strings.Contains(r.Stdout, `"ok": true`) {
			t.Fatalf("python under %s: exit %d\nstdout %s\nstderr %s", p, r.Exit, r.Stdout, r.Stderr)
		}
	}
}

// Loosening a profile is refused before anything is cloned.
func TestOverridesOnlyTighten(t *testing.T) {
	needRoot(t)
	r := str(t, "--profile", "restrictive", "--memory", "2Gi", "--net", "host", "--", "/bin/true")
	if r.Exit != 125 || !strings.Contains(r.Stderr, "2Gi") || !strings.Contains(r.Stderr, "network") {
		t.Fatalf("loosening not refused with both problems named: exit %d stderr %s", r.Exit, r.Stderr)
	}
}

// Exit status and signals pass through; a missing command is 127.
func TestExitCodes(t *testing.T) {
	needRoot(t)
	if r := str(t, "--", "/bin/sh", "-c", "exit 7"); r.Exit != 7 {
		t.Fatalf("exit 7 came back as %d", r.Exit)
	}
	// A fault kills the tool (PID 1 of its namespace ignores only the
	// signals it is sent and does not handle).
	if r := str(t, "--", "/usr/bin/python3", "-c", "import ctypes; ctypes.string_at(0)"); r.Exit != 128+11 || r.Res.Signal != 11 {
		t.Fatalf("SIGSEGV came back as exit %d signal %d", r.Exit, r.Res.Signal)
	}
	r := str(t, "--", "/no/such/tool")
	if r.Exit != 127 || !strings.Contains(r.Stderr, "/no/such/tool") {
		t.Fatalf("missing tool: exit %d stderr %s", r.Exit, r.Stderr)
	}
}
