package launcher

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/launcher/statedir"
	"github.com/securetoolruntime/str/nsinit"
	"github.com/securetoolruntime/str/profiles"
	"golang.org/x/sys/unix"
)

// The resident launcher's protocol (str serve), on a unix SOCK_SEQPACKET
// socket, one JSON document per message:
//
//	client -> server  ResidentRequest, with the caller's stdin, stdout and
//	                  stderr as SCM_RIGHTS (exactly nsinit.CallFDs)
//	server -> client  ResidentReply "refused" (SO_PEERCRED said no),
//	                  "not_poolable" (run one-shot instead), "error" (the
//	                  request is bad, as one-shot str run would say), or
//	                  "result" (the sandbox ran: its Result)
//	client -> server  ResidentCancel, any time before the reply (SIGTERM,
//	                  SIGINT or SIGHUP to the client); closing the
//	                  connection cancels the same way
//
// A connection carries one call.
//
// The compact encoding is the same request and reply for str's entry stub
// (cmd/str/fast_linux_amd64.s), which runs before Go's runtime and so
// cannot write JSON. The server tells the two apart by the first byte
// (JSON's is '{') and answers a compact request compactly:
//
//	request  "STR\x01" (CompactMagic), argc uint32 LE, envc uint32 LE,
//	         then 2+argc+envc NUL-terminated byte strings: the profile
//	         ("" = standard), the --timeout text ("" = none; parsed as
//	         the command line parses it), argv (argc >= 1), the caller's
//	         environ (as it was exec'd: a key's first entry counts, as
//	         Go's os.Getenv reads it), and nothing after the last NUL;
//	         the same three stdio descriptors as SCM_RIGHTS
//	reply    "STR\x01", a type byte (CompactResult, CompactNotPoolable,
//	         CompactRefused, CompactError), three zero bytes, the exit
//	         status as int32 LE, then text: for a result the exact
//	         bytes `str run` writes to stderr (Result.Outcome), for the
//	         others the reason; at most CompactReplyMax bytes in all
//	cancel   the JSON ResidentCancel, as from the Go client
//
// Anything but a result sends the stub to Go's runtime, which sends the
// request again as JSON and handles the answer as it always does.

// ResidentVersion is the protocol's version; a server answers a request
// of another version "not_poolable".
const ResidentVersion = 1

// ResidentRequest is `str run`'s request as the server sees it: the same
// fields as the command line's, checked by the same tighten-only rules
// (Launcher.Plan). Binds and a work dir are never poolable; the client
// does not send them.
type ResidentRequest struct {
	Version int      `json:"version"`
	Profile string   `json:"profile"`
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"` // --env additions
	// Environ is the caller's environment: the profile's passthrough
	// names are read from it, as one-shot str run reads its own.
	Environ []string       `json:"environ,omitempty"`
	Timeout time.Duration  `json:"timeout_ns,omitempty"`
	Memory  int64          `json:"memory,omitempty"`
	CPUs    int64          `json:"cpus_milli,omitempty"`
	Pids    int64          `json:"pids,omitempty"`
	Network *egress.Policy `json:"network,omitempty"`
}

// ResidentReply is the server's one answer.
type ResidentReply struct {
	Type   string  `json:"type"` // "refused", "not_poolable", "error", "result"
	Reason string  `json:"reason,omitempty"`
	Result *Result `json:"result,omitempty"`
}

// ResidentCancel is the client's cancellation.
type ResidentCancel struct {
	Type string `json:"type"` // "cancel"
}

// Errors of CallResident that send the caller to one-shot str run.
var (
	// ErrNoResident: nothing listens on the socket (or it is not one).
	ErrNoResident = errors.New("no resident launcher reachable")
	// ErrNotPoolable: the server cannot serve this request from its
	// pre-built sandboxes (reason attached).
	ErrNotPoolable = errors.New("not poolable")
)

// ResidentError is a request the server refused (SO_PEERCRED) or found
// bad ("error": what one-shot str run would say about it), or a listener
// the client would not send it to (Untrusted).
type ResidentError struct {
	Refused bool
	// Untrusted: the socket's listener is not root, so it is not a str
	// serve (which runs only as root); it was sent nothing.
	Untrusted bool
	Msg       string
}

