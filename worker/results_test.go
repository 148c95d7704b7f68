package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher/launchertest"
)

// launcherFigures wraps the fake: each sandbox reports the launcher's
// setup time and a network report of its own, as a launcher sandbox does,
// so the worker's reply and metrics can be checked to carry them unchanged.
type launcherFigures struct{ launchertest.Sandboxes }

func (f launcherFigures) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	b, err := f.Sandboxes.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return figuresBox{b}, nil
}

type figuresBox struct{ Sandbox }

const launcherSetupTime = 1234 * time.Millisecond

var launcherNetwork = NetworkReport{
	Violations: []egress.Event{{Kind: "net", Action: "denied", Reason: "not_allowed", Host: "denied.example", Count: 2}},
	Summary:    "1 connection denied: denied.example",
}

func (b figuresBox) Wait() (*SandboxExit, error) {
	e, err := b.Sandbox.Wait()
	if e != nil {
		e.SetupTime = launcherSetupTime
	}
	return e, err
}

func (b figuresBox) NetworkReport() NetworkReport { return launcherNetwork }

// TestResultsAreTheLaunchers: §3 of issue 18, each policy in one place.
// The setup time the worker records is the launcher's Exit.SetupTime (the
// worker does not time the setup itself), and the network report in the
// reply is Box.NetworkReport's (the one path to it; Exit carries none).
func TestResultsAreTheLaunchers(t *testing.T) {
	h := newHarness(t, nil)
	h.rebuild(launcherFigures{}, nil)
	h.start()
	reply := h.reply(h.send("echo", map[string]any{"args": map[string]any{"message": "figures"}}))
	var env struct {
		Result *struct {
			Violations       []egress.Event `json:"violations"`
			ViolationSummary string         `json:"violation_summary"`
		} `json:"result"`
	}
	if err := json.Unmarshal(reply, &env); err != nil || env.Result == nil {
		t.Fatalf("not a result: %s (%v)", reply, err)
	}
	r := env.Result
	if len(r.Violations) != 1 || r.Violations[0].Host != "denied.example" || r.ViolationSummary != launcherNetwork.Summary {
		t.Errorf("reply's network report %+v, want the sandbox's %+v", r, launcherNetwork)
	}
	// The metric is recorded once the sandbox is gone (after the reply).
	waitFor(t, "the setup time recorded", func() bool {
		return metricValue(t, h, "str_worker_sandbox_setup_seconds_count") == 1
	})
	if sum := metricValue(t, h, "str_worker_sandbox_setup_seconds_sum"); sum != launcherSetupTime.Seconds() {
		t.Errorf("setup time recorded %v s, want the launcher's %v s", sum, launcherSetupTime.Seconds())
	}
}
