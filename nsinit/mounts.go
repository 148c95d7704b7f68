package nsinit

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

const hintSearch = "rootless, the init clones a bind source as the caller's own host uid: the caller must be able to reach it " +
	"(search permission on every directory above it)"
const hintUserns = "user namespaces or mount namespaces unavailable? see str doctor"
const hintProc = "a fresh /proc cannot be mounted here, usually because the container runtime masks /proc " +
	"(docker: --security-opt systempaths=unconfined; Kubernetes: procMount: Unmasked); " +
	"or set best_effort: true in the profile to run without /proc"
const hintWorkdir = "the work dir itself must be searchable (and, to write in it, writable) by the tool's uid inside; " +
	"the directories above it on the host need nothing"

// ErrSymlinkSource is the cause when a NoFollow source is a symlink.
var ErrSymlinkSource = errors.New("the source is a symlink (refused: it must be the directory itself)")

// errSymlinkOnPath: a path the init must not follow a symlink on has one.
var errSymlinkOnPath = errors.New("a symlink (refused: no symlink is followed here)")

// cloneSource is a rootless bind source's detached tree (step 3), made by
// the child, the caller's own host uid, which must be able to reach the
// path (hintSearch); it returns the tree's slot. The launcher's L3 runs
// the same sequence on the host for a root-mode plan (launcher/binds.go):
//
//  1. open the source O_PATH, with O_NOFOLLOW when m.NoFollow, and refuse
//     a symlink there: the tree is cloned from that descriptor, so the
//     path is resolved exactly once;
//  2. open_tree(OPEN_TREE_CLONE|AT_RECURSIVE) on the descriptor: a copy of
//     the mount and everything mounted below it, attached nowhere;
//  3. make the copy private, recursively: a clone of a shared host mount
//     is a peer of it, so without this a mount made in the sandbox under
//     the bind would appear on the host, and host mounts inside the
//     sandbox. Read-only and the other attributes are set by step 5 for
//     every tree alike.
func (b *builder) cloneSource(m Mount) slotID {
	d := func(detail string) opDesc {
		return opDesc{action: "clone bind source", path: m.Source, detail: detail, hint: hintSearch, hintErrno: unix.EACCES}
	}
	// 1. one resolution of the path.
	flags, open := uintptr(unix.O_PATH|unix.O_CLOEXEC), "open O_PATH"
	if m.NoFollow {
		flags, open = flags|unix.O_NOFOLLOW, "open O_PATH|O_NOFOLLOW"
	}
	src := b.slot(0)
	b.sys(d(open), unix.SYS_OPENAT, 0, src, atFDCWD, b.cstr(m.Source), flags, 0)
	link := d(open)
	link.check = ErrSymlinkSource.Error()
	b.special(opCheckLink, nil, uintptr(src), 0, link)
	// 2. the detached copy.
	tree := b.slot(0)
	b.sys(d("open_tree OPEN_TREE_CLONE|AT_RECURSIVE"), unix.SYS_OPEN_TREE, 1, tree,
		uintptr(src), b.cstr(""), unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	b.close(d("close"), src)
	// 3. private, so no mount event crosses between host and sandbox.
	attr := &unix.MountAttr{Propagation: unix.MS_PRIVATE}
	b.sys(d("mount_setattr MS_PRIVATE AT_RECURSIVE"), unix.SYS_MOUNT_SETATTR, 1, noSlot,
		uintptr(tree), b.cstr(""), unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, b.mem(attr, unsafe.Pointer(attr)), unsafe.Sizeof(*attr))
	return tree
}

// bindAttr is what a bind's (or device node's) detached tree gets,
// recursively, before it is attached, and its names for an error: nosuid
// always; nodev (unless the plan says Devices), but noexec for a device
// node (it is a device); rdonly when the plan says so.
func bindAttr(m Mount) (unix.MountAttr, string) {
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID}
	what := "MOUNT_ATTR_NOSUID"
	if m.Kind == MountDevNode {
		attr.Attr_set |= unix.MOUNT_ATTR_NOEXEC
		what += "|MOUNT_ATTR_NOEXEC"
	} else if !m.Devices {
		attr.Attr_set |= unix.MOUNT_ATTR_NODEV
		what += "|MOUNT_ATTR_NODEV"
	}
	if m.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
		what += "|MOUNT_ATTR_RDONLY"
	}
	return attr, what
}

// components are path's names, root first; "." and ".." are refused
// (no path the init makes or opens may climb or stand still): the one
// split of the program's mkdirAll and openNoFollow.
func components(path string) ([]string, error) {
	var out []string
	for _, c := range strings.Split(strings.Trim(path, "/"), "/") {
		if c == "" {
			continue
		}
		if c == ".." || c == "." {
			return nil, fmt.Errorf("path component %q refused", c)
		}
		out = append(out, c)
	}
	return out, nil
}

// parentMode is the mode of a directory created as the parent of one of
// mode: the owner may enter and write it, and the group and others may
// enter and list it when the directory itself gives them anything.
func parentMode(mode uint32) uint32 {
	m := uint32(0o700)
	if mode&0o070 != 0 {
		m |= 0o050
	}
	if mode&0o007 != 0 {
		m |= 0o005
	}
	return m
}

// ListenerSocketType is the socket type of l: SOCK_STREAM for tcp,
// SOCK_DGRAM for udp.
func ListenerSocketType(l Listener) (int, error) {
	switch l.Network {
	case "tcp":
		return unix.SOCK_STREAM, nil
	case "udp":
		return unix.SOCK_DGRAM, nil
	}
	return 0, fmt.Errorf("listener %s: network %q is not tcp or udp", l.Name, l.Network)
}

// ListenerAddr is l's address, which must be IPv4 address:port (step 10
// binds it; so does a per-tool template's supervisor for each call).
func ListenerAddr(l Listener) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(l.Addr)
	if err != nil || !ap.Addr().Is4() {
		return netip.AddrPort{}, fmt.Errorf("listener %s: %q is not an IPv4 address:port", l.Name, l.Addr)
	}
	return ap, nil
}
