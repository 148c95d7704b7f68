package launcher

import (
	"testing"
	"time"
)

// The setup time is the sum of the setup phases only, counted where each
// phase is marked: the launcher's phases before the run and the init's;
// the run and the teardown are not setup (the metric
// once added cumulative launcher timestamps to the init's steps: 0.214 s
// for a 0.105 s run; later the phases were told apart by matching names).
func TestSetupTimeSumsSetupPhases(t *testing.T) {
	const hour = time.Hour
	s := &Sandbox{}
	for _, ph := range []launcherPhase{phaseRun, phaseTeardown} {
		s.last = time.Now().Add(-hour)
		s.mark(ph)
	}
	if s.setupTime != 0 {
		t.Fatalf("the run and the teardown counted as setup: %v", s.setupTime)
	}
	s.addPhase(phaseInit, 2*time.Millisecond)
	if want := 2 * time.Millisecond; s.setupTime != want {
		t.Fatalf("the init's phase: setup %v, want %v", s.setupTime, want)
	}
	for _, ph := range []launcherPhase{phaseCgroup, phaseClone} {
		before := s.setupTime
		s.last = time.Now().Add(-hour)
		s.mark(ph)
		if s.setupTime-before < hour {
			t.Fatalf("%s not counted as setup: %v -> %v", ph.name, before, s.setupTime)
		}
	}
	if len(s.timings) != 5 {
		t.Fatalf("timings: %v, want the 5 phases marked", s.timings)
	}
}
