package manifest

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"
)

// InstallMethod selects how Installer.Ensure installs a package.
type InstallMethod int

const (
	// MethodAuto uses pip when IndexURL is set or pip is available for
	// the interpreter, and unpacks a pure-Python wheel otherwise.
	MethodAuto InstallMethod = iota
	// MethodPip always uses "python -m pip install --target SiteDir".
	MethodPip
	// MethodUnpack always unpacks a pure-Python wheel from WheelsDir in Go.
	MethodUnpack
)

// Limits of the Go wheel unpacker (zip bombs).
const (
	maxWheelEntries    = 20000
	maxWheelTotalBytes = 512 << 20
)

// Installer installs the packages manifest tools name (spec §5: "package"
// + "version", installed if the module is not importable) into SiteDir,
// which the sandbox puts on the tool's import path.
type Installer struct {
	Python    string        // interpreter to check and install for; default "python3"
	SiteDir   string        // install target (pip --target); required to install
	WheelsDir string        // offline wheels (pip --no-index --find-links, or unpacked)
	IndexURL  string        // package index for pip --index-url; "" = offline only
	ToolsDir  string        // optional: also on the path when checking importability
	Method    InstallMethod // MethodAuto by default

	mu         sync.Mutex // one installation at a time (pip --target is not concurrent-safe)
	pipChecked bool       // pipOK is known (under mu)
	pipOK      bool
}

// Ensure makes t's module importable: nothing to do when t.Package is
// empty, or when the module's top-level package is already importable
// from SiteDir, ToolsDir or the interpreter's own path in a version that
// satisfies t.Version. Otherwise the package is installed into SiteDir:
//
//  1. with IndexURL set: pip install --index-url IndexURL;
//  2. else from WheelsDir: pip install --no-index --find-links WheelsDir
//     when pip is available for Python, else by unpacking the newest
//     matching pure-Python wheel (*-none-any.whl) in Go;
//  3. the module must be importable afterwards.
//
// The importability check only locates the top-level name (find_spec);
// it never imports tool code on the host.
func (i *Installer) Ensure(ctx context.Context, t *Tool) error {
	if t.Package == "" {
		return nil
	}
	// 0. inputs that end up on a command line are re-checked here.
	if !packageRE().MatchString(t.Package) {
		return fmt.Errorf("install %s: package %q is not a valid distribution name", t.Name, t.Package)
	}
	specs, err := parseOptionalSpecifiers(t.Version)
	if err != nil {
		return fmt.Errorf("install %s: version %q: %w", t.Name, t.Version, err)
	}
	if !validDotted(t.Module) {
		return fmt.Errorf("install %s: module %q is not a dotted Python identifier", t.Name, t.Module)
	}
	i.mu.Lock()
	defer i.mu.Unlock()

	// 1. already importable in a suitable version?
	ok, why, err := i.importable(ctx, t, specs)
	if err != nil {
		return fmt.Errorf("install %s: check importability: %w", t.Name, err)
	}
	if ok {
		return nil
	}
	if i.SiteDir == "" {
		return fmt.Errorf("install %s: %s and no site dir is configured to install %s into", t.Name, why, t.Package)
	}
	if err := os.MkdirAll(i.SiteDir, 0o755); err != nil {
		return fmt.Errorf("install %s: create site dir %s: %w", t.Name, i.SiteDir, err)
	}

	// 2. install.
	method := i.Method
	if method == MethodAuto {
		switch {
		case i.IndexURL != "":
			method = MethodPip
		case i.WheelsDir == "":
			return fmt.Errorf("install %s: %s; no wheels dir and no index URL to install %s from", t.Name, why, t.Package)
		case i.pipAvailable(ctx):
			method = MethodPip
		default:
			method = MethodUnpack
		}
	}
	if method == MethodPip {
		err = i.pipInstall(ctx, t)
	} else {
		err = i.unpackInstall(t, specs)
	}
	if err != nil {
		return fmt.Errorf("install %s: %w", t.Name, err)
	}

	// 3. check.
	ok, why, err = i.importable(ctx, t, specs)
	if err != nil {
		return fmt.Errorf("install %s: check after install: %w", t.Name, err)
	}
	if !ok {
		return fmt.Errorf("install %s: installed %s into %s but %s", t.Name, t.Package, i.SiteDir, why)
	}
	return nil
}

