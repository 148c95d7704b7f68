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
