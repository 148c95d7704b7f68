// Package workdir is launcher step L9, the worker's work dirs. A
// sandbox made through Provider.Create (launcher/provider) gets a work
// dir the launcher makes, caps, fills, hands to the tool and removes:
//
//	<base>/<prefix><16 hex digits>/       the tool's cwd, bound at the same path
//	    .str-workdir                      the marker (the launcher's, 0444)
//	    input/                            the caller's (inputs), read-only to the tool
//	    output/                           the tool's
//	    .str/                             the runner's own files, a tmpfs of their own
//	        runner_args.json              written by the caller before Start
//	        result.json                   written by the runner
//	        status.pipe                   the status FIFO
//
// Root mode, in order (each sub-step of Make, L9.1-L9.6):
//
//  1. mkdir under a fresh generated name (O_EXCL: an existing name is
//     never touched), mode 0700, and the marker, before anything else;
//  2. a tmpfs capped by the profile's work_dir (size, nr_inodes), owned
//     by the tool's leased host ids, mounted through an O_PATH|O_NOFOLLOW
//     descriptor of the dir: the tool gets ENOSPC at either cap, and the
//     pages are charged to the memory cgroup of whoever writes them;
//  3. the marker again, inside the tmpfs (the start-up sweep reads it);
//  4. .str/: a second, small tmpfs (RunnerSpace bytes, RunnerInodes) on
//     which the runner's files live, so a tool that fills its work dir
//     can still return its result (issue 18: "cannot write result ... No
//     space left on device"): the tool's files never compete with them;
//  5. input/ (the caller's, 0755), output/ (0700) and the FIFO (0600);
//     every mode set with fchmod after creation, never left to the umask;
//  6. ownership: the dir, output/, .str/ and the FIFO to the tool's ids
//     (lchown: nothing there can be a symlink yet, nothing but the
//     launcher can write there before Start).
//
// Both tmpfs mounts carry the source name Source; SweepStale
// unmounts exactly those, directly under the base, on a generated name.
// Removal (Box.Release) unmounts (MNT_DETACH) and removes only the
// directory made in L9.1, checked by device and inode first.
//
// Rootless (and for the host-process providers) nothing is mounted or
// chowned: the same layout in plain directories, owned by the caller,
// uncapped (Provider.CapsWorkDirs says so).
package workdir

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/launcher/procfs"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// Marker is the file every work dir carries: its content is the
// dir's own name, and the start-up sweep removes only dirs carrying it.
const Marker = ".str-workdir"

// Source is the source name of every work dir tmpfs the launcher
// mounts (the work dir's and its runner dir's).
const Source = "str-workdir"

// RunnerDirName is the runner's directory inside a work dir: relative to
// the work dir (the tool's cwd), so an argv can name its files before the
// work dir exists.
const RunnerDirName = ".str"

// Files of the runner dir.
const (
	RunnerArgsName   = "runner_args.json"
	RunnerResultName = "result.json"
	StatusPipeName   = "status.pipe"
)

// RunnerSpace and RunnerInodes cap the runner dir's tmpfs: the arguments,
// the result written next to its final name and renamed, and the FIFO,
// with room to spare (the worker's own limits on both are below 16 MiB).
// Only what is written there is ever allocated.
const (
	RunnerSpace  = 64 << 20
	RunnerInodes = 16
)

// randHex is the length of a generated name's random part.
const randHex = 16

// Modes of what the launcher creates in a work dir. Each is set with
// fchmod/chmod after creation, never left to the umask: under the
// systemd unit's UMask=0027 a mode given to mkdir loses bits the tool's
// uid needs.
const (
	modeWorkDir   = 0o700 // the tool's
	modeInputDir  = 0o755 // the caller's, readable by the tool
	modeOutputDir = 0o700 // the tool's
	modeRunnerDir = 0o700 // the tool's
	modeFIFO      = 0o600 // the tool's
	modeMarker    = 0o444
)

// Spec says where a sandbox's work dir is made: directly under
// Base (which exists, is the caller's and no one else may write), named
// Prefix followed by 16 random hex digits. Prefix is lowercase letters,
// dots and dashes, ending in a dash ("call-").
type Spec struct {
	Base   string
	Prefix string
}

