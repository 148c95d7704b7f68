package worker

import (
	"context"
	"fmt"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/worker/artifacts"
)

// TestReplacePathPrefix: a host path is replaced only where it stands as
// a whole path prefix.
func TestReplacePathPrefix(t *testing.T) {
	work := hostPath{host: "/var/lib/str/work", shown: "/work", oneLevel: true}
	tools := hostPath{host: "/opt/tools", shown: "<tools>"}
	for _, c := range []struct {
		p        hostPath
		in, want string
	}{
		{work, "open /var/lib/str/work/task-1/input/a.csv: no such file", "open /work/input/a.csv: no such file"},
		{work, "No such file or directory: '/var/lib/str/work/task-1/x'", "No such file or directory: '/work/x'"},
		{work, "in /var/lib/str/work", "in /work"},
		{work, "in /var/lib/str/work/task-1", "in /work"},
		{work, "/var/lib/str/workshop/x and /var/lib/str/work/t/y", "/var/lib/str/workshop/x and /work/y"},
		{work, "/srv/var/lib/str/work/t/y", "/srv/var/lib/str/work/t/y"},
		{tools, `File "/opt/tools/example_tools.py", line 78, in failing_tool`, `File "<tools>/example_tools.py", line 78, in failing_tool`},
		{tools, "/opt/tools2/x /opt/tools.bak /opt/tools", "/opt/tools2/x /opt/tools.bak <tools>"},
	} {
		if got := replacePathPrefix(c.in, c.p); got != c.want {
			t.Errorf("%q: got %q, want %q", c.in, got, c.want)
		}
	}
}

// pathsTools are tools whose errors name host paths: a traceback through
// the tool's module, and the call's own work dir.
const pathsTools = `
import os

def raises(ctx):
    raise ValueError("kaboom in " + os.getcwd())

def opens(ctx):
    open(os.path.join(os.getcwd(), "input", "missing.csv"))

def saves(ctx):
    ctx.save_artifact("out.txt", b"x")
    return {}
`

// failingCreate refuses every call's sandbox (the start-up probe's, which
// binds nothing read-only, is made) with an error that names the work dir
// and the read-only binds, as a bind-mount failure would.
type failingCreate struct{ launchertest.Sandboxes }

func (f failingCreate) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	if len(spec.ReadOnly) == 0 {
		return f.Sandboxes.Create(ctx, spec)
	}
	return nil, fmt.Errorf("bind-mount %s -> %s (read-only %s): permission denied", spec.WorkDir.Base, spec.WorkDir.Base, strings.Join(spec.ReadOnly, ", "))
}

// TestErrorsNameNoHostPaths: issue 15 §6, issue 16 §6. A tool raising
// (its traceback), a tool failing on a file of its work dir, an artifact
// store that cannot save, and a sandbox that cannot be set up: each error
// reply names /work and <tools>-style names, never a directory of the
// worker (they all lie under the harness's dir).
func TestErrorsNameNoHostPaths(t *testing.T) {
	h := newHarness(t, nil)
	must(t, os.WriteFile(filepath.Join(h.cfg.ToolsDir, "pathtools.py"), []byte(pathsTools), 0o644))
	must(t, os.WriteFile(h.cfg.ManifestPath, []byte(testManifest+`  raises: {module: pathtools, function: raises}
  opens: {module: pathtools, function: opens}
  saves: {module: pathtools, function: saves}
`), 0o644))
	// A filesystem store whose namespace directory is a file: every save
	// fails with an error naming the store's path.
	h.cfg.ArtifactBasePath = filepath.Join(h.dir, "artifacts")
	store, err := artifacts.NewFilesystem(h.cfg.ArtifactBasePath, h.cfg.Namespace)
	must(t, err)
	h.store = store
	h.rebuild(nil, nil)
	h.start()
	noHostPath := func(what string, reply []byte, code string, want ...string) {
		t.Helper()
		got, msg := errorCode(t, reply)
		if got != code {
			t.Errorf("%s: %s %q, want %s", what, got, msg, code)
		}
		if strings.Contains(string(reply), h.dir) {
			t.Errorf("%s: the reply names a host path under %s:\n%s", what, h.dir, reply)
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: message does not contain %q:\n%s", what, w, msg)
			}
		}
	}
	noHostPath("raises", h.reply(h.send("raises", nil)), "EXECUTION_ERROR",
		"ValueError: kaboom in /work", `File "<tools>/pathtools.py"`)
	noHostPath("opens", h.reply(h.send("opens", nil)), "EXECUTION_ERROR",
		"/work/input/missing.csv", `File "<tools>/pathtools.py"`)

	entries, err := os.ReadDir(h.cfg.ArtifactBasePath)
	must(t, err)
	for _, e := range entries {
		must(t, os.RemoveAll(filepath.Join(h.cfg.ArtifactBasePath, e.Name())))
	}
	must(t, os.MkdirAll(h.cfg.ArtifactBasePath, 0o755))
	// The store's scope dir (the namespace test/ns/'s last level) is now
	// a file.
	must(t, os.WriteFile(filepath.Join(h.cfg.ArtifactBasePath, "ns"), []byte("not a dir"), 0o644))
	noHostPath("saves", h.reply(h.send("saves", nil)), "ARTIFACT_ERROR", "<artifact store>")

	h.stop()
	h.srv = nil
	h.rebuild(failingCreate{}, nil)
	h.start()
	noHostPath("create", h.reply(h.send("echo", nil)), "SANDBOX_FAILED", "bind-mount /work -> /work", "<tools>", "<str runner>")
}
