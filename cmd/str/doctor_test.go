package main

import (
	"strings"
	"testing"

	"github.com/securetoolruntime/str/launcher"
)

func TestAccountsInRange(t *testing.T) {
	if got := accountsInRange("root:x:0:0::/:/bin/sh\nodd:x:1879048200:1::/:/bin/sh\n", launcher.DefaultIDRange); len(got) != 1 || got[0] != "odd=1879048200" {
		t.Fatalf("accounts in range: %v", got)
	}
}

// TestSuggestIDRange: the range str doctor suggests over the map shapes
// a worker meets (launcher's TestIDSpace checks ranges over the same): a
// host, a Kubernetes pod with hostUsers: false, a rootless engine's map,
// a tiny rootless map, and maps of several extents. Every suggestion
// passes IDSpace.Check.
func TestSuggestIDRange(t *testing.T) {
	space := func(uidMap, gidMap string, uid, gid int) launcher.IDSpace {
		t.Helper()
		um, err := launcher.ParseIDMap(uidMap)
		if err != nil {
			t.Fatal(err)
		}
		gm, err := launcher.ParseIDMap(gidMap)
		if err != nil {
			t.Fatal(err)
		}
		return launcher.IDSpace{UIDMap: um, GIDMap: gm, UID: uid, GID: gid, OverflowUID: 65534, OverflowGID: 65534}
	}
	pod := "         0  123469824      65536\n"
	withAccounts := space(pod, pod, 0, 0)
	// The worker image's accounts: str (uid 10001, gid 999), nobody (65534).
	withAccounts.Accounts = map[int]string{10001: "passwd str (uid 10001)", 999: "group str (gid 999)", 65534: "passwd nobody (uid 65534)"}
	for _, c := range []struct {
		name    string
		space   launcher.IDSpace
		suggest string // "START:COUNT", "" = none
	}{
		{"host (full identity map)", space("0 0 4294967295", "0 0 4294967295", 0, 0), "65536:4294901758"},
		{"pod, hostUsers: false (0-65535)", space(pod, pod, 0, 0), "1000:64534"},
		{"pod, with the image's accounts", withAccounts, "10002:55532"},
		{"pod, worker as uid 5000", space(pod, pod, 5000, 5001), "5002:60532"},
		{"tiny rootless map (unshare -r: one id)", space("0 1000 1", "0 1000 1", 0, 0), ""},
		// Two extents, contiguous inside: 1000-65533 spans them.
		{"rootless engine (podman: own id, then /etc/subuid's 65536)", space("0 1000 1\n1 100000 65536", "0 1000 1\n1 100000 65536", 0, 0), "1000:64534"},
		// 5000-7999 is in both maps (gid 2500-12499); 1000-2999 too but
		// shorter.
		{"several extents with a hole, uid and gid maps differ", space("0 100000 3000\n5000 200000 3000", "0 100000 2500\n2500 300000 10000", 0, 0), "5000:3000"},
	} {
		s, ok := suggestIDRange(c.space)
		got := ""
		if ok {
			got = strings.TrimSuffix(s.String(), " (str doctor)")
			if err := c.space.Check(s); err != nil {
				t.Errorf("%s: the suggestion %s fails Check: %v", c.name, s, err)
			}
		}
		if got != c.suggest {
			t.Errorf("%s: suggestIDRange: %q, want %q", c.name, got, c.suggest)
		}
	}
}

// TestCgroupAdvice: str doctor's cgroup line blames the cause it found,
// for the hierarchy there is: a read-only mount (in a container: the
// engine's), or a directory this user was not delegated; v1 is never
// told to use v2's Delegate=yes as if it had it, and a read-write mount
// is never called read-only (a non-root user in a container was told
// "the container's cgroup is mounted read-only").
func TestCgroupAdvice(t *testing.T) {
	v1 := func(ro, w bool) cgroupState {
		return cgroupState{version: 1, dirs: []cgroupDir{
			{controller: "memory", path: "/sys/fs/cgroup/memory/a", readOnly: ro, writable: w},
			{controller: "pids", path: "/sys/fs/cgroup/pids/a", readOnly: ro, writable: w}}}
	}
	v2 := func(ro, w bool) cgroupState {
		return cgroupState{version: 2, dirs: []cgroupDir{{path: "/sys/fs/cgroup/user.slice/a", readOnly: ro, writable: w}}}
	}
	const docker = "docker (/.dockerenv)"
	for _, c := range []struct {
		name         string
		st           cgroupState
		uid          int
		engine       string
		want, forbid []string
	}{
		{"v1 non-root host", v1(false, false), 1000, "",
			[]string{"cgroup v1: own cgroups /sys/fs/cgroup/memory/a, /sys/fs/cgroup/pids/a are not writable by uid 1000", "cgroup v1 has no Delegate=yes", "chown"},
			[]string{"read-only", "container", "delegate a cgroup v2 subtree"}},
		{"v1 non-root container", v1(false, false), 10001, docker,
			[]string{"not writable by uid 10001", "STR_RUN_AS"},
			[]string{"read-only", "--cgroupns"}},
		{"v1 root container, read-only", v1(true, false), 0, docker,
			[]string{"read-only mount (the container's cgroup)", "--cgroupns=private", "memory, pids, cpu, cpuacct and freezer bind mounts"},
			[]string{"delegat"}},
		{"v2 non-root host", v2(false, false), 1000, "",
			[]string{"cgroup v2: own cgroup /sys/fs/cgroup/user.slice/a is not delegated to uid 1000", "Delegate=yes"},
			[]string{"read-only", "STR_RUN_AS"}},
		{"v2 non-root container", v2(false, false), 10001, docker,
			[]string{"not delegated to uid 10001", "STR_RUN_AS"}, []string{"read-only"}},
		{"v2 root container, read-only", v2(true, false), 0, docker,
			[]string{"cgroup v2: /sys/fs/cgroup/user.slice/a on a read-only mount", "remount /sys/fs/cgroup read-write"},
			[]string{"delegat"}},
		{"v2 host, read-only", v2(true, false), 0, "",
			[]string{"read-only mount", "mount -o remount,rw"}, []string{"container", "delegat"}},
		{"v2 writable", v2(false, true), 1000, "", []string{"is writable"}, []string{"not"}},
	} {
		detail, fix := cgroupAdvice(c.st, c.uid, c.engine)
		text := detail + "\nfix: " + fix
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: lacks %q:\n%s", c.name, w, text)
			}
		}
		for _, f := range c.forbid {
			if strings.Contains(text, f) {
				t.Errorf("%s: says %q:\n%s", c.name, f, text)
			}
		}
	}
}
