// Package container_test runs the worker image (make image) in Docker with
// the least privileges that work and serves calls through its embedded
// broker, published on a loopback port of the host: the container test of
// make test-container.
//
// The engine settings it uses are the ones docs/deployment.md requires,
// each needed (TestContainerDoctor shows what str doctor says without it):
//
//	--cap-add SYS_ADMIN                     namespaces and mounts of each sandbox
//	--security-opt seccomp=deploy/docker/seccomp.json
//	                                        Docker's default plus pivot_root,
//	                                        open_tree, move_mount, mount_setattr
//	--security-opt systempaths=unconfined   an unmasked /proc (a sandbox mounts
//	                                        its own procfs)
//	--cgroupns private + the image's str-container-worker entrypoint
//	                                        the container's own cgroup, writable
package container_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/securetoolruntime/str/test/internal/enginetest"
	"github.com/securetoolruntime/str/test/internal/strbuild"
)

// The helpers every engine test shares.
var (
	docker    = enginetest.Docker
	firstLine = enginetest.FirstLine
	repoRoot  = enginetest.RepoRoot
)

// need skips (or, with STR_MUST_WORK=1, fails) when the test cannot run
// here, naming what is missing (enginetest.Need).
func need(t *testing.T) (image, strBin string) {
	t.Helper()
	enginetest.Need(t, enginetest.Needs{Area: "container", WhyRoot: "the test bind-mounts host dirs the container's root writes, and talks to the docker daemon", Bin: true})
	return os.Getenv("STR_IMAGE"), os.Getenv("STR_BIN")
}

// leastPrivilege is every engine setting the worker needs, and nothing
// more (docs/deployment.md, "Docker").
func leastPrivilege(root string) []string {
	return []string{
		"--cap-add", "SYS_ADMIN",
		"--security-opt", "seccomp=" + filepath.Join(root, "deploy/docker/seccomp.json"),
		"--security-opt", "systempaths=unconfined",
		"--cgroupns", "private",
	}
}

// waitFor polls cond until it holds or the (generous) deadline passes.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	last := ""
	for time.Now().Before(deadline) {
		ok, detail := cond()
		if ok {
			return
		}
		last = detail
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not after 3 minutes; last: %s", what, last)
}

// TestContainerServes runs the image with the least privileges, the
// example tools mounted read-only, the artifact store and the broker's
// token file on host dirs, and serves through str invoke: echo_tool, a
// restrictive call, an artifact round trip and a network-policy denial;
// then docker stop ends it cleanly. root: the worker is root in the
// container (the production case). rootless: the entrypoint delegates the
// container's cgroup to the image's user str (uid 10001) and runs the
// worker as that user with no capability (STR_RUN_AS=str).
func TestContainerServes(t *testing.T) {
	image, strBin := need(t)
	t.Run("root", func(t *testing.T) { serve(t, image, strBin, false) })
	t.Run("rootless", func(t *testing.T) { serve(t, image, strBin, true) })
}

// The image's non-root user (Dockerfile: useradd --uid 10001 str).
const strUID = 10001

