package launcher

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// hostSpace is a root worker on a host: the initial namespace's maps.
var hostSpace = IDSpace{
	UIDMap: []IDMap{{0, 0, 4294967295}}, GIDMap: []IDMap{{0, 0, 4294967295}},
	OverflowUID: 65534, OverflowGID: 65534,
}

func mustMap(t *testing.T, s string) []IDMap {
	t.Helper()
	m, err := ParseIDMap(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// The range check over the map shapes a worker meets (str doctor's
// suggestion over the same: cmd/str, TestSuggestIDRange):
// a host, a Kubernetes pod with hostUsers: false, a rootless engine's
// map, a tiny rootless map, and maps of several extents.
func TestIDSpace(t *testing.T) {
	space := func(uidMap, gidMap string, uid, gid int) IDSpace {
		return IDSpace{UIDMap: mustMap(t, uidMap), GIDMap: mustMap(t, gidMap), UID: uid, GID: gid, OverflowUID: 65534, OverflowGID: 65534}
	}
	pod := "         0  123469824      65536\n"
	for _, c := range []struct {
		name  string
		space IDSpace
		ok    []IDRange // valid ranges
		bad   map[IDRange]string
	}{
		{
			name:  "host (full identity map)",
			space: hostSpace,
			ok:    []IDRange{DefaultIDRange, {Start: 65536, Count: 2}, {Start: 300000, Count: 64}},
			bad: map[IDRange]string{
				{Start: 1000, Count: 100}:       "the host's accounts",
				{Start: 65000, Count: 1000}:     "the host's accounts",
				{Start: 4294967000, Count: 294}: "", // fits: last id 4294967293
			},
		},
		{
			name:  "pod, hostUsers: false (0-65535)",
			space: space(pod, pod, 0, 0),
			ok:    []IDRange{{Start: 1000, Count: 64534}, {Start: 10000, Count: 2}},
			bad: map[IDRange]string{
				DefaultIDRange:               "not all inside this process's uid_map and gid_map (0 123469824 65536)",
				{Start: 65536, Count: 1000}:  "not all inside this process's uid_map and gid_map",
				{Start: 100, Count: 10}:      "root and the system accounts",
				{Start: 1000, Count: 64536}:  "the overflow uid 65534",
				{Start: 65000, Count: 536}:   "65535 ((uint16)-1",
				{Start: 0, Count: 2}:         "the worker's uid 0",
				{Start: 60000, Count: 10000}: "not all inside",
			},
		},
		{
			// The worker image's accounts: str (uid 10001, gid 999),
			// nobody (65534).
			name: "pod, with the image's accounts",
			space: func() IDSpace {
				s := space(pod, pod, 0, 0)
				s.Accounts = map[int]string{10001: "passwd str (uid 10001)", 999: "group str (gid 999)", 65534: "passwd nobody (uid 65534)"}
				return s
			}(),
			ok:  []IDRange{{Start: 10002, Count: 55532}, {Start: 1000, Count: 9000}},
			bad: map[IDRange]string{{Start: 1000, Count: 64534}: "include the passwd str (uid 10001)"},
		},
		{
			name:  "pod, worker as uid 5000",
			space: space(pod, pod, 5000, 5001),
			ok:    []IDRange{{Start: 5002, Count: 60532}},
			bad: map[IDRange]string{
				{Start: 4000, Count: 2000}: "the worker's uid 5000",
				{Start: 5001, Count: 2}:    "the worker's gid 5001",
			},
		},
		{
			name:  "tiny rootless map (unshare -r: one id)",
			space: space("0 1000 1", "0 1000 1", 0, 0),
			bad:   map[IDRange]string{{Start: 1000, Count: 2}: "not all inside this process's uid_map and gid_map (0 1000 1)"},
		},
		{
			name:  "rootless engine (podman: own id, then /etc/subuid's 65536)",
			space: space("0 1000 1\n1 100000 65536", "0 1000 1\n1 100000 65536", 0, 0),
			// Two extents, contiguous inside: 1000-65533 spans them.
			ok:  []IDRange{{Start: 1000, Count: 64534}, {Start: 2000, Count: 2}},
			bad: map[IDRange]string{{Start: 65536, Count: 2}: "not all inside"},
		},
		{
			name: "several extents with a hole, uid and gid maps differ",
			space: space("0 100000 3000\n5000 200000 3000",
				"0 100000 2500\n2500 300000 10000", 0, 0),
			ok: []IDRange{{Start: 1000, Count: 2000}, {Start: 5000, Count: 3000}},
			bad: map[IDRange]string{
				{Start: 2000, Count: 4000}: "not all inside this process's uid_map (0 100000 3000, 5000 200000 3000)",
				{Start: 7000, Count: 2000}: "not all inside this process's uid_map",
			},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, r := range c.ok {
				if err := c.space.Check(r); err != nil {
					t.Errorf("Check(%d:%d): %v, want ok", r.Start, r.Count, err)
				}
			}
			for r, want := range c.bad {
				err := c.space.Check(r)
				switch {
				case want == "" && err != nil:
					t.Errorf("Check(%d:%d): %v, want ok", r.Start, r.Count, err)
				case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
					t.Errorf("Check(%d:%d): %v, want an error with %q", r.Start, r.Count, err, want)
				}
			}
		})
	}
}

func TestParseIDMap(t *testing.T) {
	for _, bad := range []string{"0 0", "0 0 x", "0 -1 5", "1 2 3 4"} {
		if _, err := ParseIDMap(bad); err == nil {
			t.Errorf("ParseIDMap(%q): no error", bad)
		}
	}
	m, err := ParseIDMap("         0          0 4294967295\n")
	if err != nil || !fullIdentity(m) {
		t.Errorf("the initial namespace's map: %v %v", m, err)
	}
}

// LoadIDRange checks a range from any source (STR_ID_RANGE, /etc/subuid,
// the default) against the id space: in a pod the default does not fit,
// and the error names the maps.
func TestLoadIDRangeInPod(t *testing.T) {
	pod := IDSpace{UIDMap: []IDMap{{0, 123469824, 65536}}, GIDMap: []IDMap{{0, 123469824, 65536}}, OverflowUID: 65534, OverflowGID: 65534}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "STR_ID_RANGE" {
				return v
			}
			return ""
		}
	}
	if _, err := LoadIDRange(env(""), "/nonexistent", pod); err == nil || !strings.Contains(err.Error(), "uid_map and gid_map (0 123469824 65536)") {
		t.Errorf("the default range in a pod: %v, want an error naming the uid_map", err)
	}
	r, err := LoadIDRange(env("1000:64534"), "/nonexistent", pod)
	if err != nil || r != (IDRange{Start: 1000, Count: 64534, Source: "STR_ID_RANGE"}) {
		t.Errorf("STR_ID_RANGE=1000:64534 in a pod: %+v %v", r, err)
	}
	sub := filepath.Join(t.TempDir(), "subuid")
	if err := os.WriteFile(sub, []byte("str:100:10\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIDRange(env(""), sub, pod); err == nil || !strings.Contains(err.Error(), "system accounts") {
		t.Errorf("str:100:10 in a pod: %v, want the system accounts refused", err)
	}
}

// A lease directory that cannot be created fails the lease with an
// IDLeaseError naming it (not a full id range).
func TestLeaseIDsLeaseDir(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := leaseIDs(IDRange{Start: 5000000, Count: 4}, filepath.Join(file, "ids"))
	var le *IDLeaseError
	if !errors.As(err, &le) || errors.Is(err, ErrNoFreeIDs) || !strings.Contains(err.Error(), "id lease directory "+file+"/ids (every root str of the host)") {
		t.Fatalf("leaseIDs with an unusable lease dir: %v", err)
	}
}
