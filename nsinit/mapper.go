package nsinit

import (
	"os"
	"regexp"
	"sync"

	"golang.org/x/sys/unix"
)

// MapperArgv0 is the argv[0] under which the init binary is the id-map
// opener of a per-tool template (launcher/template_mapper.go) instead of
// a sandbox's init.
const MapperArgv0 = "str-id-mapper"

// mapperPath is the only kind of path the mapper opens: a process's uid
// or gid map in the host's /proc.
var mapperPath = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^/proc/[1-9][0-9]{0,9}/(uid_map|gid_map)$`) })

// MapperMain serves the launcher on descriptor 3 (a SOCK_SEQPACKET
// socket): each message is a path, answered 'k' with the file opened
// O_WRONLY as SCM_RIGHTS, or 'e'. It runs in a template's user namespace
// as its root (the launcher's clone joined it, took its ids and executed
// this binary), with every capability there and none on the host: the
// kernel lets a user namespace's id maps be written only through a file
// opened by such a process of its parent namespace. Only the paths of
// mapperPath are opened. EOF ends it.
func MapperMain() {
	buf := make([]byte, 256)
	for {
		n, _, _, _, err := unix.Recvmsg(3, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			os.Exit(0)
		}
		path := string(buf[:n])
		if !mapperPath().MatchString(path) {
			_ = unix.Sendmsg(3, []byte{'e'}, nil, nil, 0)
			continue
		}
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			_ = unix.Sendmsg(3, []byte{'e'}, nil, nil, 0)
			continue
		}
		_ = unix.Sendmsg(3, []byte{'k'}, unix.UnixRights(fd), nil, 0)
		unix.Close(fd)
	}
}
