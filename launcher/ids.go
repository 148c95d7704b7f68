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

// Slots is how many sandboxes the range holds at once.
func (r IDRange) Slots() int { return r.Count / IDsPerSandbox }

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
	case start+count-1 > maxID:
		return IDRange{}, fmt.Errorf("range %d:%d passes the last valid id 4294967294", start, count)
	}
	return IDRange{Start: start, Count: count}, nil
}

// idLease is one sandbox's id block, held by an flock on its lock file
// until release. The file records the host pid of the sandbox's init, so
// a later lease can see whether a previous holder's process still exists
// (its launcher may have been SIGKILLed, which drops the flock at once
// while the kernel is still tearing the sandbox down).
type idLease struct {
	f    *os.File
	base int // the init's host id; the tool's is base+1
}

// leaseIDs takes the first free block, starting at a random slot, with its
// lock file in the state directory's ids/.
func leaseIDs(r IDRange, stateDir string) (*idLease, error) {
	dir, err := statedir.Sub(stateDir, "ids")
	if err != nil {
		return nil, err
	}
	slots := r.Slots()
	var b [4]byte
	_, _ = rand.Read(b[:])
	first := int(binary.LittleEndian.Uint32(b[:]) % uint32(slots))
	for i := 0; i < slots; i++ {
		slot := (first + i) % slots
		// No O_SYNC (it cost a disk flush per run, ~0.65 ms): the lease
		// coordinates live processes only. The lock is the flock, which
		// the kernel drops when its holder dies; the recorded pid is read
		// by other processes through the page cache, which every write
		// reaches at once, crash of the writer or not. What a power loss
		// could lose (the pid) names a process that did not survive the
		// reboot either: previousHolderAlive then finds no such process
		// in the block's ids, and the block is free, as it should be.
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(slot)), os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if err != nil {
			return nil, &statedir.Error{Dir: dir, Err: err}
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue // held by a live sandbox
		}
		base := r.Start + slot*IDsPerSandbox
		if previousHolderAlive(f, base) {
			f.Close()
			continue
		}
		return &idLease{f: f, base: base}, nil
	}
	return nil, fmt.Errorf("all %d id blocks of range %s are in use", slots, r)
}

// previousHolderAlive: the pid recorded in the lock file still exists and
// runs as one of the block's ids.
func previousHolderAlive(f *os.File, base int) bool {
	var buf [16]byte
	n, _ := f.ReadAt(buf[:], 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	if err != nil || pid <= 0 {
		return false
	}
	var st unix.Stat_t
	if unix.Stat("/proc/"+strconv.Itoa(pid), &st) != nil {
		return false
	}
	return int(st.Uid) >= base && int(st.Uid) < base+IDsPerSandbox
}

// record writes the init's host pid into the lock file.
func (l *idLease) record(pid int) {
	_ = l.f.Truncate(0)
	_, _ = l.f.WriteAt([]byte(strconv.Itoa(pid)+"\n"), 0)
}

// release drops the lease; called once the sandbox's processes are gone.
func (l *idLease) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	l.f.Close()
	l.f = nil
}

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
