package resident

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/launcher/statedir"
	"github.com/securetoolruntime/str/nsinit"
	"golang.org/x/sys/unix"
)

// The resident launcher's protocol (str serve), on a unix SOCK_SEQPACKET
// socket, one message each way and a connection per call. One binary
// encoding, all integers little-endian, every string NUL-terminated (so
// none holds a NUL: argv and environ cannot anyway); the Go client writes
// it without reflection and the server checks every count before it
// allocates (decodeResidentRequest, FuzzDecodeResidentRequest):
//
//	request  residentMagic ("STR" and the version byte), flags uint32
//	         (reqWantResult; no other bit), the --timeout as int64 ns (0:
//	         the profile's; never negative), three uint32 counts (argv,
//	         --env additions, environ), then the strings: the profile,
//	         argv (at least one), the --env additions, the caller's
//	         environ (a key's first entry counts, as os.Getenv reads it);
//	         nothing after the last NUL. The caller's stdin, stdout and
//	         stderr ride along as SCM_RIGHTS (exactly nsinit.CallFDs).
//	reply    residentMagic, a type byte (replyResult,
//	         replyNotPoolable: run one-shot instead, replyRefused:
//	         SO_PEERCRED said no, replyFailed: the request is bad, as
//	         one-shot str run would say), three zero bytes, the exit
//	         status as int32, the text's length as uint32, the text (for
//	         a result the exact bytes `str run` writes to stderr,
//	         outcome.Of; else the reason; at most residentTextMax
//	         bytes), then for a result asked with reqWantResult the
//	         Result as `str run --result` writes it (JSON), else nothing.
//	cancel   residentMagic and msgCancel, any time before the reply
//	         (SIGTERM, SIGINT or SIGHUP to the client); closing the
//	         connection cancels the same way.
//
// A request of another version (the same "STR" and another version byte)
// is answered "not poolable": the client runs one-shot.

// residentVersion is the protocol's version, residentMagic's last byte.
const residentVersion = 2

// The encoding's constants (see the protocol above).
const (
	residentMagic = "STR\x02"

	reqWantResult = 1 << 0 // request flag: the reply carries the Result's JSON

	// A reply's type byte, and the cancel's.
	replyResult      = 1
	replyNotPoolable = 2
	replyRefused     = 3
	replyFailed      = 4
	msgCancel        = 5

	// residentTextMax bounds a reply's text.
	residentTextMax = 64 << 10

	residentCancelMsg = residentMagic + string(rune(msgCancel))

	requestHeader = len(residentMagic) + 4 + 8 + 3*4
	replyHeader   = len(residentMagic) + 4 + 4 + 4
)

// Request is `str run`'s request as the server sees it: what a
// pre-built sandbox of the profile can take, checked by the same rules as
// one-shot (Launcher.Plan). What needs another plan (binds, a work dir,
// credentials, lower limits, a narrower network) is never poolable, so
// the client runs it one-shot without asking and the request has no
// field for it.
type Request struct {
	Profile string
	Argv    []string
	Env     []string // --env additions
	// Environ is the caller's environment: the profile's passthrough
	// names are read from it, as one-shot str run reads its own.
	Environ []string
	Timeout time.Duration // at most the profile's (Arm)
	// WantResult: the reply carries the Result's JSON (str run --result).
	WantResult bool
}

// Outcome is a served call's answer: str run's exit status and
// stderr text (outcome.Of, applied by the server), and the Result's
// JSON when the request asked for it.
type Outcome struct {
	Status int
	Stderr string
	Result []byte
}

// Errors of Call that send the caller to one-shot str run.
var (
	// ErrNoResident: nothing listens on the socket (or it is not one).
	ErrNoResident = errors.New("no resident launcher reachable")
	// ErrNotPoolable: the server cannot serve this request from its
	// pre-built sandboxes (reason attached).
	ErrNotPoolable = errors.New("not poolable")
)

