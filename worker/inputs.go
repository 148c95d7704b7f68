package worker

// A call's inputs: the artifacts it names, written into its work dir.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/runner"
)

// Modes of the files the worker creates for a sandbox (the launcher
// makes the work dir and its directories). Set with fchmod after
// creation, never left to the umask.
const modeInputFile = 0o644

// mkdirMode creates path (which must not exist) and sets its mode through
// a descriptor opened without following a symlink, whatever the umask.
func mkdirMode(path string, mode os.FileMode) error {
	if err := os.Mkdir(path, mode); err != nil {
		return fmt.Errorf("mkdir %s: %w", path, err)
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

// ensureDir makes sure the directory path exists with the group and
// other bits of mode, whatever the umask: a missing dir is created with
// mode (missing parents 0755), an existing one gets those of mode's
// group/other bits it lacks and keeps everything else, so pointing it at
// a shared directory such as /tmp changes nothing there. prepareDirs uses
// it for the work base (others need x), the runner dir and the site dir
// (others need rx), which the sandbox's uid must traverse or read; a dir
// left 0750 by an earlier start under UMask=0027 is repaired. A directory
// others could rename entries in is refused (step 3).
func ensureDir(path string, mode os.FileMode) error {
	// 1. what is missing, from the top down.
	path = filepath.Clean(path)
	var missing []string
	for p := path; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("stat %s: %w", p, err)
		}
		missing = append(missing, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		m := os.FileMode(0o755)
		if i == 0 {
			m = mode
		}
		if err := mkdirMode(missing[i], m); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	}
	// 2. the bits needed, added through a descriptor (no symlink followed).
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("stat %s: %w", path, err)
	}
	// 3. group and others may not rename what the worker makes in it (it
	// mounts a tmpfs on, and chowns, work dirs by path): no group or
	// other write bit, unless sticky (/tmp: others may add names, never
	// rename or remove the worker's). The owner is not checked: the
	// image's dirs belong to its user str (uid 10001) also when the
	// worker runs as root, where no process of that uid runs.
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Errorf("directory %s is owned by uid %d with mode %04o: group or others may write it and it is not sticky, so they could rename what the worker makes there (chmod go-w it, or name another)",
			path, st.Uid, st.Mode&0o7777)
	}
	need := uint32(mode.Perm() & 0o077)
	if st.Mode&need != need {
		if err := unix.Fchmod(fd, st.Mode&0o7777|need); err != nil {
			return fmt.Errorf("chmod %s to add %o: %w", path, need, err)
		}
	}
	return nil
}

