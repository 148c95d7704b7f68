package memory

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/securetoolruntime/str/worker/transport"
)

// ErrNotConnected is returned by Publish before Connect.
var ErrNotConnected = errors.New("memory: not connected")

// DefaultMaxMessageBytes is a bus's message limit, the dev broker's line
// limit, so that tests over the bus meet the limit the worker meets in
// development.
const DefaultMaxMessageBytes = 16 << 20

// Bus is an in-process broker. The zero value is not usable; call NewBus.
type Bus struct {
	mu       sync.Mutex
	clients  []*client      // creation order; closed clients are removed
	turns    map[string]int // queue group -> messages handed to the group so far
	maxBytes int            // see SetMaxMessageBytes
	stalls   []*stall       // see Stall
	refused  []string       // see Refuse: topic patterns
}

// NewBus returns an empty bus.
func NewBus() *Bus {
	return &Bus{turns: make(map[string]int), maxBytes: DefaultMaxMessageBytes}
}

// SetMaxMessageBytes sets the largest message the bus takes (its size:
// payload, topic, and user property names and values); a larger one is
// refused (transport.ErrRefused).
func (b *Bus) SetMaxMessageBytes(n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.maxBytes = n
}

// messageSize is what a message counts against the bus's limit.
func messageSize(m transport.Message) int {
	n := len(m.Topic) + len(m.Payload)
	for k, v := range m.UserProperties {
		n += len(k) + len(v)
	}
	return n
}

// stall is one Stall: publishes to topics matching pattern wait for
// release.
type stall struct {
	pattern string
	entered chan string
	release chan struct{}
}

// Stall makes every publish to a topic matching pattern wait, before it
// is routed, until release is called (or the publisher's context ends):
// a broker that does not take one destination's messages. entered
// receives each such publish's topic as it starts to wait (it is buffered
// for 64; later ones are not announced). Publishes to other topics go
// through. A test hook for the worker's outbound path.
func (b *Bus) Stall(pattern string) (entered <-chan string, release func()) {
	st := &stall{pattern: pattern, entered: make(chan string, 64), release: make(chan struct{})}
	b.mu.Lock()
	b.stalls = append(b.stalls, st)
	b.mu.Unlock()
	var once sync.Once
	return st.entered, func() {
		once.Do(func() {
			b.mu.Lock()
			for i, x := range b.stalls {
				if x == st {
					b.stalls = append(b.stalls[:i], b.stalls[i+1:]...)
					break
				}
			}
			b.mu.Unlock()
			close(st.release)
		})
	}
}

// Refuse makes the bus refuse (transport.ErrRefused) every publish to a
// topic matching pattern, as a broker whose access list forbids it.
func (b *Bus) Refuse(pattern string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refused = append(b.refused, pattern)
}

// Client returns a new transport attached to the bus. Clients sharing a
// non-empty queueName form a group: each message goes to one matching
// member, in turn. A message is never delivered to a client whose clientID
// equals the publisher's.
func (b *Bus) Client(clientID, queueName string) transport.Transport {
	c := &client{
		bus:    b,
		id:     clientID,
		queue:  queueName,
		subs:   make(map[string]struct{}),
		signal: make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	b.mu.Lock()
	b.clients = append(b.clients, c)
	b.mu.Unlock()
	return c
}

type client struct {
	bus    *Bus
	id     string
	queue  string
	signal chan struct{} // capacity 1: "pending may be non-empty"
	done   chan struct{} // closed by Close

	// Guarded by bus.mu.
	connected bool
	closed    bool
	subs      map[string]struct{} // what the client subscribed to
	// forgotten: the bus has dropped the client's subscriptions (Forget)
	// and routes nothing to it until it re-establishes its session.
	forgotten bool
	pending   []transport.Message
}

// Forget makes the bus drop the subscriptions of every client with
// clientID while each keeps looking connected, as a broker that removes
// a session by client id does (the reference dev broker when an old
// connection of the id ends late): nothing is routed to them until they
// re-establish their session (Reestablish). A test hook for the worker's
// liveness probe.
func (b *Bus) Forget(clientID string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.clients {
		if c.id == clientID {
			c.forgotten = true
		}
	}
}

func (c *client) Connect(ctx context.Context, subscriptions []string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: connect %s: %w", c.id, err)
	}
	c.bus.mu.Lock()
	defer c.bus.mu.Unlock()
	if c.closed {
		return transport.ErrClosed
	}
	for _, s := range subscriptions {
		c.subs[s] = struct{}{}
	}
	c.connected = true
	return nil
}

func (c *client) Subscribe(ctx context.Context, pattern string) error {
	c.bus.mu.Lock()
	defer c.bus.mu.Unlock()
	if c.closed {
		return transport.ErrClosed
	}
	c.subs[pattern] = struct{}{}
	return nil
}

func (c *client) Unsubscribe(ctx context.Context, pattern string) error {
	c.bus.mu.Lock()
	defer c.bus.mu.Unlock()
	if c.closed {
		return transport.ErrClosed
	}
	delete(c.subs, pattern)
	return nil
}

