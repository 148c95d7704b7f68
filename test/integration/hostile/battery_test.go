package hostile

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
)

// The manifest: one tool per profile, all the same function (attack),
// which runs the case named in its arguments.
const manifest = `version: 1
tools:
  h_restrictive: {module: hostile_tools, function: attack, sandbox_profile: restrictive, timeout_seconds: 120}
  h_confidential: {module: hostile_tools, function: attack, sandbox_profile: confidential, timeout_seconds: 120}
  h_standard: {module: hostile_tools, function: attack, sandbox_profile: standard, timeout_seconds: 120}
  h_permissive: {module: hostile_tools, function: attack, sandbox_profile: permissive, timeout_seconds: 120}
  h_short: {module: hostile_tools, function: attack, sandbox_profile: restrictive, timeout_seconds: 2}
  h_restricted: {module: hostile_tools, function: attack, sandbox_profile: standard, timeout_seconds: 120, network: {policy: restricted, allowed_hosts: [api.example.com], allowed_ports: [443]}}
  self_check: {module: example_tools, function: self_check, sandbox_profile: restrictive}
  self_check_standard: {module: example_tools, function: self_check, sandbox_profile: standard}
`

// hcase is one attempt: the tool of its profile runs the Python case py
// (default: name) with args, where "{var}" in a string is replaced by the
// harness's value (ports, paths, secrets of this run). The outcome must
// be exactly want (the tool result's "outcome"), or the error code (and
// a message containing msg), or a timeout; check adds assertions; run
// replaces the whole sequence for a case of several calls.
type hcase struct {
	name, profile, py string
	args              map[string]any
	params            map[string]any // request fields (artifact references, ids)
	want              string
	code, msg         string
	timedOut          bool
	check             func(t *testing.T, h *harness, r reply, res map[string]any)
	run               func(t *testing.T, h *harness, c hcase)
}

// harness is one worker and what the cases aim at.
type harness struct {
	e       *env
	w       *workerProc
	a       *agent
	vars    map[string]string
	accepts atomic.Int64 // connections the host listeners accepted
	secret  string
	hostTxt string
	mode    cgroupMode // the hierarchy the sandboxes' limits go through
}

const rpcWait = 5 * time.Minute // bound on one reply: cases queue behind each other

func (h *harness) sub(v any) any {
	switch x := v.(type) {
	case string:
		for k, val := range h.vars {
			x = strings.ReplaceAll(x, "{"+k+"}", val)
		}
		return x
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = h.sub(x[i])
		}
		return out
	case map[string]any:
		out := map[string]any{}
		for k, val := range x {
			out[k] = h.sub(val)
		}
		return out
	}
	return v
}

// call runs one case's tool and returns its reply.
func (h *harness) call(t *testing.T, profile, py string, args, params map[string]any) (reply, map[string]any, []byte, string) {
	t.Helper()
	a := map[string]any{"case": py}
	for k, v := range args {
		a[k] = h.sub(v)
	}
	p := map[string]any{"args": a, "session_id": "s-" + strings.ReplaceAll(py, "_", "-")}
	for k, v := range params {
		p[k] = h.sub(v)
	}
	id := h.a.invoke("h_"+profile, p)
	raw := h.a.reply(t, id, rpcWait)
	var r reply
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("reply: %v\n%.2000s", err, raw)
	}
	var res map[string]any
	if r.Result != nil {
		_ = json.Unmarshal(r.Result.ToolResult, &res)
	}
	return r, res, raw, id
}

