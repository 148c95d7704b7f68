package integration

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/helper"
	"github.com/securetoolruntime/str/egress/proxy"
	"github.com/securetoolruntime/str/internal/mustwork"
)

// The secretless-credential test: HTTPS servers in the test host's network
// namespace with their own CA (svc.test:9443 holds the credential's host,
// private.test:9444 is another allowed host with an HTTP rule), and a tool
// in a real sandbox (str run) that calls them with Python and curl. The
// servers see the real value; the sandbox never does.

// credServer is the Python HTTPS server run in the test host's netns: each
// request is one JSON line on stdout; the response echoes the
// Authorization header (so the proxy's scrubbing is exercised).
const credServer = `
import json, ssl, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
lock = threading.Lock()
class H(BaseHTTPRequestHandler):
    def handle_one_request(self):
        super().handle_one_request()
    def do_ANY(self):
        auth = self.headers.get("Authorization", "")
        with lock:
            print(json.dumps({"port": self.server.server_port, "method": self.command, "path": self.path, "auth": auth}), flush=True)
        body = json.dumps({"you_sent": auth}).encode()
        self.send_response(200)
        self.send_header("X-Echo", auth)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_DELETE = do_ANY
    def log_message(self, *a): pass
def serve(port, cert, key):
    srv = ThreadingHTTPServer(("0.0.0.0", port), H)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
serve(9443, sys.argv[1] + "/svc.pem", sys.argv[1] + "/svc.key")
serve(9444, sys.argv[1] + "/private.pem", sys.argv[1] + "/private.key")
print("ready", flush=True)
threading.Event().wait()
`

// credTool runs inside the sandbox. It calls svc.test with the placeholder
// (urllib and curl), sends the placeholder to private.test, asks
// private.test for a method its rule refuses, then looks for anything
// shaped like the secret (strtest- and 32 hex digits) in its environment,
// every process's environ and cmdline, the files it can read, and its own
// memory. It prints one JSON object.
const credTool = `
import json, os, re, stat, subprocess, urllib.request, urllib.error
out = {}
tok = os.environ.get("API_TOKEN", "")
out["placeholder_shape"] = tok.startswith("str-placeholder-")
def call(url, method="GET"):
    req = urllib.request.Request(url, method=method, headers={"Authorization": "Bearer " + tok})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return {"status": r.status, "body": r.read().decode(), "echo": r.headers.get("X-Echo", "")}
    except urllib.error.HTTPError as e:
        return {"status": e.code, "reason": e.headers.get("X-Str-Reason", ""), "body": e.read().decode()}
    except Exception as e:
        return {"error": str(e)}
out["urllib"] = call("https://svc.test:9443/user")
c = subprocess.run(["curl", "-sS", "-H", "Authorization: Bearer " + tok, "https://svc.test:9443/curl"], capture_output=True, text=True, timeout=20)
out["curl"] = {"rc": c.returncode, "body": c.stdout, "err": c.stderr}
req = urllib.request.Request("https://private.test:9444/public/x?leak=" + tok)
try:
    urllib.request.urlopen(req, timeout=10)
    out["leak"] = {"status": 200}
except urllib.error.HTTPError as e:
    out["leak"] = {"status": e.code, "reason": e.headers.get("X-Str-Reason", "")}
out["delete"] = call("https://private.test:9444/public/x", "DELETE")
pat = re.compile(rb"strtest-[0-9a-f]{32}")
# A decoy of the secret's shape, made at run time, proves the memory scan
# finds what is there; it is the only match allowed.
decoy = ("strtest-" + "ab" * 16).encode()
decoy_seen = False
found = []
for k, v in os.environ.items():
    if pat.search((k + "=" + v).encode()): found.append("env:" + k)
for pid in os.listdir("/proc"):
    if not pid.isdigit(): continue
    for f in ("environ", "cmdline"):
        try:
            if pat.search(open("/proc/%s/%s" % (pid, f), "rb").read()): found.append("/proc/%s/%s" % (pid, f))
        except OSError: pass
for top in ("/etc", "/tmp", "/var", "/run", "/home", os.getcwd()):
    for root, dirs, files in os.walk(top):
        for n in files:
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode) and st.st_size < (16 << 20) and pat.search(open(p, "rb").read()): found.append(p)
            except OSError: pass
mem = 0
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as m:
    for line in maps:
        addr, perms = line.split()[:2]
        if not perms.startswith("r") or "[vvar]" in line or "[vsyscall]" in line: continue
        lo, hi = (int(x, 16) for x in addr.split("-"))
        try:
            m.seek(lo); data = m.read(hi - lo)
        except (OSError, OverflowError, ValueError): continue
        mem += len(data)
        for hit in pat.findall(data):
            if hit == decoy: decoy_seen = True
            else: found.append("memory:" + line.split()[-1])
out["scanned_memory"] = mem
out["decoy_seen"] = decoy_seen
out["found"] = found
print(json.dumps(out))
`

