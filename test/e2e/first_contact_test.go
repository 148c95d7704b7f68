package e2e

// Issue 15 §1 and §6, issue 16 §6: what a new user meets first. A
// reference agent's defaults against a restrictive tool, `str tools`,
// `str invoke` of a tool nobody serves, flags after the tool name, the
// version, `str run --help`, `make demo` with no worker.

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// runStr runs str with args and env and returns its exit code, stdout and
// stderr. A run that does not end is bounded by the test's own timeout.
func runStr(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(strBin, args...)
	cmd.Env = env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("str %q: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestFirstContactWorker: against a real worker.
//   - a reference agent's defaults (sandbox_profile "standard",
//     timeout_seconds 300) call the restrictive tools: clamped, not
//     refused (they were INVALID_REQUEST);
//   - error replies (a traceback, an artifact error, a crash with its
//     stderr) name no path of the worker's host;
//   - str tools lists every tool with its ceiling, network and warm size;
//   - str invoke of a tool nobody serves exits 4 naming the served ones
//     (it used to wait 6 minutes; --wait 5m here, so the old behaviour
//     fails as exit 3 rather than hanging);
//   - str invoke TOOL --profile … --broker …: flags after the tool name
//     count (they were ignored, so this went to the default broker), and
//     the clamp is noted on stderr.
func TestFirstContactWorker(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	w := startWorker(t, e, 0, nil)
	a := newAgent(t, w.port)
	broker := "127.0.0.1:" + strconv.Itoa(w.port)

	t.Run("reference agent defaults", func(t *testing.T) {
		id := a.invoke("execute_python", map[string]any{"args": map[string]any{"code": "result = 6 * 7"},
			"sandbox_profile": "standard", "timeout_seconds": 300})
		if r := a.reply(id, 2*time.Minute); !isSuccess(r) || !strings.Contains(string(r), `"result":"42"`) {
			t.Fatalf("execute_python with the agent's defaults: %s", r)
		}
		if !w.logged("the request's sandbox profile was clamped to the tool's ceiling", id) {
			t.Errorf("no debug line for the clamp of %s", id)
		}
		id = a.invoke("escape_attempt", map[string]any{"sandbox_profile": "permissive", "timeout_seconds": 300})
		if r := a.reply(id, 2*time.Minute); !isSuccess(r) || !strings.Contains(string(r), `"all_blocked":true`) {
			t.Fatalf("escape_attempt asking permissive: %s", r)
		}
		id = a.invoke("echo_tool", map[string]any{"args": map[string]any{"message": "x"}, "sandbox_profile": "nosuch"})
		if code, msg := errorCode(t, a.reply(id, time.Minute)); code != "INVALID_REQUEST" || !strings.Contains(msg, `"nosuch"`) {
			t.Fatalf("unknown profile: %s %q", code, msg)
		}
	})

	t.Run("errors name no host paths", func(t *testing.T) {
		for _, c := range []struct {
			tool   string
			params map[string]any
			code   string
			want   string
		}{
			{"failing_tool", map[string]any{"args": map[string]any{"mode": "raise"}}, "EXECUTION_ERROR", `File "<tools>/example_tools.py"`},
			{"process_file", map[string]any{"artifact_references": map[string]any{"input_file": map[string]any{"filename": "nowhere.txt"}}}, "ARTIFACT_ERROR", "nowhere.txt"},
			{"crash", nil, "SANDBOX_FAILED", "exit code 3"},
		} {
			reply := a.reply(a.invoke(c.tool, c.params), 2*time.Minute)
			code, msg := errorCode(t, reply)
			if code != c.code || !strings.Contains(msg, c.want) || strings.Contains(string(reply), e.root) {
				t.Errorf("%s: %s %q, want %s containing %q and nothing under %s", c.tool, code, msg, c.code, c.want, e.root)
			}
		}
	})

	t.Run("str tools", func(t *testing.T) {
		code, stdout, stderr := runStr(t, cleanEnv(), "tools", "--broker", broker, "--namespace", "e2e/")
		if code != 0 {
			t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
		}
		for _, want := range []string{
			`(?m)^TOOL +PROFILE +NETWORK +WARM +TIMEOUT +WORKERS +STATUS$`,
			`(?m)^echo_tool +standard +allow_egress +0 +300s\+5s +\S+ +serving$`,
			`(?m)^execute_python +restrictive +isolated +0 +300s\+5s +\S+ +serving$`,
			`(?m)^short +standard +allow_egress +0 +1s\+5s +\S+ +serving$`,
		} {
			if !regexp.MustCompile(want).MatchString(stdout) {
				t.Errorf("no line matching %s:\n%s", want, stdout)
			}
		}
		if strings.Contains(stdout, e.root) {
			t.Errorf("the listing names a host path under %s:\n%s", e.root, stdout)
		}
		code, stdout, _ = runStr(t, cleanEnv(), "tools", "--broker", broker, "--namespace", "e2e/", "--json")
		var r struct {
			Version int `json:"version"`
			Tools   []struct {
				Name string `json:"name"`
			} `json:"tools"`
		}
		if code != 0 || json.Unmarshal([]byte(strings.TrimSpace(stdout)), &r) != nil || r.Version != 1 || len(r.Tools) != strings.Count(e2eManifest, "{module:") {
			t.Errorf("--json: exit %d, %+v\n%s", code, r, stdout)
		}
	})

	t.Run("invoke a tool nobody serves", func(t *testing.T) {
		code, stdout, stderr := runStr(t, cleanEnv(), "invoke", "nobody_serves_this", "--broker", broker, "--namespace", "e2e/", "--wait", "5m")
		if code != 4 || !strings.Contains(stderr, `no worker serves "nobody_serves_this" in namespace "e2e/"`) ||
			!strings.Contains(stderr, "echo_tool, escape_attempt, execute_python") || stdout != "" {
			t.Fatalf("exit %d, want 4\nstdout: %s\nstderr: %s", code, stdout, stderr)
		}
	})

	t.Run("flags after the tool name", func(t *testing.T) {
		code, stdout, stderr := runStr(t, cleanEnv(), "invoke", "--namespace", "e2e/", "execute_python",
			"--profile", "standard", "--broker", broker, "--args", `{"code":"result = 1 + 1"}`, "--timeout", "60")
		if code != 0 || !strings.Contains(stdout, `"result":"2"`) ||
			!strings.Contains(stderr, "stricter profile than asked (standard->restrictive") {
			t.Fatalf("exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
		}
		code, _, stderr = runStr(t, cleanEnv(), "invoke", "echo_tool", "other_tool", "--broker", broker)
		if code != 2 || !strings.Contains(stderr, `one TOOL, got ["echo_tool" "other_tool"]`) {
			t.Fatalf("two tools: exit %d\nstderr: %s", code, stderr)
		}
	})
}

// TestFirstContactNoWorker: a broker with no worker behind it. str tools
// says "no worker is serving" and exits 1; make demo's script says the
// same and stops, instead of running its steps against nobody ("(timed
// out as expected)", "something was NOT blocked").
func TestFirstContactNoWorker(t *testing.T) {
	port, _ := startStrBroker(t)
	broker := "127.0.0.1:" + strconv.Itoa(port)
	code, stdout, stderr := runStr(t, cleanEnv(), "tools", "--broker", broker, "--namespace", "e2e/", "--wait", "1s")
	if code != 1 || !strings.Contains(stderr, `no worker is serving namespace "e2e/"`) || stdout != "" {
		t.Fatalf("str tools: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	demo := exec.Command("../../scripts/demo.sh")
	demo.Env = cleanEnv("STR="+strBin, "BROKER="+broker, "SAM_NAMESPACE=e2e/")
	out, err := demo.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "demo: no worker is serving namespace e2e/ on "+broker) ||
		strings.Contains(string(out), "as expected") || strings.Contains(string(out), "NOT blocked") || strings.Contains(string(out), "=== 1.") {
		t.Fatalf("demo.sh: %v\n%s", err, out)
	}
}

// TestFirstContactCLI: str --version and str version, str run --help
// (exit 0), str invoke --help on --profile and the 5 s.
func TestFirstContactCLI(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, stdout, stderr := runStr(t, cleanEnv(), args...)
		if code != 0 || !regexp.MustCompile(`^str \S+ \(.*\), go1\.\d+`).MatchString(stdout) {
			t.Errorf("str %s: exit %d\nstdout: %s\nstderr: %s", args[0], code, stdout, stderr)
		}
	}
	if code, _, stderr := runStr(t, cleanEnv(), "run", "--help"); code != 0 || !strings.Contains(stderr, "usage: str run") {
		t.Errorf("str run --help: exit %d\n%s", code, stderr)
	}
	code, stdout, stderr := runStr(t, cleanEnv(), "invoke", "--help")
	help := stdout + stderr
	if code != 0 || !strings.Contains(help, "the stricter of it and the tool's ceiling") || !strings.Contains(help, "5 s more") ||
		!strings.Contains(help, "a looser one is clamped, never refused") {
		t.Errorf("str invoke --help: exit %d\n%s", code, help)
	}
}

// TestFirstContactNetMessage: the --net over-limit message reads like the
// other limits' (it was `network "allow_egress" asked, a narrowing of
// "isolated" (…)`).
func TestFirstContactNetMessage(t *testing.T) {
	requireRoot(t)
	code, _, stderr := runStr(t, cleanEnv(), "run", "--profile", "restrictive", "--net", "allow_egress", "--", "/bin/true")
	if code != 125 || !strings.Contains(stderr, "profile restrictive: network allow_egress asked, at most isolated allowed (overrides may only tighten)") {
		t.Errorf("--net over the limit: exit %d\n%s", code, stderr)
	}
}
