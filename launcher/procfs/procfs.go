// Package procfs reads what str needs of a process from /proc: its
// cgroups, the inodes of its namespaces, and mountinfo's escaped paths.
// It only reads; the launcher (its cgroup placement, a sandbox's recorded
// namespaces, the work dir sweep, the id-mapped binds' submounts), the
// template supervisor (C3, C9), str doctor and the tests use it.
package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Cgroups reads the cgroups of the process pid ("self", or a
// number): /proc/PID/cgroup as a map from v1 controller name (or
// "name=..." of a named hierarchy) to cgroup path, the v2 path (the "0::"
// line) under "".
func Cgroups(pid string) (map[string]string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return nil, err
	}
	cgs := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 {
			for _, c := range strings.Split(parts[1], ",") {
				cgs[c] = parts[2]
			}
		}
	}
	return cgs, nil
}

// namespaceNames are the /proc/PID/ns entries launcher.Request.RecordNamespaces reads.
var namespaceNames = []string{"cgroup", "ipc", "mnt", "net", "pid", "user", "uts"}

// NamespaceInodes is the inode of each of pid's namespaces by its
// /proc/PID/ns name (namespaceNames), and the first error of one that
// cannot be read (nil when all were): a per-tool template's supervisor
// compares its calls' with its own (package launcher/template, C3 and
// C9) and refuses on an error; launcher.Request.RecordNamespaces keeps what was
// read.
func NamespaceInodes(pid int) (map[string]uint64, error) {
	m := make(map[string]uint64, len(namespaceNames))
	var first error
	for _, n := range namespaceNames {
		var st unix.Stat_t
		err := unix.Stat(fmt.Sprintf("/proc/%d/ns/%s", pid, n), &st)
		if err == nil {
			m[n] = st.Ino
		} else if first == nil {
			first = err
		}
	}
	return m, first
}

// UnescapeMountinfo undoes the kernel's octal escapes in a mountinfo path
// (space \040, tab \011, newline \012, backslash \134).
func UnescapeMountinfo(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// RootMode says whether this process runs str in root mode: effective
// uid 0 of a user namespace whose uid_map holds more than one id. Root
// mode leases host ids for each sandbox and keeps its state in /run/str.
// Uid 0 of a namespace that maps one id (a str inside a sandbox that
// made the command uid 0, as bubblewrap's suite does with --unshare-user
// --uid 0 --cap-add ALL) has no ids to lease: it runs rootless, with a
// rootless state directory, never the /run/str a bind of / may show it
// (another str's). Without a readable uid_map it is root mode, which
// then fails reading the map, by name.
var RootMode = sync.OnceValue(func() bool {
	if os.Geteuid() != 0 {
		return false
	}
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return true
	}
	ids := 0
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			n, _ := strconv.Atoi(f[2])
			ids += n
		}
	}
	return ids != 1
})

// PidInProc is pid, a process of this process's pid namespace, as /proc
// names it. The two differ when /proc is another pid namespace's procfs:
// a str nested in a sandbox that bound its caller's /proc (bubblewrap's
// suite: --bind /proc /proc) while the sandbox has a pid namespace of its
// own, as str's always do. A pidfd's fdinfo gives the pid in the
// namespace of the procfs it is read through; a process that procfs does
// not show (a sibling namespace's /proc) is an error, never another pid.
func PidInProc(pid int) (int, error) {
	if ownProc() {
		return pid, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("pid %d is not shown by /proc, another pid namespace's procfs (its pidfd's fdinfo: %q)", pid, b)
}

// ownProc: /proc is this process's pid namespace's procfs (its self link
// names our own pid).
var ownProc = sync.OnceValue(func() bool {
	s, err := os.Readlink("/proc/self")
	return err == nil && s == strconv.Itoa(os.Getpid())
})