// writeInputs places every input artifact under input/, through a
// descriptor of input/: inputFd, held since the worker created it (a
// pooled sandbox's tool already runs and owns the work dir, so it could
// put something else at the path input/), or, when inputFd < 0, input/
// opened here without following a symlink (a sandbox not started yet).
// Each file is created O_EXCL|O_NOFOLLOW in that directory, which only
// the worker can write. Parameters naming one file share it when their
// bytes are the same (each keeps its own metadata); else INVALID_REQUEST.
func (s *Server) writeInputs(t *task, dir string, inputFd int) (map[string]string, map[string]runner.ArtifactMeta, *Error) {
	if inputFd < 0 {
		fd, err := unix.Open(filepath.Join(dir, "input"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, nil, setupError(stageWorkDir, fmt.Errorf("open %s/input: %w", dir, err), nil)
		}
		defer unix.Close(fd)
		inputFd = fd
	}
	paths := map[string]string{}
	meta := map[string]runner.ArtifactMeta{}
	// Two parameters may name one file (input/<filename>: the "user:"
	// prefix dropped): the same bytes are written once and both point at
	// them, as the reference does. Different bytes are refused: the tool
	// sees one file per name, and the reference's last write would hand
	// one parameter the other's bytes without a word.
	type written struct {
		param, what string
		data        []byte
	}
	files := map[string]written{}
	write := func(param, filename string, data []byte, mime string, version int, what string) *Error {
		local := LocalInputName(filename)
		if err := artifacts.CheckFilename(local); err != nil {
			return errorf(CodeInvalidRequest, "input %q: %v", param, err)
		}
		path := filepath.Join(dir, "input", local)
		if first, ok := files[local]; ok {
			if !bytes.Equal(first.data, data) {
				return errorf(CodeInvalidRequest, "inputs %q (%s) and %q (%s) are both input/%s but their contents differ (%d and %d bytes): "+
					"a tool sees one file per name; pass the same version, or the file under another name",
					first.param, first.what, param, what, local, len(first.data), len(data))
			}
		} else if err := writeNewFileAt(inputFd, local, path, data, modeInputFile); err != nil {
			if isNoSpace(err) {
				s.noteWorkDirFileFault(err)
				return errorf(CodeResourceExhausted, "no space for input %q in the work dir (the profile's work_dir cap, or the host's disk): %v", param, err)
			}
			return errorf(CodeArtifactError, "input %q: %v", param, err)
		}
		files[local] = written{param: param, what: what, data: data}
		if mime == "" {
			mime = artifacts.MimeByExtension(local)
		}
		paths[param] = path
		meta[param] = runner.ArtifactMeta{Filename: filename, MimeType: mime, Version: version, LocalPath: path}
		return nil
	}
	// 1. preloaded: the bytes came with the request.
	for _, param := range sortedKeys(t.req.Preloaded) {
		a := t.req.Preloaded[param]
		v := 0
		if a.Version != nil {
			v = *a.Version
		}
		if e := write(param, a.Filename, a.Content, a.MimeType, v, fmt.Sprintf("preloaded %q", a.Filename)); e != nil {
			return nil, nil, e
		}
	}
	// 2. referenced: loaded from the store, mime type from its metadata.
	// A user-scoped one only when the tool's manifest entry lets it read
	// them (artifacts.user_scope read or write).
	for _, param := range sortedKeys(t.req.References) {
		ref := t.req.References[param]
		if artifacts.IsUserScoped(ref.Filename) && !t.tool.UserScope.CanRead() {
			return nil, nil, errorf(CodeArtifactError, "input %q: artifact %q is user-scoped (%q), and tool %s may not read user-scoped artifacts (manifest artifacts.user_scope: %s)",
				param, ref.Filename, artifacts.UserPrefix, t.req.ToolName, t.tool.UserScope)
		}
		art, err := s.store.Load(t.ctx, t.req.UserID, t.req.SessionID, ref.Filename, ref.Version)
		if err != nil {
			which := "latest version"
			if ref.Version != nil {
				which = fmt.Sprintf("version %d", *ref.Version)
			}
			if errors.Is(err, artifacts.ErrNotFound) {
				return nil, nil, errorf(CodeArtifactError, "input %q: artifact %q (%s) not found", param, ref.Filename, which)
			}
			if errors.Is(err, artifacts.ErrUnsafeName) {
				return nil, nil, errorf(CodeInvalidRequest, "input %q: %v", param, err)
			}
			s.noteStoreFault(err)
			return nil, nil, errorf(storeErrorCode(err), "input %q: loading artifact %q (%s): %v", param, ref.Filename, which, err)
		}
		if e := write(param, ref.Filename, art.Data, art.MimeType, art.Version, fmt.Sprintf("artifact %q version %d", ref.Filename, art.Version)); e != nil {
			return nil, nil, e
		}
	}
	return paths, meta, nil
}

// writeNewFileAt creates name exclusively in the directory dirFd (no
// symlink followed), sets its mode on the descriptor (whatever the umask)
// and writes data; path is for messages.
func writeNewFileAt(dirFd int, name, path string, data []byte, mode os.FileMode) error {
	fd, err := unix.Openat(dirFd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, uint32(mode.Perm()))
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s to %o: %w", path, mode, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