func serve(t *testing.T, image, strBin string, rootless bool) {
	root := repoRoot(t)
	dir := t.TempDir()
	art, state := filepath.Join(dir, "artifacts"), filepath.Join(dir, "state")
	for _, d := range []string{art, state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if rootless {
			if err := os.Chown(d, strUID, strUID); err != nil {
				t.Fatal(err)
			}
		}
	}
	name := fmt.Sprintf("str-container-test-%d-%t", os.Getpid(), rootless)
	_ = exec.Command("docker", "rm", "-f", name).Run()
	args := append([]string{"run", "-d", "--name", name}, leastPrivilege(root)...)
	if rootless {
		args = append(args, "--user", "0", "-e", "STR_RUN_AS=str")
	}
	args = append(args,
		"-e", "SAM_NAMESPACE=ct/", "-e", "TOOLS_PYTHON_DIR=/tools/python",
		"-e", "DEV_BROKER_TOKEN_FILE=/state/broker.token",
		"-v", filepath.Join(root, "examples/tools")+":/tools:ro",
		"-v", art+":/sam/artifacts", "-v", state+":/state",
		"-p", "127.0.0.1::55554",
		"--entrypoint", "/usr/local/bin/str-container-worker",
		image, "--embedded-broker", "0.0.0.0:55554")
	docker(t, args...)
	stopped := false
	t.Cleanup(func() {
		if !stopped || t.Failed() {
			out, _ := exec.Command("docker", "logs", "--tail", "40", name).CombinedOutput()
			t.Logf("worker log (last lines):\n%s", out)
		}
		_ = exec.Command("docker", "rm", "-f", name).Run()
	})

	// Ready: the broker's token file is written and the worker reports
	// ready (/readyz: connected to its broker, past its start-up probe).
	token := filepath.Join(state, "broker.token")
	waitFor(t, "worker ready", func() (bool, string) {
		if st := docker(t, "inspect", "-f", "{{.State.Status}}", name); st != "running" {
			out, _ := exec.Command("docker", "logs", "--tail", "20", name).CombinedOutput()
			t.Fatalf("container %s while starting:\n%s", st, out)
		}
		if _, err := os.Stat(token); err != nil {
			return false, err.Error()
		}
		out, err := exec.Command("docker", "exec", name, "python3", "-c",
			"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8081/readyz', timeout=5).status)").CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "200", string(out)
	})
	addr := firstLine([]byte(docker(t, "port", name, "55554/tcp")))
	if rootless {
		// The worker (PID 1) runs as str with every capability set empty.
		st := docker(t, "exec", name, "grep", "-E", "^(Uid|CapEff|CapBnd|NoNewPrivs):", "/proc/1/status")
		for _, want := range []string{fmt.Sprintf("Uid:\t%d\t%d", strUID, strUID), "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
			if !strings.Contains(st, want) {
				t.Errorf("rootless worker's /proc/1/status lacks %q:\n%s", want, st)
			}
		}
	}

	invoke := func(tool string, extra ...string) (map[string]any, string) {
		t.Helper()
		return enginetest.Invoke(t, strBin, addr, token, "ct/", tool, extra...)
	}

	// 1. echo_tool.
	res, raw := invoke("echo_tool", "--args", `{"message":"from the container test"}`)
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["echo"] != "from the container test" {
		t.Errorf("echo_tool: %s", raw)
	}

	// 2. A restrictive call (execute_python's profile).
	res, raw = invoke("execute_python", "--args", `{"code":"import os\nresult = (6*7, os.getuid() != 0)"}`)
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["result"] != "(42, True)" {
		t.Errorf("execute_python (restrictive): want result (42, True) (not uid 0 in the sandbox): %s", raw)
	}

	// 2b. The example's escape attempts (read /etc/shadow, mount, unshare,
	// connect to the broker, write /usr, see other processes), all blocked
	// inside the container too.
	res, raw = invoke("escape_attempt")
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["all_blocked"] != true {
		t.Errorf("escape_attempt in the container: want all_blocked true: %s", raw)
	}

	// 3. Artifact round trip: a preloaded input, two outputs in the store.
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("one\ntwo words\nthree\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, raw = invoke("process_file", "--artifact", "input_file="+in, "--session", "ct-session")
	if tr, _ := res["tool_result"].(map[string]any); tr == nil || tr["lines"] != float64(3) {
		t.Errorf("process_file: want lines 3: %s", raw)
	}
	summary, err := os.ReadFile(filepath.Join(art, "ct", "cli-user", "ct-session", "summary.txt", "0"))
	if err != nil || string(summary) != "Lines: 3\nWords: 4\n" {
		t.Errorf("summary.txt version 0 in the host's store: %q, %v; reply %s", summary, err, raw)
	}

	// 4. Network policy: http_get is restricted to the package index; any
	// other host is refused by the worker's proxy and reported.
	res, raw = invoke("http_get", "--args", `{"url":"http://example.com/"}`)
	vs, _ := res["violations"].([]any)
	found := false
	for _, v := range vs {
		if m, _ := v.(map[string]any); m["kind"] == "net" && m["host"] == "example.com" && m["reason"] == "not_allowlisted" {
			found = true
		}
	}
	if !found {
		t.Errorf("http_get example.com: want a net violation not_allowlisted for example.com: %s", raw)
	}

	// 5. docker stop: SIGTERM to str (PID 1), which drains and exits 0;
	// the token file (its only state on the host side) is removed.
	docker(t, "stop", "-t", "120", name)
	stopped = true
	if code := docker(t, "inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", name); code != "0 false" {
		t.Errorf("after docker stop: exit code, OOM = %s, want 0 false", code)
	}
	if _, err := os.Stat(token); !os.IsNotExist(err) {
		t.Errorf("token file left after stop: %v", err)
	}
}

// TestContainerDoctor: each engine setting is needed, and str doctor in a
// container lacking it names it (the fix line).
func TestContainerDoctor(t *testing.T) {
	image, _ := need(t)
	root := repoRoot(t)
	full := leastPrivilege(root)
	without := func(opt string) []string {
		var out []string
		for i := 0; i < len(full); i += 2 {
			if full[i+1] != opt && !strings.HasPrefix(full[i+1], opt) {
				out = append(out, full[i], full[i+1])
			}
		}
		return out
	}
	cases := []struct {
		name, want string
		opts       []string
		entry      string
	}{
		{"all settings", "str can run sandboxes on this host", full, "/usr/local/bin/str-container-worker"},
		{"no SYS_ADMIN", "--cap-add SYS_ADMIN", without("SYS_ADMIN"), "/usr/local/bin/str"},
		{"docker's default seccomp", "seccomp=deploy/docker/seccomp.json", without("seccomp="), "/usr/local/bin/str-container-worker"},
		{"masked /proc", "systempaths=unconfined", without("systempaths="), "/usr/local/bin/str-container-worker"},
		{"read-only cgroup", "--cgroupns=private", full, "/usr/local/bin/str"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"run", "--rm"}, c.opts...)
			args = append(args, "--entrypoint", c.entry, image, "doctor")
			out, err := exec.Command("docker", args...).CombinedOutput()
			if !strings.Contains(string(out), c.want) {
				t.Errorf("docker %s: %v; output lacks %q:\n%s", strings.Join(args, " "), err, c.want, out)
			}
		})
	}
}

