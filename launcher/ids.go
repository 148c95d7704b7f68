package launcher

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/securetoolruntime/str/launcher/statedir"
)

// IDRange is the block of host uids and gids reserved for str's sandboxes
// in root mode. Each sandbox leases IDsPerSandbox consecutive ids of it:
// the first is the init (root of the sandbox's user namespace only), the
// second the tool. Uids and gids use the same numbers.
type IDRange struct {
	Start  int    `json:"start"`
	Count  int    `json:"count"`
	Source string `json:"source"` // where the range came from
}

// IDsPerSandbox is the size of one sandbox's id block.
const IDsPerSandbox = 2

// DefaultIDRange is used when neither STR_ID_RANGE nor a "str" entry of
// /etc/subuid names one: 65,536 ids (32,768 concurrent sandboxes) far
// above the ids of normal users and of the usual /etc/subuid blocks.
var DefaultIDRange = IDRange{Start: 1879048192, Count: 65536, Source: "default"}

// Slots is how many sandboxes the range holds at once: its whole blocks,
// which start at even ids (block).
func (r IDRange) Slots() int { return max(r.Start+r.Count-alignedStart(r), 0) / IDsPerSandbox }

// String is "START:COUNT (source)".
func (r IDRange) String() string {
	return fmt.Sprintf("%d:%d (%s)", r.Start, r.Count, r.Source)
}

// LoadIDRange finds the range: STR_ID_RANGE ("START:COUNT"), else the
// first "str:START:COUNT" line of /etc/subuid, else DefaultIDRange; and
// checks it against the id space (IDSpace.Check: inside this process's id
// maps, clear of the reserved ids).
func LoadIDRange(getenv func(string) string, subuid string, space IDSpace) (IDRange, error) {
	r, err := findIDRange(getenv, subuid)
	if err != nil {
		return IDRange{}, err
	}
	if err := space.Check(r); err != nil {
		return IDRange{}, fmt.Errorf("range %s: %w", r, err)
	}
	return r, nil
}

func findIDRange(getenv func(string) string, subuid string) (IDRange, error) {
	if v := getenv("STR_ID_RANGE"); v != "" {
		r, err := parseRange(v)
		if err != nil {
			return IDRange{}, fmt.Errorf("STR_ID_RANGE=%q: %w", v, err)
		}
		r.Source = "STR_ID_RANGE"
		return r, nil
	}
	if f, err := os.Open(subuid); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "str:"); ok {
				r, err := parseRange(rest)
				if err != nil {
					return IDRange{}, fmt.Errorf("%s: str:%s: %w", subuid, rest, err)
				}
				r.Source = subuid
				return r, nil
			}
		}
	}
	return DefaultIDRange, nil
}

func parseRange(s string) (IDRange, error) {
	a, b, ok := strings.Cut(s, ":")
	start, err1 := strconv.Atoi(a)
	count, err2 := strconv.Atoi(b)
	switch {
	case !ok || err1 != nil || err2 != nil:
		return IDRange{}, errors.New("want START:COUNT")
	case start < 0:
		return IDRange{}, fmt.Errorf("start %d is negative", start)
	case count < IDsPerSandbox:
		return IDRange{}, fmt.Errorf("count %d holds no sandbox (%d ids each)", count, IDsPerSandbox)
	case start+count-1 > MaxID:
		return IDRange{}, fmt.Errorf("range %d:%d passes the last valid id 4294967294", start, count)
	case (IDRange{Start: start, Count: count}).Slots() < 1:
		return IDRange{}, fmt.Errorf("range %d:%d holds no whole block of %d ids starting at an even id", start, count, IDsPerSandbox)
	}
	return IDRange{Start: start, Count: count}, nil
}

// IDLeaseDir holds the lease files of every root-mode sandbox of the
// host, whatever its launcher's state directory: host ids are one space
// for every str process in the host's user namespace, so two instances
// with different state directories (a worker, CI beside it, an admin's
// STR_STATE_DIR=... str run) must never lease the same block (issue 29).
// It is the default state directory's ids/, which the shipped units
// keep (RuntimeDirectory=str) and a pod mounts (an emptyDir at /run/str).
const IDLeaseDir = statedir.RootDefault + "/ids"

// ErrNoFreeIDs: every block of the id range is leased. It is capacity,
// not a fault: the worker answers RESOURCE_EXHAUSTED.
var ErrNoFreeIDs = errors.New("no free sandbox id block")

// IDLeaseError is a lease directory that cannot be created or written.
type IDLeaseError struct {
	Dir string
	Err error
}

func (e *IDLeaseError) Error() string {
	return fmt.Sprintf("id lease directory %s (every root str of the host): %v", e.Dir, e.Err)
}

func (e *IDLeaseError) Unwrap() error { return e.Err }

// IDLeaseHint is the fix for an IDLeaseError.
func IDLeaseHint() string {
	return fmt.Sprintf("make %s writable (Kubernetes, readOnlyRootFilesystem: an emptyDir mounted at %s); see str doctor",
		statedir.RootDefault, statedir.RootDefault)
}

// HostIDLease is one id block, held by an flock on its lock file until
// Release: a sandbox's (L1a) or, leased outside a sandbox, a per-tool
// template's call slot (package launcher/template), whose calls run as
// its first id. The file records the host pid of the sandbox's init, so
// a later lease can see whether a previous holder's process still exists
// (its launcher may have been SIGKILLed, which drops the flock at once
// while the kernel is still tearing the sandbox down).
type HostIDLease struct {
	lockFile
	base int // the init's host id; the tool's is base+1
}

