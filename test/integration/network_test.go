package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/test/internal/testdns"
)

// The network tests use only this machine: a test host in a network
// namespace the test creates (veth), at a public-looking address
// (203.0.113.10, TEST-NET-3) and at a private one (10.213.0.10), and a
// DNS server of the test's own on the host's loopback. Never any other
// address. The documentation ranges are refused by default like private
// ones, so the test profiles name the test host's address in
// allowed_cidrs (203.0.113.10/32 only) to stand for the public internet;
// the rest of TEST-NET-3 stays refused (testHostOther).

const (
	testHostIP    = "203.0.113.10"
	testHostPriv  = "10.213.0.10"
	testHostLocal = "203.0.113.1"  // the host's side of the veth: a host address on another interface
	testHostOther = "203.0.113.11" // no host, not named by allowed_cidrs: refused by default
)

// testNet is the test host: a netns with servers on 8443 and 8080 that
// answer every connection with "hello <port>\n".
type testNet struct {
	ns, veth string
	server   *exec.Cmd
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	needRoot(t)
	if _, err := exec.LookPath("ip"); err != nil {
		mustwork.Skip(t, "needs ip (iproute2) to create the test host's network namespace")
	}
	// The test host's addresses are fixed (testHostIP, testHostPriv):
	// two test processes of this machine (another checkout's run, a
	// developer's beside CI) would route them to two veths. One test
	// network per machine at a time: the lock is held until this one is
	// gone (registered first, its cleanup runs last).
	lock, err := os.OpenFile("/run/str-test-net.lock", os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	id := strconv.Itoa(os.Getpid() % 100000)
	n := &testNet{ns: "strt" + id, veth: "strh" + id}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	_ = exec.Command("ip", "netns", "del", n.ns).Run()
	_ = exec.Command("ip", "link", "del", n.veth).Run()
	run("netns", "add", n.ns)
	t.Cleanup(func() {
		if n.server != nil && n.server.Process != nil {
			_ = n.server.Process.Kill()
			_ = n.server.Wait()
		}
		_ = exec.Command("ip", "link", "del", n.veth).Run()
		_ = exec.Command("ip", "netns", "del", n.ns).Run()
	})
	run("link", "add", n.veth, "type", "veth", "peer", "name", "strn"+id, "netns", n.ns)
	run("addr", "add", testHostLocal+"/24", "dev", n.veth)
	run("addr", "add", "10.213.0.1/24", "dev", n.veth)
	run("link", "set", n.veth, "up")
	run("-n", n.ns, "addr", "add", testHostIP+"/24", "dev", "strn"+id)
	run("-n", n.ns, "addr", "add", testHostPriv+"/24", "dev", "strn"+id)
	run("-n", n.ns, "link", "set", "strn"+id, "up")
	run("-n", n.ns, "link", "set", "lo", "up")
	n.server = exec.Command("ip", "netns", "exec", n.ns, "/usr/bin/python3", "-c", `
import socket, threading
def serve(s, port):
    while True:
        c, _ = s.accept()
        try: c.sendall(b"hello %d\n" % port)
        finally: c.close()
# Both listen before "ready" (the threads only accept): a dial right
# after "ready" must not find a port still closed.
for p in (8443, 8080):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", p)); s.listen(64)
    threading.Thread(target=serve, args=(s, p), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
`)
	out, err := n.server.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := n.server.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := out.Read(buf); err != nil || string(buf[:5]) != "ready" {
		t.Fatalf("test host server did not start: %q %v", buf, err)
	}
	// The host reaches the test host directly (the worker's side).
	c, err := net.DialTimeout("tcp", testHostIP+":8443", 5*time.Second)
	if err != nil {
		t.Fatalf("the host cannot reach its own test host: %v", err)
	}
	c.Close()
	return n
}

// testDNS answers A queries on the host's loopback: svc.test is the test
// host, rebind.test is loopback, meta.test the metadata address,
// private.test the test host's private address; anything else NXDOMAIN.
func testDNS(t *testing.T) string {
	t.Helper()
	answers := map[string][4]byte{
		"svc.test.":     {203, 0, 113, 10},
		"rebind.test.":  {127, 0, 0, 1},
		"meta.test.":    {169, 254, 169, 254},
		"private.test.": {10, 213, 0, 10},
	}
	return testdns.Serve(t, answers)
}

// netProfiles writes two profiles for the tests: nettest-restricted and
// nettest-egress, the restrictive profile with a network policy each.
func netProfiles(t *testing.T, dns string) string {
	t.Helper()
	base, err := os.ReadFile("../../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, network := range map[string]string{
		"nettest-restricted": "network:\n  policy: restricted\n  allowed_hosts: [svc.test, rebind.test, meta.test, private.test]\n  allowed_ports: [8443]\n  allowed_cidrs: [" + testHostIP + "/32]\n  dns_servers: [\"" + dns + "\"]\n",
		"nettest-egress":     "network:\n  policy: allow_egress\n  allowed_ports: [8443]\n  allowed_cidrs: [" + testHostIP + "/32]\n  dns_servers: [\"" + dns + "\"]\n",
	} {
		y := string(base)
		y = strings.Replace(y, "name: restrictive", "name: "+name, 1)
		y = strings.Replace(y, "aliases: [untrusted]", "aliases: []", 1)
		i := strings.Index(y, "network:")
		j := strings.Index(y, "hostname:")
		y = y[:i] + network + y[j:]
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// probeScript tries each connection the test names and prints one JSON
// object: name -> "ok: <first line>" or "err: <exception>".
const probeScript = `
import json, socket, sys, struct
out = {}
def line(s):
    s.settimeout(5)
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(100)
        if not chunk: break
        data += chunk
    return data.decode().strip()
def connect_proxy(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c: break
        head += c
    status = head.split(b"\r\n")[0].decode()
    if " 200 " not in status + " ":
        return "denied: " + status
    return "ok: " + line(s)
def socks5h(host, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(b"\x05\x01\x00"); s.recv(2)
    s.sendall(b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + struct.pack(">H", port))
    rep = s.recv(10)
    if rep[1] != 0:
        return "denied: socks %d" % rep[1]
    return "ok: " + line(s)
def plain(host, port):
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    s = socket.create_connection(addr, timeout=5)
    return "ok: " + line(s)
for name, fn in [(k, v) for k, v in PROBES]:
    try:
        out[name] = fn()
    except Exception as e:
        out[name] = "err: %s" % e
print(json.dumps(out))
`

func runProbes(t *testing.T, profileDir, profile string, probes map[string]string) map[string]string {
	t.Helper()
	var list []string
	for name, expr := range probes {
		list = append(list, fmt.Sprintf("(%q, lambda: %s)", name, expr))
	}
	script := strings.Replace(probeScript, "PROBES", "["+strings.Join(list, ", ")+"]", 1)
	r := str(t, "--profile-dir", profileDir, "--profile", profile, "--", "/usr/bin/python3", "-c", script)
	if r.Exit != 0 {
		t.Fatalf("%s: exit %d\nstdout %s\nstderr %s", profile, r.Exit, r.Stdout, r.Stderr)
	}
	var got map[string]string
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("%s: probe output: %v\n%s", profile, err, r.Stdout)
	}
	return got
}

// restricted: svc.test on 8443 is reachable by CONNECT, SOCKS5h and a plain
// connect after getaddrinfo; other names, IP literals, other ports and
// names resolving to loopback or metadata (rebinding) are not, and every
// denial is in the result's violations.
func TestNetworkRestricted(t *testing.T) {
	newTestNet(t)
	dir := netProfiles(t, testDNS(t))
	got := runProbes(t, dir, "nettest-restricted", map[string]string{
		"connect":        `connect_proxy("svc.test:8443")`,
		"socks5h":        `socks5h("svc.test", 8443)`,
		"plain":          `plain("svc.test", 8443)`,
		"other-name":     `plain("other.test", 8443)`,
		"ip-literal":     `connect_proxy("` + testHostOther + `:8443")`,
		"direct-ip":      `socket.create_connection(("` + testHostIP + `", 8443), timeout=3)`,
		"other-port":     `connect_proxy("svc.test:8080")`,
		"rebind-lo":      `connect_proxy("rebind.test:8443")`,
		"rebind-meta":    `connect_proxy("meta.test:8443")`,
		"private":        `connect_proxy("private.test:8443")`,
		"host-loopback":  `socket.create_connection(("127.0.0.1", 22), timeout=3)`,
		"host-interface": `socket.create_connection(("` + testHostLocal + `", 8443), timeout=3)`,
	})
	want := map[string]string{
		"connect": "ok: hello 8443", "socks5h": "ok: hello 8443", "plain": "ok: hello 8443",
		"other-name": "err: [Errno -2]", "ip-literal": "denied: HTTP/1.1 403", "direct-ip": "err:",
		"other-port": "denied: HTTP/1.1 403", "rebind-lo": "denied: HTTP/1.1 403", "rebind-meta": "denied: HTTP/1.1 403",
		"private": "denied: HTTP/1.1 403", "host-loopback": "err:", "host-interface": "err:",
	}
	for k, w := range want {
		if !strings.HasPrefix(got[k], w) {
			t.Errorf("%s: %q, want %q...", k, got[k], w)
		}
	}
}

// allow_egress: the public test host is reachable through the proxy (by
// name and by IP); private and loopback addresses, also through a name,
// and the host's own addresses are not.
func TestNetworkAllowEgress(t *testing.T) {
	newTestNet(t)
	dir := netProfiles(t, testDNS(t))
	got := runProbes(t, dir, "nettest-egress", map[string]string{
		"by-name":       `connect_proxy("svc.test:8080")`,
		"by-ip":         `connect_proxy("` + testHostIP + `:8080")`,
		"plain":         `plain("svc.test", 8443)`,
		"private-ip":    `connect_proxy("` + testHostPriv + `:8443")`,
		"private-name":  `connect_proxy("private.test:8443")`,
		"loopback":      `connect_proxy("127.0.0.1:22")`,
		"metadata":      `connect_proxy("169.254.169.254:80")`,
		"host-addr":     `connect_proxy("` + testHostLocal + `:8443")`,
		"direct-public": `socket.create_connection(("` + testHostIP + `", 8443), timeout=3)`,
		"doc-range":     `connect_proxy("` + testHostOther + `:8080")`,
	})
	want := map[string]string{
		"by-name": "ok: hello 8080", "by-ip": "ok: hello 8080", "plain": "ok: hello 8443",
		"private-ip": "denied: HTTP/1.1 403", "private-name": "denied: HTTP/1.1 403", "loopback": "denied: HTTP/1.1 403",
		"metadata": "denied: HTTP/1.1 403", "host-addr": "denied: HTTP/1.1 403", "direct-public": "err:",
		"doc-range": "denied: HTTP/1.1 403",
	}
	for k, w := range want {
		if !strings.HasPrefix(got[k], w) {
			t.Errorf("%s: %q, want %q...", k, got[k], w)
		}
	}
}

// Every denial is an event in the result, with host, port and reason, and
// the summary an agent can show its model.
func TestNetworkViolationsReported(t *testing.T) {
	newTestNet(t)
	dir := netProfiles(t, testDNS(t))
	script := strings.Replace(probeScript, "PROBES", `[("a", lambda: plain("other.test", 8443)), ("b", lambda: connect_proxy("svc.test:8080")), ("c", lambda: connect_proxy("rebind.test:8443")), ("d", lambda: connect_proxy("`+testHostOther+`:8443"))]`, 1)
	resFile := filepath.Join(t.TempDir(), "r.json")
	cmd := exec.Command(strBin, "run", "--result", resFile, "--profile-dir", dir, "--profile", "nettest-restricted", "--", "/usr/bin/python3", "-c", script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var res struct {
		Violations []struct {
			Kind, Reason, Host, IP string
			Port                   int
		} `json:"violations"`
		Summary string `json:"violation_summary"`
	}
	data, _ := os.ReadFile(resFile)
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"other.test": "name_not_allowlisted", "svc.test:8080": "port_not_allowed",
		"rebind.test:8443": "resolved_private", testHostOther + ":8443": "ip_literal"}
	for dst, reason := range want {
		found := false
		for _, v := range res.Violations {
			key := v.Host
			if key == "" {
				key = v.IP
			}
			if v.Port != 0 && v.Kind == "net" {
				key += ":" + strconv.Itoa(v.Port)
			}
			found = found || (key == dst && v.Reason == reason)
		}
		if !found {
			t.Errorf("no violation %s %s in %s", dst, reason, data)
		}
	}
	if !strings.Contains(res.Summary, "<sandbox_violations>") || !strings.Contains(string(out), "<sandbox_violations>") {
		t.Errorf("summary missing: %q / %s", res.Summary, out)
	}
}

// on_violation: kill ends the sandbox at the first denial, and the result
// says so.
func TestNetworkOnViolationKill(t *testing.T) {
	needRoot(t)
	dir := killProfileDir(t, "nettest-kill")
	resFile := filepath.Join(t.TempDir(), "r.json")
	cmd := exec.Command(strBin, "run", "--result", resFile, "--profile-dir", dir, "--profile", "nettest-kill", "--",
		"/usr/bin/python3", "-c", `
import socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
s.sendall(b"CONNECT evil.example.net:443 HTTP/1.1\r\nHost: evil.example.net\r\n\r\n")
try: s.recv(100)
except Exception: pass
time.sleep(30)
print("survived")`)
	out, _ := cmd.CombinedOutput()
	var res struct {
		Killed bool `json:"killed_for_violation"`
		Signal int  `json:"signal"`
	}
	data, _ := os.ReadFile(resFile)
	if err := json.Unmarshal(data, &res); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !res.Killed || res.Signal != 9 || strings.Contains(string(out), "survived") {
		t.Fatalf("on_violation: kill did not end the sandbox: %s\n%s", data, out)
	}
}

// killProfileDir writes, into a directory of its own, the profile name:
// restrictive's, with a restricted network to api.example.com only and
// on_violation: kill; it returns the directory (for --profile-dir).
func killProfileDir(t *testing.T, name string) string {
	t.Helper()
	base, err := os.ReadFile("../../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(base), "name: restrictive", "name: "+name, 1)
	y = strings.Replace(y, "aliases: [untrusted]", "aliases: []", 1)
	i, j := strings.Index(y, "network:"), strings.Index(y, "hostname:")
	y = y[:i] + "network:\n  policy: restricted\n  allowed_hosts: [api.example.com]\n  on_violation: kill\n" + y[j:]
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
