package e2e

// Issue 29 §9: make run's broker port. scripts/run.sh (what make run
// runs) listened on 127.0.0.1:55554 whatever it was told, and printed
// 55554.

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/syncbuf"
)

// TestMakeRunBrokerPort: scripts/run.sh with BROKER_PORT=N starts the
// worker's embedded broker on 127.0.0.1:N, says so (with the str invoke
// line for that port), and str invoke reaches a worker there.
func TestMakeRunBrokerPort(t *testing.T) {
	requireRoot(t)
	e := newEnv(t)
	port := freePort(t)
	broker := "127.0.0.1:" + strconv.Itoa(port)
	log := &syncbuf.Buffer{}
	cmd := exec.Command("../../scripts/run.sh")
	cmd.Env = cleanEnv("BROKER_PORT="+strconv.Itoa(port), "STR_BIN="+strBin,
		"SAM_NAMESPACE=e2e-run/", "MANIFEST_PATH="+e.manifest, "TOOLS_PYTHON_DIR="+e.tools,
		"SANDBOX_WORK_DIR="+e.work, "STR_RUNNER_DIR="+filepath.Join(e.root, "runner"), "STR_SITE_DIR="+filepath.Join(e.root, "site"),
		"ARTIFACT_BASE_PATH="+e.artifacts, "HEALTH_PORT="+strconv.Itoa(freePort(t)))
	cmd.Stdout, cmd.Stderr = log, log
	must(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// run.sh execs str worker: SIGTERM drains it and it exits.
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("run.sh and worker log:\n%s", tail(log.String(), 40))
		}
	})
	want := "run.sh: worker on " + broker + " (namespace e2e-run/); try, as the same user: bin/str invoke echo_tool --broker " + broker
	waitFor(t, "run.sh's line naming the port", 2*time.Minute, func() bool {
		select {
		case <-done:
			t.Fatalf("run.sh ended:\n%s", log.String())
		default:
		}
		return strings.Contains(log.String(), want)
	})
	if strings.Contains(log.String(), "55554") {
		t.Errorf("run.sh told BROKER_PORT=%d still names 55554:\n%s", port, log.String())
	}
	// The worker is ready once its broker has written the token file
	// str invoke reads; then one call through it.
	var code int
	var stdout, stderr string
	waitFor(t, "echo_tool through the worker of run.sh", 3*time.Minute, func() bool {
		code, stdout, stderr = runStr(t, cleanEnv(), "invoke", "echo_tool", "--broker", broker, "--namespace", "e2e-run/",
			"--args", `{"message":"make run on another port"}`, "--wait", "30s")
		return code == 0
	})
	if !strings.Contains(stdout, `"echo":"make run on another port"`) {
		t.Errorf("str invoke echo_tool: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
}
