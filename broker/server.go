package broker

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/securetoolruntime/str/worker/transport"
	"golang.org/x/sys/unix"
)

// ErrServerClosed is returned by Listen once Close has been called.
var ErrServerClosed = errors.New("devbroker: server closed")

// Defaults for Options.
const (
	DefaultQueueSize     = 10000
	DefaultMaxQueueBytes = 64 << 20
	DefaultMaxLineBytes  = 16 << 20
	// Bounds before and after login (see "Connection bounds" in the
	// package doc).
	DefaultLoginLineBytes     = 4 << 10
	DefaultLoginTimeout       = 10 * time.Second
	DefaultMaxUnauthenticated = 64
	DefaultIdleTimeout        = 10 * time.Minute
	// minDerivedMaxConns is the floor of the MaxConns derived from
	// RLIMIT_NOFILE.
	minDerivedMaxConns = 16
	// writeTimeout bounds one response write, so a peer that stops reading
	// cannot pin a connection goroutine forever.
	writeTimeout = 30 * time.Second
	// maxReceiveWait caps a RECEIVE's timeout_ms; a client asking for more
	// gets TIMEOUT after this long and simply asks again.
	maxReceiveWait = time.Hour
	// A peer that vanishes without closing (host cut off the network,
	// powered off) is found by TCP itself: keep-alive probes after
	// peerIdle without traffic, peerProbeInterval apart, and a connection
	// whose probes or data stay unacknowledged for peerUserTimeout is
	// closed (TCP_USER_TIMEOUT; without it, data written to a dead peer
	// is retransmitted for about 15 minutes, tcp_retries2, and keep-alive
	// never starts). Until then the dead connection holds its client_id,
	// so the peer's reconnection under that id is refused (one connection
	// per client_id); these bound that wait to about peerIdle +
	// peerUserTimeout.
	peerIdle          = 5 * time.Second
	peerProbeInterval = 5 * time.Second
	peerUserTimeout   = 20 * time.Second
	// deferAcceptSeconds is the listening socket's TCP_DEFER_ACCEPT: the
	// kernel hands a connection to the broker once its first bytes have
	// arrived, or about this long after the handshake if none come. So a
	// client's CONNECT is already readable when its connection takes a
	// place among the MaxUnauthenticated, and a place is never given away
	// (see admit) in the moment between a client's connect and its
	// first write.
	deferAcceptSeconds = 1
)

// Options configures a Server. Exactly one of Token and Anonymous must be
// set; Listen refuses anything else, so a broker never ends up open by
// omission.
type Options struct {
	// Token is the secret every CONNECT must carry in its "token" field
	// (see NewToken; the caller publishes it with WriteTokenFile and names
	// the file with SetTokenFile).
	Token string
	// Anonymous accepts every CONNECT without a token, as the reference
	// broker does (for the reference's own clients, which send none).
	Anonymous bool
	// QueueSize is the most messages held for one client id; when full,
	// the oldest is dropped (logged on the first drop and every 100th).
	// 0 means DefaultQueueSize.
	QueueSize int
	// MaxQueueBytes is the most bytes of messages (topic, payload, user
	// properties and message id) held for one client id; a message that
	// does not fit makes room by dropping the oldest, exactly as a full
	// QueueSize does, and a message larger than MaxQueueBytes on its own
	// is dropped. 0 means DefaultMaxQueueBytes.
	MaxQueueBytes int
	// MaxLineBytes is the longest request line accepted (newline
	// excluded). A longer line is discarded up to its newline and answered
	// with INVALID_COMMAND. 0 means DefaultMaxLineBytes.
	MaxLineBytes int
	// LoginLineBytes is the longest request line accepted on a
	// connection that has not yet CONNECTed (token checked): a longer one
	// is answered INVALID_COMMAND and the connection closed, without
	// reading the rest. 0 means DefaultLoginLineBytes.
	LoginLineBytes int
	// LoginTimeout is how long a new connection has, from its accept, to
	// complete a CONNECT; then it is closed. 0 means DefaultLoginTimeout.
	LoginTimeout time.Duration
	// MaxUnauthenticated is the most connections at once that have not
	// yet completed a CONNECT. When they are all taken, one of them that
	// has no request of its own unanswered gives way to the new
	// connection (see "Connection bounds" in the package doc), so a
	// client that only opens connections cannot keep one with the token
	// out. 0 means DefaultMaxUnauthenticated.
	MaxUnauthenticated int
	// MaxConns is the most connections at once, of any kind; beyond it a
	// connection waiting for its CONNECT gives way as above, and when
	// none is waiting the new connection is closed at once. 0 means a
	// quarter of the process's RLIMIT_NOFILE soft limit at NewServer (at
	// least 16), so that broker clients cannot take the descriptors the
	// sandboxes need.
	MaxConns int
	// IdleTimeout closes a connected (CONNECTed) connection that has sent
	// no request for this long. A RECEIVE being waited on is not idle:
	// the clock runs only between a reply and the next request. 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// Logger receives connection, routing and drop events. nil means
	// slog.Default().
	Logger *slog.Logger
	// ReferenceSessions reproduces the reference broker's handling of
	// client ids, for tests of what clients must survive there: a
	// CONNECT claiming a connected client id takes the id over (the
	// first connection keeps running, stranded, as the reference leaves
	// it), and the end of any connection forgets its client id's
	// registration, whoever holds the id by then. A client that
	// reconnects under its id before the broker has seen its previous
	// connection end is then left connected and receiving nothing. Never
	// for a broker that serves anyone: it gives up "one connection per
	// client_id" (see the package doc).
	ReferenceSessions bool
}

