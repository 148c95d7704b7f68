package launcher

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// IDSpace is what decides which ids a root-mode sandbox may lease: the ids
// that exist in the worker's user namespace (its /proc/self/uid_map and
// gid_map) and the ids the worker itself uses. On a host (or a container
// without a user namespace of its own) the maps are the full identity map
// and the range must lie above the host's accounts (>= 65536); inside a
// Kubernetes pod with hostUsers: false (a 65,536-id map, 0-65535) or a
// rootless engine's map, only ids inside the map can be given to a
// sandbox, and the image's system accounts, root, the worker's ids and the
// overflow ids are left out.
type IDSpace struct {
	UIDMap, GIDMap []IDMap // the extents of /proc/self/uid_map and gid_map
	UID, GID       int     // the worker's effective ids (inside its namespace)
	// OverflowUID/GID (/proc/sys/kernel/overflowuid, overflowgid; 65534):
	// what an id without a mapping shows as.
	OverflowUID, OverflowGID int
	// Accounts are the ids /etc/passwd and /etc/group name (e.g. the
	// image's user str, 10001), each with what names it: a sandbox must
	// not share an id with an account's files and processes.
	Accounts map[int]string
}

// MaxID is the last valid id: (uid_t)-1 = 4294967295 means "no id".
const MaxID = 0xFFFFFFFE

// hostAccountsEnd: on the full identity map, ids below it belong to the
// host's accounts (login.defs UID_MAX 60000, nobody 65534, 65535).
const hostAccountsEnd = 65536

// systemAccountsEnd: inside a user namespace, ids below it are root and
// the image's system accounts (Debian's FIRST_UID 1000).
const systemAccountsEnd = 1000

// ReadIDSpace reads the calling process's id space from /proc.
func ReadIDSpace() (IDSpace, error) {
	s := IDSpace{UID: os.Geteuid(), GID: os.Getegid(), OverflowUID: 65534, OverflowGID: 65534}
	var err error
	if s.UIDMap, err = readIDMap("/proc/self/uid_map"); err != nil {
		return s, err
	}
	if s.GIDMap, err = readIDMap("/proc/self/gid_map"); err != nil {
		return s, err
	}
	s.Accounts = map[int]string{}
	for _, db := range []struct{ path, kind string }{{"/etc/passwd", "uid"}, {"/etc/group", "gid"}} {
		b, _ := os.ReadFile(db.path)
		for name, id := range accountIDs(string(b)) {
			s.Accounts[id] = fmt.Sprintf("%s %s (%s %d)", strings.TrimPrefix(db.path, "/etc/"), name, db.kind, id)
		}
	}
	for _, o := range []struct {
		path string
		v    *int
	}{{"/proc/sys/kernel/overflowuid", &s.OverflowUID}, {"/proc/sys/kernel/overflowgid", &s.OverflowGID}} {
		if b, err := os.ReadFile(o.path); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				*o.v = n
			}
		}
	}
	return s, nil
}

// accountIDs maps each name of a passwd or group file to its id (the
// third field).
func accountIDs(db string) map[string]int {
	out := map[string]int{}
	for _, l := range strings.Split(db, "\n") {
		f := strings.Split(l, ":")
		if len(f) < 3 || strings.HasPrefix(f[0], "#") {
			continue
		}
		if id, err := strconv.Atoi(f[2]); err == nil {
			out[f[0]] = id
		}
	}
	return out
}