// block is the first id of block i. Blocks start at even ids, whatever
// the range's start, and a lease file is named by its block's first id:
// the same ids are the same file in every range that holds them, so two
// ranges that overlap (different STR_ID_RANGE starts) cannot lease one
// id twice.
func (r IDRange) block(i int) int { return alignedStart(r) + i*IDsPerSandbox }

func alignedStart(r IDRange) int {
	return (r.Start + IDsPerSandbox - 1) / IDsPerSandbox * IDsPerSandbox
}

// leaseIDs takes the first free block, starting at a random slot, with
// its lock file in dir (IDLeaseDir; a test's own directory in tests).
func leaseIDs(r IDRange, dir string) (*HostIDLease, error) {
	// The lease directory passes the state directory's checks (root's,
	// writable by no one else: statedir.Sub), as it did when it was one.
	if _, err := statedir.Sub(filepath.Dir(dir), filepath.Base(dir)); err != nil {
		return nil, &IDLeaseError{Dir: dir, Err: errors.Unwrap(err)}
	}
	slots := r.Slots()
	var b [4]byte
	_, _ = rand.Read(b[:])
	first := int(binary.LittleEndian.Uint32(b[:]) % uint32(max(slots, 1)))
	for i := 0; i < slots; i++ {
		base := r.block((first + i) % slots)
		path := filepath.Join(dir, strconv.Itoa(base))
		// Raw fds: open, flock, fstat, pwrite; no os.File around them.
		// No O_SYNC (it cost a disk flush per run, ~0.65 ms): the lease
		// coordinates live processes only. The lock is the flock, which
		// the kernel drops when its holder dies; the recorded pid is read
		// by other processes through the page cache, which every write
		// reaches at once, crash of the writer or not. What a power loss
		// could lose (the pid) names a process that did not survive the
		// reboot either: previousHolderAlive then finds no such process
		// in the block's ids, and the block is free, as it should be.
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, &IDLeaseError{Dir: dir, Err: &os.PathError{Op: "open", Path: path, Err: err}}
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) != nil {
			unix.Close(fd)
			continue // held by a live sandbox
		}
		// A holder removes its file when it releases the block (the
		// directory stays at the live concurrency): a file we locked
		// after its removal is no lease; the name may already be a new
		// holder's file.
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil || st.Nlink == 0 || previousHolderAlive(fd, base) || joinersAlive(path+".join") {
			unix.Close(fd)
			continue
		}
		return &HostIDLease{lockFile{fd: fd, path: path}, base}, nil
	}
	return nil, fmt.Errorf("%w: all %d blocks of range %s are in use", ErrNoFreeIDs, slots, r)
}

// previousHolderAlive: the pid recorded in the lock file still exists and
// runs as one of the block's ids.
func previousHolderAlive(fd, base int) bool {
	var buf [16]byte
	n, _ := unix.Pread(fd, buf[:], 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:max(n, 0)])))
	if err != nil || pid <= 0 {
		return false
	}
	var st unix.Stat_t
	if unix.Stat("/proc/"+strconv.Itoa(pid), &st) != nil {
		return false
	}
	return int(st.Uid) >= base && int(st.Uid) < base+IDsPerSandbox
}

// Base is the block's first host id.
func (l *HostIDLease) Base() int { return l.base }

// Record writes into the lease the host pid that now runs as its ids
// (a sandbox's init), so a later lease sees whether it still lives.
func (l *HostIDLease) Record(pid int) {
	b := []byte(strconv.Itoa(pid) + "\n")
	_, _ = unix.Pwrite(l.fd, b, 0)
	_ = unix.Ftruncate(l.fd, int64(len(b)))
}

// Release drops the lease (lockFile.release), once nothing runs as its
// ids any more; a nil lease (rootless) has nothing to drop.
func (l *HostIDLease) Release() {
	if l != nil {
		l.lockFile.release()
	}
}

// LeaseHostIDs leases a free block of the launcher's host id range, as
// L1 does for a sandbox (root mode).
func (l *Launcher) LeaseHostIDs() (*HostIDLease, error) { return leaseIDs(l.ids, l.idLeaseDir) }

// assignIDs fills in a root-mode plan's id maps for a leased block:
// inside 0 (the init) -> base, inside the tool's uid/gid -> base+1.
func (pl *Plan) assignIDs(base int) {
	tu, tg := int(pl.Child.UID), int(pl.Child.GID)
	pl.UIDMappings = []IDMap{{Inside: 0, Outside: base, Size: 1}}
	pl.GIDMappings = []IDMap{{Inside: 0, Outside: base, Size: 1}}
	if tu != 0 {
		pl.UIDMappings = append(pl.UIDMappings, IDMap{Inside: tu, Outside: base + 1, Size: 1})
	}
	if tg != 0 {
		pl.GIDMappings = append(pl.GIDMappings, IDMap{Inside: tg, Outside: base + 1, Size: 1})
	}
	pl.UIDMappings = append(pl.UIDMappings, pl.ExtraIDMaps...)
	pl.GIDMappings = append(pl.GIDMappings, pl.ExtraIDMaps...)
	pl.ToolUID, pl.ToolGID = base+1, base+1
	if tu == 0 {
		pl.ToolUID = base
	}
	if tg == 0 {
		pl.ToolGID = base
	}
}

// initHostIDs are the host ids the init runs as: the block's first id in
// root mode, the caller's own rootless.
func (pl *Plan) initHostIDs() (uid, gid int) {
	if len(pl.UIDMappings) > 0 && len(pl.GIDMappings) > 0 && pl.UIDMappings[0].Inside == 0 {
		return pl.UIDMappings[0].Outside, pl.GIDMappings[0].Outside
	}
	return pl.ToolUID, pl.ToolGID
}
