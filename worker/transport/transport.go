// Package transport is the broker abstraction the worker talks to. The
// implementations are the in-memory bus (tests, one process), the dev
// broker client (newline-JSON over TCP, spec §10) and Solace PubSub+.
package transport

import (
	"context"
	"errors"
	"fmt"
)

// Message is one broker message. Payload is the raw bytes (UTF-8 JSON for
// every message str sends). User properties are strings on the wire of
// every transport (numbers arriving from a dev broker are formatted).
type Message struct {
	Topic          string
	Payload        []byte
	UserProperties map[string]string
	// ID, when set, names the message for the broker's duplicate check: a
	// transport that has one (the dev broker's publish_id) delivers a
	// message published again under the same ID, by the same publisher,
	// once. A publish whose answer was lost (a connection cut after the
	// broker took it) is retried, and without an ID the retry is a second
	// copy. Without an ID a transport still names each Publish call's own
	// attempts alike. The worker sets it on replies (one per task).
	ID string
}

// Delivery is a received message plus its settlement. Exactly one of Ack or
// Nack must be called once the message has been handled (after the reply has
// been published). Transports without acknowledgement make both no-ops.
type Delivery struct {
	Message
	Ack  func() error
	Nack func(reason error) error
}

// State is the connection state reported on /readyz.
type State int

const (
	Disconnected State = iota
	Connected
)

func (s State) String() string {
	if s == Connected {
		return "connected"
	}
	return "disconnected"
}

// ErrClosed is returned by Receive and Publish after Close.
var ErrClosed = errors.New("transport: closed")

// ErrNoSelfDelivery is returned by PublishToSelf when a message this
// client publishes cannot come back to its own subscriptions (the
// worker's liveness probe is then off; the error says why).
var ErrNoSelfDelivery = errors.New("transport: this client cannot receive its own messages")

// ErrRefused is matched (errors.Is) by every error a transport classified
// as a refusal: the broker answered and will not take this message, so
// sending it again cannot succeed (too large, a topic it forbids). Any
// other publish error is worth a retry (no connection, a timeout).
var ErrRefused = errors.New("refused by the broker")

// Error is a transport's failure, classified by the transport that saw it:
// each transport wraps its own library's errors, so that the worker
// decides on retries without knowing which broker it talks to.
type Error struct {
	Op    string // "publish", "subscribe", ...
	Topic string
	// Permanent: the broker refused (errors.Is(err, ErrRefused)); the same
	// request would be refused again.
	Permanent bool
	Err       error // the transport's own error, kept for errors.As
}

func (e *Error) Error() string {
	if e.Permanent {
		return fmt.Sprintf("%s %s: %v: %v", e.Op, e.Topic, ErrRefused, e.Err)
	}
	return fmt.Sprintf("%s %s: %v", e.Op, e.Topic, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Is makes a permanent Error match ErrRefused.
func (e *Error) Is(target error) bool { return target == ErrRefused && e.Permanent }

// Refused returns err as the permanent refusal of op on topic.
func Refused(op, topic string, err error) error {
	return &Error{Op: op, Topic: topic, Permanent: true, Err: err}
}

// Transport is what the worker needs from a broker.
type Transport interface {
	// Connect establishes the session with the initial subscriptions
	// (they are sent together with the connect where the protocol allows,
	// so no request published right after the connection is missed). It
	// returns once the first connection is up; later drops are repaired in
	// the background (with re-subscription) until Close.
	Connect(ctx context.Context, subscriptions []string) error
	Subscribe(ctx context.Context, pattern string) error
	Unsubscribe(ctx context.Context, pattern string) error
	// Publish sends m. An error the broker will give again for the same
	// message matches ErrRefused (see Error); any other is worth a retry.
	Publish(ctx context.Context, m Message) error
	// MaxMessageBytes is the largest message this transport's broker
	// takes: payload, topic and user properties with their framing. A
	// larger one is refused (ErrRefused).
	MaxMessageBytes() int
	// PublishToSelf publishes m so that it reaches this client's own
	// matching subscriptions, as long as the session still delivers: the
	// worker's liveness probe (a broker may keep a session that looks
	// connected but no longer routes anything to it). A broker never
	// hands a client its own publishes back, so each transport says here
	// how it gets round that; one that cannot returns an error wrapping
	// ErrNoSelfDelivery.
	PublishToSelf(ctx context.Context, m Message) error
	// Reestablish ends the current session, however healthy it looks,
	// and builds a new one with the current subscriptions, as after a
	// lost connection (State is Disconnected until it is up). It returns
	// at once; cause is logged.
	Reestablish(cause error)
	// Receive blocks until a message arrives, ctx ends or the transport is
	// closed.
	Receive(ctx context.Context) (*Delivery, error)
	State() State
	Close() error
}
