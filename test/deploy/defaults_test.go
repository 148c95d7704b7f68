package deploy_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// checkHealthcheck runs the Dockerfile's HEALTHCHECK command (python3 -c)
// against a local /healthz: it must follow HEALTH_PORT (and HEALTH_ADDR)
// from the container's environment, not a port written into the image.
func checkHealthcheck(t *testing.T, argv []string) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Logf("python3 not installed: the HEALTHCHECK command is not run")
		return
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	defer hs.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(hs.URL, "http://"))
	closed := freePort(t)
	run := func(env ...string) error {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
		return cmd.Run()
	}
	for _, c := range []struct {
		env     []string
		healthy bool
	}{
		{[]string{"HEALTH_PORT=" + port}, true},
		{[]string{"HEALTH_PORT=" + port, "HEALTH_ADDR=0.0.0.0"}, true},
		{[]string{"HEALTH_PORT=" + port, "HEALTH_ADDR=127.0.0.1"}, true},
		{[]string{"HEALTH_PORT=" + strconv.Itoa(closed)}, false},
		{[]string{"HEALTH_PORT=0"}, true}, // no health server: nothing to check
	} {
		if err := run(c.env...); (err == nil) != c.healthy {
			t.Errorf("HEALTHCHECK with %v: %v, want healthy=%v", c.env, err, c.healthy)
		}
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestArtifactStoreIsFilesystemEverywhere: every deployment file uses the
// filesystem store (the one agents share and the only one that is not
// held in the worker's memory), and none falls back to the memory store.
func TestArtifactStoreIsFilesystemEverywhere(t *testing.T) {
	// Dockerfile: ENV of the runtime stage.
	text, err := os.ReadFile(filepath.Join(root(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, string(text))
	env := map[string]string{}
	for _, in := range find(stages[len(stages)-1], "ENV") {
		for _, kv := range strings.Fields(in.args) {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
	}
	if env["ARTIFACT_SERVICE_TYPE"] != "filesystem" || env["ARTIFACT_BASE_PATH"] == "" {
		t.Errorf("Dockerfile ENV ARTIFACT_SERVICE_TYPE=%q ARTIFACT_BASE_PATH=%q, want filesystem and a base path", env["ARTIFACT_SERVICE_TYPE"], env["ARTIFACT_BASE_PATH"])
	}
	if env["HEALTH_PORT"] == "" {
		t.Error("Dockerfile sets no HEALTH_PORT")
	}

	// Kubernetes: the container's env, and the artifacts volume mounted
	// where the store is.
	m := manifests(t)
	c := get(t, m["Deployment"][0], "spec", "template", "spec", "containers", 0)
	kenv := map[string]string{}
	for _, e := range get(t, c, "env").([]any) {
		kenv[str(get(t, e, "name"))] = str(get(t, e, "value"))
	}
	if kenv["ARTIFACT_SERVICE_TYPE"] != "filesystem" {
		t.Errorf("Kubernetes ARTIFACT_SERVICE_TYPE = %q, want filesystem", kenv["ARTIFACT_SERVICE_TYPE"])
	}
	mounted := false
	for _, vm := range get(t, c, "volumeMounts").([]any) {
		mounted = mounted || str(get(t, vm, "mountPath")) == kenv["ARTIFACT_BASE_PATH"]
	}
	if !mounted {
		t.Errorf("ARTIFACT_BASE_PATH %q is not a mounted volume", kenv["ARTIFACT_BASE_PATH"])
	}
	// The worker's health server binds 127.0.0.1 unless told otherwise;
	// the kubelet's probes come from outside the pod's loopback.
	if a := kenv["HEALTH_ADDR"]; a == "" || a == "127.0.0.1" || a == "localhost" || a == "::1" {
		t.Errorf("Kubernetes HEALTH_ADDR = %q: the probes cannot reach a loopback-only health server", a)
	}

	// systemd: Environment= defaults (worker.env may override them).
	unit, err := os.ReadFile(filepath.Join(root(t), "deploy", "systemd", "str-worker.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nEnvironment=ARTIFACT_SERVICE_TYPE=filesystem\n") {
		t.Error("the systemd unit does not default ARTIFACT_SERVICE_TYPE to filesystem")
	}

	// Every deployment file and the deployment guide: never the memory store.
	files := []string{"Dockerfile", "docs/deployment.md"}
	for _, dir := range []string{"deploy/kubernetes", "deploy/systemd"} {
		entries, err := os.ReadDir(filepath.Join(root(t), dir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root(t), f))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), " ", "")
		for _, bad := range []string{"ARTIFACT_SERVICE_TYPE=memory", "ARTIFACT_SERVICE_TYPE:memory", "value:memory"} {
			if strings.Contains(s, bad) {
				t.Errorf("%s selects the memory artifact store (%s)", f, bad)
			}
		}
	}
	guide, _ := os.ReadFile(filepath.Join(root(t), "docs", "deployment.md"))
	for _, want := range []string{"ARTIFACT_SERVICE_TYPE=filesystem", "ARTIFACT_AUDIT_LOG", "ARTIFACT_MEMORY_MAX_BYTES", "HEALTH_ADDR"} {
		if !strings.Contains(string(guide), want) {
			t.Errorf("docs/deployment.md does not mention %s", want)
		}
	}
}
