// Package statedir names the one directory where str keeps its run-time
// state: the id leases of root-mode sandboxes (ids/), the locks of live
// sandbox cgroups (cgroups/), root mode's copy of the sandbox init
// (init/, launcher/initbin) and the dev broker's connection token. Every
// str process of a host (worker, str run, str doctor, str broker) must see
// the same directory, since the locks in it coordinate them: hence an
// environment variable (STR_STATE_DIR) and not a flag of one command.
//
// It is a leaf package so that the dev broker's token file follows the
// same setting without importing the launcher.
package statedir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// Env is the setting that overrides the default directory.
const Env = "STR_STATE_DIR"

// RootDefault is the directory when STR_STATE_DIR is unset and str runs as
// root. Under a read-only root file system (Kubernetes
// readOnlyRootFilesystem) it must be a writable volume, e.g. an emptyDir
// mounted there.
const RootDefault = "/run/str"

// Hint is the fix named by an error about the state directory dir.
func Hint(dir string) string {
	return fmt.Sprintf("make %s writable or set %s to a writable directory (Kubernetes, readOnlyRootFilesystem: an emptyDir mounted at %s); see str doctor",
		dir, Env, dir)
}

// Dir is the state directory:
//
//	STR_STATE_DIR set:            $STR_STATE_DIR (an absolute path, see Check)
//	root (euid 0):                /run/str
//	others, XDG_RUNTIME_DIR set:  $XDG_RUNTIME_DIR/str
//	others, otherwise:            $TMPDIR/str-UID
func Dir(getenv func(string) string) string {
	if d := getenv(Env); d != "" {
		return filepath.Clean(d)
	}
	uid := os.Geteuid()
	switch {
	case uid == 0:
		return RootDefault
	case getenv("XDG_RUNTIME_DIR") != "":
		return filepath.Join(getenv("XDG_RUNTIME_DIR"), "str")
	default:
		return filepath.Join(os.TempDir(), "str-"+strconv.Itoa(uid))
	}
}

// Check refuses a relative STR_STATE_DIR: the locks in it must mean the
// same directory to every str process, whatever its working directory.
func Check(getenv func(string) string) error {
	if d := getenv(Env); d != "" && !filepath.IsAbs(d) {
		return &Error{Dir: d, Err: errors.New("not an absolute path")}
	}
	return nil
}

// Error is a failure to create or use the state directory (or a
// subdirectory of it): it names the directory and the setting.
type Error struct {
	Dir string // the directory that could not be created or written
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("state directory %s (%s): %v", e.Dir, Env, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Sub creates the subdirectory name of dir (mode 0700, and dir itself if
// missing) and returns its path; an error is an *Error.
func Sub(dir, name string) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(p, 0o700); err != nil {
		return "", &Error{Dir: p, Err: err}
	}
	return p, nil
}
