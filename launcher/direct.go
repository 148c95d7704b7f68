package launcher

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/launcher/procfs"

	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// Every sandbox runs the init's steps in the launcher's own clone child,
// compiled into an nsinit.Program (issue 19: no second Go runtime, no
// plan to encode and decode, no second execve per sandbox; issue 30: one
// implementation of the steps): one-shot and pre-built, root and
// rootless, a worker's, a template's and a bubblewrap line's.

// runDirect is run's L4-L8, once L3 has cloned the bind sources (trees,
// in plan order; none rootless).
func (s *Sandbox) runDirect(trees []*os.File) {
	var childEnds []*os.File // the child's copies: closed here once it exists
	fail := func(se *StepError) {
		closeFiles(childEnds)
		closeFiles(trees)
		s.abort(se)
	}
	// "clone init": the child is the init, only not a program of its own.
	cloneErr := func(action string, err error) *StepError {
		return &StepError{Who: "launcher", Step: nsinit.StepLClone, Action: action, Path: "(direct: the launcher's own child)",
			Detail: cloneDetail(s.plan), Msg: err.Error(), Err: err, Hint: "user namespaces disabled or not permitted? see str doctor"}
	}

	// The child's descriptors: its stdio (a non-file reader or writer
	// through a pipe this process copies, as exec.Cmd does), the tool's
	// pass-list, the report socket, the trees and the id-map pipe.
	files := nsinit.DirectFiles{Report: int(s.reportW.Fd())}
	childEnds = append(childEnds, s.reportW)
	for i, std := range []any{s.req.Stdin, s.req.Stdout, s.req.Stderr} {
		if i == 2 && sameWriter(s.req.Stdout, s.req.Stderr) {
			// One writer, one pipe (as exec.Cmd): two copies into one
			// writer would interleave, and a bytes.Buffer's ReadFrom
			// would even undo the other's writes.
			files.Stdio[2] = files.Stdio[1]
			continue
		}
		f, err := s.childStdio(i, std)
		if err != nil {
			fail(cloneErr("stdio", err))
			return
		}
		files.Stdio[i] = int(f.Fd())
		if f != std {
			childEnds = append(childEnds, f)
		}
	}
	for _, f := range s.req.ExtraFiles {
		files.Pass = append(files.Pass, int(f.Fd()))
	}
	for _, t := range trees {
		files.Trees = append(files.Trees, int(t.Fd()))
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		fail(cloneErr("pipe", err))
		return
	}
	files.Sync = p
	childEnds = append(childEnds, os.NewFile(uintptr(p[0]), "id-map sync"), os.NewFile(uintptr(p[1]), "id-map sync"))

	// L4. The program, then the clone: the child waits for its id maps
	// (written here, as Go's fork-and-exec does for a child of its own)
	// and runs it.
	child := s.plan.Child
	if child.Join != nil {
		child.CgroupTasks = nil // cgroup v1: the launcher moves a joining init in (below)
	}
	prog, err := nsinit.CompileDirect(&child, files, lastCapability(), hardLimit)
	if err != nil {
		se, ok := err.(*StepError)
		if !ok {
			se = cloneErr("compile the init's steps", err)
		}
		fail(se)
		return
	}
	s.prog = prog
	cgroupFD := -1
	if s.cg != nil {
		if fd, ok := s.cg.CloneFD(); ok {
			// cgroup v2: CLONE_INTO_CGROUP, born inside its cgroup.
			cgroupFD = fd
		}
	}
	pid, pidfd, err := prog.Start(s.plan.CloneFlags, cgroupFD, files.Sync, func(pid int) error {
		if s.plan.Child.Join != nil {
			// No namespace of its own, no maps: the init joins (sub-step
			// 0a). cgroup v1: the launcher moves it into the cgroup (its
			// step 12 would run as ids of the joined namespace, which the
			// tasks files, the leased ids', are not).
			for _, t := range s.plan.Child.CgroupTasks {
				if err := os.WriteFile(t, []byte(strconv.Itoa(pid)), 0); err != nil {
					return fmt.Errorf("enter cgroup: %w", err)
				}
			}
			return nil
		}
		ppid, err := procfs.PidInProc(pid) // pid itself unless /proc is another pid namespace's
		if err != nil {
			return err
		}
		if s.req.RecordNamespaces {
			s.namespaces, _ = procfs.NamespaceInodes(ppid) // the child is waiting, alive
		}
		return writeIDMaps(ppid, s.plan)
	})
	if err != nil {
		// Start reaped the child, if there was one: its memory is free.
		prog.Release()
		fail(cloneErr("clone init", err))
		return
	}
	closeFiles(childEnds)
	closeFiles(trees)
	// The child's pidfd: signals go through it, and the poller waits on it.
	s.pid, s.pidfd = pid, os.NewFile(uintptr(pidfd), "pidfd")
	if s.ids != nil {
		s.ids.Record(pid)
	}
	s.mark(phaseClone)

	// L7. The wall clock, before Start returns.
	s.startClock()
	close(s.started)

	var execAt time.Time
	reportDone := make(chan struct{})
	go func() {
		defer close(reportDone)
		s.readReports()
		execAt = time.Now() // EOF: the child executed the tool, or exited
	}()
	stopCtx := context.AfterFunc(s.ctx, func() { s.interrupt() })

	s.procState, s.waitErr = s.waitDirect()
	s.reaped(stopCtx)
	<-reportDone
	s.copiers.Wait()
	// The child's setup, from the clone to the tool's execve (or its
	// failure): the init's steps, timed from here as one phase; a
	// pre-built sandbox's from its call (the wait is not setup time).
	from := s.last
	s.mu.Lock()
	if s.armedAt.After(from) {
		from = s.armedAt
	}
	s.mu.Unlock()
	if execAt.After(from) {
		s.addPhase(phaseInit, execAt.Sub(from))
		s.last = execAt
	}
	s.mark(phaseRun)

	// L8.
	s.result = s.collect()
	// The program is done with: the child ran it (its own copy) and its
	// failure, if any, was read at the report socket's EOF.
	s.prog.Release()
}

