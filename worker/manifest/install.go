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
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/launcher/hostbox"
)

// InstallMethod selects how Installer.Ensure installs a package.
type InstallMethod int

const (
	// MethodAuto uses pip in a sandbox (Installer.Pip) when there is one
	// and pip is installed for the interpreter, and unpacks a pure-Python
	// wheel from WheelsDir otherwise.
	MethodAuto InstallMethod = iota
	// MethodPip always uses pip in a sandbox.
	MethodPip
	// MethodUnpack always unpacks a pure-Python wheel from WheelsDir in Go.
	MethodUnpack
)

// Limits of the Go wheel unpacker (zip bombs).
const (
	maxWheelEntries    = 20000
	maxWheelTotalBytes = 512 << 20
)

// PipJob is one pip installation the Installer asks its PipRunner for:
// Requirement into the empty directory Target, from WheelsDir or IndexURL
// (exactly one is set).
type PipJob struct {
	Requirement string
	Target      string
	WheelsDir   string
	IndexURL    string
	ExtraHosts  []string // more hosts the index's files come from
	AllowBuilds bool     // sdists may be built (in the sandbox); else wheels only
	Output      io.Writer
}

// PipRunner runs pip in a sandbox of its own (the launcher's Install): no
// package code ever runs on the host.
type PipRunner interface {
	RunPip(ctx context.Context, job PipJob) error
}

// Installer installs the packages manifest tools declare (spec §5:
// "package" + "version"), each distribution into a site directory of its
// own, SiteDir/<normalised name>-<version>/, which is the only package
// directory on the import path of that tool's sandboxes: no tool's
// package can replace another's modules.
type Installer struct {
	Python      string        // interpreter the tools run with; default "python3"
	SiteDir     string        // base of the per-package site dirs; required to install
	WheelsDir   string        // offline wheels (and sdists): pip --no-index --find-links, or unpacked; "" or missing = none
	IndexURL    string        // PEP 503 index for pip --index-url; takes precedence over WheelsDir
	ExtraHosts  []string      // more hosts the index's files are served from (port 443)
	AllowBuilds bool          // let pip build sdists (in its sandbox); default: wheels only
	Pip         PipRunner     // where pip runs; nil = nowhere (the unpacker only)
	Method      InstallMethod // MethodAuto by default

	mu      sync.Mutex // one installation at a time
	sysSite []string   // the interpreter's own site-packages dirs (under mu)
	sysErr  error
	sysDone bool
}

// Installed is where a tool's package is.
type Installed struct {
	Package string // the distribution name as declared
	Version string // the version found or installed
	// Dir is the package's own site dir to put on the tool's import
	// path; "" when the interpreter's own site-packages has the package.
	Dir string
	// Fresh: this call installed it; From then says from where (the
	// index URL or the wheels folder) and Method how ("pip in a sandbox",
	// "unpacked").
	Fresh  bool
	From   string
	Method string
}

