// Command str-egress is the egress helper: it serves sandboxes' network
// policies (package egress/proxy) for one launcher, out of the launcher's
// process. The launcher (package egress/helper) starts it with a
// SOCK_SEQPACKET control socket as descriptor 3, as nobody when the
// launcher is root, with no environment, and hands it each sandbox's
// listeners with the sandbox's policy and credentials (see
// egress/helper/wire.go for the messages). It exits when the control
// socket closes (the launcher is gone) and is killed with its parent
// thread (Pdeathsig).
//
// It parses everything a sandbox sends to the network and terminates TLS
// with a CA whose key exists only here; it holds no host privilege: it
// refuses to run as root and sets no_new_privs before anything else.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/helper"
	"github.com/securetoolruntime/str/egress/proxy"
	"golang.org/x/sys/unix"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "str-egress:", err)
		os.Exit(1)
	}
}

func run() error {
	// 1. no_new_privs first: nothing this process execs (it execs nothing)
	// may gain privileges.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	// 1b. not dumpable: other processes of uid 65534 on the host (daemons
	// that drop to nobody) may not ptrace it or read its memory through
	// /proc (it holds the credentials' values and the CA key), and its
	// /proc entries are root's. Before any of those is received.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("dumpable: %w", err)
	}
	// 2. never as root: the launcher starts it as nobody when it is root.
	if os.Geteuid() == 0 || os.Getuid() == 0 {
		return errors.New("refusing to run as root (the launcher starts it as uid 65534)")
	}
	// 3. the control socket.
	f := os.NewFile(3, "control")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("control socket (descriptor 3): %w", err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return errors.New("descriptor 3 is not a unix socket")
	}
	s := &server{conn: uc, sessions: map[uint64]*proxy.Session{}}
	return s.serve()
}

type server struct {
	conn *net.UnixConn
	wmu  sync.Mutex

	mu       sync.Mutex
	sessions map[uint64]*proxy.Session

	caOnce   sync.Once
	ca       *proxy.CA
	roots    *x509.CertPool
	caErr    error
	extra    []byte
	extraErr string
}

func (s *server) send(m helper.Message) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := helper.Send(s.conn, m, nil); err != nil {
		fmt.Fprintf(os.Stderr, "str-egress: send %s: %v\n", m.Op, err)
	}
}

// serve reads requests until the launcher closes its end; each is handled
// on its own goroutine (a session's close waits for its connections).
func (s *server) serve() error {
	buf := make([]byte, helper.MaxMessage)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		m, files, err := helper.Recv(s.conn, buf)
		if errors.Is(err, net.ErrClosed) {
			return nil // the launcher is gone
		}
		if err != nil {
			return err
		}
		if m.Op == helper.OpHello {
			s.extra, s.extraErr = m.ExtraRoots, m.ExtraRootsErr
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := s.handle(m, files)
			r.Op, r.ID = helper.OpReply, m.ID
			s.send(r)
		}()
	}
}

func (s *server) handle(m helper.Message, files []*os.File) helper.Message {
	fail := func(err error) helper.Message { return helper.Message{Err: err.Error()} }
	switch m.Op {
	case helper.OpCA:
		ca, _, err := s.getCA()
		if err != nil {
			return fail(err)
		}
		return helper.Message{CertPEM: ca.CertPEM()}
	case helper.OpCheck:
		if m.Policy == nil {
			return fail(errors.New("check: no policy"))
		}
		pol, err := m.Policy.Compile()
		if err == nil {
			err = egress.ValidateCredentials(pol, helper.EgressCredentials(m.Credentials))
		}
		if err != nil {
			return fail(err)
		}
		return helper.Message{}
	case helper.OpStart:
		if err := s.start(m, files); err != nil {
			return fail(err)
		}
		return helper.Message{}
	case helper.OpReport, helper.OpClose:
		s.mu.Lock()
		sess := s.sessions[m.Session]
		if m.Op == helper.OpClose {
			delete(s.sessions, m.Session)
		}
		s.mu.Unlock()
		if sess == nil {
			return fail(fmt.Errorf("no session %d", m.Session))
		}
		var r helper.Message
		if m.Op == helper.OpClose {
			if err := sess.Close(); err != nil {
				r.Err = err.Error()
			}
		}
		r.Events, r.Dropped = sess.Violations()
		r.Summary = sess.Summary()
		return r
	}
	for _, f := range files {
		f.Close()
	}
	return fail(fmt.Errorf("unknown request %q", m.Op))
}

