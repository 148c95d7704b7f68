package manifest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Installed-ness is read from distribution metadata as files, never by
// running Python with the package on its path (a sitecustomize.py or a
// .pth file would run): a site directory has the distribution when it
// holds "<name>-<version>.dist-info/METADATA" (or an .egg-info directory
// with PKG-INFO, or an .egg-info file, as older system packages do) whose
// Name normalises to the package's and whose Version is read from it.

// maxMetadataBytes bounds how much of a METADATA file is read (its
// headers come first; the long description after them is not needed).
const maxMetadataBytes = 1 << 20

// distIn returns the version of distribution norm (a normalised name)
// installed in dir, and whether one is. Entries that are symlinks are
// ignored; metadata files are opened O_NOFOLLOW. A missing dir holds none.
func distIn(dir, norm string) (version string, found bool, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", false, nil
		}
		return "", false, err
	}
	for _, e := range entries {
		name := e.Name()
		var meta string
		switch {
		case strings.HasSuffix(name, ".dist-info") && e.IsDir():
			meta = filepath.Join(dir, name, "METADATA")
		case strings.HasSuffix(name, ".egg-info") && e.IsDir():
			meta = filepath.Join(dir, name, "PKG-INFO")
		case strings.HasSuffix(name, ".egg-info") && e.Type().IsRegular():
			meta = filepath.Join(dir, name)
		default:
			continue
		}
		// "<name>-<version>.dist-info": a cheap filter before reading.
		stem := name[:strings.LastIndexByte(name, '.')]
		if dash := strings.IndexByte(stem, '-'); dash >= 0 {
			stem = stem[:dash]
		}
		if normalizeDist(stem) != norm {
			continue
		}
		n, v, err := readMetadata(meta)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // an empty or half-removed dist-info
			}
			return "", false, fmt.Errorf("metadata %s: %w", meta, err)
		}
		if normalizeDist(n) == norm && v != "" {
			return v, true, nil
		}
	}
	return "", false, nil
}

// readMetadata reads the Name and Version headers of a core metadata file
// (RFC 822 style; the headers end at the first empty line).
func readMetadata(path string) (name, version string, err error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", "", &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", "", err
	}
	if !st.Mode().IsRegular() {
		return "", "", fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	sc := bufio.NewScanner(io.LimitReader(f, maxMetadataBytes))
	sc.Buffer(make([]byte, 0, 4096), maxMetadataBytes)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			break
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "name":
			if name == "" {
				name = strings.TrimSpace(v)
			}
		case "version":
			if version == "" {
				version = strings.TrimSpace(v)
			}
		}
	}
	return name, version, sc.Err()
}
