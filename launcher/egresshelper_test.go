package launcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/helper"
	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/profiles"
)

func rootLauncher(t *testing.T) *Launcher {
	t.Helper()
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "a root-mode sandbox (leased ids, cgroups) needs root")
	}
	l, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// statusField is a field of /proc/PID/status.
func statusField(t *testing.T, pid int, name string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == name {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("/proc/%d/status has no %s", pid, name)
	return ""
}

// TestEgressHelperUnprivileged: a root launcher's egress helper, the
// process that parses the sandboxes' traffic, runs as nobody with no
// capability, no supplementary group, no_new_privs, no environment, in /.
func TestEgressHelperUnprivileged(t *testing.T) {
	l := rootLauncher(t)
	// No traffic, no helper.
	res, err := l.Run(context.Background(), Request{Profile: "restrictive", Argv: []string{"/bin/true"}})
	if err != nil || res.ExitCode != 0 || len(res.Warnings) > 0 {
		t.Fatalf("run: %v, %+v", err, res)
	}
	if pid := l.egress.Pid(); pid != 0 {
		t.Errorf("an egress helper (pid %d) for a sandbox that used no network", pid)
	}
	// A connection to the proxy port: the helper serves it.
	res, err = l.Run(context.Background(), Request{Profile: "restrictive", Argv: []string{"python3", "-c", `import socket; socket.create_connection(("127.0.0.1", 3128), timeout=5).close()`}})
	if err != nil || res.ExitCode != 0 || len(res.Warnings) > 0 {
		t.Fatalf("run: %v, %+v", err, res)
	}
	pid := l.egress.Pid()
	if pid == 0 {
		t.Fatal("no egress helper runs after a sandbox's connection")
	}
	nobody := fmt.Sprintf("%d\t%d\t%d\t%d", helper.NobodyID, helper.NobodyID, helper.NobodyID, helper.NobodyID)
	for field, want := range map[string]string{
		"Uid": nobody, "Gid": nobody, "Groups": "", "NoNewPrivs": "1",
		"CapInh": "0000000000000000", "CapPrm": "0000000000000000", "CapEff": "0000000000000000", "CapAmb": "0000000000000000",
	} {
		if got := statusField(t, pid, field); got != want {
			t.Errorf("egress helper %s: %q, want %q", field, got, want)
		}
	}
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err != nil || len(env) != 0 {
		t.Errorf("egress helper environment: %q %v, want none", env, err)
	}
	// Not dumpable: its /proc entries are root's, so another process of
	// uid 65534 can neither ptrace it nor read its memory.
	st, err := os.Stat(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		t.Fatal(err)
	}
	if owner := st.Sys().(*syscall.Stat_t).Uid; owner != 0 {
		t.Errorf("egress helper /proc/%d/environ owned by uid %d, want 0 (the helper not dumpable)", pid, owner)
	}
	if cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid)); err != nil || cwd != "/" {
		t.Errorf("egress helper cwd: %q %v, want /", cwd, err)
	}
}

// lostNetwork: the sandbox reaches its proxy port, makes one denied
// request (the test waits for its record), then probes the port until the
// connection is refused (exit 0) or 30 s pass (exit 3).
const lostNetwork = `
import socket, sys, time
def probe():
    try:
        socket.create_connection(("127.0.0.1", 3128), timeout=2).close()
        return True
    except OSError:
        return False
if not probe():
    sys.exit(2)
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n")
s.recv(100)
s.close()
deadline = time.time() + 30
while time.time() < deadline:
    if not probe():
        sys.exit(0)
    time.sleep(0.05)
sys.exit(3)
`