func parseOptionalSpecifiers(v string) ([]Specifier, error) {
	if v == "" {
		return nil, nil
	}
	return ParseSpecifiers(v)
}

func (i *Installer) python() string {
	if i.Python == "" {
		return "python3"
	}
	return i.Python
}

// env is the environment for the interpreter: nothing inherited but PATH,
// the site and tools dirs on PYTHONPATH, no user site.
func (i *Installer) env() []string {
	var pp []string
	for _, d := range []string{i.SiteDir, i.ToolsDir} {
		if d != "" {
			pp = append(pp, d)
		}
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "PYTHONNOUSERSITE=1", "PYTHONDONTWRITEBYTECODE=1", "LANG=C.UTF-8", "HOME=" + os.TempDir()}
	if len(pp) > 0 {
		env = append(env, "PYTHONPATH="+strings.Join(pp, string(os.PathListSeparator)))
	}
	return env
}

const importableScript = `import sys, importlib.util
try:
    found = importlib.util.find_spec(sys.argv[1]) is not None
except Exception:
    found = False
if not found:
    print("absent")
    sys.exit(0)
try:
    from importlib.metadata import version, PackageNotFoundError
    try:
        print("present " + version(sys.argv[2]))
    except PackageNotFoundError:
        print("present")
except ImportError:
    print("present")
`

// importable reports whether the module's top-level name is found and the
// installed distribution (if it has metadata) satisfies specs; why says
// what is missing.
func (i *Installer) importable(ctx context.Context, t *Tool, specs []Specifier) (bool, string, error) {
	top := strings.SplitN(t.Module, ".", 2)[0]
	cmd := exec.CommandContext(ctx, i.python(), "-s", "-c", importableScript, top, t.Package)
	cmd.Env = i.env()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return false, "", fmt.Errorf("%s: %w: %s", i.python(), err, strings.TrimSpace(stderr.String()))
	}
	fields := strings.Fields(string(out))
	if len(fields) == 0 || fields[0] == "absent" {
		return false, fmt.Sprintf("module %s is not importable", top), nil
	}
	if len(fields) < 2 || len(specs) == 0 {
		return true, "", nil
	}
	sat, err := Satisfies(fields[1], specs)
	if err != nil {
		// An operator only pip understands: trust what is installed.
		return true, "", nil
	}
	if !sat {
		return false, fmt.Sprintf("installed %s %s does not satisfy %s", t.Package, fields[1], t.Version), nil
	}
	return true, "", nil
}

// pipAvailable reports whether "python -m pip" works, asked once per
// Installer (called under i.mu).
func (i *Installer) pipAvailable(ctx context.Context) bool {
	if !i.pipChecked {
		cmd := exec.CommandContext(ctx, i.python(), "-s", "-m", "pip", "--version")
		cmd.Env = i.env()
		i.pipOK = cmd.Run() == nil
		i.pipChecked = ctx.Err() == nil
	}
	return i.pipOK
}

func (i *Installer) pipInstall(ctx context.Context, t *Tool) error {
	args := []string{"-s", "-m", "pip", "install", "--isolated", "--disable-pip-version-check", "--no-input",
		"--no-cache-dir", "--upgrade", "--target", i.SiteDir}
	if i.IndexURL != "" {
		args = append(args, "--index-url", i.IndexURL)
	} else {
		args = append(args, "--no-index", "--find-links", i.WheelsDir)
	}
	args = append(args, t.Package+t.Version)
	cmd := exec.CommandContext(ctx, i.python(), args...)
	cmd.Env = i.env()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("pip install %s%s: %w\n%s", t.Package, t.Version, err, tail(out, 20))
	}
	return nil
}

