package helper

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/securetoolruntime/str/egress"
	"golang.org/x/sys/unix"
)

// The control socket carries one JSON Message per SOCK_SEQPACKET packet;
// a "start" packet carries the session's listeners as SCM_RIGHTS, in the
// order of Message.Listeners. The launcher sends requests with an ID; the
// helper answers each with a "reply" of the same ID, and sends "kill"
// (on_violation: kill fired, with the event) unasked.
//
//	hello   launcher -> helper, first: ExtraRoots (the PEM the launcher
//	        read from STR_EGRESS_EXTRA_ROOTS; ExtraRootsErr when it could not)
//	check   compile Policy and Credentials as a session would, with the
//	        public suffix list the launcher lacks (Err: the verdict)
//	ca      the CA's certificate (CertPEM); the CA is made at the first ca
//	        or the first start that terminates TLS, and its key never
//	        leaves the helper
//	start   serve the listeners (Session = ID) with Policy and Credentials
//	report  the session's record so far (Events, Dropped, Summary)
//	close   close the session; the reply is its final record
//	kill    helper -> launcher: Session's policy says on_violation: kill
//	        and Events[0] is the first violation
const (
	OpHello  = "hello"
	OpCheck  = "check"
	OpCA     = "ca"
	OpStart  = "start"
	OpReport = "report"
	OpClose  = "close"
	OpKill   = "kill"
	OpReply  = "reply"
)

// Message is one packet of the control socket, either way.
type Message struct {
	Op      string `json:"op"`
	ID      uint64 `json:"id,omitempty"`
	Session uint64 `json:"session,omitempty"`

	Policy        *egress.Policy `json:"policy,omitempty"`
	Credentials   []Credential   `json:"credentials,omitempty"`
	Listeners     []string       `json:"listeners,omitempty"`
	ExtraRoots    []byte         `json:"extra_roots,omitempty"`
	ExtraRootsErr string         `json:"extra_roots_err,omitempty"`

	Err     string         `json:"err,omitempty"`
	CertPEM []byte         `json:"cert_pem,omitempty"`
	Events  []egress.Event `json:"events,omitempty"`
	Dropped int            `json:"dropped,omitempty"`
	Summary string         `json:"summary,omitempty"`
}

// Credential is egress.Credential on the control socket: its value in the
// clear (egress.Secret marshals as "[redacted]"). It crosses only the
// socketpair between the launcher and its helper.
type Credential struct {
	Name        string   `json:"name"`
	Hosts       []string `json:"hosts"`
	Header      string   `json:"header,omitempty"`
	Format      string   `json:"format,omitempty"`
	Query       string   `json:"query,omitempty"`
	Value       []byte   `json:"value"`
	Placeholder string   `json:"placeholder"`
}

func wireCredentials(creds []egress.Credential) []Credential {
	out := make([]Credential, 0, len(creds))
	for _, c := range creds {
		out = append(out, Credential{Name: c.Name, Hosts: c.Hosts, Header: c.Header, Format: c.Format, Query: c.Query, Value: c.Value.Bytes(), Placeholder: c.Placeholder})
	}
	return out
}

// EgressCredentials are the helper's side of wireCredentials.
func EgressCredentials(creds []Credential) []egress.Credential {
	out := make([]egress.Credential, 0, len(creds))
	for _, c := range creds {
		out = append(out, egress.Credential{Name: c.Name, Hosts: c.Hosts, Header: c.Header, Format: c.Format, Query: c.Query, Value: egress.NewSecret(c.Value), Placeholder: c.Placeholder})
	}
	return out
}

// MaxMessage bounds one packet (a policy, or a session's record of at
// most 100 distinct events, is far smaller).
const MaxMessage = 1 << 20

// maxFDs bounds the descriptors one start carries (proxy, two DNS, and a
// capture port each).
const maxFDs = 256

// Send writes m, with fds as SCM_RIGHTS when there are any.
func Send(c *net.UnixConn, m Message, fds []int) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > MaxMessage {
		return fmt.Errorf("egress helper: a %s message of %d bytes (at most %d)", m.Op, len(b), MaxMessage)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// Recv reads one Message and the descriptors it carries (as files, close
// on exec). A packet cut short is an error (its descriptors are closed).
func Recv(c *net.UnixConn, buf []byte) (Message, []*os.File, error) {
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return Message{}, nil, net.ErrClosed // the peer closed
	}
	if err != nil {
		return Message{}, nil, err
	}
	var files []*os.File
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return Message{}, nil, fmt.Errorf("egress helper: control message: %w", perr)
		}
		for _, cm := range cmsgs {
			fds, _ := unix.ParseUnixRights(&cm)
			for _, fd := range fds {
				unix.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "listener"))
			}
		}
	}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll()
		return Message{}, nil, fmt.Errorf("egress helper: a message cut short (flags %#x)", flags)
	}
	if n == 0 {
		closeAll()
		return Message{}, nil, net.ErrClosed // the peer closed (EOF on SOCK_SEQPACKET)
	}
	var m Message
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		closeAll()
		return Message{}, nil, fmt.Errorf("egress helper: message: %w", err)
	}
	return m, files, nil
}
