package worker

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/worker/manifest"
)

// Start-up checks of the tools (issue: a worker that starts "serving" and
// then fails every call). They run at start-up and at every manifest
// reload (each problem logged as an error), for /readyz (listed), and when
// an executor takes a queued call (answered TOOL_NOT_AVAILABLE: the
// worker's configuration is at fault, never the caller).

// sourceCheck is how the sandboxes of this worker read the tools dir.
func (s *Server) sourceCheck() manifest.SourceCheck {
	c := manifest.SourceCheck{
		ToolsDir: s.cfg.ToolsDir, Given: s.cfg.toolsDirGiven,
		ManifestDir: filepath.Dir(s.cfg.ManifestPath), OwnerUID: -1,
	}
	switch {
	case s.cfg.SandboxMode == ModeNone:
		// The tool runs as the worker: existence is all that matters.
		c.SkipPermissions = true
	case os.Geteuid() != 0:
		// Rootless: the launcher maps the worker's uid to the tool's uid
		// inside the sandbox, so files the worker owns are read with the
		// owner's bits. As root, each sandbox's uid owns nothing here.
		c.OwnerUID = os.Geteuid()
	}
	return c
}

// toolProblem says why tool cannot work on this worker, or nil.
func (s *Server) toolProblem(tool *manifest.Tool) error {
	if p := tool.SandboxProfile; p != "" {
		if err := s.sb.CheckProfile(p); err != nil {
			return fmt.Errorf("tool %s: %w: sandbox_profile %q: %w", tool.Name, manifest.ErrToolUnavailable, p, err)
		}
	}
	if err := s.packageProblem(tool); err != nil {
		return err
	}
	if tool.Credentials != nil && s.cfg.SandboxMode == ModeNone {
		// Without a sandbox there is no proxy to keep the value out.
		return fmt.Errorf("tool %s: %w: credentials need a sandbox (SANDBOX_MODE is none)", tool.Name, manifest.ErrToolUnavailable)
	}
	return tool.CheckSource(s.sourceCheck())
}

// notHereError is the answer to a call of a tool that cannot work on this
// host (toolProblem's err): the worker log says why (its paths are the
// host's), but a runtime class this host cannot run is named with its
// reason, which names nothing of the host's (launcher.RuntimeError).
func notHereError(name string, err error) *Error {
	var re *launcher.RuntimeError
	if errors.As(err, &re) {
		return errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker: %s", truncateName(name), truncate(re.Error(), maxReasonInMessage))
	}
	return errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker: it cannot be loaded here (the worker log says why)", truncateName(name))
}

// unavailableEntryError is the answer to a call of a manifest entry that
// failed its checks: the worker's configuration is at fault, and the
// reason (the manifest's own words, with line numbers) says what to fix.
func unavailableEntryError(name, reason string) *Error {
	return errorf(CodeToolNotAvailable, "Tool '%s' is not available on this worker: its manifest entry is invalid: %s",
		truncateName(name), truncate(reason, maxReasonInMessage))
}

// maxReasonInMessage bounds a manifest entry's reasons in a reply.
const maxReasonInMessage = 2048

// unavailableTools maps each entry of m that cannot work to why: those
// the manifest's checks refused (Manifest.Unavailable) and those that
// passed them but cannot work on this host.
func (s *Server) unavailableTools(m *manifest.Manifest) map[string]string {
	out := map[string]string{}
	if m == nil {
		return out
	}
	for name, reason := range m.Unavailable {
		out[name] = "manifest entry invalid: " + reason
	}
	for _, name := range m.Names() {
		if err := s.toolProblem(m.Tools[name]); err != nil {
			out[name] = err.Error()
		}
	}
	return out
}

// logToolProblems logs one error per tool of m that cannot work.
func (s *Server) logToolProblems(m *manifest.Manifest) {
	bad := s.unavailableTools(m)
	for _, name := range sortedKeys(bad) {
		s.log.Error("tool cannot work on this worker: its calls will be answered TOOL_NOT_AVAILABLE", "tool", name, "error", bad[name])
	}
	if len(bad) > 0 {
		s.log.Error("tools unavailable (see /readyz)", "count", len(bad), "of", len(m.Tools)+len(m.Unavailable))
	}
}
