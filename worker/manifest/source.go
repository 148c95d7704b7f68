package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// ErrHashMismatch is wrapped by Verify when the source does not match.
var ErrHashMismatch = errors.New("tool source hash mismatch")

// SourcePath returns the file Python would import for the tool's module
// from toolsDir: for "a.b", toolsDir/a/b/__init__.py if that package
// exists (packages win over modules in Python's path finder), else
// toolsDir/a/b.py. Symlinks are followed only while they stay inside
// toolsDir; the returned path is the resolved one.
func (t *Tool) SourcePath(toolsDir string) (string, error) {
	if !validDotted(t.Module) {
		return "", fmt.Errorf("tool %s: module %q is not a dotted Python identifier", t.Name, t.Module)
	}
	root, err := filepath.EvalSymlinks(toolsDir)
	if err != nil {
		return "", fmt.Errorf("tool %s: tools dir %s: %w", t.Name, toolsDir, err)
	}
	root, err = filepath.Abs(root)
	if err != nil {
		return "", fmt.Errorf("tool %s: tools dir %s: %w", t.Name, toolsDir, err)
	}
	rel := filepath.Join(strings.Split(t.Module, ".")...)
	candidates := []string{filepath.Join(root, rel, "__init__.py"), filepath.Join(root, rel+".py")}
	for _, c := range candidates {
		resolved, err := filepath.EvalSymlinks(c)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("tool %s: resolve %s: %w", t.Name, c, err)
		}
		if !within(root, resolved) {
			return "", fmt.Errorf("tool %s: %s resolves to %s, outside the tools dir %s", t.Name, c, resolved, root)
		}
		st, err := os.Stat(resolved)
		if err != nil {
			return "", fmt.Errorf("tool %s: stat %s: %w", t.Name, resolved, err)
		}
		if !st.Mode().IsRegular() {
			return "", fmt.Errorf("tool %s: %s is not a regular file", t.Name, resolved)
		}
		return resolved, nil
	}
	return "", fmt.Errorf("tool %s: module %s: none of %s exists: %w", t.Name, t.Module, strings.Join(candidates, ", "), os.ErrNotExist)
}

func within(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}

// Verify checks the tool's module source against the manifest's sha256.
// It does nothing when no sha256 is set. The hash covers that one file
// (not other modules it imports, nor a cached .pyc).
func (t *Tool) Verify(toolsDir string) error {
	if t.SHA256 == "" {
		return nil
	}
	path, err := t.SourcePath(toolsDir)
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}
	actual, err := FileSHA256(path)
	if err != nil {
		return fmt.Errorf("verify tool %s: %w", t.Name, err)
	}
	if !strings.EqualFold(actual, t.SHA256) {
		return fmt.Errorf("verify tool %s: %s: %w: expected sha256 %s, actual %s", t.Name, path, ErrHashMismatch, strings.ToLower(t.SHA256), actual)
	}
	return nil
}

// FileSHA256 returns the lowercase hex sha256 of the file at path.
func FileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
