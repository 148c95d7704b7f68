package worker

import (
	"context"
	"fmt"
	"time"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/hostbox"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/profiles"
)

// Unsandboxed runs each tool as a plain child process of the worker,
// WITHOUT ANY ISOLATION: the tool has the worker's uid, files, network and
// capabilities. It is what SANDBOX_MODE=none selects, explicitly, for
// trusted tools on a host that cannot create sandboxes (the reference's
// "direct" mode); the worker says so at start-up and on every call's log
// lines. What it keeps: the profile's wall-clock timeout (capped as the
// launcher caps it), the profile's fixed environment plus the call's (never
// the worker's own environment, which holds its secrets), its own process
// group killed as a whole at the end.
type Unsandboxed struct {
	// Profiles resolves profile names (the tighten-only rule still
	// applies to names even though nothing enforces the limits).
	Profiles *profiles.Set
}

// CheckProfile looks the name up; unknown names wrap ErrUnknownProfile.
func (u Unsandboxed) CheckProfile(name string) error {
	if _, err := u.Profiles.Lookup(name); err != nil {
		return fmt.Errorf("%w: %w", ErrUnknownProfile, err)
	}
	return nil
}

// Create checks the profile and the timeout and makes the work dir
// (hostbox.New: plain directories, uncapped); nothing runs until
// Start. As the launcher's plan: Timeout 0 is the profile's, and one
// above the profile's is refused (the worker fits its timeouts with launcher.FitTimeout).
func (u Unsandboxed) Create(ctx context.Context, spec SandboxSpec) (Sandbox, error) {
	prof, err := u.Profiles.Lookup(spec.Profile)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSandboxRequest, err)
	}
	limit := time.Duration(prof.Timeout)
	switch {
	case spec.Timeout < 0 || spec.Idle < 0:
		return nil, fmt.Errorf("%w: timeout %s, idle limit %s: must not be negative", ErrInvalidSandboxRequest, spec.Timeout, spec.Idle)
	case limit > 0 && spec.Timeout > limit:
		return nil, fmt.Errorf("%w: timeout %s asked, profile %s allows at most %s", ErrInvalidSandboxRequest, spec.Timeout, prof.Name, limit)
	}
	spec.Timeout = launcher.FitTimeout(prof, spec.Timeout) // 0: the profile's
	env := make([]string, 0, len(prof.Env.Set)+len(spec.Env))
	for _, k := range sortedKeys(prof.Env.Set) {
		env = append(env, k+"="+prof.Env.Set[k])
	}
	b, err := hostbox.New(ctx, spec, append(env, spec.Env...), nil)
	if err != nil {
		return nil, fmt.Errorf("SANDBOX_MODE=none: %w", err)
	}
	return b, nil
}

// CapsWorkDirs: a plain directory per call, uncapped.
func (Unsandboxed) CapsWorkDirs() bool { return false }

// Templates: none (every call runs cold).
func (Unsandboxed) Templates() bool { return false }

func (Unsandboxed) StartTemplate(context.Context, provider.TemplateSpec) (provider.Template, error) {
	return nil, provider.ErrNoTemplates
}
