package worker

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/worker/manifest"
)

// Declared packages (spec §5 "package" + "version"; issue 15 §2, issue
// 18 §1). Each is installed at start-up and at every manifest reload,
// never at a call: the Installer finds it (distribution metadata, read as
// files) or installs it (pip in a sandbox of its own, through the
// launcher) into a site dir of its own. A tool's sandboxes get only its
// package's site dir on their import path. A failed installation makes
// the tools that declare that package unavailable (TOOL_NOT_AVAILABLE,
// listed on /readyz), never the worker.

// pkgKey is a declared package as the manifest writes it.
type pkgKey struct{ pkg, version string }

func keyOf(t *manifest.Tool) pkgKey { return pkgKey{t.Package, t.Version} }

// pkgState is where a declared package is, or why it is not.
type pkgState struct {
	dir string // "" = the interpreter's own site-packages
	err error
}

// packageSet holds the outcome of the last installation pass per
// declared package.
type packageSet struct {
	mu sync.Mutex
	m  map[pkgKey]pkgState
}

// installPackages ensures the packages m declares, one Ensure per
// distinct (package, version): those no pass has looked at yet, and
// those of the tools in redo (added or changed by a reload: a failed
// installation is retried when its entry changes, not at every poll). It
// logs what was installed, which version, from where. Runs without the
// dispatch lock.
func (s *Server) installPackages(ctx context.Context, m *manifest.Manifest, redo []string) {
	if s.inst == nil || m == nil {
		return
	}
	again := map[string]bool{}
	for _, name := range redo {
		again[name] = true
	}
	users := map[pkgKey][]string{}
	var order []pkgKey
	for _, name := range m.Names() {
		t := m.Tools[name]
		if t.Package == "" {
			continue
		}
		k := keyOf(t)
		s.pkgs.mu.Lock()
		_, seen := s.pkgs.m[k]
		s.pkgs.mu.Unlock()
		if seen && !again[name] {
			continue
		}
		if users[k] == nil {
			order = append(order, k)
		}
		users[k] = append(users[k], name)
	}
	for _, k := range order {
		tools := users[k]
		got, err := s.inst.Ensure(ctx, m.Tools[tools[0]])
		st := pkgState{dir: got.Dir, err: err}
		s.pkgs.mu.Lock()
		if s.pkgs.m == nil {
			s.pkgs.m = map[pkgKey]pkgState{}
		}
		s.pkgs.m[k] = st
		s.pkgs.mu.Unlock()
		where := got.Dir
		if where == "" {
			where = "the interpreter's own site-packages"
		}
		switch {
		case err != nil:
			s.log.Error("package installation failed: the tools that declare it are unavailable (TOOL_NOT_AVAILABLE, see /readyz)",
				"package", k.pkg, "version", k.version, "tools", tools, "error", err)
		case got.Fresh:
			s.log.Info("package installed", "package", k.pkg, "version", got.Version, "declared_version", k.version,
				"from", got.From, "method", got.Method, "site_dir", where, "tools", tools)
		default:
			s.log.Info("package already installed", "package", k.pkg, "version", got.Version, "declared_version", k.version,
				"site_dir", where, "tools", tools)
		}
	}
}

// packageProblem says why tool's declared package is not usable, or nil.
func (s *Server) packageProblem(tool *manifest.Tool) error {
	if s.inst == nil || tool.Package == "" {
		return nil
	}
	s.pkgs.mu.Lock()
	st, ok := s.pkgs.m[keyOf(tool)]
	s.pkgs.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("tool %s: %w: package %s%s is not installed yet", tool.Name, manifest.ErrToolUnavailable, tool.Package, tool.Version)
	case st.err != nil:
		return fmt.Errorf("tool %s: %w: package %s%s could not be installed: %s", tool.Name, manifest.ErrToolUnavailable,
			tool.Package, tool.Version, firstLine(st.err.Error()))
	}
	return nil
}

// packageDir is the site dir of tool's declared package ("" = none).
func (s *Server) packageDir(tool *manifest.Tool) string {
	if tool.Package == "" {
		return ""
	}
	s.pkgs.mu.Lock()
	defer s.pkgs.mu.Unlock()
	st := s.pkgs.m[keyOf(tool)]
	if st.err != nil {
		return ""
	}
	return st.dir
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
