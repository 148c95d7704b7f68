package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/securetoolruntime/str/nsinit"
)

// wantStep checks that err is a launcher StepError of step.
func wantStep(t *testing.T, err error, step nsinit.Step, object string) {
	t.Helper()
	var se *StepError
	if !errors.As(err, &se) {
		t.Fatalf("want a StepError of step %s, got %T %v", step, err, err)
	}
	if se.Who != "launcher" || se.Step != step {
		t.Fatalf("want launcher step %s, got %s step %s: %v", step, se.Who, se.Step, se)
	}
	if msg := se.Error(); !strings.Contains(msg, "step "+step.String()) || !strings.Contains(msg, object) {
		t.Errorf("the message does not name step %s and %s: %s", step, object, msg)
	}
}

// TestStepL5CgroupSelfEntry: a cgroup v1 whose tasks file cannot be
// handed to the init's host ids fails at L5, naming the file.
func TestStepL5CgroupSelfEntry(t *testing.T) {
	dir := t.TempDir() // a cgroup directory without its tasks file
	cg := &cgroupV1{paths: map[string]string{"memory": dir}, order: []string{"memory"}}
	pl := &Plan{ToolUID: 100000, ToolGID: 100000}
	err := cgroupSelfEntry(cg, pl)
	wantStep(t, err, nsinit.StepLCgroupOwner, filepath.Join(dir, "tasks"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the cause is lost: %v", err)
	}
	if pl.Child.CgroupTasks != nil {
		t.Errorf("a failed L5 named tasks files in the plan: %q", pl.Child.CgroupTasks)
	}
}

// TestCollectSetupError: the child's own failure record is the
// sandbox's setup error, and a sandbox without one has none.
func TestCollectSetupError(t *testing.T) {
	own := &StepError{Who: "nsinit", Step: nsinit.StepMounts, Action: "mount proc", Msg: "operation not permitted"}
	s := &Sandbox{events: []nsinit.Event{{Type: "error", Error: own}}}
	if got := s.collect().SetupError; got != own {
		t.Errorf("setup error %v, want the child's own %v", got, own)
	}
	if s := (&Sandbox{}); s.collect().SetupError != nil {
		t.Error("a setup error without any failure")
	}
}
