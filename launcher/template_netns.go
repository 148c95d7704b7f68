package launcher

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// The one file of str that calls setns: a per-tool template's supervisor
// brings up lo in each call's fresh network namespace from the host, so
// the call's child never needs netlink or a network ioctl of its own.

// hostNetNS is the supervisor's own network namespace, opened once.
var hostNetNS = sync.OnceValues(func() (int, error) {
	return unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
})

// socketInNetNS makes an AF_INET datagram socket in the network namespace
// of nsPath (/proc/PID/ns/net): the one locked thread joins it, creates
// the socket and goes back. A socket keeps its namespace for life, so
// its ioctls then act there from any thread. If the way back fails the
// thread stays locked and dies with its goroutine (Go then discards it):
// no goroutine ever runs in the call's namespace.
func socketInNetNS(nsPath string, hostNS int) (int, error) {
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		ns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- res{-1, fmt.Errorf("open %s: %w", nsPath, err)}
			return
		}
		defer unix.Close(ns)
		if err := unix.Setns(ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- res{-1, fmt.Errorf("setns %s: %w", nsPath, err)}
			return
		}
		s, serr := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err := unix.Setns(hostNS, unix.CLONE_NEWNET); err != nil {
			if serr == nil {
				unix.Close(s)
			}
			ch <- res{-1, fmt.Errorf("setns back to the host's network namespace: %w", err)} // thread stays locked: discarded
			return
		}
		runtime.UnlockOSThread()
		ch <- res{s, serr}
	}()
	r := <-ch
	return r.fd, r.err
}

// loopbackUpIn brings up lo in the network namespace of nsPath.
func loopbackUpIn(nsPath string) error {
	host, err := hostNetNS()
	if err != nil {
		return fmt.Errorf("open the host's network namespace: %w", err)
	}
	s, err := socketInNetNS(nsPath, host)
	if err != nil {
		return err
	}
	defer unix.Close(s)
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
