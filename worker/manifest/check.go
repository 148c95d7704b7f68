package manifest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// ErrToolUnavailable is wrapped by CheckSource: the tool cannot work on
// this host as configured (the operator's fault, never the caller's).
var ErrToolUnavailable = errors.New("tool unavailable")

// SourceCheck says how CheckSource judges a tool's module.
type SourceCheck struct {
	// ToolsDir is TOOLS_PYTHON_DIR, absolute. The sandbox sees it bound
	// at the same path, so the permissions of its host ancestors do not
	// matter; its own and those below it do.
	ToolsDir string
	// Given is TOOLS_PYTHON_DIR as configured, before a relative path was
	// resolved against the working directory ("" = ToolsDir); used in
	// hints only.
	Given string
	// ManifestDir is the directory of the manifest file; used in hints.
	ManifestDir string
	// OwnerUID is the host uid the sandboxed tool reads as when that uid
	// can own files here (rootless: the worker's own uid, mapped inside);
	// files it owns are judged by their owner bits. -1 = the tool runs as
	// an unprivileged uid unique to each sandbox, which owns nothing: only
	// the "other" bits count (world-readable files, world-searchable
	// directories).
	OwnerUID int
	// SkipPermissions: the tool runs as the worker itself
	// (SANDBOX_MODE=none); only existence is checked.
	SkipPermissions bool
}

// CheckSource reports why the runner, inside a sandbox, could not import
// the tool's module from the tools dir, or nil. The error wraps
// ErrToolUnavailable and says what to change. Checks, in order:
//  1. the tools dir exists and is a directory (hint: a relative
//     TOOLS_PYTHON_DIR is resolved against the working directory);
//  2. the module file exists under it (SourcePath); a tool with a package
//     whose module is not there passes (the module may be the package's,
//     installed into its own site dir at start-up; hint: TOOLS_PYTHON_DIR names the manifest's directory
//     instead of its python/ folder);
//  3. the tools dir and every package directory down to the module can
//     be listed and searched by the sandbox's uid, and the module file
//     can be read by it (Python's path finder lists each directory).
func (t *Tool) CheckSource(c SourceCheck) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("tool %s: %w: %s", t.Name, ErrToolUnavailable, fmt.Sprintf(format, a...))
	}
	// 1. the tools dir.
	st, err := os.Stat(c.ToolsDir)
	if err != nil {
		hint := ""
		if g := c.Given; g != "" && !filepath.IsAbs(g) && c.ManifestDir != "" {
			if alt := filepath.Join(c.ManifestDir, g); isDir(alt) {
				hint = fmt.Sprintf(" (TOOLS_PYTHON_DIR=%q is relative: it is resolved against the working directory, not the manifest's directory; did you mean %s?)", g, alt)
			}
		}
		return fail("TOOLS_PYTHON_DIR %s: %v%s", c.ToolsDir, err, hint)
	}
	if !st.IsDir() {
		return fail("TOOLS_PYTHON_DIR %s is not a directory", c.ToolsDir)
	}
	// 2. the module file.
	path, err := t.SourcePath(c.ToolsDir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return fail("%v", err)
		}
		if t.Package != "" {
			return nil // may be the package's own module (its site dir)
		}
		sub := filepath.Join(c.ToolsDir, "python")
		if _, serr := t.SourcePath(sub); serr == nil {
			if c.ManifestDir != "" && filepath.Clean(c.ManifestDir) == filepath.Clean(c.ToolsDir) {
				return fail("TOOLS_PYTHON_DIR %s is the manifest's directory, not its python/ folder: module %s is in %s; set TOOLS_PYTHON_DIR=%s",
					c.ToolsDir, t.Module, sub, sub)
			}
			return fail("module %s is not in TOOLS_PYTHON_DIR %s but in its python/ folder: set TOOLS_PYTHON_DIR=%s", t.Module, c.ToolsDir, sub)
		}
		return fail("%v", err)
	}
	// 3. what the sandbox's uid can read, from the tools dir down.
	if c.SkipPermissions {
		return nil
	}
	root, err := filepath.EvalSymlinks(c.ToolsDir)
	if err != nil {
		return fail("TOOLS_PYTHON_DIR %s: %v", c.ToolsDir, err)
	}
	rel, err := filepath.Rel(root, filepath.Dir(path))
	if err != nil {
		return fail("%v", err)
	}
	dir := root
	dirs := []string{root}
	if rel != "." {
		for _, part := range strings.Split(rel, string(filepath.Separator)) {
			dir = filepath.Join(dir, part)
			dirs = append(dirs, dir)
		}
	}
	for _, d := range dirs {
		st, err := os.Stat(d)
		if err != nil {
			return fail("%v", err)
		}
		if !c.allows(st, 0o5) {
			return fail("the sandbox's uid cannot list directory %s (mode %s, owner uid %d): make it world-readable and searchable (chmod o+rx)", d, st.Mode().Perm(), ownerOf(st))
		}
	}
	st, err = os.Stat(path)
	if err != nil {
		return fail("%v", err)
	}
	if !c.allows(st, 0o4) {
		return fail("the sandbox's uid cannot read %s (mode %s, owner uid %d): make it world-readable (chmod o+r)", path, st.Mode().Perm(), ownerOf(st))
	}
	return nil
}

// allows reports whether the sandbox's uid has the permission bits need
// (4 = read, 1 = search) on st: the owner bits when it owns the file,
// else the "other" bits. Group membership is not credited.
func (c SourceCheck) allows(st os.FileInfo, need os.FileMode) bool {
	perm := st.Mode().Perm()
	if c.OwnerUID >= 0 && ownerOf(st) == c.OwnerUID {
		return (perm>>6)&need == need
	}
	return perm&need == need
}

func ownerOf(st os.FileInfo) int {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(sys.Uid)
	}
	return -1
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}