func tail(b []byte, lines int) string {
	parts := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// wheelName is a parsed wheel file name (PEP 427).
type wheelName struct {
	file, dist, version, python, abi, platform string
}

var distSepRE = lazyRegexp(`[-_.]+`)

func normalizeDist(name string) string {
	return distSepRE().ReplaceAllString(strings.ToLower(name), "-")
}

func parseWheelName(file string) (wheelName, bool) {
	base, ok := strings.CutSuffix(file, ".whl")
	if !ok {
		return wheelName{}, false
	}
	parts := strings.Split(base, "-")
	if len(parts) != 5 && len(parts) != 6 {
		return wheelName{}, false
	}
	n := len(parts)
	return wheelName{file: file, dist: parts[0], version: parts[1], python: parts[n-3], abi: parts[n-2], platform: parts[n-1]}, true
}

// findWheel returns the newest pure-Python wheel of pkg in dir that
// satisfies specs.
func findWheel(dir, pkg string, specs []Specifier) (wheelName, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return wheelName{}, fmt.Errorf("wheels dir %s: %w", dir, err)
	}
	want := normalizeDist(pkg)
	var candidates []wheelName
	var rejected []string
	for _, e := range entries {
		w, ok := parseWheelName(e.Name())
		if !ok || normalizeDist(w.dist) != want || !e.Type().IsRegular() {
			continue
		}
		if w.abi != "none" || w.platform != "any" {
			rejected = append(rejected, e.Name()+" (not pure Python: needs pip)")
			continue
		}
		sat, err := Satisfies(w.version, specs)
		if err != nil {
			rejected = append(rejected, fmt.Sprintf("%s (%v)", e.Name(), err))
			continue
		}
		if !sat {
			rejected = append(rejected, e.Name()+" (version does not match)")
			continue
		}
		candidates = append(candidates, w)
	}
	if len(candidates) == 0 {
		msg := fmt.Sprintf("no pure-Python wheel of %s in %s", pkg, dir)
		if len(rejected) > 0 {
			msg += "; rejected: " + strings.Join(rejected, ", ")
		}
		return wheelName{}, errors.New(msg)
	}
	sort.Slice(candidates, func(a, b int) bool {
		c, _ := CompareVersions(candidates[a].version, candidates[b].version)
		return c > 0
	})
	return candidates[0], nil
}

// unpackInstall installs a pure-Python wheel without pip:
//
//  1. pick the wheel (findWheel);
//  2. extract every entry into a staging dir inside SiteDir, refusing
//     absolute names, "..", backslashes, symlinks and oversized archives;
//     "<dist>.data/purelib" and "platlib" go to the top, other .data
//     schemes (scripts, headers, data) are skipped;
//  3. if the wheel has a RECORD, check every sha256 it lists (a wheel
//     without RECORD is accepted);
//  4. move each top-level entry into SiteDir, replacing an older one.
func (i *Installer) unpackInstall(t *Tool, specs []Specifier) error {
	if i.WheelsDir == "" {
		return errors.New("no wheels dir to unpack from")
	}
	// 1.
	w, err := findWheel(i.WheelsDir, t.Package, specs)
	if err != nil {
		return err
	}
	wheelPath := filepath.Join(i.WheelsDir, w.file)
	zr, err := zip.OpenReader(wheelPath)
	if err != nil {
		return fmt.Errorf("open wheel %s: %w", wheelPath, err)
	}
	defer zr.Close()

	staging, err := os.MkdirTemp(i.SiteDir, ".str-unpack-")
	if err != nil {
		return fmt.Errorf("unpack %s: staging dir: %w", wheelPath, err)
	}
	defer os.RemoveAll(staging)

	// 2.
	if len(zr.File) > maxWheelEntries {
		return fmt.Errorf("unpack %s: %d entries, more than %d", wheelPath, len(zr.File), maxWheelEntries)
	}
	hashes := map[string]string{} // entry name -> urlsafe base64 sha256
	var record []byte
	var recordName string
	var total int64
	for _, f := range zr.File {
		name := f.Name
		if err := checkEntryName(name); err != nil {
			return fmt.Errorf("unpack %s: %w", wheelPath, err)
		}
		if f.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("unpack %s: entry %q is a symlink", wheelPath, name)
		}
		target := name
		if top, rest, ok := strings.Cut(name, "/"); ok && isDataDir(top, w) {
			scheme, sub, _ := strings.Cut(rest, "/")
			if scheme != "purelib" && scheme != "platlib" {
				continue
			}
			target = sub
		}
		if target == "" || strings.HasSuffix(name, "/") {
			if target != "" {
				if err := os.MkdirAll(filepath.Join(staging, filepath.FromSlash(target)), 0o755); err != nil {
					return fmt.Errorf("unpack %s: mkdir %s: %w", wheelPath, target, err)
				}
			}
			continue
		}
		dst := filepath.Join(staging, filepath.FromSlash(target))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("unpack %s: mkdir for %s: %w", wheelPath, target, err)
		}
		sum, n, content, err := extractEntry(f, dst, maxWheelTotalBytes-total, strings.HasSuffix(name, ".dist-info/RECORD"))
		if err != nil {
			return fmt.Errorf("unpack %s: entry %s: %w", wheelPath, name, err)
		}
		total += n
		hashes[name] = sum
		if content != nil {
			record, recordName = content, name
		}
	}

	// 3.
	if record != nil {
		if err := checkRecord(record, hashes); err != nil {
			return fmt.Errorf("unpack %s: %s: %w", wheelPath, recordName, err)
		}
	}

	// 4.
	tops, err := os.ReadDir(staging)
	if err != nil {
		return fmt.Errorf("unpack %s: list staging dir: %w", wheelPath, err)
	}
	for _, e := range tops {
		dst := filepath.Join(i.SiteDir, e.Name())
		if err := os.RemoveAll(dst); err != nil {
			return fmt.Errorf("unpack %s: replace %s: %w", wheelPath, dst, err)
		}
		if err := os.Rename(filepath.Join(staging, e.Name()), dst); err != nil {
			return fmt.Errorf("unpack %s: move into %s: %w", wheelPath, dst, err)
		}
	}
	return nil
}