// waitDirect reaps the direct child: its pidfd becomes readable when it
// exits, then wait4 (WNOHANG) takes its status and resource usage. The
// poller waits, so no thread blocks in a wait while the tool runs (one
// per sandbox otherwise, in a worker or str serve with many).
func (s *Sandbox) waitDirect() (*exitState, error) {
	defer s.pidfd.Close()
	rc, err := s.pidfd.SyscallConn()
	if err != nil {
		return nil, err
	}
	st := &exitState{}
	var werr error
	err = rc.Read(func(uintptr) bool {
		for {
			wpid, e := syscall.Wait4(s.pid, &st.ws, syscall.WNOHANG, &st.ru)
			switch {
			case e == syscall.EINTR:
				continue
			case e != nil:
				werr = e
				return true
			case wpid == 0:
				return false // still running: wait for the pidfd
			}
			return true
		}
	})
	if err == nil {
		err = werr
	}
	if err != nil {
		return nil, fmt.Errorf("wait4 %d: %w", s.pid, err)
	}
	return st, nil
}

// childStdio is the file the child gets as descriptor i (0-2) for std, a
// Request's Stdin, Stdout or Stderr: the file itself, /dev/null for nil,
// or a pipe's end whose other end this process copies from or to (the
// copy of an output ends before Wait returns).
func (s *Sandbox) childStdio(i int, std any) (*os.File, error) {
	if f, ok := std.(*os.File); ok {
		if f != nil {
			return f, nil
		}
		std = nil // a typed nil file is no file: /dev/null, as nil
	}
	if rd, ok := std.(io.Reader); ok && i == 0 {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		go func() {
			_, _ = io.Copy(w, rd)
			w.Close()
		}()
		return r, nil
	}
	if w, ok := std.(io.Writer); ok && i > 0 {
		r, wr, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		s.copiers.Add(1)
		go func() {
			defer s.copiers.Done()
			_, _ = io.Copy(w, r)
			r.Close()
		}()
		return wr, nil
	}
	flag := os.O_RDONLY
	if i > 0 {
		flag = os.O_WRONLY
	}
	return os.OpenFile(os.DevNull, flag, 0)
}

// sameWriter: a and b are the same writer (false for values that cannot
// be compared).
func sameWriter(a, b io.Writer) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a != nil && a == b
}

// writeIDMaps writes the child's uid and gid maps, each in one write as
// the kernel requires. Rootless, setgroups is denied first: the kernel
// takes an unprivileged gid map only then (and the child can then not
// setgroups(2): nsinit.Config.SetGroups is false).
func writeIDMaps(pid int, plan *Plan) error {
	line := func(maps []IDMap) []byte {
		var b []byte
		for _, x := range maps {
			b = fmt.Appendf(b, "%d %d %d\n", x.Inside, x.Outside, x.Size)
		}
		return b
	}
	type write struct {
		file string
		data []byte
	}
	var writes []write
	if plan.Rootless {
		writes = append(writes, write{"setgroups", []byte("deny")})
	}
	writes = append(writes, write{"uid_map", line(plan.UIDMappings)}, write{"gid_map", line(plan.GIDMappings)})
	for _, w := range writes {
		path := fmt.Sprintf("/proc/%d/%s", pid, w.file)
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", path, err)
		}
		_, err = unix.Write(fd, w.data)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("write %s %q: %w", path, w.data, err)
		}
	}
	return nil
}

// lastCapability is the host's highest capability number
// (/proc/sys/kernel/cap_last_cap), read once per process: step 13 drops
// every one up to it.
var lastCapability = sync.OnceValue(func() int {
	b, _ := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
		return n
	}
	return int(unix.CAP_LAST_CAP)
})

// hardLimit is this process's hard limit of resource, which the child
// inherits at the fork.
func hardLimit(resource int) (uint64, error) {
	var l unix.Rlimit
	if err := unix.Getrlimit(resource, &l); err != nil {
		return 0, err
	}
	return l.Max, nil
}
