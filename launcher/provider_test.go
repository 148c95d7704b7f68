package launcher

import (
	"testing"
	"time"
)

// The setup time is the sum of the setup phases only: every phase is a
// duration, and the run and the teardown are not setup (the metric once
// added cumulative launcher timestamps to the init's steps: 0.214 s for a
// 0.105 s run).
func TestSetupTimeSumsSetupPhases(t *testing.T) {
	phases := []Phase{
		{Name: "launcher_cgroup", Ms: 2}, {Name: "launcher_clone", Ms: 3}, {Name: "launcher_plan_sent", Ms: 1},
		{Name: "launcher_run", Ms: 100}, {Name: "nsinit_config", Ms: 0.5}, {Name: "nsinit_mounts", Ms: 1.5},
		{Name: "nsinit_privileges", Ms: 1}, {Name: "launcher_teardown", Ms: 4},
	}
	if got, want := setupTime(phases), 9*time.Millisecond; got != want {
		t.Fatalf("setup time %v, want %v", got, want)
	}
}