func (e *ResidentError) Error() string { return e.Msg }

// ResidentLostError: the connection ended without a reply after the
// request was sent (str serve killed mid-call). The command may have run;
// str run exits ExitResidentLost and does not run it again. The entry
// stub (cmd/str/fast_linux_amd64.s) writes the same text.
type ResidentLostError struct {
	Socket string
	Err    error // the read's error (io.EOF: the server closed)
}

func (e *ResidentLostError) Error() string {
	return fmt.Sprintf("resident launcher %s died during the call; the command may have run (no reply: %v)", e.Socket, e.Err)
}

func (e *ResidentLostError) Unwrap() error { return e.Err }

// ResidentSocketName is the resident launcher's socket in the state
// directory (DefaultResidentSocket).
const ResidentSocketName = "serve.sock"

// DefaultResidentSocket is where str serve listens and str run looks when
// neither is told another socket: serve.sock in the state directory
// (/run/str/serve.sock for root). The entry stub spells the same rule
// (cmd/str/fast_linux_amd64.s).
func DefaultResidentSocket(getenv func(string) string) string {
	return filepath.Join(statedir.Dir(getenv), ResidentSocketName)
}

// ResidentSocketEnv names the resident launcher's socket for str run.
const ResidentSocketEnv = "STR_SERVE_SOCKET"

// ImplicitResidentSocket is the socket str run uses when no --serve names
// one: $STR_SERVE_SOCKET when set (empty: none, ""), else
// DefaultResidentSocket. str doctor and str-bench ask the same.
func ImplicitResidentSocket() string {
	if s, ok := os.LookupEnv(ResidentSocketEnv); ok {
		return s
	}
	return DefaultResidentSocket(os.Getenv)
}

// The compact encoding's constants (see the protocol above); the entry
// stub spells the same values (cmd/str/fast_linux_amd64.s).
const (
	CompactMagic       = "STR\x01"
	CompactReplyMax    = 64 << 10
	CompactResult      = 1
	CompactNotPoolable = 2
	CompactRefused     = 3
	CompactError       = 4
	compactHeader      = len(CompactMagic) + 8
)

// decodeCompact reads a compact request: every check of the format
// above, then the --timeout text parsed and checked as `str run` parses
// it (a positive duration). The result goes through the same checks as a
// JSON request.
func decodeCompact(b []byte) (ResidentRequest, error) {
	var req ResidentRequest
	if len(b) < compactHeader || string(b[:len(CompactMagic)]) != CompactMagic {
		return req, errors.New("compact request: no header")
	}
	argc := binary.LittleEndian.Uint32(b[4:])
	envc := binary.LittleEndian.Uint32(b[8:])
	rest := b[compactHeader:]
	// Each string takes at least its NUL: counts beyond the bytes left
	// are refused before anything is allocated for them.
	if argc == 0 || uint64(argc)+uint64(envc)+2 > uint64(len(rest)) {
		return req, fmt.Errorf("compact request: %d arguments and %d environment entries in %d bytes", argc, envc, len(rest))
	}
	next := func() (string, error) {
		i := bytes.IndexByte(rest, 0)
		if i < 0 {
			return "", errors.New("compact request: a string without its NUL")
		}
		s := string(rest[:i])
		rest = rest[i+1:]
		return s, nil
	}
	var timeout string
	var err error
	if req.Profile, err = next(); err != nil {
		return req, err
	}
	if timeout, err = next(); err != nil {
		return req, err
	}
	req.Argv = make([]string, argc)
	for i := range req.Argv {
		if req.Argv[i], err = next(); err != nil {
			return req, err
		}
	}
	req.Environ = make([]string, envc)
	for i := range req.Environ {
		if req.Environ[i], err = next(); err != nil {
			return req, err
		}
	}
	if len(rest) != 0 {
		return req, fmt.Errorf("compact request: %d bytes after the last string", len(rest))
	}
	if timeout != "" {
		d, err := profiles.ParseDuration(timeout)
		if err != nil || d <= 0 {
			return req, fmt.Errorf("compact request: --timeout %q: not a positive duration", timeout)
		}
		req.Timeout = d
	}
	req.Version = ResidentVersion
	return req, nil
}

