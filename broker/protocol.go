package broker

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Commands, statuses and error codes of the dev broker protocol (spec §10).
// The strings are exact; commands are case-sensitive.
const (
	CmdConnect     = "CONNECT"
	CmdSubscribe   = "SUBSCRIBE"
	CmdUnsubscribe = "UNSUBSCRIBE"
	CmdPublish     = "PUBLISH"
	CmdReceive     = "RECEIVE"
	CmdAck         = "ACK"
	CmdDisconnect  = "DISCONNECT"

	StatusOK      = "OK"
	StatusTimeout = "TIMEOUT"
	StatusError   = "ERROR"

	CodeNotConnected   = "NOT_CONNECTED"
	CodeInvalidCommand = "INVALID_COMMAND"
	CodeInternalError  = "INTERNAL_ERROR"
)

// DefaultPort is the reference's default TCP port (DEV_BROKER_PORT).
const DefaultPort = 55555

// DefaultReceiveTimeoutMS is the server's RECEIVE timeout when a request
// carries no timeout_ms.
const DefaultReceiveTimeoutMS = 5000

// response is every reply the server sends. Absent fields are left out, so
// each reply has exactly the fields of its row in spec §10.
type response struct {
	Status       string       `json:"status"`
	ClientID     *string      `json:"client_id,omitempty"`
	MessageID    string       `json:"message_id,omitempty"`
	Message      *wireMessage `json:"message,omitempty"`
	ErrorCode    string       `json:"error_code,omitempty"`
	ErrorMessage string       `json:"error_message,omitempty"`
}

// wireMessage is a delivered message inside a RECEIVE reply. Payload and
// UserProperties are carried as the publisher sent them (any JSON value, and
// a JSON object).
type wireMessage struct {
	MessageID      string          `json:"message_id"`
	Topic          string          `json:"topic"`
	Payload        json.RawMessage `json:"payload"`
	UserProperties json.RawMessage `json:"user_properties"`
}

// size is what msg counts against a client's MaxQueueBytes: its fields'
// bytes plus a fixed allowance for the struct and the JSON around them.
func (m *wireMessage) size() int {
	return len(m.MessageID) + len(m.Topic) + len(m.Payload) + len(m.UserProperties) + 128
}

// EncodeLine renders v as one JSON line. HTML escaping is off so payload
// text passes through as sent ("<" stays "<").
func EncodeLine(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil { // Encode appends the '\n'
		return nil, err
	}
	return buf.Bytes(), nil
}

// newID returns a random RFC 4122 version 4 UUID in its usual text form,
// the shape of the reference's client and message ids.
func newID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand panics instead)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}

// ReadLine reads one '\n'-terminated line of at most max bytes before
// its "\r\n" or "\n" (the server's rule for requests, readLines): a
// client's reader of response lines.
func ReadLine(r *bufio.Reader, max int) ([]byte, error) {
	var buf []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(buf)+len(frag) > max+2 {
			return nil, fmt.Errorf("reply line longer than %d bytes", max)
		}
		buf = append(buf, frag...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			return nil, err
		}
		// The +2 above leaves room for "\r\n", not for a longer line.
		if len(bytes.TrimRight(buf, "\r\n")) > max {
			return nil, fmt.Errorf("reply line longer than %d bytes", max)
		}
		return buf, nil
	}
}