func TestHostile(t *testing.T) {
	requireRoot(t)
	h := &harness{e: newEnv(t, manifest), secret: fmt.Sprintf("STR-PLANTED-SECRET-%d", time.Now().UnixNano()), mode: hostCgroupMode(t)}
	t.Logf("cgroup mode: %s", h.mode)
	int80, int80Why := int80Want()
	t.Logf("int80_syscall wants %s: %s", int80, int80Why)
	h.hostTxt = "HOST-ONLY-" + h.secret
	hostFile := filepath.Join(h.e.root, "host-secret.txt")
	must(t, os.WriteFile(hostFile, []byte(h.hostTxt), 0o644)) // world-readable: only the mount namespace hides it
	// A setuid-root copy of id(1) in the tools dir (bound read-only).
	copyFile(t, "/usr/bin/id", filepath.Join(h.e.tools, "suid-id"))
	must(t, os.Chmod(filepath.Join(h.e.tools, "suid-id"), 0o4755))
	// Another user's artifacts, in the reference layout.
	for _, rel := range []string{"u-2/s-1/secret.txt", "u-2/user/secret.txt", "u-1/s-1/mine.txt"} {
		dir := filepath.Join(h.e.artifacts, "e2e", rel)
		must(t, os.MkdirAll(dir, 0o755))
		must(t, os.WriteFile(filepath.Join(dir, "0"), []byte("U2-SECRET"), 0o644))
		must(t, os.WriteFile(filepath.Join(dir, "0.meta"), []byte(`{"mime_type": "text/plain"}`), 0o644))
	}

	// Host listeners the sandbox must not reach: TCP on 127.0.0.1 and on
	// the host's other address, and an abstract unix socket.
	listen := func(network, addr string) net.Listener { return countingListener(t, network, addr, &h.accepts) }
	lo := listen("tcp", "127.0.0.1:0")
	abstract := fmt.Sprintf("str-hostile-%d", os.Getpid())
	listen("unix", "@"+abstract)
	hostAddr := hostAddress()
	hostPort := "1"
	if hostAddr != "" {
		hostPort = strconv.Itoa(listen("tcp", hostAddr+":0").Addr().(*net.TCPAddr).Port)
	}

	h.w = startWorker(t, h.e, map[string]string{"STR_TEST_SECRET": h.secret, "SANDBOX_MAX_CONCURRENT": "6",
		"STR_USER_MAX_RUNNING": "6"}) // one user runs the whole battery: all its slots
	h.a = newAgent(t, h.w.port)
	h.vars = map[string]string{
		"broker": strconv.Itoa(h.w.port), "health": strconv.Itoa(h.w.health),
		"listener": strconv.Itoa(lo.Addr().(*net.TCPAddr).Port), "hostaddr": hostAddr, "hostport": hostPort,
		"abstract": abstract, "secret": h.secret, "hostfile": hostFile, "manifest": h.e.manifest,
		"token": tokenFile(h.w.port), "workerpid": strconv.Itoa(h.w.cmd.Process.Pid), "testpid": strconv.Itoa(os.Getpid()),
		"work": h.e.work, "artifacts": h.e.artifacts,
	}

	// After every case: nothing reached the host listeners, no stored
	// artifact holds the host file or the planted secret, the worker serves.
	t.Cleanup(func() {
		if n := h.accepts.Load(); n != 0 {
			t.Errorf("the host's listeners accepted %d connections from sandboxes", n)
		}
		filepath.WalkDir(h.e.artifacts, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				b, _ := os.ReadFile(p)
				if strings.Contains(string(b), h.hostTxt) || strings.Contains(string(b), h.secret) {
					t.Errorf("stored artifact %s holds a host secret", p)
				}
			}
			return nil
		})
		if code, _ := h.w.get("/readyz"); code != 200 || !h.w.alive() {
			t.Errorf("the worker is not ready after the battery (readyz %d)", code)
		}
		if templateMode {
			checkTemplated(t, h.w)
		}
	})

	// Not a case of the table (SECURITY.md names those): the mode the
	// battery asserts is the mode its sandboxes really ran in.
	t.Run(cgroupModeCase, func(t *testing.T) {
		t.Parallel()
		checkCgroupMode(t, h, h.mode)
	})
	for _, c := range cases() {
		c := c
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if c.profile == "" || (c.want == "" && c.code == "" && !c.timedOut && c.check == nil && c.run == nil) {
				t.Fatalf("case %s says neither its profile nor its outcome", c.name)
			}
			if c.run != nil {
				c.run(t, h, c)
				return
			}
			py := c.py
			if py == "" {
				py = c.name
			}
			if templateMode {
				c = templateVariant(c)
			}
			r, res, raw, _ := h.call(t, c.profile, py, c.args, c.params)
			switch {
			case c.code != "":
				if r.Error == nil || r.Error.Code != c.code || !strings.Contains(r.Error.Message, c.msg) {
					t.Fatalf("want error %s (%q), got %.3000s", c.code, c.msg, raw)
				}
			case c.timedOut:
				if r.Result == nil || !r.Result.TimedOut {
					t.Fatalf("want a timed_out reply, got %.3000s", raw)
				}
			case c.want != "":
				if r.Result == nil || res["outcome"] != c.want {
					t.Fatalf("outcome: want %q, got %.3000s", c.want, raw)
				}
			default:
				if r.Result == nil {
					t.Fatalf("want a result, got %.3000s", raw)
				}
			}
			if c.check != nil {
				c.check(t, h, r, res)
			}
		})
	}
}