// matches reports whether one of c's subscriptions matches topic. The
// caller holds bus.mu.
func (c *client) matches(topic string) bool {
	if c.forgotten {
		return false
	}
	for s := range c.subs {
		if transport.MatchDev(s, topic) {
			return true
		}
	}
	return false
}

// Publish routes m as the dev broker does: one copy to every other
// connected client with a matching subscription and no queue group, and
// one copy to one matching member of each queue group (in turn).
func (c *client) Publish(ctx context.Context, m transport.Message) error {
	return c.route(ctx, m, false)
}

// MaxMessageBytes is the bus's limit (SetMaxMessageBytes).
func (c *client) MaxMessageBytes() int {
	c.bus.mu.Lock()
	defer c.bus.mu.Unlock()
	return c.bus.maxBytes
}

// PublishToSelf routes m as Publish does, the publishing client included
// (as if it came from another client of the bus): it comes back to c
// when c's subscriptions match, unless the bus has forgotten them.
func (c *client) PublishToSelf(ctx context.Context, m transport.Message) error {
	return c.route(ctx, m, true)
}

// Reestablish makes the bus route to c again (the subscriptions c asked
// for were kept on its side, as a client keeps them for a reconnection).
func (c *client) Reestablish(cause error) {
	c.bus.mu.Lock()
	defer c.bus.mu.Unlock()
	c.forgotten = false
}

func (c *client) route(ctx context.Context, m transport.Message, self bool) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memory: publish %s: %w", m.Topic, err)
	}
	b := c.bus
	// A stalled destination: wait outside the bus's lock, so that the
	// rest of the bus goes on.
	b.mu.Lock()
	var waits []*stall
	for _, st := range b.stalls {
		if transport.MatchDev(st.pattern, m.Topic) {
			waits = append(waits, st)
		}
	}
	b.mu.Unlock()
	for _, st := range waits {
		select {
		case st.entered <- m.Topic:
		default:
		}
		select {
		case <-st.release:
		case <-ctx.Done():
			return fmt.Errorf("memory: publish %s: stalled: %w", m.Topic, ctx.Err())
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.closed {
		return transport.ErrClosed
	}
	if !c.connected {
		return fmt.Errorf("memory: publish %s from %s: %w", m.Topic, c.id, ErrNotConnected)
	}
	for _, p := range b.refused {
		if transport.MatchDev(p, m.Topic) {
			return transport.Refused("memory: publish", m.Topic, fmt.Errorf("the topic matches the refused pattern %q", p))
		}
	}
	if n := messageSize(m); n > b.maxBytes {
		return transport.Refused("memory: publish", m.Topic, fmt.Errorf("message of %d bytes, the bus takes at most %d", n, b.maxBytes))
	}
	groups := make(map[string][]*client)
	var groupOrder []string
	for _, r := range b.clients {
		if (r.id == c.id && !(self && r == c)) || !r.connected || !r.matches(m.Topic) {
			continue
		}
		if r.queue == "" {
			r.deliver(m)
			continue
		}
		if _, seen := groups[r.queue]; !seen {
			groupOrder = append(groupOrder, r.queue)
		}
		groups[r.queue] = append(groups[r.queue], r)
	}
	for _, q := range groupOrder {
		members := groups[q]
		members[b.turns[q]%len(members)].deliver(m)
		b.turns[q]++
	}
	return nil
}

// deliver queues a private copy of m. The caller holds bus.mu.
func (c *client) deliver(m transport.Message) {
	cp := transport.Message{
		Topic:          m.Topic,
		Payload:        append([]byte(nil), m.Payload...),
		UserProperties: maps.Clone(m.UserProperties),
	}
	if cp.UserProperties == nil {
		cp.UserProperties = map[string]string{}
	}
	c.pending = append(c.pending, cp)
	select {
	case c.signal <- struct{}{}:
	default:
	}
}

func (c *client) Receive(ctx context.Context) (*transport.Delivery, error) {
	noop := func() error { return nil }
	for {
		c.bus.mu.Lock()
		if c.closed {
			c.bus.mu.Unlock()
			return nil, transport.ErrClosed
		}
		if len(c.pending) > 0 {
			m := c.pending[0]
			c.pending[0] = transport.Message{}
			c.pending = c.pending[1:]
			if len(c.pending) > 0 {
				// Another Receive may be waiting for the same signal.
				select {
				case c.signal <- struct{}{}:
				default:
				}
			}
			c.bus.mu.Unlock()
			return &transport.Delivery{Message: m, Ack: noop, Nack: func(error) error { return nil }}, nil
		}
		c.bus.mu.Unlock()
		select {
		case <-c.signal:
		case <-c.done:
			return nil, transport.ErrClosed
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (c *client) State() transport.State {
	c.bus.mu.Lock()
	defer c.bus.mu.Unlock()
	if c.connected && !c.closed {
		return transport.Connected
	}
	return transport.Disconnected
}

// Close detaches the client from the bus and drops its pending messages.
func (c *client) Close() error {
	b := c.bus
	b.mu.Lock()
	defer b.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.connected = false
	c.pending = nil
	for i, r := range b.clients {
		if r == c {
			b.clients = append(b.clients[:i], b.clients[i+1:]...)
			break
		}
	}
	close(c.done)
	return nil
}
