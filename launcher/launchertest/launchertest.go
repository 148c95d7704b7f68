// Package launchertest is a fake of the launcher's Provider for the unit
// tests of its callers (the worker): each "sandbox" is a plain child
// process of the test (launcher/hostbox), with the launcher's work
// dir layout (plain directories, uncapped) and its clock, idle limit,
// arm and cancellation, without namespaces, cgroups or root. Containment
// itself is tested against the real launcher (launcher's own tests,
// test/integration, test/e2e).
package launchertest

import (
	"context"
	"fmt"
	"syscall"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/hostbox"
	"github.com/securetoolruntime/str/launcher/provider"
	"github.com/securetoolruntime/str/profiles"
)

// Profiles are the names the fake knows (the embedded profiles' names).
var Profiles = map[string]bool{"restrictive": true, "standard": true, "permissive": true}

// Sandboxes is the fake Provider. UID and GID, when UID is not 0, are the
// ids the tool runs as and its work dir is handed to (the test must be
// root), as a launcher sandbox's own host ids. Template, when set, is
// its StartTemplate (a test's fake templates); nil: no templates.
type Sandboxes struct {
	UID, GID int
	Template func(ctx context.Context, spec provider.TemplateSpec) (provider.Template, error)
}

// CheckProfile knows Profiles; another name wraps profiles.ErrUnknownProfile.
func (Sandboxes) CheckProfile(name string) error {
	if !Profiles[name] {
		return fmt.Errorf("%w: %q", profiles.ErrUnknownProfile, name)
	}
	return nil
}

// CapsWorkDirs: the fake's work dirs are plain directories.
func (Sandboxes) CapsWorkDirs() bool { return false }

// Templates: when Template is set.
func (s Sandboxes) Templates() bool { return s.Template != nil }

func (s Sandboxes) StartTemplate(ctx context.Context, spec provider.TemplateSpec) (provider.Template, error) {
	if s.Template == nil {
		return nil, provider.ErrNoTemplates
	}
	return s.Template(ctx, spec)
}

// Create makes the work dir; the process starts at Box.Start.
func (s Sandboxes) Create(ctx context.Context, spec provider.Spec) (provider.Box, error) {
	if err := s.CheckProfile(spec.Profile); err != nil {
		return nil, fmt.Errorf("%w: %w", launcher.ErrInvalidRequest, err)
	}
	var cred *syscall.Credential
	if s.UID != 0 {
		cred = &syscall.Credential{Uid: uint32(s.UID), Gid: uint32(s.GID)}
	}
	env := append([]string{"PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}, spec.Env...)
	// As the launcher: a credential reaches the tool as its placeholder
	// (the fake has no proxy: the value goes nowhere).
	env = append(env, egress.CredentialEnv(spec.Credentials)...)
	return hostbox.New(ctx, spec, env, cred)
}
