package integration

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/worker/runner"
)

// netTemplate starts a template of net_tool (testdata/template) under
// the nettest-restricted profile (network_test.go): svc.test on 8443
// allowed, everything else refused.
func netTemplate(t *testing.T) *template.Template {
	t.Helper()
	newTestNet(t)
	dir := netProfiles(t, testDNS(t))
	tpl, err := templateIn(t, dir, "nettest-restricted", "net_tool", "probe", "")
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// violation reports whether report has a denial of dst ("host:port" or
// "host") for reason.
func violation(report provider.NetworkReport, dst, reason string) bool {
	for _, v := range report.Violations {
		key := v.Host
		if key == "" {
			key = v.IP
		}
		if v.Port != 0 && v.Kind == egress.KindNet {
			key += ":" + strconv.Itoa(v.Port)
		}
		if key == dst && v.Reason == reason {
			return true
		}
	}
	return false
}

// A template call of a tool with an allow-list has a cold call's egress:
// the proxy variables, the proxy and the DNS stub on its own lo, served
// with the tool's policy. The allowed host answers (CONNECT, and a plain
// connect after the stub's answer); a refused host, a refused port and a
// direct connect do not, and the refusals are in the call's report.
func TestTemplateCallNetwork(t *testing.T) {
	tpl := netTemplate(t)
	res, got := templateCall(t, tpl, "net_tool", "probe", map[string]any{"probes": [][]any{
		{"allowed", "proxy", "svc.test", 8443},
		{"allowed_plain", "plain", "svc.test", 8443},
		{"other_name", "proxy", "other.test", 8443},
		{"other_port", "proxy", "svc.test", 8080},
		{"direct", "plain", testHostIP, 8443},
	}})
	if res == nil {
		t.FailNow()
	}
	env, _ := got["env"].(map[string]any)
	if env["HTTPS_PROXY"] != "http://"+egress.ProxyAddr || env["STR_NETWORK"] != "restricted" {
		t.Errorf("the call's environment: %v, want the proxy at %s and STR_NETWORK=restricted", env, egress.ProxyAddr)
	}
	for name, want := range map[string]string{"allowed": "ok: hello 8443", "allowed_plain": "ok: hello 8443"} {
		if got[name] != want {
			t.Errorf("%s: %v, want %q", name, got[name], want)
		}
	}
	for _, name := range []string{"other_name", "other_port", "direct"} {
		if s, _ := got[name].(string); strings.HasPrefix(s, "ok") || s == "" {
			t.Errorf("%s: %q, want a refusal", name, s)
		}
	}
	for dst, reason := range map[string]string{"other.test:8443": "not_allowlisted", "svc.test:8080": "port_not_allowed"} {
		if !violation(res.Network, dst, reason) {
			t.Errorf("no violation %s %s in the call's report %+v", dst, reason, res.Network)
		}
	}
	if !strings.Contains(res.Network.Summary, "<sandbox_violations>") {
		t.Errorf("the call's report has no summary: %+v", res.Network)
	}
}

// Two calls of one template at once: each call's refusals are in its own
// report only (a session per call), and both reach the allowed host.
func TestTemplateCallNetworkPerCall(t *testing.T) {
	tpl := netTemplate(t)
	names := []string{"first-call.test", "second-call.test"}
	reports := make([]provider.NetworkReport, len(names))
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// hold: both calls are alive together (their refusals made
			// while the other's session serves).
			res, got := templateCall(t, tpl, "net_tool", "probe", map[string]any{"hold": 2, "probes": [][]any{
				{"refused", "proxy", name, 8443},
				{"allowed", "proxy", "svc.test", 8443},
			}})
			if res == nil {
				return
			}
			if got["allowed"] != "ok: hello 8443" {
				t.Errorf("call %d: allowed: %v", i, got["allowed"])
			}
			reports[i] = res.Network
		}()
	}
	wg.Wait()
	for i, name := range names {
		if !violation(reports[i], name+":8443", "not_allowlisted") {
			t.Errorf("call %d: its refusal of %s is not in its report %+v", i, name, reports[i])
		}
		other := names[1-i]
		for _, v := range reports[i].Violations {
			if v.Host == other {
				t.Errorf("call %d: the other call's refusal of %s is in its report %+v", i, other, reports[i])
			}
		}
	}
}

