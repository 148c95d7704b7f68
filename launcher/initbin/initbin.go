// Package initbin carries cmd/str-init inside str: the program a per-tool
// template's id-map opener executes (launcher/template_mapper.go) and the
// executable ownerMap's stopped child names (launcher/binds.go). It is no
// sandbox's init any more: every sandbox runs the init's steps in the
// launcher's own clone child (nsinit.CompileDirect). It is handed to the
// kernel as root from a read-only mount of one copy kept in the state
// directory (Cached, cached.go), or from a sealed memfd (File).
//
// The binary is built by go generate (below; `make build` runs it) with
// CGO_ENABLED=0, -trimpath and no VCS stamp, so the build is reproducible:
// TestEmbeddedInitUpToDate rebuilds it and fails when the committed copy
// differs from what the sources produce.
//
// Why (CVE-2019-5736): a process that can open the executable through
// /proc/PID/exe must never reach a file of the host it could overwrite.
// Cached's copy is root's, mode 0555, and executed from a read-only mount
// (cached.go has why that suffices). File's memfd is sealed against any
// write, shrink or grow before its first use, one per str process.
package initbin

import (
	_ "embed"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The init is built with exactly go.mod's toolchain (GOTOOLCHAIN, not the
// "at least" of the toolchain line): its bytes depend on the compiler, and
// TestEmbeddedInitUpToDate rebuilds it the same way.
//
//go:generate sh -c "GOTOOLCHAIN=$(sed -n 's/^toolchain //p' ../../go.mod) CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags='-s -w' -o str-init ../../cmd/str-init"
//go:generate sh -c "sha256sum str-init > str-init.sha256"

// Binary is the static init, as built by go generate.
//
//go:embed str-init
var Binary []byte

var (
	once    sync.Once
	file    *os.File
	openErr error
)

// File returns the sealed memfd holding the init, creating it on first
// use. It is one per str process, shared by every sandbox: never close
// it.
func File() (*os.File, error) {
	once.Do(func() { file, openErr = seal() })
	return file, openErr
}

// seal: memfd_create, write, seal.
func seal() (*os.File, error) {
	fd, err := unix.MemfdCreate("str-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("initbin: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "str-init")
	for off := 0; off < len(Binary); {
		n, err := unix.Write(fd, Binary[off:])
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("initbin: write memfd: %w", err)
		}
		off += n
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("initbin: seal memfd (F_SEAL_SEAL|F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_WRITE): %w", err)
	}
	return f, nil
}