// isDataDir reports whether a top-level directory is the wheel's
// "<dist>-<version>.data" (names compared normalised, as the file name's
// spelling of the distribution may differ from the archive's).
func isDataDir(top string, w wheelName) bool {
	base, ok := strings.CutSuffix(top, ".data")
	return ok && normalizeDist(base) == normalizeDist(w.dist+"-"+w.version)
}

// checkEntryName refuses zip names that could leave the target directory.
func checkEntryName(name string) error {
	switch {
	case name == "":
		return errors.New("empty entry name")
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("entry %q contains NUL", name)
	case strings.Contains(name, `\`):
		return fmt.Errorf("entry %q contains a backslash", name)
	case path.IsAbs(name):
		return fmt.Errorf("entry %q is absolute", name)
	}
	for _, part := range strings.Split(strings.TrimSuffix(name, "/"), "/") {
		if part == ".." || part == "." || part == "" {
			return fmt.Errorf("entry %q has a %q path element", name, part)
		}
	}
	return nil
}

// extractEntry writes one entry to dst (created exclusively) and returns
// its sha256 in RECORD form, its size, and its content when keep is set.
func extractEntry(f *zip.File, dst string, budget int64, keep bool) (string, int64, []byte, error) {
	rc, err := f.Open()
	if err != nil {
		return "", 0, nil, err
	}
	defer rc.Close()
	mode := os.FileMode(0o644)
	if f.Mode()&0o111 != 0 {
		mode = 0o755
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return "", 0, nil, err
	}
	h := sha256.New()
	var kept bytes.Buffer
	w := io.MultiWriter(out, h)
	if keep {
		w = io.MultiWriter(out, h, &kept)
	}
	n, err := io.Copy(w, io.LimitReader(rc, budget+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", 0, nil, err
	}
	if n > budget {
		return "", 0, nil, fmt.Errorf("the wheel unpacks to more than %d bytes", maxWheelTotalBytes)
	}
	var content []byte
	if keep {
		content = kept.Bytes()
	}
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)), n, content, nil
}

// checkRecord compares the sha256 entries of a RECORD file with the
// extracted entries' hashes.
func checkRecord(record []byte, hashes map[string]string) error {
	rows, err := csv.NewReader(bytes.NewReader(record)).ReadAll()
	if err != nil {
		return fmt.Errorf("parse: %w", err)
	}
	for _, row := range rows {
		if len(row) < 2 || row[1] == "" {
			continue
		}
		algo, want, ok := strings.Cut(row[1], "=")
		if !ok || algo != "sha256" {
			continue
		}
		got, present := hashes[row[0]]
		if !present {
			continue // listed but not extracted (a skipped .data scheme)
		}
		if got != strings.TrimRight(want, "=") {
			return fmt.Errorf("%s: sha256 %s, RECORD says %s", row[0], got, want)
		}
	}
	return nil
}
