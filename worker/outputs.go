package worker

// A call's outputs: the files the tool left in its output dir, stored.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"golang.org/x/text/unicode/norm"

	"github.com/securetoolruntime/str/worker/artifacts"
)

// saveOutputs stores the top-level regular files of output/, all or
// nothing: every output is checked first (count, total size, name,
// scope, mime type), and only when all pass is any saved, each streamed
// from its file into the store (the worker never holds an output whole). The tool
// owns the work dir, so output/ is opened without following a symlink
// and every file through that directory fd, also without following one.
// Regular files that cannot be stored are returned as skipped, with the
// reason: names breaking the filename rule (artifacts.CheckFilename), and
// user-scoped ("user:") names when the tool's manifest entry does not
// allow writing them (artifacts.user_scope read or none). Anything that
// is not a regular file is not an output (spec §7.6) and is only logged.
// A mime type the tool gave that breaks artifacts.CheckMimeType (longer
// than 255 bytes, not type/subtype) is replaced by the one of the
// file's extension, and logged; so is an active one (HTML, SVG, XML,
// JavaScript: artifacts.IsActiveMimeType) unless ARTIFACT_ACTIVE_MIME_TYPES
// is keep, which stores it and marks the entry (active_mime_type). Two
// outputs whose names are one after NFKC normalisation (the store's form)
// are not saved as one artifact's two versions: the first in name order
// is saved, the other skipped with the reason. A save that fails after others succeeded
// cannot be undone (the store keeps versions): the error lists exactly
// what was saved.
func (s *Server) saveOutputs(t *task, dir string, toolMimes map[string]string) ([]CreatedArtifact, []SkippedOutput, *Error) {
	// 1. the directory, by fd.
	dirFd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errorf(CodeArtifactError, "open work dir %s: %v", dir, err)
	}
	defer unix.Close(dirFd)
	outFd, err := unix.Openat(dirFd, "output", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, errorf(CodeArtifactError, "open %s/output (a symlink is refused): %v", dir, err)
	}
	outDir := os.NewFile(uintptr(outFd), filepath.Join(dir, "output"))
	defer outDir.Close()
	names, err := outDir.Readdirnames(maxOutputFiles + 1)
	if err != nil && err != io.EOF {
		return nil, nil, errorf(CodeArtifactError, "list %s/output: %v", dir, err)
	}
	if len(names) > maxOutputFiles {
		return nil, nil, errorf(CodeArtifactError, "the tool wrote more than %d files to output/; nothing was saved", maxOutputFiles)
	}
	sort.Strings(names)
	// 2. every output read and checked; nothing saved yet.
	type pending struct {
		name, mime string
		active     bool // a tool-chosen active mime type, kept
		size       int64
		dev, ino   uint64 // the file checked, so that step 4 saves that one
	}
	var todo []pending
	var total int64
	var skipped []SkippedOutput
	kept := map[string]string{} // NFKC name -> the output saved under it
	isRegular := func(name string) bool {
		var st unix.Stat_t
		return unix.Fstatat(outFd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
	}
	for _, name := range names {
		log := t.log.With("output", name)
		if err := artifacts.CheckFilename(name); err != nil {
			if isRegular(name) {
				reason := err.Error()
				var fe *artifacts.FilenameError
				if errors.As(err, &fe) {
					reason = fe.Reason
				}
				log.Warn("output skipped: its name breaks the filename rule", "output_quoted", strconv.Quote(name), "reason", reason)
				skipped = append(skipped, SkippedOutput{Filename: strings.ToValidUTF8(name, "\uFFFD"), Reason: reason})
			} else {
				log.Debug("not an output (not a regular file) and an unsafe name", "error", err)
			}
			continue
		}
		if artifacts.IsUserScoped(name) && !t.tool.UserScope.CanWrite() {
			if isRegular(name) {
				reason := fmt.Sprintf("a user-scoped artifact (%q), shared by all of the user's sessions: tool %s may not write them (manifest artifacts.user_scope: %s; write allows it)",
					artifacts.UserPrefix, t.req.ToolName, t.tool.UserScope)
				log.Warn("output skipped: user-scoped artifacts are not allowed for this tool", "user_scope", t.tool.UserScope.String())
				skipped = append(skipped, SkippedOutput{Filename: name, Reason: reason})
			}
			continue
		}
		stored := norm.NFKC.String(name) // the name the store keeps
		if first, ok := kept[stored]; ok {
			if isRegular(name) {
				reason := fmt.Sprintf("its name is %q after NFKC normalisation (the form the store keeps), as is the name of output %q: only %q was saved",
					stored, first, first)
				log.Warn("output skipped: its name merges with another output's", "stored_as", stored, "kept", first)
				skipped = append(skipped, SkippedOutput{Filename: name, Reason: reason})
			}
			continue
		}
		fd, err := unix.Openat(outFd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			log.Warn("output skipped (symlinks are not followed)", "error", err)
			continue
		}
		var st unix.Stat_t
		err = unix.Fstat(fd, &st)
		unix.Close(fd)
		if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			log.Warn("output that is not a regular file skipped")
			continue
		}
		// Only the size is taken now: the data is streamed into the
		// store in step 4, never read whole into the worker's memory.
		total += st.Size
		if s.cfg.MaxOutputBytes > 0 && total > s.cfg.MaxOutputBytes {
			return nil, nil, errorf(CodeArtifactError, "outputs exceed the limit of %d bytes; nothing was saved", s.cfg.MaxOutputBytes)
		}
		mime := toolMimes[name]
		if mime != "" {
			if err := artifacts.CheckMimeType(mime); err != nil {
				log.Warn("the tool's mime type for this output is refused; the extension's is used", "mime_type_bytes", len(mime), "reason", err.Error())
				mime = ""
			}
		}
		active := false
		if mime != "" && artifacts.IsActiveMimeType(mime) {
			if s.cfg.ActiveMimeTypes == "keep" {
				active = true
				log.Warn("output stored with the active mime type the tool chose (ARTIFACT_ACTIVE_MIME_TYPES=keep)", "mime_type", mime)
			} else {
				log.Warn("the tool's active mime type is replaced by the extension's (ARTIFACT_ACTIVE_MIME_TYPES=fallback)", "mime_type", mime)
				mime = ""
			}
		}
		if mime == "" {
			mime = artifacts.MimeByExtension(name)
		}
		kept[stored] = name
		todo = append(todo, pending{name: name, mime: mime, active: active, size: st.Size, dev: st.Dev, ino: st.Ino})
	}
	// 3. the user's and the session's artifact quotas (artifacts.Quota),
	// for all of them at once: over quota, nothing is saved.
	if qc, ok := s.store.(artifacts.QuotaChecker); ok && len(todo) > 0 {
		names, sizes := make([]string, len(todo)), make([]int64, len(todo))
		for i, p := range todo {
			names[i], sizes[i] = p.name, p.size
		}
		if err := qc.CheckQuota(t.ctx, t.req.UserID, t.req.SessionID, names, sizes); err != nil {
			t.log.Warn("outputs refused by the artifact quota", "outputs", len(todo), "error", err)
			s.noteStoreFault(err)
			return nil, nil, errorf(storeErrorCode(err), "save outputs: %v; nothing was saved", err)
		}
	}
	// 4. save them, in name order, each streamed from the file checked in
	// step 2 (reopened without following a symlink; the same inode, and
	// exactly the size checked: the store reads no byte more).
	created := []CreatedArtifact{}
	for _, p := range todo {
		v, err := s.saveOutput(t, outFd, p.name, p.size, p.dev, p.ino, p.mime)
		if errors.Is(err, unix.ELOOP) {
			// A symlink now, swapped in after step 2: skipped as step 2
			// skips one (never followed, nothing of it read).
			t.log.Warn("output skipped (symlinks are not followed)", "output", p.name, "error", err)
			continue
		}
		if err != nil {
			saved := "nothing was saved"
			if len(created) > 0 {
				list := make([]string, len(created))
				for i, c := range created {
					list[i] = fmt.Sprintf("%q version %d", c.Filename, c.Version)
				}
				saved = fmt.Sprintf("already saved (and kept: versions are never removed): %s", strings.Join(list, ", "))
			}
			t.log.Error("saving an output failed", "output", p.name, "saved_before", len(created), "error", err)
			s.noteStoreFault(err)
			var ae *artifacts.AuditError
			if errors.As(err, &ae) {
				// stored, but unaudited: reported failed (fail closed).
				saved = fmt.Sprintf("%s; %s itself was stored but its audit line was not written", saved, p.name)
			}
			return nil, nil, errorf(storeErrorCode(err), "save output %s: %v; %d of %d outputs were saved before: %s", p.name, err, len(created), len(todo), saved)
		}
		created = append(created, CreatedArtifact{Filename: p.name, Version: v, MimeType: p.mime, SizeBytes: p.size, ActiveMimeType: p.active})
	}
	return created, skipped, nil
}

// saveOutput streams output name (under outFd) into the store. The file
// must still be the regular file (dev, ino) of size bytes that
// saveOutputs checked; the store's SaveReader copies it through a fixed
// buffer and fails if it yields more or fewer bytes.
func (s *Server) saveOutput(t *task, outFd int, name string, size int64, dev, ino uint64, mime string) (int, error) {
	fd, err := unix.Openat(outFd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("reopen: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != dev || st.Ino != ino || st.Size != size {
		return 0, fmt.Errorf("the file changed after it was checked (%d bytes then, %d now)", size, st.Size)
	}
	return s.store.SaveReader(t.ctx, t.req.UserID, t.req.SessionID, name, f, size, mime)
}