// Server is str's embedded dev broker (spec §10). Create it with NewServer,
// start it with Listen, stop it with Close.
type Server struct {
	token      string // "" with anonymous
	anonymous  bool
	queueSize  int
	queueBytes int
	maxLine    int
	loginLine  int
	loginWait  time.Duration
	maxUnauth  int
	maxConns   int
	idle       time.Duration
	refSess    bool // Options.ReferenceSessions
	log        *slog.Logger
	done       chan struct{} // closed by Close
	wg         sync.WaitGroup
	// progress (capacity 1) tells admit, waiting for a connection that
	// may give way, that one may now: a connection waiting for its
	// CONNECT read bytes, had its first line answered, logged in or
	// closed.
	progress chan struct{}
	accepted atomic.Uint64 // connections accepted, numbering them (conn.seq); one accept loop per listener

	mu        sync.Mutex
	closed    bool
	listeners []net.Listener
	conns     map[*conn]struct{}
	tokenFile string // named in refusals; see SetTokenFile
	clients   map[string]*client
	order     []*client         // clients in connect order (publish routes in this order)
	groups    map[string]*group // queue name -> the group's shared queue, while it has members
	published recentPublishes   // publish_ids routed lately, per client_id (duplicate check)
	unauth    int               // connections in conns that have not CONNECTed
	bounds    boundCounts
}

// boundCounts counts the connections each bound has cut. Guarded by
// Server.mu.
type boundCounts struct {
	overMaxConns     uint64 // accepted beyond MaxConns and closed
	gaveWay          uint64 // waiting for CONNECT, closed to make room for a new connection
	loginLineTooLong uint64 // a line over LoginLineBytes before CONNECT
	loginTimeout     uint64 // no CONNECT within LoginTimeout
	idleTimeout      uint64 // no request within IdleTimeout
}

// Stats is a snapshot of the broker's connections and of the
// connections its bounds have cut, for its operator and its tests.
type Stats struct {
	Conns           int // connections open
	Unauthenticated int // of those, not yet CONNECTed
	// Cut by a bound since NewServer (see "Connection bounds" in the
	// package doc). GaveWay counts connections that had not CONNECTed
	// and were closed to make room for a new one.
	OverMaxConns, GaveWay, LoginLineTooLong, LoginTimeout, IdleTimeout uint64
}

// Stats returns the current Stats.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.bounds
	return Stats{Conns: len(s.conns), Unauthenticated: s.unauth,
		OverMaxConns: b.overMaxConns, GaveWay: b.gaveWay, LoginLineTooLong: b.loginLineTooLong,
		LoginTimeout: b.loginTimeout, IdleTimeout: b.idleTimeout}
}

// GroupQueued reports how many messages wait in the shared queue of the
// queue group name (0 when the group has no members).
func (s *Server) GroupQueued(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[name]; g != nil {
		return len(g.pending)
	}
	return 0
}

// Connected reports whether a client is connected under id.
func (s *Server) Connected(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients[id] != nil
}

// client is the broker-side state of one client id. Exactly one connection
// carries it (a CONNECT claiming an id that another connection holds is
// refused), and the client goes away with that connection.
type client struct {
	id       string
	queue    string              // queue group; "" = none
	subs     map[string]struct{} // patterns as sent, matched with MatchDev
	msgQueue                     // messages for this client alone
	signal   chan struct{}       // capacity 1: "pending, or its group's, may be non-empty"
}

// msgQueue is a bounded queue of messages (QueueSize, MaxQueueBytes).
// Guarded by Server.mu.
type msgQueue struct {
	pending      []*wireMessage
	pendingBytes int // sum of size() over pending
	dropped      uint64
}

// group is a queue group's shared queue. A message for the group waits
// here until the RECEIVE of a member whose subscriptions match it takes
// it: work goes to whichever member asks first, so a member that is busy,
// stopped or cut off takes no more than the one message its last RECEIVE
// asked for, and what it never asked for stays for the others. The group
// lives while it has members: when the last one goes, its queue goes
// with it (there is no persistence). Guarded by Server.mu.
type group struct {
	name    string
	members int
	msgQueue
}

// conn is one accepted TCP connection.
type conn struct {
	srv     *Server
	nc      net.Conn
	raw     syscall.RawConn // nc's socket, for reads before CONNECT (nil: not a socket)
	seq     uint64          // accept order: older connections give way first
	source  netip.Addr      // the peer's address, without the port
	session *client         // nil until CONNECT
	gone    chan struct{}   // closed when the peer's side is finished
	unauth  bool            // counted in Server.unauth; guarded by Server.mu
	// Before CONNECT: how far the first request line has got (first)
	// and whether the connection was closed to make room for a new one
	// (gaveWay: its reader reads nothing more). Guarded by loginMu,
	// which Read holds across each read(2) before CONNECT, so that
	// giveWay sees every byte either still in the socket or in first;
	// gaveWay is written with Server.mu held as well. Lock order:
	// Server.mu, then loginMu.
	loginMu sync.Mutex
	first   firstLine
	gaveWay bool
	// authed is set by the first successful CONNECT; the line reader
	// switches from LoginLineBytes to MaxLineBytes then.
	authed atomic.Bool
	// handled carries one token per line the handler has finished with.
	// Before CONNECT the reader waits for it before reading on, so that
	// no line is read ahead under the wrong limit.
	handled chan struct{}
}

// firstLine is how far a connection's first request line has got, the
// one a client with the token sends its CONNECT in.
type firstLine uint8

const (
	// firstUnread: no complete line read yet (perhaps a part of one).
	firstUnread firstLine = iota
	// firstInHand: read, not yet answered.
	firstInHand
	// firstAnswered: answered; a connection still without a session
	// after that has shown it is no client with the token (those
	// CONNECT first), and gives way before any other.
	firstAnswered
)

// errGaveWay is what the reader of a connection that gave way to a new
// one gets (its socket is being closed).
var errGaveWay = errors.New("devbroker: connection closed to make room for a new one")