// templateVariant is a case as a template call (STR_HOSTILE_TEMPLATE=1)
// answers it where that differs from a cold call. Each answer is the same
// protection, reached earlier or more strictly (SECURITY.md "Per-tool
// templates"); everything else wants the cold answer. A template call's
// network is a cold call's (the egress listeners on its own lo, the
// tool's policy), so the network cases want the cold answers.
func templateVariant(c hcase) hcase {
	switch {
	case strings.HasPrefix(c.name, "net_interfaces_"):
		// if_nameindex asks netlink, which a template call's filter
		// refuses outright (seccomp.CallPolicy: EPERM to every netlink,
		// raw and packet socket): the tool learns nothing of any
		// interface, where a cold call learns that it has lo only.
		c.want, c.code, c.msg = "", "EXECUTION_ERROR", "PermissionError"
	case c.name == "socket_families":
		// The same six sockets refused, by seccomp in both. Netlink
		// (audit, uevent) and packet sockets meet two filters in a
		// template call: the profile's (its EAFNOSUPPORT rule answers
		// them in a cold call) and, stacked on it, the call filter
		// (seccomp.CallPolicy: EPERM to every netlink, raw and packet
		// socket); between two errno answers the kernel returns the
		// later filter's. Raw IP, vsock and AF_ALG answer as cold.
		c.want = "EPERM,EPERM,EPERM,EPERM,EAFNOSUPPORT,EAFNOSUPPORT"
	case c.name == "setuid_root":
		// The tool stays its own uid either way. A template call's user
		// namespace maps the profile's uid alone, so uid 0 does not exist
		// there: setuid(0) and setresuid(0, 0, 0) are EINVAL (the kernel
		// checks the id is mapped before the capability); a cold
		// sandbox's namespace maps its init's uid 0 too, so there they
		// are EPERM (no CAP_SETUID). setgroups is EPERM in both
		// (setgroups denied in the user namespace).
		c.want = "EINVAL,EPERM,EINVAL"
	}
	return c
}

// checkTemplated: in template mode every tool of the manifest served
// calls from a template, and no call fell back to a cold sandbox because
// its template could not start or it was not eligible (a template the
// launcher refused would otherwise let the battery pass on cold calls).
func checkTemplated(t *testing.T, w *workerProc) {
	t.Helper()
	_, page := w.get("/metrics")
	t.Logf("template metrics:\n%s", strings.Join(regexp.MustCompile(`(?m)^str_worker_template.*$`).FindAllString(page, -1), "\n"))
	for _, m := range regexp.MustCompile(`(?m)^str_worker_template_fallbacks_total\{reason="([a-z_]+)"\} (\d+)$`).FindAllStringSubmatch(page, -1) {
		if m[1] != "retired_before_call" && m[2] != "0" {
			t.Errorf("%s calls ran cold (str_worker_template_fallbacks_total{reason=%q}): the worker log says why", m[2], m[1])
		}
	}
	for _, line := range strings.Split(manifest, "\n") {
		tool, _, ok := strings.Cut(strings.TrimSpace(line), ": {")
		if !ok || !strings.HasPrefix(tool, "h_") {
			continue
		}
		if !regexp.MustCompile(`(?m)^str_worker_template_calls_total\{tool="` + tool + `"\} [1-9]`).MatchString(page) {
			t.Errorf("no call of %s was served by a template", tool)
		}
	}
}

func tokenFile(port int) string { return broker.TokenFileFor(port) }

// created is the sorted list of stored output names.
func created(r reply) []string {
	var out []string
	if r.Result != nil {
		for _, c := range r.Result.Created {
			out = append(out, c.Filename)
		}
	}
	return out
}

func onlyOK(t *testing.T, _ *harness, r reply, _ map[string]any) {
	t.Helper()
	if got := strings.Join(created(r), ","); got != "ok.txt" {
		t.Fatalf("stored outputs %q, want only ok.txt", got)
	}
}

// per expands one case over several profiles (name_profile).
func per(profiles []string, c hcase) []hcase {
	var out []hcase
	for _, p := range profiles {
		d := c
		d.profile = p
		d.name = c.name + "_" + p
		if d.py == "" {
			d.py = c.name
		}
		out = append(out, d)
	}
	return out
}

var (
	all      = []string{"restrictive", "confidential", "standard", "permissive"}
	isolated = []string{"restrictive", "confidential"}
	egress   = []string{"standard", "permissive"}
)
