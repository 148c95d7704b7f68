package helper

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"syscall"

	"github.com/securetoolruntime/str/egress"
	"golang.org/x/sys/unix"
)

// BinEnv names the variable that overrides where the helper program is
// (default: str-egress beside the running executable).
const BinEnv = "STR_EGRESS_BIN"

// ExtraRootsEnv names the variable an operator (or a test) sets to a PEM
// file of extra roots upstream servers are verified against. The launcher
// reads the file (the helper may not be able to: it runs as nobody) and
// passes its contents on the control socket.
const ExtraRootsEnv = "STR_EGRESS_EXTRA_ROOTS"

// NobodyID is the uid and gid the helper runs as when the launcher is
// root.
const NobodyID = 65534

// Client is one launcher's egress helper: started at first use, and again
// at the next use after it died. The zero value is ready; a Client must
// not be copied. It is safe for concurrent use.
type Client struct {
	mu sync.Mutex
	p  *proc

	starterOnce sync.Once
	starts      chan chan startResult
}

type startResult struct {
	p   *proc
	err error
}

// Ready starts the helper if none runs and returns once one does.
func (c *Client) Ready() error {
	_, err := c.get()
	return err
}

// Pid is the running helper's process id (0 when none runs).
func (c *Client) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p == nil || c.p.gone() {
		return 0
	}
	return c.p.cmd.Process.Pid
}

// get returns the running helper, starting one if there is none or the
// last one died.
func (c *Client) get() (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.p != nil && !c.p.gone() {
		return c.p, nil
	}
	// The helper's parent death signal follows the thread that forked it:
	// fork from one locked thread that lives as long as the launcher, so
	// that a thread the launcher retires (a locked goroutine that exits)
	// never takes the helper with it.
	c.starterOnce.Do(func() {
		c.starts = make(chan chan startResult)
		go func() {
			runtime.LockOSThread() // never unlocked: this thread is the helpers' parent
			for r := range c.starts {
				p, err := start()
				r <- startResult{p, err}
			}
		}()
	})
	r := make(chan startResult, 1)
	c.starts <- r
	res := <-r
	if res.err != nil {
		return nil, res.err
	}
	c.p = res.p
	return c.p, nil
}

// Path is where the helper program is: $STR_EGRESS_BIN, or str-egress
// beside the running executable.
func Path() (string, error) {
	if p := os.Getenv(BinEnv); p != "" {
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("egress helper: the running executable: %w", err)
	}
	return filepath.Join(filepath.Dir(exe), "str-egress"), nil
}

// start runs the helper program with one end of a SOCK_SEQPACKET pair as
// its descriptor 3: as nobody (uid and gid 65534, no groups, hence no
// capabilities) when the launcher is root, with no environment, in /,
// killed when its parent thread dies. It sets no_new_privs itself before
// anything else.
func start() (*proc, error) {
	path, err := Path()
	if err != nil {
		return nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("egress helper: socketpair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "egress-helper"), os.NewFile(uintptr(fds[1]), "egress-helper-peer")
	defer ours.Close()
	cmd := &exec.Cmd{
		Path:        path,
		Args:        []string{"str-egress"},
		Env:         []string{},
		Dir:         "/",
		Stderr:      os.Stderr,
		ExtraFiles:  []*os.File{theirs},
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: NobodyID, Gid: NobodyID, Groups: []uint32{}}
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		return nil, fmt.Errorf("egress helper %s: %w (make build puts str-egress beside str; %s overrides the path)", path, err, BinEnv)
	}
	fc, err := net.FileConn(ours)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("egress helper: control socket: %w", err)
	}
	p := &proc{conn: fc.(*net.UnixConn), cmd: cmd, pending: map[uint64]chan Message{}, sessions: map[uint64]*Session{}, done: make(chan struct{})}
	hello := Message{Op: OpHello}
	if f := os.Getenv(ExtraRootsEnv); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			hello.ExtraRootsErr = fmt.Sprintf("%s: %v", ExtraRootsEnv, err)
		}
		hello.ExtraRoots = b
	}
	if err := Send(p.conn, hello, nil); err != nil {
		p.conn.Close()
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("egress helper %s: hello: %w", path, err)
	}
	go p.read()
	return p, nil
}

// proc is one running helper.
type proc struct {
	conn *net.UnixConn
	cmd  *exec.Cmd

	mu          sync.Mutex
	next        uint64 // request IDs
	nextSession uint64
	pending     map[uint64]chan Message
	sessions    map[uint64]*Session
	caPEM       []byte
	err         error         // why it is gone
	done        chan struct{} // closed when it is gone
}