// Dir is a sandbox's work dir as the launcher made it: host paths,
// each the same inside the sandbox.
type Dir struct {
	Path       string // the tool's cwd
	Input      string // Path/input: the caller's; it writes the inputs here (O_EXCL, no symlink followed)
	Output     string // Path/output: the tool's
	Runner     string // Path/.str: the runner's files, off the work dir's cap
	Args       string // Runner/runner_args.json: the caller writes it before Start
	Result     string // Runner/result.json
	StatusPipe string // Runner/status.pipe

	dev, ino uint64 // of the directory as made, before any tmpfs
	mounts   int    // tmpfs mounts on it and under it (root mode)
}

// checkPrefix refuses a prefix that could make a name outside the base
// or one SweepStale would not recognise.
func checkPrefix(p string) error {
	if p == "" || !strings.HasSuffix(p, "-") || len(p) > 32 || strings.Trim(p, "abcdefghijklmnopqrstuvwxyz.-") != "" {
		return fmt.Errorf("%w: work dir prefix %q: want lowercase letters, dots and dashes ending in a dash", launcher.ErrInvalidRequest, p)
	}
	return nil
}

// Make is step L9, a work dir (the package comment numbers its steps).
// capacity nil: nothing is mounted; uid < 0: nothing is chowned. On
// error nothing of it is left. A per-tool template's call's is capped
// by its plan's work_dir and owned by its pair's host id (package
// launcher/template). Remove removes it.
func Make(spec Spec, capacity *profiles.WorkDir, uid, gid int) (*Dir, error) {
	w, err := New(spec)
	if err != nil {
		return nil, err
	}
	if err := w.Fill(capacity, uid, gid); err != nil {
		_ = w.Remove()
		return nil, err
	}
	return w, nil
}

// MakeUncapped is Make without a cap: plain directories,
// nothing mounted (a box without a sandbox: launcher/hostbox); uid < 0:
// nothing is chowned.
func MakeUncapped(spec Spec, uid, gid int) (*Dir, error) {
	return Make(spec, nil, uid, gid)
}

// Fill is L9.2-L9.6 on the dir L9.1 (New) made. On error the caller
// removes w (remove unmounts what was mounted).
func (w *Dir) Fill(capacity *profiles.WorkDir, uid, gid int) error {
	se := func(action, path, detail string, err error) *launcher.StepError {
		return &launcher.StepError{Who: "launcher", Step: nsinit.StepLWorkDir, Action: action, Path: path, Detail: detail, Msg: err.Error(), Err: err}
	}
	if capacity != nil && (capacity.Size <= 0 || capacity.Inodes <= 0) {
		return se("cap work dir", w.Path, "", errors.New("the profile sets no work_dir cap (size and inodes)"))
	}
	name := filepath.Base(w.Path)
	// 2. the capped tmpfs, owned by the tool.
	if capacity != nil {
		data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", int64(capacity.Size), capacity.Inodes, uid, gid)
		if err := mountTmpfs(w.Path, data); err != nil {
			return se("mount work dir tmpfs", w.Path, data, err)
		}
		w.mounts++
		// 3. the marker again, on the tmpfs.
		if err := writeMarker(w.Path, name); err != nil {
			return se("mark work dir", w.Path, "on its tmpfs", err)
		}
	}
	// 4. the runner's dir, on its own small tmpfs.
	if err := mkdirMode(w.Runner, modeRunnerDir); err != nil {
		return se("make runner dir", w.Runner, "", err)
	}
	if capacity != nil {
		data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700,uid=%d,gid=%d", RunnerSpace, RunnerInodes, uid, gid)
		if err := mountTmpfs(w.Runner, data); err != nil {
			return se("mount runner dir tmpfs", w.Runner, data, err)
		}
		w.mounts++
	}
	// 5. input/, output/, the FIFO. Nothing but the launcher can write
	// in the dir yet, so the path chmod follows is the FIFO just made.
	if err := mkdirMode(w.Input, modeInputDir); err != nil {
		return se("make input dir", w.Input, "", err)
	}
	if err := mkdirMode(w.Output, modeOutputDir); err != nil {
		return se("make output dir", w.Output, "", err)
	}
	if err := unix.Mkfifo(w.StatusPipe, modeFIFO); err != nil {
		return se("make status FIFO", w.StatusPipe, "", err)
	}
	if err := unix.Fchmodat(unix.AT_FDCWD, w.StatusPipe, modeFIFO, 0); err != nil {
		return se("chmod status FIFO", w.StatusPipe, fmt.Sprintf("%o", modeFIFO), err)
	}
	// 6. ownership (lchown: never follow a symlink).
	if uid >= 0 {
		for _, p := range []string{w.Path, w.Output, w.Runner, w.StatusPipe} {
			if err := os.Lchown(p, uid, gid); err != nil {
				return se("chown work dir", p, fmt.Sprintf("to %d:%d", uid, gid), err)
			}
		}
	}
	return nil
}

