package worker

import (
	"cmp"
	"path/filepath"
	"slices"
	"strings"
)

// Texts the agent reads (error messages, with the tracebacks and stderr
// tails they carry, and the str tools listing) name the worker's
// directories by what they are, never by their host paths: a host path
// tells a model (and whoever steers it) the worker's layout, and is no
// use to it. The worker's own log keeps the full text.
//
// Each directory of the configuration, as configured and with its
// symlinks resolved, is replaced where it stands as a whole path prefix:
//
//	SANDBOX_WORK_DIR/<dir>  /work   (the call's work dir, or any other under the base)
//	SANDBOX_WORK_DIR        /work
//	TOOLS_PYTHON_DIR        <tools>
//	STR_RUNNER_DIR          <str runner>
//	STR_SITE_DIR            <site-packages>
//	ARTIFACT_BASE_PATH      <artifact store>
//	ARTIFACT_AUDIT_LOG      <artifact audit log>
//
// The longest prefix wins, so a directory configured inside another is
// named for itself.

// hostPath is one replacement.
type hostPath struct {
	host, shown string
	oneLevel    bool // also replace the path component after host (the work base's task dirs)
}

// agentPaths returns the replacements of s's configuration, longest host
// path first.
func (s *Server) agentPaths() []hostPath {
	var out []hostPath
	add := func(host, shown string, oneLevel bool) {
		if host == "" || host == "/" || !filepath.IsAbs(host) {
			return
		}
		for _, h := range []string{filepath.Clean(host), resolved(host)} {
			if h != "" && h != "/" && !slices.ContainsFunc(out, func(p hostPath) bool { return p.host == h }) {
				out = append(out, hostPath{host: h, shown: shown, oneLevel: oneLevel})
			}
		}
	}
	add(s.cfg.WorkDir, "/work", true)
	add(s.cfg.ToolsDir, "<tools>", false)
	add(s.cfg.RunnerDir, "<str runner>", false)
	add(s.cfg.SiteDir, "<site-packages>", false)
	add(s.cfg.ArtifactBasePath, "<artifact store>", false)
	add(s.cfg.ArtifactAuditLog, "<artifact audit log>", false)
	slices.SortStableFunc(out, func(a, b hostPath) int { return cmp.Compare(len(b.host), len(a.host)) })
	return out
}

// resolved is path with its symlinks resolved, "" when it cannot be.
func resolved(path string) string {
	r, err := filepath.EvalSymlinks(path)
	if err != nil {
		return ""
	}
	return r
}

// forAgent returns text with the worker's host paths replaced (see
// above); taskDir, when not "", is the call's work dir, replaced first
// and whole whatever its task id holds.
func (s *Server) forAgent(text, taskDir string) string {
	if taskDir != "" {
		for _, h := range []string{filepath.Clean(taskDir), resolved(taskDir)} {
			if h != "" {
				text = replacePathPrefix(text, hostPath{host: h, shown: "/work"})
			}
		}
	}
	for _, p := range s.agentPaths() {
		text = replacePathPrefix(text, p)
	}
	return text
}

// replacePathPrefix replaces every occurrence of p.host that stands as a
// whole path prefix: not preceded by a path character, and followed by
// the end of a path or a "/".
func replacePathPrefix(text string, p hostPath) string {
	var b strings.Builder
	for {
		i := strings.Index(text, p.host)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		end := i + len(p.host)
		if (i > 0 && isPathByte(text[i-1])) || (end < len(text) && text[end] != '/' && isPathByte(text[end])) {
			// Part of a longer path or name: keep it.
			b.WriteString(text[:end])
			text = text[end:]
			continue
		}
		b.WriteString(text[:i])
		b.WriteString(p.shown)
		if p.oneLevel && end < len(text) && text[end] == '/' {
			// The component after the base (a task's work dir) goes too.
			j := end + 1
			for j < len(text) && text[j] != '/' && isPathByte(text[j]) {
				j++
			}
			end = j
		}
		text = text[end:]
	}
}

// isPathByte reports whether c can be part of a path component as the
// worker's directories and task ids spell them (not a separator, quote,
// space or punctuation around a path in a message).
func isPathByte(c byte) bool {
	return c == '/' || c == '.' || c == '_' || c == '-' || c == '+' || c == '@' || c == '~' ||
		'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c >= 0x80
}