// Error is a request the server refused (SO_PEERCRED) or found
// bad ("error": what one-shot str run would say about it), or a listener
// the client would not send it to (Untrusted).
type Error struct {
	Refused bool
	// Untrusted: the socket's listener is not root, so it is not a str
	// serve (which runs only as root); it was sent nothing.
	Untrusted bool
	Msg       string
}

func (e *Error) Error() string { return e.Msg }

// LostError: the connection ended without a reply after the
// request was sent (str serve killed mid-call). The command may have run;
// str run exits outcome.ExitResidentLost and does not run it again.
type LostError struct {
	Socket string
	Err    error // the read's error (io.EOF: the server closed)
}

func (e *LostError) Error() string {
	return fmt.Sprintf("resident launcher %s died during the call; the command may have run (no reply: %v)", e.Socket, e.Err)
}

func (e *LostError) Unwrap() error { return e.Err }

// SocketName is the resident launcher's socket in the state
// directory (DefaultSocket).
const SocketName = "serve.sock"

// DefaultSocket is where str serve listens and str run looks when
// neither is told another socket: serve.sock in the state directory
// (/run/str/serve.sock for root).
func DefaultSocket(getenv func(string) string) string {
	return filepath.Join(statedir.Dir(getenv), SocketName)
}

// SocketEnv names the resident launcher's socket for str run.
const SocketEnv = "STR_SERVE_SOCKET"

// ImplicitSocket is the socket str run uses when no --serve names
// one: $STR_SERVE_SOCKET when set (empty: none, ""), else
// DefaultSocket. str doctor and str-bench ask the same.
func ImplicitSocket() string {
	if s, ok := os.LookupEnv(SocketEnv); ok {
		return s
	}
	return DefaultSocket(os.Getenv)
}

// errResidentVersion: a request of another version of the protocol.
var errResidentVersion = errors.New("another protocol version")

// encodeResidentRequest is req in the request encoding; an error when a
// string holds a NUL (the encoding's terminator) or the timeout is
// negative.
func encodeResidentRequest(req Request) ([]byte, error) {
	if len(req.Argv) == 0 {
		return nil, errors.New("no argv")
	}
	if req.Timeout < 0 {
		return nil, fmt.Errorf("a negative timeout (%v)", req.Timeout)
	}
	var flags uint32
	if req.WantResult {
		flags |= reqWantResult
	}
	lists := [][]string{{req.Profile}, req.Argv, req.Env, req.Environ}
	size := requestHeader
	for _, l := range lists {
		for _, s := range l {
			if strings.IndexByte(s, 0) >= 0 {
				return nil, fmt.Errorf("%q holds a NUL", s)
			}
			size += len(s) + 1
		}
	}
	le := binary.LittleEndian
	b := make([]byte, 0, size)
	b = append(b, residentMagic...)
	b = le.AppendUint32(b, flags)
	b = le.AppendUint64(b, uint64(req.Timeout))
	for _, l := range lists[1:] {
		b = le.AppendUint32(b, uint32(len(l)))
	}
	for _, l := range lists {
		for _, s := range l {
			b = append(append(b, s...), 0)
		}
	}
	return b, nil
}

