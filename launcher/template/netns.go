package template

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/securetoolruntime/str/launcher"
	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// The one file of str that calls setns (with the mapper's raw clone,
// mapper.go): a per-tool template's supervisor brings up lo in each call's
// fresh network namespace from the host and opens the call's egress
// listeners there (the ones nsinit step 10 opens in a cold sandbox), so the
// call's child never needs netlink, a network ioctl or a socket of its own
// before its tool runs; and it attaches the call's fresh mounts in the
// call's mount namespace (attachMounts), so the child never holds a mount
// descriptor or calls move_mount.

// hostNetNS is the supervisor's own network namespace, opened once.
var hostNetNS = sync.OnceValues(func() (int, error) {
	return unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
})

// socketsInNetNS makes one AF_INET socket of each type (SOCK_DGRAM,
// SOCK_STREAM) in the network namespace of nsPath (/proc/PID/ns/net): the
// one locked thread joins it, creates the sockets and goes back. A socket
// keeps its namespace for life, so its ioctls, bind and listen then act
// there from any thread: nothing else is done inside. If the way back fails the
// thread stays locked and its goroutine is parked for good: no other
// goroutine ever runs in the call's namespace, and the thread is never
// ended (Go ends a locked thread whose goroutine returns, and the kernel
// then sends the parent-death signal to every child created from that
// thread earlier, such as a template's id mapper: see attachMounts).
func socketsInNetNS(nsPath string, hostNS int, types []int) ([]int, error) {
	type res struct {
		fds []int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{nil, fmt.Errorf("open %s: %w", nsPath, err)}
			return
		}
		defer unix.Close(ns)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{nil, fmt.Errorf("setns %s: %w", nsPath, err)}
			return
		}
		var fds []int
		var serr error
		for _, typ := range types {
			s, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				serr = fmt.Errorf("socket in %s: %w", nsPath, err)
				break
			}
			fds = append(fds, s)
		}
		if err := unix.Setns(hostNS, unix.CLONE_NEWNET); err != nil {
			launcher.CloseFDs(fds)
			ch <- res{nil, fmt.Errorf("setns back to the host's network namespace: %w", err)}
			select {} // parked, locked, never ended (above)
		}
		runtime.UnlockOSThread()
		if serr != nil {
			launcher.CloseFDs(fds)
			fds = nil
		}
		ch <- res{fds, serr}
	}()
	r := <-ch
	return r.fds, r.err
}

// callNetwork brings up lo in the network namespace of nsPath and opens
// there the egress listeners ls (bound, and listening if TCP), returned in
// ls's order: one visit of the namespace makes every socket
// (socketsInNetNS), so each listener is the call's namespace's, never the
// host's. lo first: a bind to 127.0.0.1 needs it up.
func callNetwork(nsPath string, ls []nsinit.Listener) ([]int, error) {
	host, err := hostNetNS()
	if err != nil {
		return nil, fmt.Errorf("open the host's network namespace: %w", err)
	}
	types := []int{unix.SOCK_DGRAM} // the first: lo's ioctls
	for _, l := range ls {
		typ, err := nsinit.ListenerSocketType(l)
		if err != nil {
			return nil, err
		}
		types = append(types, typ)
	}
	fds, err := socketsInNetNS(nsPath, host, types)
	if err != nil {
		return nil, err
	}
	err = loopbackUp(fds[0])
	unix.Close(fds[0])
	lfds := fds[1:]
	for i, l := range ls {
		if err != nil {
			break
		}
		err = bindListener(lfds[i], l)
	}
	if err != nil {
		launcher.CloseFDs(lfds)
		return nil, err
	}
	return lfds, nil
}

// loopbackUp sets IFF_UP on lo through s, an AF_INET socket of the call's
// network namespace (as a sandbox's program does at step 10 with raw calls).
func loopbackUp(s int) error {
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCGIFFLAGS lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("SIOCSIFFLAGS lo: %w", err)
	}
	return nil
}

// bindListener binds fd, an AF_INET socket of nsinit.ListenerSocketType(l)
// in the call's network namespace, to l's address (nsinit.ListenerAddr)
// and, for TCP, listens, as a sandbox's program does at step 10.
func bindListener(fd int, l nsinit.Listener) error {
	ap, err := nsinit.ListenerAddr(l)
	if err != nil {
		return err
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		return fmt.Errorf("listener %s: bind %s: %w", l.Name, l.Addr, err)
	}
	if l.Network == "tcp" {
		if err := unix.Listen(fd, 128); err != nil {
			return fmt.Errorf("listener %s: listen %s: %w", l.Name, l.Addr, err)
		}
	}
	return nil
}

// attachMounts is C7's second half: the detached mounts fds (made on the
// host, freshMounts and workDirTree) are moved onto targets in the mount
// namespace of the process pidfd names (the call's child, pinned at C3),
// by the mount attacher (attacher). Host root joins that namespace without
// entering the call's user namespace (CAP_SYS_ADMIN over its owner, whose
// ancestor is the host's), and the join makes the call's root the
// thread's root: each target resolves there, never on the host.
func attachMounts(pidfd int, fds []int, targets []string) error {
	r := attachReq{pidfd: pidfd, fds: fds, targets: targets, done: make(chan error, 1)}
	attacher() <- r
	return <-r.done
}

type attachReq struct {
	pidfd   int
	fds     []int
	targets []string
	done    chan error
}

// attacher is the goroutine that attaches every call's mounts, locked to
// its OS thread for the life of the process and never ending: a thread
// that ended would fire the parent-death signal of every child any
// goroutine forked from it (the template's id mapper is such a child).
// The thread first takes an fs_struct of its own (unshare CLONE_FS:
// setns refuses to join a mount namespace with an fs_struct the process's
// other threads share, and would move their root and cwd with it); it
// runs nothing but attachIn.
var attacher = sync.OnceValue(func() chan<- attachReq {
	c := make(chan attachReq)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		host, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			err = fmt.Errorf("open the host's mount namespace: %w", err)
		} else if err = unix.Unshare(unix.CLONE_FS); err != nil {
			err = fmt.Errorf("unshare CLONE_FS: %w", err)
		}
		for r := range c {
			if err != nil {
				r.done <- err
				continue
			}
			r.done <- attachIn(host, r)
		}
	}()
	return c
})

// attachIn joins the call's mount namespace, moves each mount onto its
// target there, and goes back to the host's (host): between two calls
// the thread holds no call's namespace (its mounts end with the call).
func attachIn(host int, r attachReq) error {
	if err := unix.Setns(r.pidfd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("setns the call's mount namespace: %w", err)
	}
	var err error
	for i, fd := range r.fds {
		if err = unix.MoveMount(fd, "", unix.AT_FDCWD, r.targets[i], unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			err = fmt.Errorf("move_mount onto %s in the call's mount namespace: %w", r.targets[i], err)
			break
		}
	}
	if berr := unix.Setns(host, unix.CLONE_NEWNS); berr != nil && err == nil {
		err = fmt.Errorf("setns back to the host's mount namespace: %w", berr)
	}
	return err
}
