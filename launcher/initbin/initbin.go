// Package initbin carries the sandbox init (cmd/str-init) inside str and
// hands it to the kernel from a sealed memfd.
//
// The binary is built by go generate (below; `make build` runs it) with
// CGO_ENABLED=0, -trimpath and no VCS stamp, so the build is reproducible:
// TestEmbeddedInitUpToDate rebuilds it and fails when the committed copy
// differs from what the sources produce.
//
// Why a memfd (CVE-2019-5736): a sandbox process that can open its init's
// executable through /proc/PID/exe must never reach a file of the host it
// could overwrite. The init is executed from an anonymous memfd sealed
// against any write, shrink or grow before the first sandbox starts, one
// per str process and reused by every sandbox (no copy per spawn). Once
// the tool runs, the init's image is gone anyway: the tool replaced it.
package initbin

import (
	_ "embed"
	"fmt"
	"sync"

	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

//go:generate sh -c "CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags='-s -w' -o str-init ../../cmd/str-init"

// Binary is the static init, as built by go generate.
//
//go:embed str-init
var Binary []byte

// minFD is the lowest descriptor the memfd may have: above every fd the
// launcher places in a child (0-2, the pass-list, the config pipe, the
// report socket and the mount trees: nsinit.MaxInitFDs), so the child's
// fd shuffling before execve does not overwrite it.
const minFD = nsinit.MaxInitFDs + 1

var (
	once    sync.Once
	path    string
	openErr error
)

// Path returns "/proc/self/fd/N" for the sealed memfd holding the init,
// creating it on first use. Executed in a child before its descriptors
// close (the memfd is close-on-exec), the path names this same sealed file.
func Path() (string, error) {
	once.Do(func() { path, openErr = seal() })
	return path, openErr
}

// seal: memfd_create, write, seal, move above minFD.
func seal() (string, error) {
	fd, err := unix.MemfdCreate("str-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return "", fmt.Errorf("initbin: memfd_create: %w", err)
	}
	defer unix.Close(fd)
	for off := 0; off < len(Binary); {
		n, err := unix.Write(fd, Binary[off:])
		if err != nil {
			return "", fmt.Errorf("initbin: write memfd: %w", err)
		}
		off += n
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return "", fmt.Errorf("initbin: seal memfd (F_SEAL_SEAL|F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_WRITE): %w", err)
	}
	high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, minFD)
	if err != nil {
		return "", fmt.Errorf("initbin: move memfd to fd >= %d: %w", minFD, err)
	}
	return fmt.Sprintf("/proc/self/fd/%d", high), nil
}