// getCA makes the CA and the upstream roots at first use.
func (s *server) getCA() (*proxy.CA, *x509.CertPool, error) {
	s.caOnce.Do(func() {
		if s.extraErr != "" {
			s.caErr = errors.New(s.extraErr)
			return
		}
		if s.ca, s.caErr = proxy.NewCA(); s.caErr != nil {
			return
		}
		if s.roots, s.caErr = proxy.UpstreamRoots(s.extra); s.caErr != nil {
			s.caErr = fmt.Errorf("%s: %w", helper.ExtraRootsEnv, s.caErr)
		}
	})
	return s.ca, s.roots, s.caErr
}

// start serves a session's listeners; on error they are closed.
func (s *server) start(m helper.Message, files []*os.File) error {
	l, err := listeners(m.Listeners, files)
	if err != nil {
		return err
	}
	if m.Policy == nil {
		closeListeners(l)
		return errors.New("start: no policy")
	}
	creds := helper.EgressCredentials(m.Credentials)
	var o proxy.Options
	if egress.Terminates(*m.Policy, creds) {
		ca, roots, err := s.getCA()
		if err != nil {
			closeListeners(l)
			return err
		}
		o.Intercept = &proxy.Interception{CA: ca, Credentials: creds, UpstreamRoots: roots}
	}
	id := m.Session
	o.OnKill = func(ev egress.Event) {
		s.send(helper.Message{Op: helper.OpKill, Session: id, Events: []egress.Event{ev}})
	}
	sess, err := proxy.Start(context.Background(), *m.Policy, l, o)
	if err != nil {
		closeListeners(l)
		return err
	}
	s.mu.Lock()
	s.sessions[id] = sess
	s.mu.Unlock()
	return nil
}

// listeners makes the proxy's listeners of the sockets a sandbox's init
// (nsinit step 10) or a template call opened, by name; the files are
// closed (net.File* dup them).
func listeners(names []string, files []*os.File) (proxy.Listeners, error) {
	var l proxy.Listeners
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if len(names) != len(files) {
		return l, fmt.Errorf("start: %d listener names, %d descriptors", len(names), len(files))
	}
	var errs []error
	for i, name := range names {
		f := files[i]
		var err error
		switch {
		case name == "proxy":
			l.Proxy, err = net.FileListener(f)
		case name == "dns-tcp":
			l.DNSTCP, err = net.FileListener(f)
		case name == "dns-udp":
			l.DNSUDP, err = net.FilePacketConn(f)
		case strings.HasPrefix(name, "capture-"):
			port, perr := strconv.Atoi(strings.TrimPrefix(name, "capture-"))
			if perr != nil {
				err = perr
				break
			}
			var ln net.Listener
			if ln, err = net.FileListener(f); err == nil {
				if l.Capture == nil {
					l.Capture = map[int]net.Listener{}
				}
				l.Capture[port] = ln
			}
		default:
			err = errors.New("unknown listener")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("listener %s: %w", name, err))
		}
	}
	if len(errs) > 0 {
		closeListeners(l)
		return proxy.Listeners{}, errors.Join(errs...)
	}
	return l, nil
}

func closeListeners(l proxy.Listeners) {
	for _, c := range []interface{ Close() error }{l.Proxy, l.DNSTCP, l.DNSUDP} {
		if c != nil {
			c.Close()
		}
	}
	for _, c := range l.Capture {
		c.Close()
	}
}