// decodeResidentRequest reads a request: every check of the encoding
// above, the counts against the bytes left before anything is allocated
// for them. The result goes through Launcher.Plan's checks like any
// request (str serve's check 3). A request of another version is
// errResidentVersion.
func decodeResidentRequest(b []byte) (Request, error) {
	var req Request
	const magic = len(residentMagic)
	if len(b) >= magic && string(b[:magic-1]) == residentMagic[:magic-1] && b[magic-1] != residentMagic[magic-1] {
		return req, fmt.Errorf("%w: protocol version %d, this server speaks %d", errResidentVersion, b[magic-1], residentVersion)
	}
	if len(b) < requestHeader || string(b[:magic]) != residentMagic {
		return req, errors.New("request: no header")
	}
	le := binary.LittleEndian
	flags := le.Uint32(b[magic:])
	if flags&^reqWantResult != 0 {
		return req, fmt.Errorf("request: unknown flags %#x", flags)
	}
	req.WantResult = flags&reqWantResult != 0
	if req.Timeout = time.Duration(le.Uint64(b[magic+4:])); req.Timeout < 0 {
		return Request{}, fmt.Errorf("request: a negative timeout (%d ns)", int64(req.Timeout))
	}
	argc, envc, environc := uint64(le.Uint32(b[magic+12:])), uint64(le.Uint32(b[magic+16:])), uint64(le.Uint32(b[magic+20:]))
	rest := b[requestHeader:]
	if argc == 0 {
		return Request{}, errors.New("request: no argv")
	}
	// Each string takes at least its NUL.
	if n := 1 + argc + envc + environc; n > uint64(len(rest)) {
		return Request{}, fmt.Errorf("request: %d strings in %d bytes", n, len(rest))
	}
	var bad error
	next := func() string {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			bad = errors.New("request: a string without its NUL")
			return ""
		}
		s := string(rest[:i])
		rest = rest[i+1:]
		return s
	}
	list := func(n uint64) []string {
		if n == 0 || bad != nil {
			return nil
		}
		l := make([]string, n)
		for i := range l {
			l[i] = next()
		}
		return l
	}
	req.Profile = next()
	req.Argv = list(argc)
	req.Env = list(envc)
	req.Environ = list(environc)
	if bad != nil {
		return Request{}, bad
	}
	if len(rest) != 0 {
		return Request{}, fmt.Errorf("request: %d bytes after the last string", len(rest))
	}
	return req, nil
}

// residentReply is the server's one answer (the reply above).
type residentReply struct {
	typ    byte
	status int
	text   string
	result []byte // the Result's JSON (a result asked with reqWantResult)
}

// encode is the reply's bytes, its text cut to residentTextMax.
func (r residentReply) encode() []byte {
	text := r.text
	if len(text) > residentTextMax {
		text = text[:residentTextMax]
	}
	b := make([]byte, 0, replyHeader+len(text)+len(r.result))
	b = append(b, residentMagic...)
	b = append(b, r.typ, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(int32(r.status)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(text)))
	b = append(b, text...)
	return append(b, r.result...)
}

// decodeResidentReply reads a reply (the client's side).
func decodeResidentReply(b []byte) (residentReply, error) {
	var r residentReply
	if len(b) < replyHeader || string(b[:len(residentMagic)]) != residentMagic || b[5]|b[6]|b[7] != 0 {
		return r, errors.New("no header")
	}
	r.typ = b[4]
	r.status = int(int32(binary.LittleEndian.Uint32(b[8:])))
	n := uint64(binary.LittleEndian.Uint32(b[12:]))
	rest := b[replyHeader:]
	if n > uint64(len(rest)) || n > residentTextMax {
		return r, fmt.Errorf("a text of %d bytes in %d", n, len(rest))
	}
	r.text = string(rest[:n])
	if r.typ != replyResult && len(rest) != int(n) {
		return r, fmt.Errorf("%d bytes after the text", len(rest)-int(n))
	}
	if len(rest) > int(n) {
		r.result = rest[n:]
	}
	return r, nil
}

// maxReplyBytes bounds a reply with the Result's JSON (a Result with its
// violations); without it a reply is at most its header and
// residentTextMax.
const maxReplyBytes = 1 << 20

