package launcher

import (
	"errors"
	"testing"
	"time"

	"github.com/securetoolruntime/str/profiles"
)

// armable is a sandbox of plan that has "started" without running
// anything (no process, no cgroup: kill only marks it), with its wall
// clock started as run starts it (L7).
func armable(t *testing.T, pl *Plan, started bool) *Sandbox {
	t.Helper()
	s := &Sandbox{id: "armtest", plan: pl, started: make(chan struct{}), finished: make(chan struct{})}
	if started {
		s.begun = true
		s.startClock()
		close(s.started)
	}
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.timer != nil {
			s.timer.Stop()
		}
	})
	return s
}

func (s *Sandbox) state() (timedOut, killed, armed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.timedOut, s.killed, s.armed
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestPlanIdle: Request.Idle reaches the plan unchanged (it is not a
// limit of the profile's: Arm's timeout is); a negative one is refused.
func TestPlanIdle(t *testing.T) {
	pl := mustPlan(t, "restrictive", Request{Idle: 3 * time.Minute}, fakeHost(0, CgroupV1))
	if pl.Idle != 3*time.Minute || pl.Timeout != 60*time.Second {
		t.Fatalf("idle %v timeout %v, want 3m0s and the profile's 1m0s", pl.Idle, pl.Timeout)
	}
	if pl := mustPlan(t, "restrictive", Request{}, fakeHost(0, CgroupV1)); pl.Idle != 0 {
		t.Fatalf("idle %v without Request.Idle", pl.Idle)
	}
	set, err := profiles.Embedded()
	if err != nil {
		t.Fatal(err)
	}
	prof, _ := set.Lookup("standard")
	if _, err := NewPlan(prof, Request{Argv: []string{"/bin/true"}, Idle: -time.Second}, fakeHost(0, CgroupV1), nil); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("negative idle limit: %v", err)
	}
}

// TestArmChecks: Arm's checklist, in order, each refusal with its error.
func TestArmChecks(t *testing.T) {
	pooled := func() *Plan { return &Plan{Profile: "standard", Timeout: 300 * time.Second, Idle: time.Hour} }

	// 1. only a sandbox made to wait unarmed, once started.
	s := armable(t, &Plan{Profile: "standard", Timeout: 300 * time.Second}, true)
	if err := s.Arm(time.Second); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("a sandbox created without Idle: %v", err)
	}
	if err := armable(t, pooled(), false).Arm(time.Second); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("not started: %v", err)
	}
	// 2. tighten only: the whole profile limit is fine, a nanosecond
	// more is not, nor is zero.
	s = armable(t, pooled(), true)
	for _, d := range []time.Duration{0, -time.Second, 300*time.Second + 1} {
		if err := s.Arm(d); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("Arm(%v): %v", d, err)
		}
	}
	idle := s.timer
	if err := s.Arm(300 * time.Second); err != nil {
		t.Fatalf("Arm(the profile's whole limit): %v", err)
	}
	if idle.Stop() {
		t.Error("the idle timer still ran after Arm")
	}
	// 3. once.
	if err := s.Arm(time.Second); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("armed twice: %v", err)
	}
	if timedOut, killed, _ := s.state(); timedOut || killed {
		t.Error("arming killed the sandbox")
	}
}

// TestArmedClockKills: the armed timeout kills the sandbox (TimedOut),
// counted from the Arm, not from the start.
func TestArmedClockKills(t *testing.T) {
	s := armable(t, &Plan{Profile: "standard", Timeout: 300 * time.Second, Idle: time.Hour}, true)
	if err := s.Arm(time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the armed timeout to kill the sandbox", func() bool { timedOut, killed, _ := s.state(); return timedOut && killed })
}

// TestArmAfterTheEnd: a sandbox whose idle limit ran out, or that was
// killed, is not armed (ErrEnded): it cannot serve a run.
func TestArmAfterTheEnd(t *testing.T) {
	s := armable(t, &Plan{Profile: "standard", Timeout: 300 * time.Second, Idle: time.Nanosecond}, true)
	waitUntil(t, "the idle limit to kill the sandbox", func() bool { timedOut, killed, _ := s.state(); return timedOut && killed })
	if err := s.Arm(time.Second); !errors.Is(err, ErrEnded) {
		t.Errorf("after the idle limit: %v", err)
	}
	if _, _, armed := s.state(); armed {
		t.Error("armed after its end")
	}

	s = armable(t, &Plan{Profile: "standard", Timeout: 300 * time.Second, Idle: time.Hour}, true)
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := s.Arm(time.Second); !errors.Is(err, ErrEnded) {
		t.Errorf("after Kill: %v", err)
	}
	if timedOut, _, _ := s.state(); timedOut {
		t.Error("Kill marked the sandbox timed out")
	}
}