// encodeCompact is a compact reply of type typ: status and text (cut to
// fit CompactReplyMax).
func encodeCompact(typ byte, status int, text string) []byte {
	if len(text) > CompactReplyMax-compactHeader {
		text = text[:CompactReplyMax-compactHeader]
	}
	b := make([]byte, compactHeader, compactHeader+len(text))
	copy(b, CompactMagic)
	b[4] = typ
	binary.LittleEndian.PutUint32(b[8:], uint32(int32(status)))
	return append(b, text...)
}

// maxReplyBytes bounds a reply (a Result with its violations).
const maxReplyBytes = 1 << 20

// CallResident runs req through the resident launcher on socket with the
// caller's stdio. ErrNoResident and ErrNotPoolable (wrapped) mean: run
// one-shot. A cancelled ctx asks the server to end the sandbox (SIGINT to
// the tool, SIGKILL after CancelGrace, as one-shot); the result still
// comes back.
func CallResident(ctx context.Context, socket string, req ResidentRequest, stdio [nsinit.CallFDs]*os.File) (*Result, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrNoResident, socket, err)
	}
	defer c.Close()
	// The listener must be root: str serve runs only as root, and
	// anything else listening there (a socket planted in a directory the
	// caller did not check) gets neither the request nor the caller's
	// stdio. SO_PEERCRED gives the listener's credentials as of listen().
	if cred, err := peerCred(c); err != nil || cred.Uid != 0 {
		return nil, &ResidentError{Untrusted: true, Msg: untrustedMsg(socket, cred, err)}
	}
	req.Version = ResidentVersion
	data, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, f := range stdio {
		fds = append(fds, int(f.Fd()))
	}
	if _, _, err := c.WriteMsgUnix(data, unix.UnixRights(fds...), nil); err != nil {
		return nil, fmt.Errorf("%w: %s: send: %w", ErrNoResident, socket, err)
	}
	stop := context.AfterFunc(ctx, func() {
		b, _ := json.Marshal(ResidentCancel{Type: "cancel"})
		_, _ = c.Write(b)
	})
	defer stop()
	buf := make([]byte, maxReplyBytes)
	n, err := c.Read(buf)
	if err != nil || n == 0 {
		// The server went away after it was sent the call: nothing says
		// what ran; not a case to retry one-shot (the command may have
		// run).
		return nil, &ResidentLostError{Socket: socket, Err: errOr(err, errors.New("connection closed"))}
	}
	var rep ResidentReply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		return nil, fmt.Errorf("resident launcher %s: bad reply: %w", socket, err)
	}
	switch rep.Type {
	case "result":
		if rep.Result == nil {
			return nil, fmt.Errorf("resident launcher %s: a result reply without a result", socket)
		}
		return rep.Result, nil
	case "not_poolable":
		return nil, fmt.Errorf("%w: %s", ErrNotPoolable, rep.Reason)
	case "refused":
		return nil, &ResidentError{Refused: true, Msg: rep.Reason}
	case "error":
		return nil, &ResidentError{Msg: rep.Reason}
	}
	return nil, fmt.Errorf("resident launcher %s: unknown reply %q", socket, rep.Type)
}

// peerCred is what SO_PEERCRED says of c's peer: for a connected
// client, the listener's credentials as of its listen().
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var gerr error
	if err := rc.Control(func(fd uintptr) { cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, gerr
}

// ResidentListener connects to socket, sends nothing, and returns the
// listener's pid and uid (SO_PEERCRED, as of its listen()): what str
// doctor reports. An error wraps ErrNoResident when nothing listens.
func ResidentListener(socket string) (pid, uid int, err error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return 0, 0, fmt.Errorf("%w: %s: %w", ErrNoResident, socket, err)
	}
	defer c.Close()
	cred, err := peerCred(c)
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
