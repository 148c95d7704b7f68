package container_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// documentedRun is the code block of docs/deployment.md ("Docker") that
// starts the worker with docker run and calls it from the host with str
// invoke: the lines, continuations joined.
func documentedRun(t *testing.T, root string) (run, call string) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join(root, "docs", "deployment.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	for _, b := range blocks {
		text := strings.ReplaceAll(b[1], "\\\n", " ")
		if !strings.Contains(text, "docker run -d --name str-worker") {
			continue
		}
		for _, line := range strings.Split(text, "\n") {
			switch {
			case strings.HasPrefix(line, "docker run "):
				run = line
			case strings.HasPrefix(line, "bin/str invoke "):
				call = line
			}
		}
		if run == "" || call == "" {
			t.Fatalf("docs/deployment.md: the docker run block lacks the docker run or the bin/str invoke line:\n%s", b[1])
		}
		return run, call
	}
	t.Fatal("docs/deployment.md: no ```sh block with `docker run -d --name str-worker`")
	return "", ""
}

// replaceOnce replaces old by new in s, which must hold old exactly once
// (a doc edit that changes what the test replaces fails here, loudly).
func replaceOnce(t *testing.T, what, s, old, new string) string {
	t.Helper()
	if n := strings.Count(s, old); n != 1 {
		t.Fatalf("%s: %q occurs %d times, want once:\n%s", what, old, n, s)
	}
	return strings.Replace(s, old, new, 1)
}

// TestContainerDocumentedRun: the docker run line of docs/deployment.md
// and its str invoke line, run as written from a source tree as root
// (deploy/docker/worker.env, the examples' tools, var/docker for the
// artifacts and the broker's token), serve a call from the host. Only
// what would collide with other runs on this host is changed: the
// container's name and the host ports (published on free ones, then read
// back). The tools are the examples with echo_tool served from a per-tool
// template (warm: template), so that the call also shows the line needs
// no NET_ADMIN for a template's calls (the worker brings up lo in each
// call's network namespace from outside).
func TestContainerDocumentedRun(t *testing.T) {
	image, strBin := need(t)
	root := repoRoot(t)
	run, call := documentedRun(t, root)

	// A source tree of our own: deploy/ is the repository's, examples/
	// a copy with echo_tool made a template tool, var/ created by the
	// run (docker makes the bind-mount sources).
	tree := t.TempDir()
	if err := os.Chmod(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "deploy"), filepath.Join(tree, "deploy")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(tree, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(strBin, filepath.Join(tree, "bin", "str")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-R", filepath.Join(root, "examples"), filepath.Join(tree, "examples")).CombinedOutput(); err != nil {
		t.Fatalf("copy examples: %v\n%s", err, out)
	}
	mf := filepath.Join(tree, "examples", "tools", "manifest.yaml")
	m, err := os.ReadFile(mf)
	if err != nil {
		t.Fatal(err)
	}
	tpl := replaceOnce(t, "examples/tools/manifest.yaml", string(m),
		"    function: echo_tool\n    description: \"Echo a message back\"\n    timeout_seconds: 30\n    warm: 2\n",
		"    function: echo_tool\n    description: \"Echo a message back\"\n    timeout_seconds: 30\n    warm: template\n")
	if err := os.WriteFile(mf, []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}

	name := fmt.Sprintf("str-doc-run-%d", os.Getpid())
	run = replaceOnce(t, "the docker run line", run, "--name str-worker ", "--name "+name+" ")
	run = replaceOnce(t, "the docker run line", run, "-p 127.0.0.1:55554:55554", "-p 127.0.0.1::55554")
	run = replaceOnce(t, "the docker run line", run, "-p 127.0.0.1:8081:8081", "-p 127.0.0.1::8081")
	if image != "str-worker:dev" {
		run = replaceOnce(t, "the docker run line", run, " str-worker:dev", " "+image)
	}
	if strings.Contains(run, "NET_ADMIN") {
		t.Errorf("the documented docker run line adds NET_ADMIN: %s", run)
	}
	_ = exec.Command("docker", "rm", "-f", name).Run()
	sh := func(line string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "bash", "-c", line)
		cmd.Dir = tree
		cmd.Env = append(cleanEnv(), "PWD="+tree)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := sh(run); err != nil {
		t.Fatalf("the documented docker run line: %v\n%s\n%s", err, run, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("docker", "logs", "--tail", "40", name).CombinedOutput()
			t.Logf("worker log (last lines):\n%s", out)
		}
		_ = exec.Command("docker", "rm", "-f", name).Run()
	})
	brokerAddr := firstLine([]byte(docker(t, "port", name, "55554/tcp")))
	healthAddr := firstLine([]byte(docker(t, "port", name, "8081/tcp")))
	call = replaceOnce(t, "the str invoke line", call, "--broker 127.0.0.1:55554", "--broker "+brokerAddr)

	// Ready: /readyz through the published health port (the docs' check).
	waitFor(t, "the worker's /readyz on "+healthAddr, func() (bool, string) {
		if st := docker(t, "inspect", "-f", "{{.State.Status}}", name); st != "running" {
			out, _ := exec.Command("docker", "logs", "--tail", "20", name).CombinedOutput()
			t.Fatalf("container %s while starting:\n%s", st, out)
		}
		out, err := exec.Command("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://"+healthAddr+"/readyz").CombinedOutput()
		return err == nil && string(out) == "200", string(out)
	})
	// Served by echo_tool's template (its calls need lo brought up from
	// outside each call's network namespace; the line has no NET_ADMIN).
	// A call may run cold while the template starts: a few calls, each
	// of which must answer, until one is the template's.
	served := regexp.MustCompile(`"msg":"tool finished","tool":"echo_tool".*"template":true`)
	var logs []byte
	for i := 0; i < 5 && !served.Match(logs); i++ {
		out, err := sh(call)
		if err != nil || !strings.Contains(out, `"echo":"hi"`) {
			t.Fatalf("the documented str invoke line: %v\n%s\n%s", err, call, out)
		}
		logs, _ = exec.Command("docker", "logs", name).CombinedOutput()
	}
	if !served.Match(logs) {
		t.Errorf("echo_tool was not served from its template in 5 calls (no tool finished line with template true):\n%s", logs)
	}
	// The token is where the docs say, under the tree's var/docker.
	if _, err := os.Stat(filepath.Join(tree, "var", "docker", "broker", "broker.token")); err != nil {
		t.Errorf("the broker's token: %v", err)
	}
}

// cleanEnv is this process's environment without the dev broker settings
// (str invoke must find the broker and token from the line alone).
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEV_BROKER_") && !strings.HasPrefix(kv, "PWD=") {
			env = append(env, kv)
		}
	}
	return env
}