// Call runs req through the resident launcher on socket with the
// caller's stdio. ErrNoResident and ErrNotPoolable (wrapped) mean: run
// one-shot. A cancelled ctx asks the server to end the sandbox (SIGINT to
// the tool, SIGKILL after CancelGrace, as one-shot); the outcome still
// comes back. Raw system calls on a blocking socket: no poller to start
// for the one exchange.
func Call(ctx context.Context, socket string, req Request, stdio [nsinit.CallFDs]*os.File) (*Outcome, error) {
	data, err := encodeResidentRequest(req)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotPoolable, err)
	}
	c, err := dialResident(socket)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoResident, socket, err)
	}
	defer c.close()
	// The listener must be root: str serve runs only as root, and
	// anything else listening there (a socket planted in a directory the
	// caller did not check) gets neither the request nor the caller's
	// stdio. SO_PEERCRED gives the listener's credentials as of listen().
	if cred, err := unix.GetsockoptUcred(c.fd, unix.SOL_SOCKET, unix.SO_PEERCRED); err != nil || cred.Uid != 0 {
		return nil, &Error{Untrusted: true, Msg: untrustedMsg(socket, cred, err)}
	}
	var fds [nsinit.CallFDs]int
	for i, f := range stdio {
		fds[i] = int(f.Fd())
	}
	if err := retryEINTR(func() error { return unix.Sendmsg(c.fd, data, unix.UnixRights(fds[:]...), nil, unix.MSG_NOSIGNAL) }); err != nil {
		return nil, fmt.Errorf("%w: %s: send: %w", ErrNoResident, socket, err)
	}
	stop := context.AfterFunc(ctx, func() { c.send([]byte(residentCancelMsg)) })
	defer stop()
	buf := make([]byte, replyHeader+residentTextMax)
	if req.WantResult {
		buf = make([]byte, maxReplyBytes)
	}
	var n, flags int
	err = retryEINTR(func() (err error) { n, _, flags, _, err = unix.Recvmsg(c.fd, buf, nil, 0); return err })
	if err != nil || n == 0 {
		// The server went away after it was sent the call: nothing says
		// what ran; not a case to retry one-shot (the command may have
		// run).
		return nil, &LostError{Socket: socket, Err: errOr(err, io.EOF)}
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("resident launcher %s: bad reply: more than %d bytes", socket, len(buf))
	}
	rep, err := decodeResidentReply(buf[:n])
	if err != nil {
		return nil, fmt.Errorf("resident launcher %s: bad reply: %w", socket, err)
	}
	switch rep.typ {
	case replyResult:
		return &Outcome{Status: rep.status, Stderr: rep.text, Result: rep.result}, nil
	case replyNotPoolable:
		return nil, fmt.Errorf("%w: %s", ErrNotPoolable, rep.text)
	case replyRefused:
		return nil, &Error{Refused: true, Msg: rep.text}
	case replyFailed:
		return nil, &Error{Msg: rep.text}
	}
	return nil, fmt.Errorf("resident launcher %s: unknown reply type %d", socket, rep.typ)
}

// residentConn is a client's connection: its cancel message may be sent
// from the context's goroutine while the caller waits for the reply, and
// never after close (the descriptor's number could be another file's by
// then).
type residentConn struct {
	mu     sync.Mutex
	fd     int
	closed bool
}

// dialResident connects to socket (blocking, close-on-exec).
func dialResident(socket string) (*residentConn, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := retryEINTR(func() error { return unix.Connect(fd, &unix.SockaddrUnix{Name: socket}) }); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("connect: %w", err)
	}
	return &residentConn{fd: fd}, nil
}

func (c *residentConn) send(b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		_ = retryEINTR(func() error { return unix.Sendto(c.fd, b, unix.MSG_NOSIGNAL, nil) })
	}
}

func (c *residentConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		unix.Close(c.fd)
	}
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// Listener connects to socket, sends nothing, and returns the
// listener's pid and uid (SO_PEERCRED, as of its listen()): what str
// doctor reports. An error wraps ErrNoResident when nothing listens.
func Listener(socket string) (pid, uid int, err error) {
	c, err := dialResident(socket)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s: %w", ErrNoResident, socket, err)
	}
	defer c.close()
	cred, err := unix.GetsockoptUcred(c.fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil {
		return 0, 0, fmt.Errorf("resident launcher %s: SO_PEERCRED: %w", socket, err)
	}
	return int(cred.Pid), int(cred.Uid), nil
}

func untrustedMsg(socket string, cred *unix.Ucred, err error) string {
	if err != nil {
		return fmt.Sprintf("resident launcher %s: SO_PEERCRED: %v", socket, err)
	}
	return fmt.Sprintf("resident launcher %s: the listener is uid %d, not root: not a str serve", socket, cred.Uid)
}

func errOr(err, fallback error) error {
	if err != nil {
		return err
	}
	return fallback
}