func readIDMap(path string) ([]IDMap, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := ParseIDMap(string(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// ParseIDMap parses the text of a uid_map or gid_map: one "INSIDE OUTSIDE
// COUNT" extent a line.
func ParseIDMap(s string) ([]IDMap, error) {
	var m []IDMap
	for _, l := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("extent %q: want INSIDE OUTSIDE COUNT", l)
		}
		var n [3]int
		for i := range f {
			v, err := strconv.ParseUint(f[i], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("extent %q: %w", l, err)
			}
			n[i] = int(v)
		}
		m = append(m, IDMap{Inside: n[0], Outside: n[1], Size: n[2]})
	}
	return m, nil
}

// fullIdentity: the map of the initial user namespace, "0 0 4294967295".
func fullIdentity(m []IDMap) bool {
	return len(m) == 1 && m[0].Inside == 0 && m[0].Outside == 0 && m[0].Size == MaxID+1
}

// FullIdentityMap: both maps are the initial user namespace's (a host, or
// a container without a user namespace of its own).
func FullIdentityMap(s IDSpace) bool { return fullIdentity(s.UIDMap) && fullIdentity(s.GIDMap) }

// FormatIDMap is the map as "INSIDE OUTSIDE COUNT" extents joined by ", ".
func FormatIDMap(m []IDMap) string {
	var s []string
	for _, e := range m {
		s = append(s, fmt.Sprintf("%d %d %d", e.Inside, e.Outside, e.Size))
	}
	return strings.Join(s, ", ")
}

// ReservedIDs is a run of ids no sandbox may lease, and why.
type ReservedIDs struct {
	First, Last int
	Why         string
}

// Reserved lists the ids a range must leave out, lowest first (Check;
// str doctor's suggestion of a range that fits).
func (s IDSpace) Reserved() []ReservedIDs {
	var r []ReservedIDs
	if FullIdentityMap(s) {
		r = append(r, ReservedIDs{0, hostAccountsEnd - 1, "the host's accounts (below 65536)"})
	} else {
		r = append(r,
			ReservedIDs{0, systemAccountsEnd - 1, "root and the system accounts (below 1000)"},
			// 65535 is -1 to the 16-bit id calls (setuid16 and friends).
			ReservedIDs{65535, 65535, "65535 ((uint16)-1 of the 16-bit id calls)"})
	}
	r = append(r,
		ReservedIDs{s.UID, s.UID, fmt.Sprintf("the worker's uid %d", s.UID)},
		ReservedIDs{s.GID, s.GID, fmt.Sprintf("the worker's gid %d", s.GID)},
		ReservedIDs{s.OverflowUID, s.OverflowUID, fmt.Sprintf("the overflow uid %d (what unmapped ids show as)", s.OverflowUID)},
		ReservedIDs{s.OverflowGID, s.OverflowGID, fmt.Sprintf("the overflow gid %d (what unmapped ids show as)", s.OverflowGID)})
	ids := make([]int, 0, len(s.Accounts))
	for id := range s.Accounts {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		r = append(r, ReservedIDs{id, id, "the " + s.Accounts[id]})
	}
	return r
}

// covered: every id of [first, last] is inside one of m's extents (the
// extents of a map never overlap, so contiguous extents chain).
func covered(m []IDMap, first, last int) bool {
	for id := first; id <= last; {
		next := -1
		for _, e := range m {
			if id >= e.Inside && id < e.Inside+e.Size {
				next = e.Inside + e.Size
				break
			}
		}
		if next < 0 {
			return false
		}
		id = next
	}
	return true
}

// Check says whether sandboxes may lease r here: inside the uid and the
// gid map (uids and gids use the same numbers), and clear of every
// reserved id. All problems are reported.
func (s IDSpace) Check(r IDRange) error {
	first, last := r.Start, r.Start+r.Count-1
	var problems []string
	uidOK, gidOK := covered(s.UIDMap, first, last), covered(s.GIDMap, first, last)
	switch um, gm := FormatIDMap(s.UIDMap), FormatIDMap(s.GIDMap); {
	case !uidOK && !gidOK && um == gm:
		problems = append(problems, fmt.Sprintf("ids %d-%d are not all inside this process's uid_map and gid_map (%s)", first, last, um))
	default:
		if !uidOK {
			problems = append(problems, fmt.Sprintf("ids %d-%d are not all inside this process's uid_map (%s)", first, last, um))
		}
		if !gidOK {
			problems = append(problems, fmt.Sprintf("ids %d-%d are not all inside this process's gid_map (%s)", first, last, gm))
		}
	}
	for _, res := range s.Reserved() {
		if first <= res.Last && res.First <= last {
			problems = append(problems, fmt.Sprintf("ids %d-%d include %s", first, last, res.Why))
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	return nil
}