func TestSecretlessCredential(t *testing.T) {
	tn := newTestNet(t)
	dns := testDNS(t)
	if _, err := exec.LookPath("curl"); err != nil {
		mustwork.Skip(t, "needs curl on the host (bound into the sandbox with /usr)")
	}

	// The servers' own CA (not the proxy's), and the worker's extra roots.
	certDir := t.TempDir()
	serverCA, err := proxy.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	for name, host := range map[string]string{"svc": "svc.test", "private": "private.test"} {
		leaf, err := serverCA.Leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		var chain bytes.Buffer
		for _, der := range leaf.Certificate {
			pem.Encode(&chain, &pem.Block{Type: "CERTIFICATE", Bytes: der})
		}
		key, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(certDir, name+".pem"), chain.Bytes())
		writeFile(t, filepath.Join(certDir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}))
	}
	roots := filepath.Join(certDir, "roots.pem")
	writeFile(t, roots, serverCA.CertPEM())

	// The servers, in the test host's namespace.
	srv := exec.Command("ip", "netns", "exec", tn.ns, "/usr/bin/python3", "-c", credServer, certDir)
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		t.Fatalf("HTTPS test servers did not start: %q", lines.Text())
	}
	var mu sync.Mutex
	var seen []map[string]any
	go func() {
		for lines.Scan() {
			var m map[string]any
			if json.Unmarshal(lines.Bytes(), &m) == nil {
				mu.Lock()
				seen = append(seen, m)
				mu.Unlock()
			}
		}
	}()

	// The profile: restricted to the two hosts, an HTTP rule on the second.
	base, err := os.ReadFile("../../profiles/restrictive.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := strings.Replace(string(base), "name: restrictive", "name: credtest", 1)
	y = strings.Replace(y, "aliases: [untrusted]", "aliases: []", 1)
	i, j := strings.Index(y, "network:"), strings.Index(y, "hostname:")
	y = y[:i] + `network:
  policy: restricted
  allowed_hosts: [svc.test, private.test]
  allowed_ports: [9443, 9444]
  allowed_cidrs: [` + testHostIP + `/32, ` + testHostPriv + `/32]
  dns_servers: ["` + dns + `"]
  http_rules:
    - {host: private.test, methods: [GET], paths: [/public/]}
` + y[j:]
	pdir := t.TempDir()
	writeFile(t, filepath.Join(pdir, "credtest.yaml"), []byte(y))

	var rnd [16]byte
	rand.Read(rnd[:])
	secret := "strtest-" + hex.EncodeToString(rnd[:])
	resFile := filepath.Join(t.TempDir(), "r.json")
	cmd := exec.Command(strBin, "run", "--result", resFile, "--profile-dir", pdir, "--profile", "credtest",
		"--credential", "API_TOKEN=env:CRED_TEST_SECRET",
		"--credential-host", "API_TOKEN=svc.test",
		"--credential-header", "API_TOKEN=Authorization: Bearer {value}",
		"--", "/usr/bin/python3", "-c", credTool)
	cmd.Env = append(os.Environ(), "CRED_TEST_SECRET="+secret, helper.ExtraRootsEnv+"="+roots)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("str run: %v\nstdout %s\nstderr %s", err, out.String(), errb.String())
	}
	if strings.Contains(out.String(), secret) || strings.Contains(errb.String(), secret) {
		t.Errorf("the secret is in the tool's output or str run's messages")
	}
	var got struct {
		PlaceholderShape bool           `json:"placeholder_shape"`
		URLLib           map[string]any `json:"urllib"`
		Curl             map[string]any `json:"curl"`
		Leak, Delete     map[string]any `json:"-"`
		Found            []string       `json:"found"`
		Scanned          int64          `json:"scanned_memory"`
		DecoySeen        bool           `json:"decoy_seen"`
	}
	last := strings.TrimSpace(out.String())
	last = last[strings.LastIndexByte(last, '\n')+1:]
	if err := json.Unmarshal([]byte(last), &got); err != nil {
		t.Fatalf("tool output: %v\n%s\nstderr %s", err, out.String(), errb.String())
	}
	var rest map[string]map[string]any
	json.Unmarshal([]byte(last), &rest)
	got.Leak, got.Delete = rest["leak"], rest["delete"]

	if !got.PlaceholderShape {
		t.Errorf("API_TOKEN in the sandbox is not a placeholder")
	}
	if len(got.Found) > 0 {
		t.Errorf("the sandbox found the secret in: %v", got.Found)
	}
	if got.Scanned < 1<<20 || !got.DecoySeen {
		t.Errorf("the memory scan read only %d bytes, or missed the decoy (seen: %v)", got.Scanned, got.DecoySeen)
	}
	if got.URLLib["status"] != float64(200) || !strings.Contains(got.URLLib["body"].(string), "str-placeholder-") {
		t.Errorf("urllib call: %v", got.URLLib)
	}
	if got.Curl["rc"] != float64(0) || !strings.Contains(got.Curl["body"].(string), "str-placeholder-") {
		t.Errorf("curl call: %v", got.Curl)
	}
	if got.Leak["status"] != float64(403) || got.Leak["reason"] != egress.ReasonCredentialHost {
		t.Errorf("placeholder to private.test: %v", got.Leak)
	}
	if got.Delete["status"] != float64(403) || got.Delete["reason"] != egress.ReasonMethodNotAllowed {
		t.Errorf("DELETE on private.test: %v", got.Delete)
	}

	// What the servers saw: the real value, at svc.test only, twice.
	time.Sleep(200 * time.Millisecond) // the reader goroutine drains the pipe
	mu.Lock()
	defer mu.Unlock()
	var svcAuth []string
	for _, m := range seen {
		if m["port"] == float64(9443) {
			svcAuth = append(svcAuth, m["auth"].(string))
		} else {
			t.Errorf("private.test received %v", m)
		}
	}
	if len(svcAuth) != 2 || svcAuth[0] != "Bearer "+secret || svcAuth[1] != "Bearer "+secret {
		t.Errorf("svc.test saw %d requests, want 2 (urllib, curl) carrying the real value", len(svcAuth))
	}

	// The result names the violations; never the value.
	data, _ := os.ReadFile(resFile)
	if strings.Contains(string(data), secret) {
		t.Errorf("the secret is in the result")
	}
	var res struct {
		Violations []egress.Event `json:"violations"`
	}
	json.Unmarshal(data, &res)
	var kinds []string
	for _, v := range res.Violations {
		kinds = append(kinds, v.Kind+"/"+v.Reason+"/"+v.Host)
	}
	for _, want := range []string{"credential/" + egress.ReasonCredentialHost + "/private.test", "net/" + egress.ReasonMethodNotAllowed + "/private.test"} {
		if !strings.Contains(strings.Join(kinds, " "), want) {
			t.Errorf("no violation %s in %v", want, kinds)
		}
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
