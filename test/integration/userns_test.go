package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// held is a sandbox kept running until release: its tool writes "ready"
// into its work dir, then waits for the test to create "go" (a live work
// dir: both sides see the other's file at once).
type held struct {
	t    *testing.T
	wd   string
	cmd  *exec.Cmd
	errb bytes.Buffer
}

func hold(t *testing.T, profile, before string) *held {
	t.Helper()
	h := &held{t: t, wd: worldDir(t)}
	h.cmd = exec.Command(strBin, "run", "--profile", profile, "--workdir", h.wd, "--workdir-live", "--", "/bin/sh", "-c",
		before+`; touch ready; while [ ! -e go ]; do sleep 0.02; done`)
	h.cmd.Stderr = &h.errb
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.release)
	if !eventually(60*time.Second, func() bool { _, err := os.Stat(filepath.Join(h.wd, "ready")); return err == nil }) {
		t.Fatalf("held sandbox never got ready: %s", h.errb.String())
	}
	return h
}

func (h *held) release() {
	if h.cmd.ProcessState != nil {
		return
	}
	_ = os.WriteFile(filepath.Join(h.wd, "go"), nil, 0o644)
	_ = h.cmd.Wait()
}

// hostUID is the host owner of a file the tool wrote.
func hostUID(t *testing.T, path string) int {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return int(st.Sys().(*syscall.Stat_t).Uid)
}

// Two concurrent sandboxes run under different host uids, neither root nor
// the shared 65534, and files a tool writes belong to its own uid: a
// setuid binary it plants is setuid to nobody else's uid.
func TestConcurrentSandboxesHaveUniqueHostUIDs(t *testing.T) {
	needRoot(t)
	a := hold(t, "restrictive", "cp /bin/true planted && chmod 4755 planted")
	b := hold(t, "restrictive", "true")
	ua, ub := hostUID(t, filepath.Join(a.wd, "ready")), hostUID(t, filepath.Join(b.wd, "ready"))
	if ua == ub || ua == 0 || ub == 0 || ua == 65534 || ub == 65534 {
		t.Fatalf("host uids of two live sandboxes: %d and %d; want distinct, neither 0 nor 65534", ua, ub)
	}
	if u := hostUID(t, filepath.Join(a.wd, "planted")); u != ua {
		t.Fatalf("planted setuid binary owned by host uid %d, want the sandbox's own %d", u, ua)
	}
	// The sandbox's PID 1 (the tool) holds no capability on the host and
	// its user namespace maps neither host root nor 65534.
	pid := sandboxPID1(t, ua)
	status, _ := os.ReadFile("/proc/" + pid + "/status")
	for _, f := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"} {
		if !strings.Contains(string(status), f+":\t0000000000000000") {
			t.Fatalf("sandbox PID 1 (host pid %s) has %s set:\n%s", pid, f, status)
		}
	}
	uidMap, _ := os.ReadFile("/proc/" + pid + "/uid_map")
	for _, line := range strings.Split(strings.TrimSpace(string(uidMap)), "\n") {
		if f := strings.Fields(line); len(f) == 3 && (f[1] == "0" || f[1] == "65534") {
			t.Fatalf("sandbox user namespace maps host uid %s:\n%s", f[1], uidMap)
		}
	}
}

// sandboxPID1 finds the host pid of the process running as uid that is
// PID 1 of its pid namespace (NSpid ends in 1).
func sandboxPID1(t *testing.T, uid int) string {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		st, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		s := string(st)
		if strings.Contains(s, "\nUid:\t"+strconv.Itoa(uid)+"\t") && strings.Contains(s, "\nNSpid:\t"+e.Name()+"\t1\n") {
			return e.Name()
		}
	}
	t.Fatalf("no PID 1 of a sandbox runs as host uid %d", uid)
	return ""
}

// A host process running as 65534 (the uid every tool shared before) can
// read neither a tool's memory nor its environment.
func TestHostNobodyCannotReadTool(t *testing.T) {
	needRoot(t)
	h := hold(t, "restrictive", "true")
	pid := sandboxPID1(t, hostUID(t, filepath.Join(h.wd, "ready")))
	for _, f := range []string{"mem", "environ"} {
		cmd := exec.Command("/bin/cat", "/proc/"+pid+"/"+f)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Fatalf("host nobody read /proc/%s/%s of a tool: %q", pid, f, out)
		}
	}
}

// A tool holding all the processes it may have does not stop a concurrent
// sandbox from forking (RLIMIT_NPROC counts per host uid, and each sandbox
// has its own).
func TestProcessLimitNotShared(t *testing.T) {
	needRoot(t)
	hold(t, "restrictive", `i=0; while [ $i -lt 28 ]; do sleep 600 & i=$((i+1)); done`)
	r := sh(t, "restrictive", `sh -c 'echo child' & wait; echo forked`)
	if !strings.Contains(r.Stdout, "child") || !strings.Contains(r.Stdout, "forked") {
		t.Fatalf("second sandbox could not fork:\n%s", r.Stdout)
	}
}

// No str program is left inside to overwrite (CVE-2019-5736): PID 1 is
// the tool itself from its first instruction (the launcher's clone child
// executed it in its own place), and its binary is a read-only bind.
func TestPID1ExeNotWritable(t *testing.T) {
	needRoot(t)
	r := sh(t, "restrictive", `readlink /proc/1/exe; if echo x >>/proc/1/exe; then echo WROTE; fi 2>/dev/null; echo done`)
	if strings.Contains(r.Stdout, "WROTE") || !strings.Contains(r.Stdout, "done") {
		t.Fatalf("/proc/1/exe writable from inside:\n%s", r.Stdout)
	}
	shell, err := filepath.EvalSymlinks("/bin/sh")
	if err != nil {
		t.Fatal(err)
	}
	if exe, _, _ := strings.Cut(r.Stdout, "\n"); exe != shell {
		t.Fatalf("PID 1 is %q while the tool (%s) runs, not the tool:\n%s", exe, shell, r.Stdout)
	}
}

// rlimits.as: the reference's 512 MiB stops a program that reserves 1 GiB
// of address space (as Go and JVM runtimes do) although it uses almost
// none; a profile with as: unlimited lets it run, memory.max still bounds
// what it uses.
func TestAddressSpaceLimitIsAProfileField(t *testing.T) {
	needRoot(t)
	reserve := `import mmap; m = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, prot=mmap.PROT_READ); print("reserved")`
	if r := str(t, "--profile", "restrictive", "--", "/usr/bin/python3", "-c", reserve); r.Exit == 0 || strings.Contains(r.Stdout, "reserved") {
		t.Fatalf("1 GiB reserved under restrictive's 512 MiB RLIMIT_AS: exit %d %s", r.Exit, r.Stdout)
	}
	src, err := os.ReadFile("../../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	y := strings.Replace(strings.Replace(string(src), "name: restrictive", "name: bigvm", 1), "as: 512Mi", "as: unlimited", 1)
	y = strings.Replace(y, "aliases: [untrusted]", "aliases: []", 1)
	if err := os.WriteFile(filepath.Join(dir, "bigvm.yaml"), []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := str(t, "--profile-dir", dir, "--profile", "bigvm", "--", "/usr/bin/python3", "-c", reserve); r.Exit != 0 || !strings.Contains(r.Stdout, "reserved") {
		t.Fatalf("as: unlimited did not lift the address-space limit: exit %d\n%s\n%s", r.Exit, r.Stdout, r.Stderr)
	}
}