func (p *proc) gone() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// read dispatches the helper's messages until its socket closes (the
// helper exited or was killed), then fails every pending request and
// every session it served.
func (p *proc) read() {
	buf := make([]byte, MaxMessage)
	var err error
	for {
		var m Message
		var files []*os.File
		m, files, err = Recv(p.conn, buf)
		for _, f := range files { // the helper sends none
			f.Close()
		}
		if err != nil {
			break
		}
		p.mu.Lock()
		switch m.Op {
		case OpReply:
			if ch := p.pending[m.ID]; ch != nil {
				delete(p.pending, m.ID)
				ch <- m
			}
		case OpKill:
			if s := p.sessions[m.Session]; s != nil && len(m.Events) > 0 && s.onKill != nil {
				go s.onKill(m.Events[0])
			}
		}
		p.mu.Unlock()
	}
	p.conn.Close()
	werr := p.cmd.Wait()
	p.mu.Lock()
	p.err = fmt.Errorf("egress helper (pid %d) died: %v", p.cmd.Process.Pid, werr)
	if werr == nil {
		p.err = fmt.Errorf("egress helper (pid %d) exited: %v", p.cmd.Process.Pid, err)
	}
	close(p.done)
	p.mu.Unlock()
}

// request sends m (with fds) and waits for its reply; the reply's Err is
// returned as an error.
func (p *proc) request(m Message, fds []int) (Message, error) {
	ch := make(chan Message, 1)
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		return Message{}, err
	}
	p.next++
	m.ID = p.next
	p.pending[m.ID] = ch
	p.mu.Unlock()
	if err := Send(p.conn, m, fds); err != nil {
		p.mu.Lock()
		delete(p.pending, m.ID)
		p.mu.Unlock()
		return Message{}, fmt.Errorf("egress helper: %s: %w", m.Op, err)
	}
	select {
	case r := <-ch:
		if r.Err != "" {
			return r, errors.New(r.Err)
		}
		return r, nil
	case <-p.done:
		return Message{}, p.err
	}
}

// ErrRefused marks the helper's verdict on a policy (Check), as opposed to
// a helper that could not be asked.
var ErrRefused = errors.New("refused by the egress helper")

// Check has the helper compile policy and creds as a session would: with
// the public suffix list, which a program without the proxy lacks
// (egress.PublicSuffix). A refusal wraps ErrRefused.
func (c *Client) Check(policy egress.Policy, creds []egress.Credential) error {
	p, err := c.get()
	if err != nil {
		return err
	}
	r, err := p.request(Message{Op: OpCheck, Policy: &policy, Credentials: wireCredentials(creds)}, nil)
	if err != nil && r.Op == OpReply {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}

// CACert is the certificate (PEM) of the CA the helper terminates TLS
// with, made in the helper at the first request; its key never leaves the
// helper. A helper that died and was started again has a new CA: a
// sandbox planned with the old one fails to verify (closed), never passes.
func (c *Client) CACert() ([]byte, error) {
	p, err := c.get()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	pem := p.caPEM
	p.mu.Unlock()
	if pem != nil {
		return pem, nil
	}
	r, err := p.request(Message{Op: OpCA}, nil)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.caPEM = r.CertPEM
	p.mu.Unlock()
	return r.CertPEM, nil
}

// Session is one sandbox's (or template call's) egress session. Its
// listeners stay with the launcher until the first connection or datagram
// reaches one of them (it waits in the listener's backlog meanwhile): only
// then are they handed to the helper, started if none runs. A sandbox
// that never uses the network (a one-shot /bin/true) costs no helper and
// no round trip.
type Session struct {
	c      *Client
	policy egress.Policy
	creds  []egress.Credential
	onKill func(egress.Event)
	names  []string
	fds    []int      // the listeners (ours until handed over), by names
	files  []*os.File // the same descriptors, registered with the poller
	stop   func() bool

	mu     sync.Mutex // serializes the hand-over and Close
	handed bool       // handed over (or tried to)
	closed bool
	p      *proc
	id     uint64
	final  Message
	err    error // the hand-over's failure, or the helper's death
}

// Serve serves files (the listeners a sandbox's init or a template call
// opened, by name: proxy, dns-tcp, dns-udp, capture-PORT) with policy and
// creds until ctx is done or Close; onKill runs (on its own goroutine)
// when on_violation: kill fires. At the first traffic the listeners go to
// the helper, which then holds the only copies: if it dies, the sandbox's
// listeners close with it (no network, never an open one). The files are
// closed here either way.
func (c *Client) Serve(ctx context.Context, policy egress.Policy, creds []egress.Credential, files map[string]*os.File, onKill func(egress.Event)) (*Session, error) {
	s := &Session{c: c, policy: policy, creds: creds, onKill: onKill}
	for name := range files {
		s.names = append(s.names, name)
	}
	sort.Strings(s.names)
	var err error
	for _, name := range s.names {
		// A non-blocking copy the runtime's poller waits on; the original
		// (a blocking descriptor from the init) is closed.
		f := files[name]
		fd, derr := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if derr == nil {
			derr = unix.SetNonblock(fd, true)
			if derr != nil {
				unix.Close(fd)
			}
		}
		if derr != nil && err == nil {
			err = fmt.Errorf("egress: listener %s: %w", name, derr)
		}
		if derr == nil {
			s.fds = append(s.fds, fd)
			s.files = append(s.files, os.NewFile(uintptr(fd), name))
		}
	}
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		s.closeFiles()
		return nil, err
	}
	for _, f := range s.files {
		go s.watch(f)
	}
	s.mu.Lock() // Close may run at once, with ctx done already
	s.stop = context.AfterFunc(ctx, func() { s.Close() })
	s.mu.Unlock()
	return s, nil
}