// NewServer returns a server that is not yet listening.
func NewServer(opts Options) *Server {
	s := &Server{
		token:      opts.Token,
		anonymous:  opts.Anonymous,
		queueSize:  opts.QueueSize,
		queueBytes: opts.MaxQueueBytes,
		maxLine:    opts.MaxLineBytes,
		loginLine:  opts.LoginLineBytes,
		loginWait:  opts.LoginTimeout,
		maxUnauth:  opts.MaxUnauthenticated,
		maxConns:   opts.MaxConns,
		idle:       opts.IdleTimeout,
		refSess:    opts.ReferenceSessions,
		log:        opts.Logger,
		done:       make(chan struct{}),
		progress:   make(chan struct{}, 1),
		conns:      make(map[*conn]struct{}),
		clients:    make(map[string]*client),
		groups:     make(map[string]*group),
	}
	if s.queueSize <= 0 {
		s.queueSize = DefaultQueueSize
	}
	if s.queueBytes <= 0 {
		s.queueBytes = DefaultMaxQueueBytes
	}
	if s.maxLine <= 0 {
		s.maxLine = DefaultMaxLineBytes
	}
	if s.loginLine <= 0 {
		s.loginLine = DefaultLoginLineBytes
	}
	if s.loginWait <= 0 {
		s.loginWait = DefaultLoginTimeout
	}
	if s.maxUnauth <= 0 {
		s.maxUnauth = DefaultMaxUnauthenticated
	}
	if s.maxConns <= 0 {
		s.maxConns = derivedMaxConns()
	}
	if s.idle <= 0 {
		s.idle = DefaultIdleTimeout
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("component", "devbroker")
	return s
}

// derivedMaxConns is the MaxConns used when none is given: a quarter of
// the process's RLIMIT_NOFILE soft limit, at least 16. (Go raises the soft
// limit to the hard one at start-up, so this is normally a quarter of the
// hard limit.) The other three quarters stay for sandboxes, files and the
// worker's own sockets.
func derivedMaxConns() int {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == 0 {
		return minDerivedMaxConns
	}
	return int(max(min(rl.Cur/4, math.MaxInt32), minDerivedMaxConns))
}

// Listen binds addr ("host:port"; port 0 picks a free one) and serves it in
// the background until Close. It returns once the socket is bound, so Addr
// is valid when it returns nil.
func (s *Server) Listen(addr string) error {
	switch {
	case s.token == "" && !s.anonymous:
		return errors.New("devbroker: no token and not anonymous: set Options.Token (or, for clients that send none, Options.Anonymous)")
	case s.token != "" && s.anonymous:
		return errors.New("devbroker: both a token and anonymous: choose one")
	}
	lc := net.ListenConfig{Control: deferAccept}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return fmt.Errorf("devbroker: listen on %s: %w", addr, err)
	}
	if err := s.track(ln); err != nil {
		ln.Close()
		return err
	}
	go func() {
		defer s.wg.Done()
		if err := s.serve(ln); err != nil && !errors.Is(err, ErrServerClosed) {
			s.log.Error("accept loop ended", "addr", ln.Addr().String(), "err", err)
		}
	}()
	return nil
}

// deferAccept sets TCP_DEFER_ACCEPT (deferAcceptSeconds) on the listening
// socket before it listens.
func deferAccept(network, address string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, deferAcceptSeconds)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt TCP_DEFER_ACCEPT %d s on %s: %w", deferAcceptSeconds, address, serr)
	}
	return nil
}

// SetTokenFile records where the token was written, so that the reply to a
// refused CONNECT can say where to look. (The path usually depends on the
// port, known only after Listen.)
func (s *Server) SetTokenFile(path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokenFile = path
}

// PublishTokenFile writes token to path, or (path empty) to the token
// file the clients of the bound port look for (TokenFileFor), tells the
// server the path for its refusal messages (SetTokenFile), and returns it.
// Called after Listen: the port is the one actually bound (the listen
// address may say port 0). str broker and the worker's embedded broker
// both publish their token so.
func (s *Server) PublishTokenFile(path, token string) (string, error) {
	if path == "" {
		addr, ok := s.Addr().(*net.TCPAddr)
		if !ok {
			return "", fmt.Errorf("devbroker: token file: the server listens on %v, not a TCP port", s.Addr())
		}
		path = TokenFileFor(addr.Port)
	}
	if err := WriteTokenFile(path, token); err != nil {
		return "", err
	}
	s.SetTokenFile(path)
	return path, nil
}

// Addr is the address of the first listener, or nil before Listen.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.listeners) == 0 {
		return nil
	}
	return s.listeners[0].Addr()
}

// Close stops accepting, closes every connection (a pending RECEIVE ends
// without a reply), forgets every client and waits for the connection
// goroutines. It is safe to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	close(s.done)
	var errs []error
	for _, ln := range s.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("devbroker: close listener %s: %w", ln.Addr(), err))
		}
	}
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.log.Info("stopped")
	return errors.Join(errs...)
}

// track registers ln so Close closes it, and counts the accept goroutine
// Listen is about to start, under the same lock as the closed check so
// Close cannot miss it.
func (s *Server) track(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrServerClosed
	}
	s.wg.Add(1)
	s.listeners = append(s.listeners, ln)
	s.log.Info("listening", "addr", ln.Addr().String(), "anonymous", s.anonymous,
		"max_conns", s.maxConns, "max_unauthenticated", s.maxUnauth, "login_timeout", s.loginWait.String(),
		"login_line_bytes", s.loginLine, "idle_timeout", s.idle.String())
	return nil
}

func (s *Server) serve(ln net.Listener) error {
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			select {
			case <-s.done:
				return ErrServerClosed
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("devbroker: accept on %s: %w", ln.Addr(), err)
			}
			// Out of file descriptors and the like: wait and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed, retrying", "addr", ln.Addr().String(), "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if err := watchPeer(nc); err != nil {
			// The connection still works; only a vanished peer would
			// be noticed later (by IdleTimeout).
			s.log.Warn("cannot set keep-alive on the connection; a peer that vanishes is noticed only by IdleTimeout",
				"remote", nc.RemoteAddr().String(), "err", err)
		}
		c := &conn{srv: s, nc: nc, seq: s.accepted.Add(1), gone: make(chan struct{}), handled: make(chan struct{}, 1), unauth: true}
		if sc, ok := nc.(syscall.Conn); ok {
			c.raw, _ = sc.SyscallConn() // nil on error: c is then never made to give way before its first line is answered
		}
		if ap, err := netip.ParseAddrPort(nc.RemoteAddr().String()); err == nil {
			c.source = ap.Addr().Unmap()
		}
		// The connection bounds, before any byte is read.
		switch err := s.admit(c); {
		case errors.Is(err, ErrServerClosed):
			nc.Close()
			return err
		case err != nil: // refused and counted
			nc.Close()
			continue
		}
		go s.handleConn(c)
	}
}

