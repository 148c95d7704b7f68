package worker

// Work dirs: a call's, a pooled sandbox's work area and the start-up
// probe's are directories directly under SANDBOX_WORK_DIR whose names the
// worker generates (a prefix and 16 random hex digits), never a request's
// string: a task id is a name in logs, replies and status messages, never
// a path. The worker unmounts and removes only what it made:
//
//   - in this process, only a *workDir newWorkDir returned (made with an
//     exclusive mkdir under a fresh name), after checking that the path is
//     still the directory it made (device and inode as created);
//   - at start-up (a previous run's, after a crash), only a directory
//     whose name is of the generated form and which carries the marker
//     file, regular, owned by the worker's uid, holding the directory's
//     own name; the tmpfs mounts unmounted first are only those of the
//     worker's source name on such names.
//
// The marker lies in the directory itself, under the work dir's tmpfs
// when work dirs are capped (a tool never sees it); rootless, a tool owns
// its work dir and can delete or rewrite it, which at worst leaves its
// own dir (one the worker made) behind after a crash, or lets the sweep
// remove it: never any other directory, since a tool cannot create
// entries in the base.

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Prefixes of the work dir names the worker generates.
const (
	callDirPrefix  = "call-"
	probeDirPrefix = ".probe-"
	// warmDirPrefix is pool.go's.
)

// workDirRandHex is the length of a generated name's random part.
const workDirRandHex = 16

// workDir is one work dir this worker made (newWorkDir).
type workDir struct {
	path     string
	dev, ino uint64 // of the directory as made, before any tmpfs
	mounted  bool   // capWorkDir mounted its tmpfs on it
}

// newWorkDir makes a work dir under base named prefix + random hex, with
// its marker. A name that exists is never touched: another name is tried.
func newWorkDir(base, prefix string) (*workDir, error) {
	for try := 0; try < 4; try++ {
		var rnd [workDirRandHex / 2]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, fmt.Errorf("work dir name: %w", err)
		}
		path := filepath.Join(base, prefix+hex.EncodeToString(rnd[:]))
		err := makeTaskDir(path)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			return nil, fmt.Errorf("stat %s: %w", path, err)
		}
		return &workDir{path: path, dev: st.Dev, ino: st.Ino}, nil
	}
	return nil, fmt.Errorf("mkdir under %s: every generated name (%s + %d hex digits) tried exists", base, prefix, workDirRandHex)
}

// remove unmounts w's tmpfs (if capWorkDir mounted one) and removes w,
// after checking that its path is still the directory newWorkDir made.
func (w *workDir) remove() error {
	// 1. the tmpfs this worker mounted on it.
	if w.mounted {
		if err := unmountWorkDir(w.path); err != nil {
			return err
		}
		w.mounted = false
	}
	// 2. still the directory made: a real directory, same device and inode.
	var st unix.Stat_t
	if err := unix.Lstat(w.path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", w.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Dev != w.dev || st.Ino != w.ino {
		return fmt.Errorf("%s is not the work dir this worker made (device %d inode %d, made as %d %d): left alone",
			w.path, st.Dev, st.Ino, w.dev, w.ino)
	}
	// 3. remove.
	return os.RemoveAll(w.path)
}

// generatedWorkDirName reports whether name is of the form the worker
// gives work dirs: a known prefix and workDirRandHex lowercase hex digits.
func generatedWorkDirName(name string) bool {
	for _, prefix := range []string{callDirPrefix, warmDirPrefix, probeDirPrefix} {
		rest, ok := strings.CutPrefix(name, prefix)
		if !ok || len(rest) != workDirRandHex {
			continue
		}
		for _, c := range rest {
			if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
				return false
			}
		}
		return true
	}
	return false
}

// staleWorkDirProblem says why path (directly under the base) is not a
// work dir a previous run of the worker left, "" when it is one: its name
// is generated, it is a real directory, and its marker is a regular file
// owned by the worker's uid whose content is the directory's name.
func staleWorkDirProblem(path string) string {
	name := filepath.Base(path)
	if !generatedWorkDirName(name) {
		return "its name is not one the worker generates"
	}
	if fi, err := os.Lstat(path); err != nil || !fi.IsDir() {
		return "not a directory"
	}
	marker := filepath.Join(path, WorkDirMarker)
	var st unix.Stat_t
	if err := unix.Lstat(marker, &st); err != nil {
		return "no marker: " + err.Error()
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Size != int64(len(name)) {
		return fmt.Sprintf("its marker is not the worker's (mode %o, uid %d, %d bytes)", st.Mode, st.Uid, st.Size)
	}
	data, err := os.ReadFile(marker)
	if err != nil || string(data) != name {
		return "its marker does not name it"
	}
	return ""
}