// TestSeccompProfileCurrent: deploy/docker/seccomp.json is what
// scripts/container-seccomp.py writes (edit the script, not the file).
func TestSeccompProfileCurrent(t *testing.T) {
	root := repoRoot(t)
	if _, err := os.Stat("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"); err != nil {
		t.Skipf("no x86_64 syscall table to regenerate from (linux-libc-dev): %v", err)
	}
	want, err := exec.Command("python3", filepath.Join(root, "scripts/container-seccomp.py")).Output()
	if err != nil {
		t.Fatalf("scripts/container-seccomp.py: %v", err)
	}
	have, err := os.ReadFile(filepath.Join(root, "deploy/docker/seccomp.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, want) {
		t.Error("deploy/docker/seccomp.json is stale: run python3 scripts/container-seccomp.py > deploy/docker/seccomp.json")
	}
}

// TestContainerBattery runs the hostile battery (test/integration/hostile,
// TestHostile: every case of every profile) inside the container, with the
// same least-privilege settings as the worker: the sandbox holds inside an
// unprivileged container as it does on the host.
func TestContainerBattery(t *testing.T) {
	image, strBin := need(t)
	root := repoRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "hostile.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "./test/integration/hostile")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c ./test/integration/hostile: %v\n%s", err, out)
	}
	name := fmt.Sprintf("str-container-battery-%d", os.Getpid())
	t.Cleanup(func() { _ = exec.Command("docker", "rm", "-f", name).Run() })
	args := append([]string{"run", "--rm", "--name", name}, leastPrivilege(root)...)
	args = append(args,
		"-v", bin+":/t/hostile.test:ro", "-v", strBin+":/t/str:ro", "-v", strbuild.WorkerBeside(strBin)+":/t/"+strbuild.Worker+":ro",
		"-v", strbuild.EgressBeside(strBin)+":/t/"+strbuild.Egress+":ro",
		"-v", filepath.Join(root, "test/integration/hostile")+":/src/test/integration/hostile:ro",
		"-v", filepath.Join(root, "examples")+":/src/examples:ro",
		"-w", "/src/test/integration/hostile",
		"-e", "STR_BIN=/t/str", "-e", "STR_MUST_WORK=1",
		"--entrypoint", "/usr/local/bin/str-container-worker", image,
		// Through sh, so that the test process is not PID 1 (signal_host
		// signals the test's pid from a sandbox whose own PID 1 is the init).
		"/bin/sh", "-c", "/t/hostile.test -test.run '^TestHostile$' -test.timeout 12m")
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		var fails []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "--- FAIL") || strings.Contains(l, ".go:") {
				fails = append(fails, l)
			}
		}
		t.Fatalf("the hostile battery in the container: %v\n%s", err, strings.Join(fails, "\n"))
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("the hostile battery in the container printed no PASS:\n%s", out)
	}
}
