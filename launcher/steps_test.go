package launcher

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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

// TestStepL6SendPlan: an init gone before it read its plan (the config
// pipe's read end closed) fails at L6, and that is the sandbox's setup
// error unless the init reported one of its own.
func TestStepL6SendPlan(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	defer w.Close()
	sendErr := sendPlan(w, &nsinit.Config{})
	wantStep(t, sendErr, nsinit.StepLSendPlan, "config pipe")
	if !errors.Is(sendErr, syscall.EPIPE) {
		t.Errorf("want EPIPE as the cause: %v", sendErr)
	}

	// collect: no report from the init, so L6 is the setup error.
	s := &Sandbox{cmd: &exec.Cmd{}, sendErr: sendErr}
	wantStep(t, s.collect().SetupError, nsinit.StepLSendPlan, "config pipe")
	// The init's own report wins.
	own := &StepError{Who: "nsinit", Step: nsinit.StepReadPlan, Action: "read plan", Msg: "short read"}
	s = &Sandbox{cmd: &exec.Cmd{}, sendErr: sendErr, events: []nsinit.Event{{Type: "error", Error: own}}}
	if got := s.collect().SetupError; got != own {
		t.Errorf("setup error %v, want the init's own %v", got, own)
	}
	// A plan sent is no error.
	r, w, err = os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := sendPlan(w, &nsinit.Config{}); err != nil {
		t.Errorf("a plan into an open pipe: %v", err)
	}
	if s := (&Sandbox{cmd: &exec.Cmd{}}); s.collect().SetupError != nil {
		t.Error("a setup error without any failure")
	}
}