// watchPeer turns on TCP's own detection of a vanished peer on nc (see
// peerUserTimeout).
func watchPeer(nc net.Conn) error {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil // not TCP (tests with other listeners): nothing to set
	}
	if err := tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: peerIdle,
		Interval: peerProbeInterval, Count: int(peerUserTimeout / peerProbeInterval)}); err != nil {
		return fmt.Errorf("keep-alive: %w", err)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(peerUserTimeout.Milliseconds()))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt TCP_USER_TIMEOUT %v: %w", peerUserTimeout, serr)
	}
	return nil
}

// errRefused is admit's answer for a connection over MaxConns when no
// connection waits for its CONNECT.
var errRefused = errors.New("devbroker: connection refused")

// admit registers the freshly accepted connection c under the connection
// bounds, counting and logging each refusal and each connection that
// gives way (the first and every 100th of each kind, so a flood cannot
// flood the log). Its steps, repeated until c is in or refused:
//  1. room under both MaxConns and MaxUnauthenticated: c is in;
//  2. MaxConns connections open and none of them waiting for its
//     CONNECT: c is refused (descriptors for the sandboxes come first,
//     and connected clients are not pushed out by newcomers);
//  3. otherwise one connection waiting for its CONNECT gives way to c
//     (s.giveWayFor): closed, and c takes its place;
//  4. none of them can give way yet (each has its first line unread in
//     the socket, or in hand, unanswered): wait until one of them moves
//     (s.progress) and go back to 1. The wait is short (reading and
//     answering one line of at most LoginLineBytes; the answer is the
//     connection's first write, which its empty send buffer takes at
//     once), and meanwhile new connections wait in the kernel's accept
//     queue instead of being refused.
//
// It returns nil (c is in), errRefused or ErrServerClosed.
func (s *Server) admit(c *conn) error {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return ErrServerClosed
		}
		// 1. Room.
		if len(s.conns) < s.maxConns && s.unauth < s.maxUnauth {
			s.conns[c] = struct{}{}
			s.unauth++
			s.wg.Add(1)
			s.mu.Unlock()
			return nil
		}
		// 2. Full of connected clients.
		if s.unauth == 0 {
			s.cut(&s.bounds.overMaxConns, "connection refused: MaxConns connections open", c)
			s.mu.Unlock()
			return errRefused
		}
		// 3. A waiting connection gives way.
		if old := s.giveWayFor(); old != nil {
			delete(s.conns, old)
			old.unauth = false
			s.conns[c] = struct{}{} // the counts stay: one waiting connection for another
			s.wg.Add(1)
			s.cut(&s.bounds.gaveWay, "connection closed: it had not CONNECTed and gave way to a new connection (MaxUnauthenticated or MaxConns reached)", old)
			s.mu.Unlock()
			// Outside s.mu: Close waits for a read in progress on old,
			// which holds old.loginMu, never s.mu.
			old.nc.Close()
			return nil
		}
		s.mu.Unlock()
		// 4. Wait for one to move.
		select {
		case <-s.progress:
		case <-s.done:
			return ErrServerClosed
		}
	}
}

// giveWayFor picks the connection waiting for its CONNECT that makes room
// for a new one, marks it (conn.gaveWay) and returns it; nil when none
// may give way now. The order:
//  1. connections whose first line was answered and which still have no
//     session (a client with the token sends its CONNECT first, so these
//     are none);
//  2. then those from the peer address holding the most waiting
//     connections (a flood from one host makes room from its own, not
//     from other hosts'; on loopback every peer is 127.0.0.1, so this
//     alone could not be the defence);
//  3. then the oldest first.
//
// A connection never gives way while its first line is in hand or its
// socket holds bytes not yet read: those may be the CONNECT of a client
// with the token. With TCP_DEFER_ACCEPT (deferAcceptSeconds) a client's
// first bytes are in the socket when it is accepted, so what gives way is
// what sent nothing, or only part of a line and then stopped. The caller
// holds s.mu.
func (s *Server) giveWayFor() *conn {
	var waiting []*conn
	perSource := make(map[netip.Addr]int)
	for c := range s.conns {
		if c.unauth {
			waiting = append(waiting, c)
			perSource[c.source]++
		}
	}
	answered := make(map[*conn]bool, len(waiting))
	for _, c := range waiting {
		c.loginMu.Lock()
		answered[c] = c.first == firstAnswered
		c.loginMu.Unlock()
	}
	slices.SortFunc(waiting, func(a, b *conn) int {
		if answered[a] != answered[b] {
			if answered[a] {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(perSource[b.source], perSource[a.source]), cmp.Compare(a.seq, b.seq))
	})
	for _, c := range waiting {
		if c.giveWay() {
			return c
		}
	}
	return nil
}

// giveWay marks c as giving way, unless its first line may be a CONNECT
// still to be answered: in hand, or (not yet read) in its socket. It holds
// c.loginMu, so no read(2) of c runs meanwhile (see Read).
func (c *conn) giveWay() bool {
	c.loginMu.Lock()
	defer c.loginMu.Unlock()
	switch c.first {
	case firstInHand:
		return false
	case firstUnread:
		if c.raw == nil {
			return false
		}
		unread := -1
		if err := c.raw.Control(func(fd uintptr) {
			if n, err := unix.IoctlGetInt(int(fd), unix.SIOCINQ); err == nil {
				unread = n
			}
		}); err != nil || unread != 0 {
			return false // bytes to read (or the socket is closing: its end nudges admit)
		}
	}
	c.gaveWay = true
	return true
}

// Read is the line reader's read of c's socket. After the CONNECT it is
// nc.Read. Before it, the read(2) runs under c.loginMu and notes in
// c.first when the first line is complete, so that giveWay sees each of
// c's bytes either in the socket or in c.first, never between the two; and
// a connection that gave way reads nothing more.
func (c *conn) Read(p []byte) (int, error) {
	if c.raw == nil || c.authed.Load() {
		return c.nc.Read(p)
	}
	var n int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		c.loginMu.Lock()
		defer c.loginMu.Unlock()
		if c.gaveWay {
			rerr = errGaveWay
			return true
		}
		for {
			n, rerr = unix.Read(int(fd), p)
			if !errors.Is(rerr, unix.EINTR) {
				break
			}
		}
		if errors.Is(rerr, unix.EAGAIN) {
			return false // nothing yet: wait until readable
		}
		if rerr == nil && c.first == firstUnread && bytes.IndexByte(p[:n], '\n') >= 0 {
			c.first = firstInHand
		}
		return true
	})
	switch {
	case err != nil:
		return 0, err
	case rerr != nil:
		return 0, rerr
	case n == 0:
		return 0, io.EOF
	}
	c.srv.nudge() // what was in the socket is read: c may give way now
	return n, nil
}