// New is L9.1: the dir under a fresh name, and its marker.
func New(spec Spec) (*Dir, error) {
	if err := checkPrefix(spec.Prefix); err != nil {
		return nil, err
	}
	w, err := newIn(spec)
	if err != nil {
		return nil, &launcher.StepError{Who: "launcher", Step: nsinit.StepLWorkDir, Action: "make work dir", Path: spec.Base,
			Detail: spec.Prefix + "<random>", Msg: err.Error(), Err: err}
	}
	return w, nil
}

// newIn makes the dir and its marker under a fresh generated name.
// A name that exists is never touched: another one is tried.
func newIn(spec Spec) (*Dir, error) {
	for try := 0; try < 4; try++ {
		var rnd [randHex / 2]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, fmt.Errorf("work dir name: %w", err)
		}
		path := filepath.Join(spec.Base, spec.Prefix+hex.EncodeToString(rnd[:]))
		err := mkdirMode(path, modeWorkDir)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("stat %s: %w", path, err)
		}
		// The marker makes it removable as stale after a crash; a dir
		// that cannot be marked is removed again (it is empty and ours).
		if err := writeMarker(path, filepath.Base(path)); err != nil {
			os.Remove(path)
			return nil, err
		}
		runner := filepath.Join(path, RunnerDirName)
		return &Dir{Path: path, Input: filepath.Join(path, "input"), Output: filepath.Join(path, "output"),
			Runner: runner, Args: filepath.Join(runner, RunnerArgsName), Result: filepath.Join(runner, RunnerResultName),
			StatusPipe: filepath.Join(runner, StatusPipeName), dev: st.Dev, ino: st.Ino}, nil
	}
	return nil, fmt.Errorf("mkdir under %s: every generated name (%s + %d hex digits) tried exists", spec.Base, spec.Prefix, randHex)
}

// writeMarker creates dir's marker (O_EXCL|O_NOFOLLOW) holding name.
func writeMarker(dir, name string) error {
	path := filepath.Join(dir, Marker)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, modeMarker)
	if err != nil {
		return fmt.Errorf("mark %s: %w", dir, err)
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(name)); err != nil {
		return fmt.Errorf("mark %s: %w", dir, err)
	}
	if err := unix.Fchmod(fd, modeMarker); err != nil {
		return fmt.Errorf("mark %s: chmod %o: %w", dir, modeMarker, err)
	}
	return nil
}

// mountTmpfs mounts a Source tmpfs with data on dir (nosuid,
// nodev, noexec is not set: a tool may run what it wrote, as before),
// through an O_PATH|O_NOFOLLOW descriptor so no symlink is followed.
func mountTmpfs(dir, data string) error {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer unix.Close(fd)
	return unix.Mount(Source, fmt.Sprintf("/proc/self/fd/%d", fd), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, data)
}

// Remove unmounts w's tmpfs mounts (the sandbox may still hold them:
// MNT_DETACH, their pages are freed once the last user is gone) and
// removes w, after checking that its path is still the directory made
// (Box.Release; a per-tool template's call's, made by Make).
func (w *Dir) Remove() error {
	// 1. the tmpfs mounts, the runner dir's first (under the work dir's).
	if w.mounts > 0 {
		for _, p := range []string{w.Runner, w.Path} {
			if err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil &&
				!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmount %s: %w", p, err)
			}
		}
		w.mounts = 0
	}
	// 2. still the directory made: a real directory, same device and inode.
	var st unix.Stat_t
	if err := unix.Lstat(w.Path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", w.Path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Dev != w.dev || st.Ino != w.ino {
		return fmt.Errorf("%s is not the work dir the launcher made (device %d inode %d, made as %d %d): left alone",
			w.Path, st.Dev, st.Ino, w.dev, w.ino)
	}
	// 3. remove.
	return os.RemoveAll(w.Path)
}

