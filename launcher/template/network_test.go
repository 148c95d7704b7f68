package template_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/template"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/worker/runner"
)

// A template call whose egress listeners cannot be made (C5; injected
// through template.SetCallNetwork) fails with ErrCallNetwork before any
// of its data or its work dir exists, and the template is not retired:
// the next call, with the listeners made, runs in it.
func TestTemplateCallNetworkFails(t *testing.T) {
	if os.Geteuid() != 0 {
		mustwork.Skip(t, "needs root: a template leases host ids and makes namespaces and cgroups")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		mustwork.Skip(t, "needs python3: the template runs the runner")
	}
	l, err := launcher.New(launcher.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	rdir, tools := filepath.Join(dir, "runner"), filepath.Join(dir, "tools")
	for _, d := range []string{rdir, tools} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tools, "net_fail_tool.py"), []byte("def hello():\n    return {\"hello\": 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rpath, err := runner.Install(rdir)
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := template.Start(context.Background(), l, template.Request{SourceHash: "test", Request: launcher.Request{
		Profile: "restrictive",
		Argv:    runner.Command("/usr/bin/python3", "/opt/str-runner/"+filepath.Base(rpath), "--template", "3", "net_fail_tool", "hello"),
		Env:     []string{"PYTHONPATH=/opt/str-tools", "PYTHONDONTWRITEBYTECODE=1"},
		Binds:   []launcher.Bind{{Source: rdir, Target: "/opt/str-runner"}, {Source: tools, Target: "/opt/str-tools"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tpl.Close)
	args, err := runner.EncodeArgs(&runner.Args{Module: "net_fail_tool", Function: "hello", ResultFile: "/dev/null", OutputDir: "/tmp"})
	if err != nil {
		t.Fatal(err)
	}

	injected := errors.New("injected: no listeners")
	fail := true
	template.SetCallNetwork(t, func(nsPath string, ls []nsinit.Listener) ([]int, error) {
		if fail {
			return nil, injected
		}
		return template.CallNetwork(nsPath, ls)
	})
	madeWorkDir := false
	opts := template.CallOptions{Timeout: time.Minute, WorkDir: func(int, int) (string, error) {
		madeWorkDir = true
		return "", errors.New("not wanted")
	}}
	_, err = tpl.Call(context.Background(), args, opts)
	if !errors.Is(err, template.ErrCallNetwork) || !errors.Is(err, injected) {
		t.Fatalf("call with failing listeners: %v, want ErrCallNetwork wrapping the injected error", err)
	}
	if madeWorkDir {
		t.Error("the call's work dir was asked for before its network was up")
	}
	if r := tpl.Retired(); r != nil {
		t.Fatalf("the template was retired by a call whose listeners failed: %v", r)
	}

	fail = false
	res, err := tpl.Call(context.Background(), args, template.CallOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatalf("the next call: %v", err)
	}
	var doc struct {
		Result struct{ Hello int } `json:"result"`
	}
	if err := json.Unmarshal(res.Document, &doc); err != nil || doc.Result.Hello != 1 {
		t.Errorf("the next call's result: %s (%v)", res.Document, err)
	}
}