// Ensure makes sure t's declared package is installed in a version that
// satisfies t.Version, and returns where. Nothing to do when t.Package is
// empty. In order:
//
//  0. the package name, specifiers and module are re-checked (they reach
//     a command line);
//  1. the interpreter's own site-packages has it in a satisfying version
//     (read as files: dist-info metadata) → Dir "";
//  2. a per-package dir SiteDir/<name>-<version>/ has it (newest first);
//  3. else it is installed into a fresh staging dir under SiteDir: by pip
//     in a sandbox (Pip) from IndexURL or WheelsDir, wheels only unless
//     AllowBuilds, or by the Go unpacker from WheelsDir;
//  4. the staging dir must then hold the distribution's metadata with a
//     satisfying version; it is renamed to SiteDir/<name>-<version>/.
//
// No step runs Python with a package on its path on the host.
func (i *Installer) Ensure(ctx context.Context, t *Tool) (Installed, error) {
	out := Installed{Package: t.Package}
	if t.Package == "" {
		return out, nil
	}
	// 0.
	if !packageRE().MatchString(t.Package) {
		return out, fmt.Errorf("install %s: package %q is not a valid distribution name", t.Name, t.Package)
	}
	specs, err := parseOptionalSpecifiers(t.Version)
	if err != nil {
		return out, fmt.Errorf("install %s: version %q: %w", t.Name, t.Version, err)
	}
	if !validDotted(t.Module) {
		return out, fmt.Errorf("install %s: module %q is not a dotted Python identifier", t.Name, t.Module)
	}
	norm := normalizeDist(t.Package)
	i.mu.Lock()
	defer i.mu.Unlock()

	// 1.
	var why []string
	sys, sysErr := i.interpreterSite(ctx)
	for _, d := range sys {
		v, ok, err := distIn(d, norm)
		if err != nil {
			return out, fmt.Errorf("install %s: %w", t.Name, err)
		}
		if ok {
			if satisfied(v, specs) {
				out.Version = v
				return out, nil
			}
			why = append(why, fmt.Sprintf("%s %s in %s does not satisfy %q", t.Package, v, d, t.Version))
		}
	}
	// 2.
	if dir, v, err := i.findInstalled(norm, specs); err != nil {
		return out, fmt.Errorf("install %s: %w", t.Name, err)
	} else if dir != "" {
		out.Dir, out.Version = dir, v
		return out, nil
	}
	if len(why) == 0 {
		why = append(why, fmt.Sprintf("%s is not installed", t.Package))
	}
	if i.SiteDir == "" {
		return out, fmt.Errorf("install %s: %s and no site dir is configured to install it into", t.Name, strings.Join(why, "; "))
	}

	// 3.
	method, err := i.method(sysErr)
	if err != nil {
		return out, fmt.Errorf("install %s: %s, but %w", t.Name, strings.Join(why, "; "), err)
	}
	if err := os.MkdirAll(i.SiteDir, 0o755); err != nil {
		return out, fmt.Errorf("install %s: create site dir %s: %w", t.Name, i.SiteDir, err)
	}
	staging, err := os.MkdirTemp(i.SiteDir, ".staging-"+norm+"-")
	if err != nil {
		return out, fmt.Errorf("install %s: staging dir: %w", t.Name, err)
	}
	defer os.RemoveAll(staging) // gone after the rename; else what a failure left
	if err := os.Chmod(staging, 0o755); err != nil {
		return out, fmt.Errorf("install %s: staging dir: %w", t.Name, err)
	}
	out.Fresh = true
	if method == MethodPip {
		out.Method = "pip in a sandbox"
		job := PipJob{Requirement: t.Package + t.Version, Target: staging, AllowBuilds: i.AllowBuilds}
		if i.IndexURL != "" {
			job.IndexURL, job.ExtraHosts, out.From = i.IndexURL, i.ExtraHosts, i.IndexURL
		} else {
			job.WheelsDir, out.From = i.WheelsDir, i.WheelsDir
		}
		var log bytes.Buffer
		job.Output = &log
		if err := i.Pip.RunPip(ctx, job); err != nil {
			return out, fmt.Errorf("install %s: pip install %s from %s: %w\n%s", t.Name, job.Requirement, out.From, err, tail(log.Bytes(), 20))
		}
	} else {
		out.Method, out.From = "unpacked", i.WheelsDir
		if err := i.unpackInstall(t, specs, staging); err != nil {
			return out, fmt.Errorf("install %s: %w", t.Name, err)
		}
	}

	// 4.
	v, ok, err := distIn(staging, norm)
	switch {
	case err != nil:
		return out, fmt.Errorf("install %s: after installing: %w", t.Name, err)
	case !ok:
		return out, fmt.Errorf("install %s: installed from %s, but no metadata of %s is in %s", t.Name, out.From, t.Package, staging)
	case !satisfied(v, specs) && Satisfiable(v, specs):
		return out, fmt.Errorf("install %s: installed %s %s from %s, which does not satisfy %q", t.Name, t.Package, v, out.From, t.Version)
	}
	final := filepath.Join(i.SiteDir, norm+"-"+safeVersion(v))
	if err := os.RemoveAll(final); err != nil { // a broken earlier one (step 2 did not take it)
		return out, fmt.Errorf("install %s: replace %s: %w", t.Name, final, err)
	}
	if err := os.Rename(staging, final); err != nil {
		return out, fmt.Errorf("install %s: move into %s: %w", t.Name, final, err)
	}
	out.Dir, out.Version = final, v
	return out, nil
}

// method picks how to install (step 3).
func (i *Installer) method(sysErr error) (InstallMethod, error) {
	wheels := i.WheelsDir != "" && isDir(i.WheelsDir)
	pip := func() error {
		switch {
		case i.Pip == nil:
			return errors.New("no sandbox to run pip in (SANDBOX_MODE=none installs only pure-Python wheels from the wheels folder)")
		case sysErr != nil:
			return fmt.Errorf("cannot tell whether pip is installed for %s: %w", i.python(), sysErr)
		case !i.hasPip():
			return fmt.Errorf("pip is not installed for %s", i.python())
		}
		return nil
	}
	switch i.Method {
	case MethodPip:
		if err := pip(); err != nil {
			return 0, err
		}
		if i.IndexURL == "" && !wheels {
			return 0, fmt.Errorf("no index URL and no wheels folder (%q) to install from", i.WheelsDir)
		}
		return MethodPip, nil
	case MethodUnpack:
		if !wheels {
			return 0, fmt.Errorf("no wheels folder (%q) to unpack from", i.WheelsDir)
		}
		return MethodUnpack, nil
	}
	perr := pip()
	switch {
	case perr == nil && (i.IndexURL != "" || wheels):
		return MethodPip, nil
	case i.IndexURL != "":
		return 0, fmt.Errorf("index %s needs pip: %w", i.IndexURL, perr)
	case wheels:
		return MethodUnpack, nil
	}
	return 0, fmt.Errorf("no index URL and no wheels folder (%q) to install from", i.WheelsDir)
}