// The worker runs a tool with a network policy in its template (warm:
// template) and replies with the call's denials, as for a cold call: the
// allowed host answers, a refused one is in the reply's violations.
func TestWorkerTemplateNetwork(t *testing.T) {
	newTestNet(t)
	profileDir := netProfiles(t, testDNS(t))
	dir, tools := templateWorkerDir(t, "str-it-tplnet-")
	src, err := os.ReadFile("testdata/template/net_tool.py")
	if err != nil {
		t.Fatal(err)
	}
	tool := string(src) + `

def fetch(ctx, probes):
    out = probe(probes)
    with open("/proc/self/uid_map") as f:
        out["lower"] = int(f.read().split()[1])
    return out
`
	if err := os.WriteFile(filepath.Join(tools, "tpl_net.py"), []byte(tool), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(manifest, []byte(`version: 1
tools:
  fetch: {module: tpl_net, function: fetch, timeout_seconds: 60, sandbox_profile: nettest-restricted, warm: template, network: {policy: restricted, allowed_hosts: [svc.test], allowed_ports: [8443]}}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	broker, health := freeTCPPort(t), freeTCPPort(t)
	w := startWorker(t, broker, health, map[string]string{
		"SAM_NAMESPACE": "it/", "MANIFEST_PATH": manifest, "TOOLS_PYTHON_DIR": tools, "SANDBOX_PROFILE_DIR": profileDir,
		"SANDBOX_WORK_DIR": filepath.Join(dir, "work"), "STR_RUNNER_DIR": filepath.Join(dir, "runner"), "STR_SITE_DIR": filepath.Join(dir, "site"),
		"ARTIFACT_SERVICE_TYPE": "filesystem", "ARTIFACT_BASE_PATH": filepath.Join(dir, "artifacts"),
	})
	for i := range 2 {
		r, out := invoke(t, broker, "fetch", `{"probes": [["allowed", "proxy", "svc.test", 8443], ["refused", "proxy", "other.test", 8443]]}`)
		if r.Result == nil || r.Result.TimedOut {
			t.Fatalf("call %d: no result; output:\n%s\nworker log:\n%s", i, out, w.log.String())
		}
		got := r.Result.ToolResult
		if lower, _ := got["lower"].(float64); lower < 100000 {
			t.Errorf("call %d: uid_map lower id %v: not a template call's\nworker log:\n%s", i, got["lower"], w.log.String())
		}
		if got["allowed"] != "ok: hello 8443" {
			t.Errorf("call %d: allowed: %v", i, got["allowed"])
		}
		if s, _ := got["refused"].(string); !strings.HasPrefix(s, "denied") {
			t.Errorf("call %d: refused: %q, want a refusal", i, s)
		}
		var rep struct {
			Result struct {
				Violations []egress.Event `json:"violations"`
			} `json:"result"`
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rep); err != nil {
			t.Fatal(err)
		}
		if !violation(provider.NetworkReport{Violations: rep.Result.Violations}, "other.test:8443", "not_allowlisted") || len(rep.Result.Violations) != 1 {
			t.Errorf("call %d: violations %+v, want this call's refusal of other.test:8443 only", i, rep.Result.Violations)
		}
	}
	if !strings.Contains(w.log.String(), "template started") {
		t.Errorf("the worker log does not say it started a template:\n%s", w.log.String())
	}
}

// on_violation: kill ends the call that broke the policy (not the
// template: its next call is served) and says so, with the denial in
// that call's report.
func TestTemplateCallNetworkKill(t *testing.T) {
	dir := killProfileDir(t, "nettest-tplkill")
	tpl, err := templateIn(t, dir, "nettest-tplkill", "net_tool", "probe", "")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"hold": 60, "probes": [][]any{{"evil", "proxy", "evil.example.net", 443}}})
	a, err := runner.EncodeArgs(&runner.Args{Module: "net_tool", Function: "probe", Args: raw, ResultFile: "/dev/null", OutputDir: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := tpl.Call(context.Background(), a, template.CallOptions{Timeout: 5 * time.Minute})
	if err != nil {
		t.Fatalf("template call: %v", err)
	}
	if !res.KilledForViolation || res.TimedOut || len(res.Document) != 0 {
		t.Fatalf("on_violation: kill did not end the call: killed %v, timed out %v, document %s", res.KilledForViolation, res.TimedOut, res.Document)
	}
	if !violation(res.Network, "evil.example.net:443", "not_allowlisted") {
		t.Errorf("the killed call's report %+v lacks its denial", res.Network)
	}
	if _, got := templateCall(t, tpl, "net_tool", "probe", map[string]any{"probes": [][]any{}}); got == nil {
		t.Errorf("the template did not serve the next call")
	}
}
