package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/launchertest"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"github.com/securetoolruntime/str/worker/manifest"
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

// stepFails is a launcher whose Create fails at one of its own steps.
type stepFails struct {
	launchertest.Sandboxes
	err error
}

func (s stepFails) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	if spec.Argv[0] == "/bin/true" {
		return s.Sandboxes.Create(ctx, spec) // the start-up probe passes
	}
	return nil, s.err
}

// stepAtInit is a sandbox whose init failed at one of its steps
// (SandboxExit.SetupError).
type stepAtInit struct{ launchertest.Sandboxes }

func (s stepAtInit) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	c, err := s.Sandboxes.Create(ctx, spec)
	if err != nil || spec.Argv[0] == "/bin/true" {
		return c, err
	}
	return initStepCreated{setupFailsCreated{c}}, nil
}

type initStepCreated struct{ setupFailsCreated }

var initStep = &launcher.StepError{Who: "nsinit", Step: nsinit.StepMounts, Action: "mount proc", Path: "/newroot/proc",
	Msg: "operation not permitted", Errno: int(syscall.EPERM)}

func (initStepCreated) Wait() (*SandboxExit, error) {
	return &SandboxExit{ExitCode: 1, SetupError: initStep}, nil
}

// TestSetupErrorCarriesTheLaunchersStep: §3 of issue 18, error identity
// translated once. A setup failure the launcher (or the init) raised
// reaches the agent as "sandbox setup failed: " and the StepError's own
// text, its step and object unchanged, with no stage of the worker's
// around it (it said `step "create"` over the launcher's L9 before); the
// worker's own stages keep their names; a full disk is
// RESOURCE_EXHAUSTED. setupError is the one place that decides.
func TestSetupErrorCarriesTheLaunchersStep(t *testing.T) {
	noIDs := &launcher.StepError{Who: "launcher", Step: nsinit.StepLCgroup, Action: "lease host ids", Path: launcher.IDLeaseDir,
		Msg: "no free sandbox id block: all 2 blocks of range 5000000:4 (STR_ID_RANGE) are in use", Err: fmt.Errorf("%w: all 2 blocks", launcher.ErrNoFreeIDs)}
	workDir := &launcher.StepError{Who: "launcher", Step: nsinit.StepLWorkDir, Action: "make work dir", Path: "/var/lib/str/work",
		Msg: "permission denied", Errno: int(syscall.EACCES), Err: syscall.EACCES}
	for _, c := range []struct {
		stage string
		err   error
		code  Code
		msg   string
	}{
		{stageCreate, workDir, CodeSandboxFailed, "sandbox setup failed: " + workDir.Error()},
		{stageStart, fmt.Errorf("launcher: start: %w", workDir), CodeSandboxFailed, "sandbox setup failed: launcher: start: " + workDir.Error()},
		{"", initStep, CodeSandboxFailed, "sandbox setup failed: " + initStep.Error()},
		{stageStatusPipe, errors.New("mkfifo: exists"), CodeSandboxFailed, `sandbox setup failed at step "status pipe": mkfifo: exists`},
		{stageRunnerArgs, syscall.ENOSPC, CodeResourceExhausted, "no disk space for the work dir: runner arguments: " + syscall.ENOSPC.Error()},
		{"", fmt.Errorf("mkdir: %w", syscall.ENOSPC), CodeResourceExhausted, "no disk space for the work dir: mkdir: " + syscall.ENOSPC.Error()},
		// No free id block is capacity, named without the host's paths.
		{stageCreate, noIDs, CodeResourceExhausted, "no free sandbox id block: every block of this worker's id range is leased by a running sandbox on its host; retry when calls finish"},
	} {
		e := setupError(c.stage, c.err, nil)
		if e.Code != c.code || e.Message != c.msg {
			t.Errorf("setupError(%q, %v) = %s %q, want %s %q", c.stage, c.err, e.Code, e.Message, c.code, c.msg)
		}
	}

	// Through a call: Create's StepError, and the init's in the exit.
	for _, c := range []struct {
		sb   Sandboxes
		want string
	}{
		{stepFails{err: workDir}, "sandbox setup failed: " + workDir.Error()},
		{stepAtInit{}, "sandbox setup failed: " + initStep.Error()},
	} {
		h := newHarness(t, nil)
		h.rebuild(c.sb, nil)
		h.start()
		code, msg := errorCode(t, h.reply(h.send("echo", nil)))
		if code != string(CodeSandboxFailed) || !strings.HasPrefix(msg, c.want) || strings.Contains(msg, "at step") {
			t.Errorf("%T: %s %q, want SANDBOX_FAILED starting %q", c.sb, code, msg, c.want)
		}
	}
}

// TestChooseFitsTheSandboxClock: the call's sandbox clock is computed
// once, by choose, with launcher.FitTimeout (the one rule, the plan's
// too): the tool's timeout + timeoutSlack within the profile's, whichever
// of the ceiling and the request's profile the call runs with.
func TestChooseFitsTheSandboxClock(t *testing.T) {
	h := newHarness(t, nil)
	set, err := profiles.Embedded()
	must(t, err)
	restrictive, _ := set.Lookup("restrictive")
	standard, _ := set.Lookup("standard")
	for _, c := range []struct {
		ceiling, asked string
		seconds        float64
		prof           *profiles.Profile
	}{
		{"standard", "", 10, standard},
		{"standard", "", 300, standard},
		{"standard", "restrictive", 300, restrictive}, // stricter asked: its clock
		{"restrictive", "standard", 300, restrictive}, // clamped to the ceiling
	} {
		tool := &manifest.Tool{Name: "t", SandboxProfile: c.ceiling, TimeoutSeconds: 300}
		req := &Request{SandboxProfile: c.asked, TimeoutSeconds: c.seconds, TimeoutSet: true}
		got, e := h.srv.choose(tool, req)
		if e != nil {
			t.Fatalf("%+v: %v", c, e)
		}
		want := launcher.FitTimeout(c.prof, time.Duration(c.seconds*float64(time.Second))+timeoutSlack)
		if got.sandboxTimeout != want || got.profile != c.prof.Name {
			t.Errorf("%+v: profile %s clock %v, want %s %v", c, got.profile, got.sandboxTimeout, c.prof.Name, want)
		}
	}
}
