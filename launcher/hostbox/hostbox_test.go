package hostbox

import (
	"context"
	"os/exec"
	"testing"
	"time"
)

// TestHostProcExited: a tool process that has exited but is not yet
// reaped counts as exited (a cancellation then does not mark it
// cancelled); a running one does not.
func TestHostProcExited(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, err := startHostProc(ctx, exec.Command("sleep", "60"), time.Minute, 0)
	must(t, err)
	if p.exited() {
		t.Fatal("a running process counts as exited")
	}
	must(t, p.kill())
	waitFor(t, "the killed process counted as exited (a zombie, not reaped)", p.exited)
	e, err := p.wait()
	must(t, err)
	if e.Cancelled {
		t.Errorf("cancelled without a cancellation: %+v", e)
	}
	if !p.exited() {
		t.Error("a reaped process does not count as exited")
	}
}

// TestHostProcArm: the host double's (and SANDBOX_MODE=none's) Arm
// has the launcher's checks: only a process waiting unarmed, once, within
// its limit, before its idle limit ran out; the armed timeout kills it.
func TestHostProcArm(t *testing.T) {
	ctx := context.Background()
	plain, err := startHostProc(ctx, exec.Command("sleep", "60"), time.Minute, 0)
	must(t, err)
	defer func() { plain.kill(); plain.wait() }()
	if err := plain.arm(time.Second); err == nil {
		t.Error("armed a process not waiting unarmed")
	}

	p, err := startHostProc(ctx, exec.Command("sleep", "60"), time.Minute, time.Hour)
	must(t, err)
	for _, d := range []time.Duration{0, time.Minute + 1} {
		if err := p.arm(d); err == nil {
			t.Errorf("Arm(%v) accepted (limit 1m)", d)
		}
	}
	must(t, p.arm(time.Nanosecond))
	if err := p.arm(time.Second); err == nil {
		t.Error("armed twice")
	}
	e, err := p.wait()
	must(t, err)
	if !e.TimedOut {
		t.Errorf("the armed timeout did not end the process: %+v", e)
	}

	idle, err := startHostProc(ctx, exec.Command("sleep", "60"), time.Minute, time.Nanosecond)
	must(t, err)
	e, err = idle.wait()
	must(t, err)
	if !e.TimedOut {
		t.Errorf("the idle limit did not end the process: %+v", e)
	}
	if err := idle.arm(time.Second); err == nil {
		t.Error("armed after the idle limit ran out")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