// findInstalled returns the newest SiteDir/<norm>-<version>/ whose
// metadata says a version that satisfies specs (step 2).
func (i *Installer) findInstalled(norm string, specs []Specifier) (dir, version string, err error) {
	if i.SiteDir == "" {
		return "", "", nil
	}
	entries, err := os.ReadDir(i.SiteDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", "", nil
		}
		return "", "", fmt.Errorf("site dir %s: %w", i.SiteDir, err)
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), norm+"-") {
			continue
		}
		d := filepath.Join(i.SiteDir, e.Name())
		v, ok, err := distIn(d, norm)
		if err != nil {
			return "", "", err
		}
		if !ok || e.Name() != norm+"-"+safeVersion(v) || !satisfied(v, specs) {
			continue
		}
		if dir == "" {
			dir, version = d, v
		} else if c, err := CompareVersions(v, version); err == nil && c > 0 {
			dir, version = d, v
		}
	}
	return dir, version, nil
}

// satisfied: no specifiers, or the version meets them all; a version or
// operator Satisfies cannot evaluate counts as not satisfied (install).
func satisfied(v string, specs []Specifier) bool {
	if len(specs) == 0 {
		return true
	}
	ok, err := Satisfies(v, specs)
	return err == nil && ok
}

// Satisfiable reports whether Satisfies can evaluate v against specs.
func Satisfiable(v string, specs []Specifier) bool {
	_, err := Satisfies(v, specs)
	return err == nil
}

var unsafeVersionRE = lazyRegexp(`[^A-Za-z0-9.+!_-]`)

// safeVersion is a version as a directory name component.
func safeVersion(v string) string { return unsafeVersionRE().ReplaceAllString(v, "_") }

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

// sitePackagesScript prints the interpreter's own site-packages dirs.
// It runs with -I -S: no environment, no user site, no site-packages on
// the path and no .pth or sitecustomize processing; it imports the
// standard library's site module only to ask it.
const sitePackagesScript = `import site
for d in site.getsitepackages():
    print(d)
`

// interpreterSite returns the interpreter's own site-packages dirs, asked
// once (called under i.mu).
func (i *Installer) interpreterSite(ctx context.Context) ([]string, error) {
	if !i.sysDone {
		b, err := hostbox.Python(ctx, i.python(), sitePackagesScript)
		if err != nil {
			i.sysErr = err
		} else {
			i.sysSite = strings.Fields(string(b))
		}
		i.sysDone = ctx.Err() == nil
	}
	return i.sysSite, i.sysErr
}

// hasPip reports whether the interpreter's own site-packages has pip.
func (i *Installer) hasPip() bool {
	for _, d := range i.sysSite {
		if _, ok, _ := distIn(d, "pip"); ok {
			return true
		}
	}
	return false
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

// unpackInstall installs a pure-Python wheel without pip, into target
// (an empty staging dir); it runs no package code:
//
//  1. pick the wheel (findWheel);
//  2. extract every entry into target, refusing absolute names, "..",
//     backslashes, symlinks and oversized archives; files are created
//     O_EXCL; "<dist>.data/purelib" and "platlib" go to the top, other
//     .data schemes (scripts, headers, data) are skipped;
//  3. if the wheel has a RECORD, check every sha256 it lists (a wheel
//     without RECORD is accepted).
func (i *Installer) unpackInstall(t *Tool, specs []Specifier, target string) error {
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
		dest := name
		if top, rest, ok := strings.Cut(name, "/"); ok && isDataDir(top, w) {
			scheme, sub, _ := strings.Cut(rest, "/")
			if scheme != "purelib" && scheme != "platlib" {
				continue
			}
			dest = sub
		}
		if dest == "" || strings.HasSuffix(name, "/") {
			if dest != "" {
				if err := os.MkdirAll(filepath.Join(target, filepath.FromSlash(dest)), 0o755); err != nil {
					return fmt.Errorf("unpack %s: mkdir %s: %w", wheelPath, dest, err)
				}
			}
			continue
		}
		dst := filepath.Join(target, filepath.FromSlash(dest))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("unpack %s: mkdir for %s: %w", wheelPath, dest, err)
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