// answeredFirst notes that c's first line has been answered.
func (c *conn) answeredFirst() {
	c.loginMu.Lock()
	defer c.loginMu.Unlock()
	c.first = firstAnswered
}

// nudge tells admit that a connection waiting for its CONNECT has moved
// (see Server.progress).
func (s *Server) nudge() {
	select {
	case s.progress <- struct{}{}:
	default:
	}
}

// cut counts a connection cut by a bound (n) and logs the first and
// every 100th. The caller holds s.mu.
func (s *Server) cut(n *uint64, what string, c *conn) {
	*n++
	if *n == 1 || *n%100 == 0 {
		s.log.Warn(what, "remote", c.nc.RemoteAddr().String(), "open", len(s.conns), "unauthenticated", s.unauth,
			"max_conns", s.maxConns, "max_unauthenticated", s.maxUnauth, "total", *n)
	}
}

// count adds one to a bound's counter. It takes s.mu.
func (s *Server) count(n *uint64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	*n++
	return *n
}

// line is one request read from a connection.
type line struct {
	data    []byte
	tooLong bool
	login   bool // read before CONNECT, under LoginLineBytes
}

// readLines reads newline-terminated requests into out until the peer
// closes or errs, then closes c.gone. Over-long lines are discarded up to
// their newline and reported with tooLong, so the connection survives them.
// A final line without a newline is still delivered (as Python's readline
// does).
//
// Before CONNECT the limit is LoginLineBytes, an over-long line ends the
// reading at once (its rest is never read), and each line is read only
// once the handler is done with the previous one, so that a line sent
// right after the CONNECT is measured against the limit in force after it.
func (s *Server) readLines(c *conn, out chan<- line, stop <-chan struct{}) {
	defer close(c.gone)
	r := bufio.NewReaderSize(c, 16<<10) // c.Read: see giveWay
	var buf []byte
	tooLong := false
	for {
		login := !c.authed.Load()
		limit := s.maxLine
		if login {
			limit = s.loginLine
		}
		for {
			frag, err := r.ReadSlice('\n')
			if !tooLong {
				if len(buf)+len(frag) > limit+2 { // +2: "\r\n"
					tooLong, buf = true, nil
				} else {
					buf = append(buf, frag...)
				}
			}
			if tooLong && login {
				err = io.EOF // the rest is not read: the handler hangs up
			}
			if errors.Is(err, bufio.ErrBufferFull) {
				continue
			}
			if err != nil && len(buf) == 0 && !tooLong {
				return // EOF or error between requests
			}
			l := line{data: bytes.TrimRight(buf, "\r\n"), tooLong: tooLong, login: login}
			if !tooLong && len(l.data) > limit {
				l = line{tooLong: true, login: login}
			}
			select {
			case out <- l:
			case <-stop:
				return
			}
			buf, tooLong = nil, false
			if err != nil {
				return
			}
			break
		}
		if login {
			select {
			case <-c.handled:
			case <-stop:
				return
			}
		}
	}
}

func (s *Server) handleConn(c *conn) {
	defer s.wg.Done()
	remote := c.nc.RemoteAddr().String()
	log := s.log.With("remote", remote)
	log.Debug("connection opened")

	lines := make(chan line)
	stop := make(chan struct{})
	go s.readLines(c, lines, stop)

	defer func() {
		close(stop)
		c.nc.Close()
		<-c.gone
		s.mu.Lock()
		delete(s.conns, c)
		if c.unauth {
			c.unauth = false
			s.unauth--
		}
		s.detach(c, log)
		s.mu.Unlock()
		s.nudge() // a place may be free
		log.Debug("connection closed")
	}()

	// Until CONNECT: LoginTimeout from the accept. After: IdleTimeout
	// between a reply and the next request.
	login := time.NewTimer(s.loginWait)
	defer login.Stop()
	loginC := login.C
	idle := time.NewTimer(s.idle)
	defer idle.Stop()
	var idleC <-chan time.Time
	for {
		if loginC != nil && c.authed.Load() {
			login.Stop()
			loginC = nil
		}
		if loginC == nil {
			idle.Reset(s.idle)
			idleC = idle.C
		}
		var l line
		select {
		case l = <-lines:
		case <-c.gone:
			return
		case <-s.done:
			return
		case <-loginC:
			n := s.count(&s.bounds.loginTimeout)
			log.Warn("connection closed: no CONNECT within LoginTimeout", "login_timeout", s.loginWait.String(), "closed_total", n)
			return
		case <-idleC:
			n := s.count(&s.bounds.idleTimeout)
			log.Info("connection closed: no request within IdleTimeout", "idle_timeout", s.idle.String(), "closed_total", n)
			return
		}
		resp, hangUp := s.handle(c, l, log)
		if l.login {
			c.answeredFirst()
			s.nudge() // c may give way now, if still without a session
			select {
			case c.handled <- struct{}{}:
			default:
			}
		}
		if l.login && l.tooLong {
			n := s.count(&s.bounds.loginLineTooLong)
			log.Warn("connection closed: request line before CONNECT over LoginLineBytes", "login_line_bytes", s.loginLine, "closed_total", n)
			hangUp = true
		}
		if resp == nil {
			return // RECEIVE cut short by the peer leaving or Close
		}
		out, err := EncodeLine(resp)
		if err != nil {
			// Only reachable if a stored raw value were invalid JSON,
			// which handlePublish rules out.
			log.Error("encode response", "err", err)
			out, _ = EncodeLine(errorResponse(CodeInternalError, "cannot encode response: "+err.Error()))
		}
		c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := c.nc.Write(out); err != nil {
			log.Debug("write response failed, closing", "err", err)
			return
		}
		if hangUp {
			return
		}
	}
}