// mkdirMode creates path (which must not exist) and sets its mode through
// a descriptor opened without following a symlink, whatever the umask.
func mkdirMode(path string, mode os.FileMode) error {
	if err := os.Mkdir(path, mode); err != nil {
		return err
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, uint32(mode.Perm())); err != nil {
		return fmt.Errorf("chmod %s to %o: %w", path, mode.Perm(), err)
	}
	return nil
}

// generatedName reports whether name is of the form work dirs are given:
// one of prefixes and 16 lowercase hex digits.
func generatedName(name string, prefixes []string) bool {
	for _, prefix := range prefixes {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || len(rest) != randHex || checkPrefix(prefix) != nil {
			continue
		}
		return strings.Trim(rest, "0123456789abcdef") == ""
	}
	return false
}

// staleProblem says why path (directly under the base) is not a
// work dir a previous run left, "" when it is one: its name is
// generated, it is a real directory, and its marker is a regular file
// owned by this process's uid whose content is the directory's name.
func staleProblem(path string, prefixes []string) string {
	name := filepath.Base(path)
	if !generatedName(name, prefixes) {
		return "its name is not one the launcher generates"
	}
	if fi, err := os.Lstat(path); err != nil || !fi.IsDir() {
		return "not a directory"
	}
	marker := filepath.Join(path, Marker)
	var st unix.Stat_t
	if err := unix.Lstat(marker, &st); err != nil {
		return "no marker: " + err.Error()
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Size != int64(len(name)) {
		return fmt.Sprintf("its marker is not the launcher's (mode %o, uid %d, %d bytes)", st.Mode, st.Uid, st.Size)
	}
	data, err := os.ReadFile(marker)
	if err != nil || string(data) != name {
		return "its marker does not name it"
	}
	return ""
}

// Sweep is what SweepStale did.
type Sweep struct {
	Unmounted []string          // tmpfs mounts detached
	Removed   []string          // stale work dirs removed
	Kept      map[string]string // entries under the base left alone, and why
}

// SweepStale removes what a previous run left under base (a caller
// SIGKILLed with sandboxes running), at start-up, before any sandbox of
// this run exists; prefixes are those the caller's Specs use:
//
//  1. every Source tmpfs mounted on a generated name directly
//     under base, or on its runner dir, read from /proc/self/mountinfo,
//     is detached (an operator's mount of that source elsewhere is kept);
//  2. then every real directory of a generated name carrying the marker
//     (staleProblem) is removed; anything else under base (an
//     operator's files, a symlink) is left alone and reported in Kept.
func SweepStale(base string, prefixes ...string) (Sweep, error) {
	sw := Sweep{Kept: map[string]string{}}
	// 1. the mounts; the deepest first (a runner dir's before its work dir's).
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return sw, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	var mps []string
	seen := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		// id parent major:minor root mountpoint options [optional...] - fstype source superopts
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 2 || g[0] != "tmpfs" || g[1] != Source {
			continue
		}
		mp := procfs.UnescapeMountinfo(f[4])
		dir := mp
		if filepath.Base(mp) == RunnerDirName {
			dir = filepath.Dir(mp)
		}
		if filepath.Dir(dir) != base || !generatedName(filepath.Base(dir), prefixes) || seen[mp] {
			continue
		}
		seen[mp] = true
		mps = append(mps, mp)
	}
	// Runner dirs first: they lie on their work dir.
	for _, pass := range []bool{true, false} {
		for _, mp := range mps {
			if (filepath.Base(mp) == RunnerDirName) != pass {
				continue
			}
			// Stacked mounts (none are made, but never leave one behind).
			for i := 0; i < 16; i++ {
				if err := unix.Unmount(mp, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
					if i == 0 && !errors.Is(err, unix.EINVAL) {
						return sw, fmt.Errorf("unmount stale work dir %s: %w", mp, err)
					}
					break
				}
			}
			sw.Unmounted = append(sw.Unmounted, mp)
		}
	}
	// 2. the dirs.
	entries, err := os.ReadDir(base)
	if err != nil {
		return sw, fmt.Errorf("read work dir base %s: %w", base, err)
	}
	for _, e := range entries {
		p := filepath.Join(base, e.Name())
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			continue
		}
		if why := staleProblem(p, prefixes); why != "" {
			sw.Kept[p] = why
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return sw, fmt.Errorf("remove stale work dir %s: %w", p, err)
		}
		sw.Removed = append(sw.Removed, p)
	}
	return sw, nil
}
