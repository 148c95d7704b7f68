package broker

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/securetoolruntime/str/launcher/statedir"
	"golang.org/x/sys/unix"
)

// The connection token (see "Authentication" in the package doc).

// TokenFileEnv names the environment variable that overrides the token
// file's path, for the broker that writes it and the clients that read it.
const TokenFileEnv = "DEV_BROKER_TOKEN_FILE"

// maxTokenFileBytes bounds what ReadTokenFile reads: a token is 64 hex
// digits and a newline.
const maxTokenFileBytes = 4096

// NewToken returns a fresh random token: 32 bytes from crypto/rand, in hex.
func NewToken() string {
	var b [32]byte
	rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// DefaultTokenFile is where the broker listening on port writes its token
// and where clients of that port look for it: broker-PORT.token in str's
// state directory (statedir.Dir: $STR_STATE_DIR, else /run/str as root,
// else $XDG_RUNTIME_DIR/str, else $TMPDIR/str-UID).
//
// The port is in the name so that several brokers on one host (tests, a
// worker's embedded broker beside `str broker`) keep their tokens apart.
func DefaultTokenFile(port int) string {
	return filepath.Join(statedir.Dir(os.Getenv), "broker-"+strconv.Itoa(port)+".token")
}

// TokenFileFor is the token file of the broker on port: $DEV_BROKER_TOKEN_FILE
// when set, else DefaultTokenFile(port).
func TokenFileFor(port int) string {
	if p := os.Getenv(TokenFileEnv); p != "" {
		return p
	}
	return DefaultTokenFile(port)
}

// WriteTokenFile writes token to path, mode 0600, atomically (a temporary
// file in the same directory, then rename), creating the directory with mode
// 0700 when it is missing. The directory must be owned by the caller's euid
// and writable by nobody else, so another local user cannot have planted it
// (e.g. /tmp/str-UID) to read or swap the token; it is checked on an
// O_PATH descriptor and the file is created and renamed relative to that
// descriptor, so a directory above it renamed after the check changes
// nothing (the token never lands in a directory that was not checked).
func WriteTokenFile(path, token string) error {
	dir, name := filepath.Split(path)
	dir = filepath.Clean(dir)
	// 1. the directory: ours, not a symlink, not group/world writable.
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("devbroker: token file %s: create directory: %w", path, err)
	}
	dirfd, err := statedir.OpenOwned(dir, os.Geteuid())
	if err != nil {
		return fmt.Errorf("devbroker: token file %s: %w; remove it or choose another path (--token-file, %s)", path, err, TokenFileEnv)
	}
	defer unix.Close(dirfd)
	// 2. the file: created 0600 under a fresh name (O_EXCL, O_NOFOLLOW;
	// fchmod makes the mode independent of the umask), then renamed over
	// any stale one, both relative to the checked directory.
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := ".broker-token-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(dirfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("devbroker: token file %s: create %s: %w", path, tmp, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, tmp))
	err = f.Chmod(0o600)
	if err == nil {
		_, err = f.WriteString(token + "\n")
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dirfd, tmp, dirfd, name)
	}
	if err != nil {
		unix.Unlinkat(dirfd, tmp, 0)
		return fmt.Errorf("devbroker: token file %s: write: %w", path, err)
	}
	return nil
}

// ReadTokenFile returns the token in path (surrounding white space
// removed).
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("devbroker: read token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFileBytes+1))
	if err != nil {
		return "", fmt.Errorf("devbroker: read token file %s: %w", path, err)
	}
	if len(b) > maxTokenFileBytes {
		return "", fmt.Errorf("devbroker: token file %s is larger than %d bytes", path, maxTokenFileBytes)
	}
	tok := string(bytes.TrimSpace(b))
	if tok == "" {
		return "", fmt.Errorf("devbroker: token file %s is empty", path)
	}
	return tok, nil
}

// RemoveTokenFile removes path if it still holds token (a broker started
// since on the same port may have replaced it).
func RemoveTokenFile(path, token string) error {
	got, err := ReadTokenFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if !tokenEqual(got, token) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("devbroker: remove token file: %w", err)
	}
	return nil
}

// RemoveStaleTokenFile removes the token file named by port
// (DefaultTokenFile) when it is a regular file, and says whether it did. A
// broker without a token (--anonymous) calls it once it has bound port: a
// file there was left by an earlier broker on the same port that died
// without removing it (SIGKILL), and would tell clients a token that no
// live broker holds. $DEV_BROKER_TOKEN_FILE is not touched: that path is
// the operator's, not the port's.
func RemoveStaleTokenFile(port int) (string, bool, error) {
	path := DefaultTokenFile(port)
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return path, false, nil
	case err != nil:
		return path, false, fmt.Errorf("devbroker: stale token file: %w", err)
	case !fi.Mode().IsRegular():
		return path, false, fmt.Errorf("devbroker: stale token file %s is not a regular file (mode %v); remove it", path, fi.Mode())
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return path, false, fmt.Errorf("devbroker: remove stale token file: %w", err)
	}
	return path, true, nil
}

// tokenEqual compares in constant time (for equal lengths), so response
// timing does not reveal how much of a guess was right.
func tokenEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