// TestEgressHelperKilled: when the egress helper dies mid-run, the sandbox
// it served loses its network (its listeners closed with the helper: fail
// closed), its result says so, and the next sandbox gets a new helper and
// a working network.
func TestEgressHelperKilled(t *testing.T) {
	l := rootLauncher(t)
	var out bytes.Buffer
	s, err := l.Create(context.Background(), Request{Profile: "standard", Argv: []string{"python3", "-c", lostNetwork}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if ev, _, _ := s.NetworkReport(); len(ev) > 0 {
			break
		}
		if time.Now().After(deadline) {
			s.Kill()
			t.Fatalf("the sandbox's denied request was never recorded: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	pid := l.egress.Pid()
	if pid == 0 {
		t.Fatal("no egress helper")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	res, err := s.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 {
		t.Errorf("the sandbox kept its network after the helper died: exit %d: %s", res.ExitCode, out.String())
	}
	if !slices.ContainsFunc(res.Warnings, func(w string) bool {
		return strings.Contains(w, "lost its network") && strings.Contains(w, "egress helper")
	}) {
		t.Errorf("no warning that the sandbox lost its network: %q", res.Warnings)
	}

	// The next sandbox: a new helper, and a network.
	out.Reset()
	res, err = l.Run(context.Background(), Request{Profile: "standard", Argv: []string{"python3", "-c", `import socket; socket.create_connection(("127.0.0.1", 3128), timeout=5).close()`}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || len(res.Warnings) > 0 {
		t.Errorf("the sandbox after the helper died: exit %d, warnings %q: %s", res.ExitCode, res.Warnings, out.String())
	}
	if p := l.egress.Pid(); p == 0 || p == pid {
		t.Errorf("egress helper pid %d after the old one (%d) died", p, pid)
	}
}

// TestPlanWildcardOverPublicSuffix: str links no public suffix list, so
// the plan has the egress helper check wildcard hosts: one over a public
// suffix is the caller's fault, as it is where the list is linked.
func TestPlanWildcardOverPublicSuffix(t *testing.T) {
	l := &Launcher{host: fakeHost(0, CgroupV2)}
	var err error
	if l.profiles, err = profiles.Embedded(); err != nil {
		t.Fatal(err)
	}
	for host, bad := range map[string]bool{"*.co.uk": true, "*.example.co.uk": false} {
		_, err := l.Plan(Request{Profile: "standard", Argv: []string{"/bin/true"}, Network: &egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{host}}})
		if got := errors.Is(err, ErrInvalidRequest) && strings.Contains(err.Error(), "public suffix"); got != bad || !bad && err != nil {
			t.Errorf("allowed_hosts %s: %v, want refused %v", host, err, bad)
		}
	}
}

// TestNetworkReportThroughTeardown: the record of denials stays readable
// while the sandbox is torn down and after (the worker reads it as soon as
// the tool is done, which can be while the reaper closes the session with
// a round trip to the helper): once a denial was seen, every later
// NetworkReport has it, and so does the one after Wait. A report that
// found no session mid-teardown dropped a reply's violations under load
// (CI, TestContainerServes/rootless).
func TestNetworkReportThroughTeardown(t *testing.T) {
	l := rootLauncher(t)
	var out bytes.Buffer
	denied := `import socket
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1:443\r\n\r\n")
s.recv(100)
s.close()`
	s, err := l.Create(context.Background(), Request{Profile: "standard", Argv: []string{"python3", "-c", denied}, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	lost := make(chan int, 1)
	go func() {
		seen, reads := false, 0
		for {
			select {
			case <-done:
				return
			default:
			}
			ev, _, _ := s.NetworkReport()
			reads++
			if len(ev) > 0 {
				seen = true
			} else if seen {
				lost <- reads
				return
			}
		}
	}()
	res, err := s.Wait()
	close(done)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-lost:
		t.Errorf("NetworkReport lost the denial during teardown (read %d)", n)
	default:
	}
	if len(res.Violations) == 0 {
		t.Fatalf("no violation in the result: exit %d, %s", res.ExitCode, out.String())
	}
	if ev, _, _ := s.NetworkReport(); len(ev) == 0 {
		t.Errorf("NetworkReport after Wait: no denial; the result has %d", len(res.Violations))
	}
}