// watch waits until f has a connection or a datagram waiting, then hands
// the session over. It ends without one when the files are closed.
func (s *Session) watch(f *os.File) {
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	waited := false
	err = rc.Read(func(uintptr) bool {
		done := waited // the first call only asks the poller to wait
		waited = true
		return done
	})
	if err == nil {
		s.handOver()
	}
}

func (s *Session) closeFiles() {
	for _, f := range s.files {
		f.Close()
	}
	s.files, s.fds = nil, nil
}

// handOver gives the listeners to the helper (started if none runs) with
// the policy and credentials, once.
func (s *Session) handOver() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handed || s.closed {
		return
	}
	s.handed = true
	defer s.closeFiles()
	p, err := s.c.get()
	if err != nil {
		s.err = fmt.Errorf("the egress proxy did not start, the sandbox had no network: %w", err)
		return
	}
	p.mu.Lock()
	p.nextSession++
	id := p.nextSession // registered before a kill for it can arrive
	p.sessions[id] = s
	p.mu.Unlock()
	_, err = p.request(Message{Op: OpStart, Session: id, Policy: &s.policy, Credentials: wireCredentials(s.creds), Listeners: s.names}, s.fds)
	if err != nil {
		p.mu.Lock()
		delete(p.sessions, id)
		p.mu.Unlock()
		s.err = fmt.Errorf("the egress proxy did not start, the sandbox had no network: %w", err)
		return
	}
	s.p, s.id = p, id
}

// Close ends the session and keeps its final record. Its error says the
// proxy never started or the helper died while serving it (the sandbox
// had no network, or lost it).
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return s.err
	}
	s.closed = true
	if s.stop != nil {
		s.stop()
	}
	if s.p == nil { // never handed over (no traffic), or failed to
		s.closeFiles()
		return s.err
	}
	var err error
	s.final, err = s.p.request(Message{Op: OpClose, Session: s.id}, nil)
	s.p.mu.Lock()
	delete(s.p.sessions, s.id)
	s.p.mu.Unlock()
	if err != nil {
		s.err = fmt.Errorf("the sandbox lost its network: %w", err)
	}
	return s.err
}

// record is the session's record: the final one once closed, none before
// any traffic, else asked.
func (s *Session) record() Message {
	s.mu.Lock()
	if s.closed || s.p == nil {
		defer s.mu.Unlock()
		return s.final
	}
	p, id := s.p, s.id
	s.mu.Unlock()
	r, err := p.request(Message{Op: OpReport, Session: id}, nil)
	if err != nil {
		// A Close that reached the helper first (the helper answers each
		// request on its own goroutine) leaves no session to report:
		// Close holds s.mu until it has the final record, so wait for
		// it and take that.
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return s.final
		}
	}
	return r
}

// Violations are the session's aggregated denials and how many were
// dropped past the cap (none known if the helper died).
func (s *Session) Violations() ([]egress.Event, int) {
	r := s.record()
	return r.Events, r.Dropped
}

// Summary is the text an agent can show its model ("" with none).
func (s *Session) Summary() string { return s.record().Summary }