func errorResponse(code, msg string) *response {
	return &response{Status: StatusError, ErrorCode: code, ErrorMessage: msg}
}

var okResponse = &response{Status: StatusOK}

// handle answers one request line. hangUp asks the caller to close the
// connection after writing the reply (DISCONNECT). A nil reply means the
// connection is ending and gets no reply.
func (s *Server) handle(c *conn, l line, log *slog.Logger) (resp *response, hangUp bool) {
	// 1. Framing and JSON. Garbage is answered, never fatal.
	if l.tooLong {
		limit := s.maxLine
		if l.login {
			limit = s.loginLine
		}
		return errorResponse(CodeInvalidCommand, fmt.Sprintf("request line longer than %d bytes", limit)), false
	}
	if !utf8.Valid(l.data) {
		return errorResponse(CodeInvalidCommand, "request is not valid UTF-8"), false
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(l.data, &req); err != nil {
		return errorResponse(CodeInvalidCommand, "invalid JSON: "+err.Error()), false
	}
	if req == nil {
		return errorResponse(CodeInvalidCommand, "request must be a JSON object"), false
	}
	var cmd string
	if raw, ok := req["cmd"]; ok && json.Unmarshal(raw, &cmd) != nil {
		cmd = string(raw) // not a string: reported as unknown below
	}

	// 2. CONNECT is the only command allowed on a fresh connection. A
	// refused CONNECT (wrong token, client id taken) closes the connection.
	if cmd == CmdConnect {
		return s.handleConnect(c, req, log)
	}
	if c.session == nil {
		return errorResponse(CodeNotConnected, "Not connected"), false
	}

	// 3. Everything else acts on the connection's client.
	switch cmd {
	case CmdSubscribe, CmdUnsubscribe:
		return s.handleSubscription(c, cmd, req, log), false
	case CmdPublish:
		return s.handlePublish(c, req, log), false
	case CmdReceive:
		return s.handleReceive(c, req), false
	case CmdAck:
		// No persistence, so nothing to settle (as in the reference).
		return okResponse, false
	case CmdDisconnect:
		return okResponse, true
	default:
		if cmd == "" {
			return errorResponse(CodeInvalidCommand, "Missing cmd"), false
		}
		return errorResponse(CodeInvalidCommand, "Unknown command: "+cmd), false
	}
}

// optString decodes field name of req as a string. Absent and null give
// ("", false, nil); any other non-string is an error.
func optString(req map[string]json.RawMessage, name string) (string, bool, error) {
	raw, ok := req[name]
	if !ok || string(raw) == "null" {
		return "", false, nil
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", false, fmt.Errorf("%s must be a string", name)
	}
	return v, true, nil
}

// handleConnect answers a CONNECT. Its steps:
//  1. the token, before anything else is looked at (unless anonymous);
//  2. the fields;
//  3. the client id: refused when another connection holds it;
//  4. the session: created (or kept, for a repeated CONNECT with the same
//     id), with the queue name and subscriptions.
//
// refused asks the caller to close the connection after the reply.
func (s *Server) handleConnect(c *conn, req map[string]json.RawMessage, log *slog.Logger) (resp *response, refused bool) {
	// 1. The token.
	if !s.anonymous {
		tok, _, err := optString(req, "token")
		if err != nil || !tokenEqual(tok, s.token) {
			where := "see str broker --help"
			s.mu.Lock()
			if s.tokenFile != "" {
				where = "it is in " + s.tokenFile + ", readable by the broker's user only"
			}
			s.mu.Unlock()
			log.Warn("CONNECT refused: missing or wrong token", "present", tok != "")
			return errorResponse(CodeNotConnected, "CONNECT refused: missing or wrong token (this broker requires the \"token\" field; "+where+")"), true
		}
	}

	// 2. The fields.
	id, hasID, err := optString(req, "client_id")
	if err != nil {
		return errorResponse(CodeInvalidCommand, err.Error()), false
	}
	if !hasID {
		id = newID()
	}
	queue, _, err := optString(req, "queue_name")
	if err != nil {
		return errorResponse(CodeInvalidCommand, err.Error()), false
	}
	var subs []string
	if raw, ok := req["subscriptions"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &subs); err != nil {
			return errorResponse(CodeInvalidCommand, "subscriptions must be an array of strings"), false
		}
	}
	for i, p := range subs {
		if p == "" {
			return errorResponse(CodeInvalidCommand, fmt.Sprintf("subscriptions[%d] is empty", i)), false
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if c.gaveWay {
		// Closed to make room meanwhile (a connection whose first
		// line was not this CONNECT): its place is another's now.
		return errorResponse(CodeNotConnected, "CONNECT refused: the connection had to give way to a new one (send CONNECT first)"), true
	}
	// 3. One connection per client id: a second connection claiming a
	// connected id would share its queue and subscriptions (take its
	// messages, unsubscribe it, subscribe it to a flood).
	if c.session == nil || c.session.id != id {
		if _, taken := s.clients[id]; taken {
			if !s.refSess {
				log.Warn("CONNECT refused: client id already connected", "client_id", id)
				return errorResponse(CodeNotConnected, fmt.Sprintf("CONNECT refused: client_id %q is already connected on another connection (another process with the same id?)", id)), true
			}
			// The reference's way: the id moves to this connection; the
			// other one keeps its session object, registered nowhere.
			log.Warn("CONNECT takes over a connected client id (ReferenceSessions)", "client_id", id)
			s.unregister(id)
		}
	}

	// 4. The session. A second CONNECT on one connection moves it to the
	// new identity (or, with the same client_id, just adds to it).
	if c.session != nil && c.session.id != id {
		s.detach(c, log)
	}
	cl := c.session
	if cl == nil {
		cl = &client{id: id, subs: make(map[string]struct{}), signal: make(chan struct{}, 1)}
		s.clients[id] = cl
		s.order = append(s.order, cl)
	}
	if queue != "" && queue != cl.queue {
		// The latest non-empty queue name wins; "" (a publishing
		// connection, typically) leaves the group alone.
		s.leaveGroup(cl, log)
		cl.queue = queue
		g := s.groups[queue]
		if g == nil {
			g = &group{name: queue}
			s.groups[queue] = g
		}
		g.members++
	}
	for _, p := range subs {
		cl.subs[p] = struct{}{}
	}
	c.session = cl
	if c.unauth {
		c.unauth = false
		s.unauth--
		s.nudge() // a place is free
	}
	c.authed.Store(true)
	log.Info("client connected", "client_id", id, "queue_name", cl.queue, "subscriptions", len(subs))
	return &response{Status: StatusOK, ClientID: &id}, false
}

// detach ends c's session and forgets its client. The caller holds s.mu.
func (s *Server) detach(c *conn, log *slog.Logger) {
	cl := c.session
	if cl == nil {
		return
	}
	c.session = nil
	// By id: without ReferenceSessions the id is cl's alone; with it, a
	// connection that lost its id to a newer one unregisters the newer
	// one here (the reference's failure this option reproduces).
	s.unregister(cl.id)
	log.Info("client disconnected", "client_id", cl.id, "undelivered", len(cl.pending))
}

// unregister removes the client registered under id from routing (and
// from its queue group). The caller holds s.mu.
func (s *Server) unregister(id string) {
	if cl := s.clients[id]; cl != nil {
		s.leaveGroup(cl, s.log)
	}
	delete(s.clients, id)
	s.order = slices.DeleteFunc(s.order, func(o *client) bool { return o.id == id })
}

// leaveGroup takes cl out of its queue group, if any; the group's queue
// goes with its last member. The caller holds s.mu.
func (s *Server) leaveGroup(cl *client, log *slog.Logger) {
	g := s.groups[cl.queue]
	cl.queue = ""
	if g == nil {
		return
	}
	g.members--
	if g.members > 0 {
		return
	}
	delete(s.groups, g.name)
	if len(g.pending) > 0 {
		log.Warn("queue group's last member left: its undelivered messages are dropped", "queue_name", g.name, "undelivered", len(g.pending))
	}
}

func (s *Server) handleSubscription(c *conn, cmd string, req map[string]json.RawMessage, log *slog.Logger) *response {
	pattern, _, err := optString(req, "topic_pattern")
	if err != nil {
		return errorResponse(CodeInvalidCommand, err.Error())
	}
	if pattern == "" {
		return errorResponse(CodeInvalidCommand, "Missing topic_pattern")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cmd == CmdSubscribe {
		c.session.subs[pattern] = struct{}{}
	} else {
		delete(c.session.subs, pattern)
	}
	log.Debug("subscription changed", "client_id", c.session.id, "cmd", cmd, "topic_pattern", pattern)
	return okResponse
}

func (s *Server) handlePublish(c *conn, req map[string]json.RawMessage, log *slog.Logger) *response {
	topic, _, err := optString(req, "topic")
	if err != nil {
		return errorResponse(CodeInvalidCommand, err.Error())
	}
	if topic == "" {
		return errorResponse(CodeInvalidCommand, "Missing topic")
	}
	payload := req["payload"] // absent = null, as in the reference
	if payload == nil {
		payload = json.RawMessage("null")
	}
	props := req["user_properties"]
	if props == nil || string(props) == "null" {
		props = json.RawMessage("{}")
	} else if props[0] != '{' { // json.Unmarshal left no leading space
		return errorResponse(CodeInvalidCommand, "user_properties must be a JSON object")
	}
	publishID, _, err := optString(req, "publish_id")
	if err != nil {
		return errorResponse(CodeInvalidCommand, err.Error())
	}
	if len(publishID) > MaxPublishIDBytes {
		return errorResponse(CodeInvalidCommand, fmt.Sprintf("publish_id is %d bytes, at most %d", len(publishID), MaxPublishIDBytes))
	}
	msg := &wireMessage{MessageID: newID(), Topic: topic, Payload: payload, UserProperties: props}

	s.mu.Lock()
	defer s.mu.Unlock()
	from := c.session.id
	if publishID != "" {
		// A PUBLISH again under a publish_id this client_id used
		// recently: the first one was routed (its answer was lost, the
		// client retried), so this one is answered as it was and not
		// routed again.
		if first, ok := s.published.seen(from, publishID); ok {
			log.Info("duplicate publish not routed again", "client_id", from, "topic", topic, "publish_id", publishID, "message_id", first)
			return &response{Status: StatusOK, MessageID: first}
		}
		s.published.add(from, publishID, msg.MessageID)
	}
	// Every other matching client gets the message, except that a queue
	// group gets it once, in its shared queue, for the first matching
	// member that asks (handleReceive).
	var toGroups []*group
	delivered := 0
	for _, cl := range s.order {
		if cl.id == from || !cl.matches(topic) {
			continue
		}
		if cl.queue == "" {
			s.enqueue(&cl.msgQueue, cl.id, msg, log)
			wake(cl)
			delivered++
			continue
		}
		if g := s.groups[cl.queue]; !slices.Contains(toGroups, g) {
			toGroups = append(toGroups, g)
			s.enqueue(&g.msgQueue, "queue group "+g.name, msg, log)
			delivered++
		}
	}
	if len(toGroups) > 0 {
		// Every waiting member of those groups looks; one takes it.
		for _, cl := range s.order {
			if cl.queue != "" && slices.Contains(toGroups, s.groups[cl.queue]) {
				wake(cl)
			}
		}
	}
	log.Debug("published", "client_id", from, "topic", topic, "message_id", msg.MessageID, "receivers", delivered)
	return &response{Status: StatusOK, MessageID: msg.MessageID}
}

// matches reports whether one of cl's subscriptions matches topic. The
// caller holds s.mu.
func (cl *client) matches(topic string) bool {
	for p := range cl.subs {
		if transport.MatchDev(p, topic) {
			return true
		}
	}
	return false
}

// wake tells cl's waiting RECEIVE, if any, to look at its queues again.
func wake(cl *client) {
	select {
	case cl.signal <- struct{}{}:
	default:
	}
}

// enqueue appends msg to q (a client's queue or a group's, named by who),
// dropping the oldest messages while the queue is over QueueSize messages
// or MaxQueueBytes bytes; a message larger than MaxQueueBytes by itself is
// dropped instead. The caller holds s.mu. Messages are shared between
// receivers: nothing mutates a wireMessage after it is built, and each
// queue counts its full size.
func (s *Server) enqueue(q *msgQueue, who string, msg *wireMessage, log *slog.Logger) {
	size := msg.size()
	if size > s.queueBytes {
		s.dropped(q, who, msg, "message larger than the queue's byte bound, dropped", log)
		return
	}
	for len(q.pending) >= s.queueSize || q.pendingBytes+size > s.queueBytes {
		s.dropped(q, who, q.take(0), "queue full, dropped oldest message", log)
	}
	q.pending = append(q.pending, msg)
	q.pendingBytes += size
}

// take removes and returns the i-th message of q.
func (q *msgQueue) take(i int) *wireMessage {
	msg := q.pending[i]
	if i == 0 {
		q.pending[0] = nil
		q.pending = q.pending[1:]
	} else {
		q.pending = slices.Delete(q.pending, i, i+1)
	}
	q.pendingBytes -= msg.size()
	return msg
}

// dropped counts a message dropped from q and logs the first drop and then
// one per 100, so a stuck consumer cannot flood the log.
func (s *Server) dropped(q *msgQueue, who string, msg *wireMessage, what string, log *slog.Logger) {
	q.dropped++
	if q.dropped == 1 || q.dropped%100 == 0 {
		log.Warn(what, "queue_of", who, "queue_size", s.queueSize, "queue_bytes", s.queueBytes,
			"queued", len(q.pending), "queued_bytes", q.pendingBytes,
			"dropped_message_id", msg.MessageID, "dropped_topic", msg.Topic,
			"dropped_bytes", msg.size(), "dropped_total", q.dropped)
	}
}

// next takes the message cl's RECEIVE gets, if there is one: the oldest
// of its own queue, else the oldest of its group's queue that one of its
// subscriptions matches (members of a group normally subscribe alike;
// one whose subscriptions differ leaves what it does not match to the
// others). The caller holds s.mu.
func (s *Server) next(cl *client) *wireMessage {
	if len(cl.pending) > 0 {
		return cl.take(0)
	}
	g := s.groups[cl.queue]
	if g == nil {
		return nil
	}
	for i, m := range g.pending {
		if cl.matches(m.Topic) {
			return g.take(i)
		}
	}
	return nil
}

// handleReceive waits up to timeout_ms for a message of the connection's
// client. It returns nil, meaning "no reply", when the peer leaves or the
// server closes meanwhile.
func (s *Server) handleReceive(c *conn, req map[string]json.RawMessage) *response {
	wait := time.Duration(DefaultReceiveTimeoutMS) * time.Millisecond
	if raw, ok := req["timeout_ms"]; ok && string(raw) != "null" {
		var ms float64
		if err := json.Unmarshal(raw, &ms); err != nil {
			return errorResponse(CodeInvalidCommand, "timeout_ms must be a number")
		}
		switch {
		case ms <= 0 || math.IsNaN(ms):
			wait = 0
		case ms >= float64(maxReceiveWait/time.Millisecond):
			wait = maxReceiveWait
		default:
			wait = time.Duration(ms * float64(time.Millisecond))
		}
	}
	cl := c.session // stays valid: this connection holds a reference
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		s.mu.Lock()
		msg := s.next(cl)
		s.mu.Unlock()
		if msg != nil {
			return &response{Status: StatusOK, Message: msg}
		}
		select {
		case <-cl.signal:
		case <-timer.C:
			return &response{Status: StatusTimeout}
		case <-c.gone:
			// The peer is gone: take nothing off the queue for it, and
			// send no reply.
			return nil
		case <-s.done:
			return nil
		}
	}
}

// MaxPublishIDBytes bounds a PUBLISH's publish_id (str's extension: the
// client's name for the message, the same on each retry of it).
const MaxPublishIDBytes = 128

// Bounds of the duplicate check's memory. Each client_id that sends
// publish_ids has a ring of its last recentPerClient, kept after its
// connection ends (a retry comes on the next one); at most
// recentClientsMax rings are kept, the least lately used dropped first. A
// retry follows the lost answer within that client's own next few
// publishes (its connection publishes one at a time, and nothing while
// cut off), so a ring per client, which only the client's own traffic
// turns over, holds it; one shared list would let other clients' traffic
// push it out, and would hold far more (TestSoak: 16,384 shared entries
// were 3 MB of the worker's RSS).
const (
	recentPerClient  = 1024
	recentClientsMax = 64
)

// recentPublishes remembers, per client_id, the publish_ids routed lately
// and the message_id each got. Guarded by Server.mu.
type recentPublishes struct {
	clients map[string]*publishRing
	tick    uint64 // use counter: the least lately used ring goes first
}

// publishRing is one client_id's last recentPerClient publish_ids.
type publishRing struct {
	ids      map[string]string // publish_id -> message_id
	order    [recentPerClient]string
	next     int // where the next publish_id goes in order
	lastUsed uint64
}

func (r *recentPublishes) seen(client, publishID string) (messageID string, ok bool) {
	ring := r.clients[client]
	if ring == nil {
		return "", false
	}
	messageID, ok = ring.ids[publishID]
	return messageID, ok
}

func (r *recentPublishes) add(client, publishID, messageID string) {
	if r.clients == nil {
		r.clients = make(map[string]*publishRing)
	}
	r.tick++
	ring := r.clients[client]
	if ring == nil {
		if len(r.clients) >= recentClientsMax {
			oldest, at := "", uint64(0)
			for id, rg := range r.clients {
				if oldest == "" || rg.lastUsed < at {
					oldest, at = id, rg.lastUsed
				}
			}
			delete(r.clients, oldest)
		}
		ring = &publishRing{ids: make(map[string]string)}
		r.clients[client] = ring
	}
	ring.lastUsed = r.tick
	if old := ring.order[ring.next]; old != "" {
		delete(ring.ids, old)
	}
	ring.order[ring.next] = publishID
	ring.next = (ring.next + 1) % recentPerClient
	ring.ids[publishID] = messageID
}
