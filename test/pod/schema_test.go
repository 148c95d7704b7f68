package pod_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/internal/mustwork"
)

// TestKubernetesSchema validates deploy/kubernetes/*.yaml against the
// Kubernetes API types with kubeschema (test/pod/kubeschema: strict
// decoding into k8s.io/api's types, unknown fields refused, offline), and
// shows that it catches a misspelt field, a malformed quantity and an
// unknown kind.
func TestKubernetesSchema(t *testing.T) {
	root := repoRoot(t)
	dir := filepath.Join(root, "test/pod/kubeschema")
	bin := filepath.Join(t.TempDir(), "kubeschema")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		// Its module's dependencies come from the Go module proxy (or the
		// module cache).
		reason := "cannot build test/pod/kubeschema (k8s.io/api from the module cache or proxy): " + err.Error() + "\n" + string(out)
		mustwork.Skip(t, reason)
	}
	files, err := filepath.Glob(filepath.Join(root, "deploy/kubernetes/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	out, err := exec.Command(bin, files...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubeschema deploy/kubernetes/*.yaml: %v\n%s", err, out)
	}
	t.Logf("%s", out)

	// It can fail: each broken copy is refused, naming the problem.
	dep, err := os.ReadFile(filepath.Join(root, "deploy/kubernetes/deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	hpa, err := os.ReadFile(filepath.Join(root, "deploy/kubernetes/hpa.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, text, want string
	}{
		{"misspelt field", strings.Replace(string(dep), "procMount: Unmasked\n", "procMounts: Unmasked\n", 1), `unknown field "spec.template.spec.containers[0].securityContext.procMounts"`},
		{"malformed quantity", strings.Replace(string(dep), "sizeLimit: 16Mi", "sizeLimit: sixteen", 1), "quantities must match"},
		{"wrong type", strings.Replace(string(dep), "hostUsers: false\n", "hostUsers: \"no\"\n", 1), "hostUsers"},
		{"unknown kind", strings.Replace(string(hpa), "kind: HorizontalPodAutoscaler", "kind: HorizontalPodScaler", 1), `no kind "HorizontalPodScaler"`},
	} {
		f := filepath.Join(t.TempDir(), "bad.yaml")
		if err := os.WriteFile(f, []byte(c.text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(bin, f).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: kubeschema %v, want a failure with %q:\n%s", c.name, err, c.want, out)
		}
	}
}
