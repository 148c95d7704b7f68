package bwrap

import (
	"fmt"
	"strings"
)

// InfoDoc is what --info-fd and --json-status-fd report once the sandbox
// runs: its init's host pid and its namespaces' inode numbers, under
// bubblewrap's key names.
type InfoDoc struct {
	ChildPid   int
	Namespaces []NSInode // in bubblewrap's order
}

// NSInode is one namespace of the sandbox: its key and inode number.
type NSInode struct {
	Key string
	Ino uint64
}

// nsKeys are the namespaces reported, in order, with the key each has.
var nsKeys = [][2]string{{"cgroup", "cgroup-namespace"}, {"ipc", "ipc-namespace"}, {"mnt", "mnt-namespace"}, {"net", "net-namespace"}, {"pid", "pid-namespace"}, {"uts", "uts-namespace"}}

// Info collects the document; nsIno reads /proc/PID/ns/NAME's inode (0:
// unknown, left out).
func Info(pid int, nsIno func(pid int, ns string) uint64) InfoDoc {
	d := InfoDoc{ChildPid: pid}
	for _, k := range nsKeys {
		if ino := nsIno(pid, k[0]); ino != 0 {
			d.Namespaces = append(d.Namespaces, NSInode{Key: k[1], Ino: ino})
		}
	}
	return d
}

func (d InfoDoc) fields() []string {
	f := []string{fmt.Sprintf("\"child-pid\": %d", d.ChildPid)}
	for _, ns := range d.Namespaces {
		f = append(f, fmt.Sprintf("%q: %d", ns.Key, ns.Ino))
	}
	return f
}

// Pretty is the --info-fd form: one JSON object over several lines.
func (d InfoDoc) Pretty() string {
	return "{\n    " + strings.Join(d.fields(), ",\n    ") + "\n}\n"
}

// Line is the --json-status-fd form: one JSON object on one line.
func (d InfoDoc) Line() string { return "{ " + strings.Join(d.fields(), ", ") + " }\n" }
