package devbroker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker/transport"
)

// Client defaults.
const (
	DefaultRetryDelay     = 3 * time.Second // CONNECT_RETRY_DELAY_MS
	DefaultReceiveTimeout = time.Second
	DefaultCommandTimeout = 10 * time.Second
	// DefaultKeepAlive is well below the server's DefaultIdleTimeout.
	DefaultKeepAlive = time.Minute
	// PublisherSuffix is appended to ClientID to name the publishing
	// connection when ClientOptions.PublisherID is empty.
	PublisherSuffix = "-pub"
)

// ClientOptions configures a Client.
type ClientOptions struct {
	Host string // DEV_BROKER_HOST; required
	Port int    // DEV_BROKER_PORT; 0 means broker.DefaultPort
	// ClientID is the client_id of the receiving connection, the identity
	// that owns the subscriptions. Required.
	ClientID string
	// Token is sent in every CONNECT (the "token" field) to a broker that
	// requires one. At most one of Token and TokenFile may be set; with
	// neither, CONNECT carries no token (an anonymous broker, or the
	// reference's).
	Token string
	// TokenFile is read before every connection attempt, so a restarted
	// broker's new token is picked up; while the file does not exist, no
	// token is sent (and a broker that requires one refuses, with a
	// message naming its token file). See broker.TokenFileFor.
	TokenFile string
	// QueueName is sent in the receiving connection's CONNECT. On str's
	// broker clients sharing a non-empty queue name share the work.
	QueueName string
	// PublisherID is the client_id of the publishing connection; empty
	// means ClientID+PublisherSuffix. A distinct id is the default because
	// the reference broker keeps one session per client_id and a second
	// CONNECT under the same id would steal the receiver's session; str's
	// broker refuses a second connection under a connected id.
	PublisherID string
	// RetryDelay is the wait between connection attempts, before the
	// first connection and after every drop (CONNECT_RETRY_DELAY_MS).
	// 0 means DefaultRetryDelay.
	RetryDelay time.Duration
	// Retries bounds the retries of the first connection in Connect
	// (CONNECT_RETRIES): Connect fails after 1+Retries attempts. 0 means
	// retry forever. Reconnection after a drop always retries forever.
	Retries int
	// ReceiveTimeout is the timeout_ms of each RECEIVE. Subscribe and
	// Unsubscribe travel on the receiving connection between RECEIVEs, so
	// this is also their worst-case delay. 0 means DefaultReceiveTimeout.
	ReceiveTimeout time.Duration
	// CommandTimeout bounds dialing and the wait for a reply to any other
	// command (and is added to ReceiveTimeout for RECEIVE). 0 means
	// DefaultCommandTimeout.
	CommandTimeout time.Duration
	// KeepAlive: when the publishing connection has carried nothing for
	// this long, the receive loop sends an ACK on it (accepted and ignored
	// by every dev broker), so that a broker's idle timeout does not close
	// it (and with it the receiving one) while there is nothing to
	// publish. 0 means DefaultKeepAlive.
	KeepAlive time.Duration
	// MaxLineBytes is the longest reply line accepted. 0 means
	// broker.DefaultMaxLineBytes.
	MaxLineBytes int
	// Logger receives connection events. nil means slog.Default().
	Logger *slog.Logger
}

// Client is a transport.Transport over the dev broker protocol. It keeps two
// connections: a receiving one (CONNECT with the subscriptions, then
// RECEIVE after RECEIVE, SUBSCRIBE/UNSUBSCRIBE in between) and a publishing
// one. If either drops, both are closed and re-established every RetryDelay
// until Close, with the current subscription set in the new CONNECT.
type Client struct {
	opts   ClientOptions
	addr   string
	log    *slog.Logger
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	done   chan struct{} // closed by Close

	ctrl       chan *ctrlOp             // Subscribe/Unsubscribe → receive loop
	deliveries chan *transport.Delivery // receive loop → Receive
	loopDone   chan struct{}            // closed when the receive loop ends

	mu      sync.Mutex
	subs    []string      // desired subscriptions, in order of first subscription
	sess    *session      // nil while disconnected
	ready   chan struct{} // closed once sess is non-nil; replaced on drop
	started bool
	closed  bool
}

// session is one pair of live connections.
type session struct {
	recv  *lineConn // used only by Connect, then by the receive loop
	pubMu sync.Mutex
	pub   *lineConn // guarded by pubMu
	// pubUsed is when pub last carried a command; guarded by pubMu.
	pubUsed time.Time
	once    sync.Once
}

func (s *session) kill() {
	s.once.Do(func() {
		s.recv.nc.Close()
		s.pub.nc.Close()
	})
}

type ctrlOp struct {
	cmd     string
	pattern string
	sess    *session
	result  chan error // capacity 1
}

var _ transport.Transport = (*Client)(nil)

// NewClient checks opts and returns a client that is not yet connected.
func NewClient(opts ClientOptions) (*Client, error) {
	var problems []error
	if opts.Host == "" {
		problems = append(problems, errors.New("host is empty (set DEV_BROKER_HOST)"))
	}
	if opts.Port == 0 {
		opts.Port = broker.DefaultPort
	}
	if opts.Port < 1 || opts.Port > 65535 {
		problems = append(problems, fmt.Errorf("port %d is outside 1-65535", opts.Port))
	}
	if opts.ClientID == "" {
		problems = append(problems, errors.New("client id is empty"))
	}
	if opts.Token != "" && opts.TokenFile != "" {
		problems = append(problems, errors.New("both Token and TokenFile are set"))
	}
	if opts.Retries < 0 {
		problems = append(problems, fmt.Errorf("retries %d is negative (0 means forever)", opts.Retries))
	}
	for name, d := range map[string]time.Duration{
		"RetryDelay": opts.RetryDelay, "ReceiveTimeout": opts.ReceiveTimeout, "CommandTimeout": opts.CommandTimeout,
		"KeepAlive": opts.KeepAlive,
	} {
		if d < 0 {
			problems = append(problems, fmt.Errorf("%s %v is negative", name, d))
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("devbroker: client options: %w", errors.Join(problems...))
	}
	if opts.PublisherID == "" {
		opts.PublisherID = opts.ClientID + PublisherSuffix
	}
	if opts.RetryDelay == 0 {
		opts.RetryDelay = DefaultRetryDelay
	}
	if opts.KeepAlive == 0 {
		opts.KeepAlive = DefaultKeepAlive
	}
	if opts.ReceiveTimeout == 0 {
		opts.ReceiveTimeout = DefaultReceiveTimeout
	}
	if opts.CommandTimeout == 0 {
		opts.CommandTimeout = DefaultCommandTimeout
	}
	if opts.MaxLineBytes <= 0 {
		opts.MaxLineBytes = broker.DefaultMaxLineBytes
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Client{
		opts:       opts,
		addr:       net.JoinHostPort(opts.Host, strconv.Itoa(opts.Port)),
		done:       make(chan struct{}),
		ctrl:       make(chan *ctrlOp),
		deliveries: make(chan *transport.Delivery),
		loopDone:   make(chan struct{}),
		ready:      make(chan struct{}),
	}
	c.log = log.With("component", "devbroker-client", "broker", c.addr, "client_id", opts.ClientID)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	return c, nil
}

// Connect opens both connections, sending subscriptions (plus any given to
// Subscribe before) inside the receiving connection's CONNECT, so nothing
// published after Connect returns is missed. It tries 1+Retries times (0 =
// until ctx ends), RetryDelay apart, then starts the background receive
// loop, which repairs later drops by itself.
func (c *Client) Connect(ctx context.Context, subscriptions []string) error {
	c.mu.Lock()
	switch {
	case c.closed:
		c.mu.Unlock()
		return transport.ErrClosed
	case c.started:
		c.mu.Unlock()
		return errors.New("devbroker: Connect called twice")
	}
	c.started = true
	for _, p := range subscriptions {
		if p == "" {
			c.started = false
			c.mu.Unlock()
			return errors.New("devbroker: connect: empty subscription pattern")
		}
		if !slices.Contains(c.subs, p) {
			c.subs = append(c.subs, p)
		}
	}
	c.mu.Unlock()

	ctx, stop := mergeDone(ctx, c.ctx)
	defer stop()
	for attempt := 1; ; attempt++ {
		err := c.establish(ctx)
		if err == nil {
			break
		}
		if c.isClosed() {
			close(c.loopDone)
			return transport.ErrClosed
		}
		if ctx.Err() != nil || (c.opts.Retries > 0 && attempt > c.opts.Retries) {
			close(c.loopDone)
			return fmt.Errorf("devbroker: connect to %s failed after %d attempt(s): %w", c.addr, attempt, err)
		}
		c.log.Info("connect failed, retrying", "attempt", attempt, "retry_in", c.opts.RetryDelay, "err", err)
		select {
		case <-time.After(c.opts.RetryDelay):
		case <-ctx.Done():
			close(c.loopDone)
			if c.isClosed() {
				return transport.ErrClosed
			}
			return fmt.Errorf("devbroker: connect to %s failed after %d attempt(s): %w (last error: %v)", c.addr, attempt, ctx.Err(), err)
		}
	}
	go c.run()
	return nil
}

// mergeDone returns a context that ends when either a or b ends.
func mergeDone(a, b context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(a)
	stop := context.AfterFunc(b, cancel)
	return ctx, func() { stop(); cancel() }
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// establish dials and CONNECTs both connections and installs the session.
// Steps:
//  1. dial the receiving connection; CONNECT with ClientID, QueueName and
//     a snapshot of the subscriptions;
//  2. dial the publishing connection; CONNECT with PublisherID, no queue
//     name and no subscriptions;
//  3. install the session, then SUBSCRIBE/UNSUBSCRIBE whatever changed in
//     the subscription set since the snapshot of step 1.
func (c *Client) establish(ctx context.Context) (err error) {
	c.mu.Lock()
	snapshot := slices.Clone(c.subs)
	c.mu.Unlock()
	token, err := c.token()
	if err != nil {
		return err
	}

	// 1. Receiving connection.
	recv, err := c.dial(ctx, "receiving")
	if err != nil {
		return err
	}
	sess := &session{recv: recv, pubUsed: time.Now()}
	defer func() {
		if err != nil {
			recv.nc.Close()
			if sess.pub != nil {
				sess.pub.nc.Close()
			}
		}
	}()
	// Closing the socket when ctx ends interrupts a blocked handshake.
	stopRecv := context.AfterFunc(ctx, func() { recv.nc.Close() })
	defer stopRecv()
	if snapshot == nil {
		snapshot = []string{}
	}
	err = recv.expectOK(broker.CmdConnect, connectRequest{Cmd: broker.CmdConnect, ClientID: c.opts.ClientID,
		QueueName: c.opts.QueueName, Subscriptions: snapshot, Token: token}, c.opts.CommandTimeout)
	if err != nil {
		return fmt.Errorf("receiving connection: %w", err)
	}

	// 2. Publishing connection.
	pub, err := c.dial(ctx, "publishing")
	if err != nil {
		return err
	}
	sess.pub = pub
	stopPub := context.AfterFunc(ctx, func() { pub.nc.Close() })
	defer stopPub()
	err = pub.expectOK(broker.CmdConnect, connectRequest{Cmd: broker.CmdConnect, ClientID: c.opts.PublisherID,
		Subscriptions: []string{}, Token: token}, c.opts.CommandTimeout)
	if err != nil {
		return fmt.Errorf("publishing connection: %w", err)
	}

	// 3. Install, then catch up with Subscribe/Unsubscribe calls made
	// while the CONNECT was in flight (they saw no session and relied on
	// this step).
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return transport.ErrClosed
	}
	var add, remove []string
	for _, p := range c.subs {
		if !slices.Contains(snapshot, p) {
			add = append(add, p)
		}
	}
	for _, p := range snapshot {
		if !slices.Contains(c.subs, p) {
			remove = append(remove, p)
		}
	}
	c.sess = sess
	close(c.ready)
	c.mu.Unlock()
	c.log.Info("connected", "queue_name", c.opts.QueueName, "publisher_id", c.opts.PublisherID,
		"subscriptions", len(snapshot)+len(add)-len(remove))
	for _, p := range add {
		if err := recv.expectOK(broker.CmdSubscribe, subscriptionRequest{Cmd: broker.CmdSubscribe, TopicPattern: p}, c.opts.CommandTimeout); err != nil {
			c.drop(sess, err)
			return err
		}
	}
	for _, p := range remove {
		if err := recv.expectOK(broker.CmdUnsubscribe, subscriptionRequest{Cmd: broker.CmdUnsubscribe, TopicPattern: p}, c.opts.CommandTimeout); err != nil {
			c.drop(sess, err)
			return err
		}
	}
	return nil
}

// token is what the next CONNECTs carry: Token, or TokenFile's content,
// or "" when TokenFile does not exist (yet).
func (c *Client) token() (string, error) {
	if c.opts.TokenFile == "" {
		return c.opts.Token, nil
	}
	tok, err := broker.ReadTokenFile(c.opts.TokenFile)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	return tok, err
}

func (c *Client) dial(ctx context.Context, which string) (*lineConn, error) {
	d := net.Dialer{Timeout: c.opts.CommandTimeout}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s connection: %w", which, err)
	}
	return &lineConn{nc: nc, r: bufio.NewReaderSize(nc, 64<<10), max: c.opts.MaxLineBytes}, nil
}

// drop retires sess after an error: the client becomes disconnected and
// both sockets are closed. The receive loop then reconnects.
func (c *Client) drop(sess *session, cause error) {
	c.mu.Lock()
	current := c.sess == sess
	if current {
		c.sess = nil
		c.ready = make(chan struct{})
	}
	closed := c.closed
	c.mu.Unlock()
	sess.kill()
	if current && !closed {
		c.log.Warn("connection lost, reconnecting", "retry_in", c.opts.RetryDelay, "err", cause)
	}
}

// run is the receive loop: RECEIVE, hand over, repeat; reconnect on any
// error until Close.
func (c *Client) run() {
	defer close(c.loopDone)
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	for {
		if sess == nil {
			select {
			case <-time.After(c.opts.RetryDelay):
			case <-c.done:
				return
			}
			if err := c.establish(c.ctx); err != nil {
				if c.isClosed() {
					return
				}
				c.log.Info("reconnect failed, retrying", "retry_in", c.opts.RetryDelay, "err", err)
				continue
			}
			c.mu.Lock()
			sess = c.sess
			c.mu.Unlock()
			if sess == nil { // dropped again already
				continue
			}
		}
		if err := c.receiveOnce(sess); err != nil {
			if c.isClosed() {
				return
			}
			c.drop(sess, err)
			sess = nil
		}
	}
}

// receiveOnce applies pending subscription changes, issues one RECEIVE and
// hands a message, if any, to Receive.
func (c *Client) receiveOnce(sess *session) error {
	for {
		select {
		case op := <-c.ctrl:
			if err := c.applyCtrl(sess, op); err != nil {
				return err
			}
			continue
		case <-c.done:
			return transport.ErrClosed
		default:
		}
		break
	}
	if err := c.keepAlive(sess); err != nil {
		return err
	}
	rep, err := sess.recv.roundTrip(broker.CmdReceive, receiveRequest{Cmd: broker.CmdReceive, TimeoutMS: c.opts.ReceiveTimeout.Milliseconds()},
		c.opts.ReceiveTimeout+c.opts.CommandTimeout)
	if err != nil {
		return err
	}
	switch rep.Status {
	case broker.StatusTimeout:
		return nil
	case broker.StatusOK:
	default:
		// NOT_CONNECTED means the broker lost our session; anything else is
		// just as unexpected. A fresh CONNECT repairs both.
		return rep.err(broker.CmdReceive)
	}
	d, err := c.toDelivery(rep.Message)
	if err != nil {
		c.log.Error("dropping malformed message from broker", "err", err)
		return nil
	}
	var ctrlErr error
	for {
		select {
		case c.deliveries <- d:
			return ctrlErr
		case op := <-c.ctrl:
			if ctrlErr != nil {
				op.result <- ctrlErr
				continue
			}
			ctrlErr = c.applyCtrl(sess, op)
		case <-c.done:
			// Close: Receive will not take it. It never reached the
			// caller, so it goes back to the broker for another
			// client (a queue group's member) instead of being lost.
			c.giveBack(sess, rep.Message)
			return transport.ErrClosed
		}
	}
}

// giveBack publishes m again, as received (topic, payload and user
// properties; the broker gives it a new message_id), on the publishing
// connection: a message this client fetched but never handed over, at
// Close. A queue group gets it once more and hands it to a member that
// asks; a subscriber outside the group also gets a second copy. It is
// never a second run: this client never handed it to anyone.
func (c *Client) giveBack(sess *session, m *replyMessage) {
	props := m.UserProperties
	if props == nil {
		props = map[string]json.RawMessage{}
	}
	sess.pubMu.Lock()
	rep, err := sess.pub.roundTrip(broker.CmdPublish, giveBackRequest{Cmd: broker.CmdPublish, Topic: m.Topic, Payload: m.Payload,
		UserProperties: props}, c.opts.CommandTimeout)
	sess.pubUsed = time.Now()
	sess.pubMu.Unlock()
	if err == nil && rep.Status != broker.StatusOK {
		err = rep.err(broker.CmdPublish)
	}
	if err != nil {
		c.log.Warn("closing: a message fetched but not handed over could not be given back and is lost",
			"topic", m.Topic, "message_id", jsonText(m.MessageID), "err", err)
		return
	}
	c.log.Info("closing: gave a message fetched but not handed over back to the broker", "topic", m.Topic,
		"message_id", jsonText(m.MessageID))
}

// keepAlive sends an ACK on the publishing connection when it has carried
// nothing for KeepAlive (the receiving connection is kept alive by the
// RECEIVEs themselves). A publish in progress is activity: then nothing
// is sent.
func (c *Client) keepAlive(sess *session) error {
	if !sess.pubMu.TryLock() {
		return nil
	}
	defer sess.pubMu.Unlock()
	if time.Since(sess.pubUsed) < c.opts.KeepAlive {
		return nil
	}
	sess.pubUsed = time.Now()
	if err := sess.pub.expectOK(broker.CmdAck, ackRequest{Cmd: broker.CmdAck}, c.opts.CommandTimeout); err != nil {
		return fmt.Errorf("publishing connection keep-alive: %w", err)
	}
	return nil
}

// applyCtrl sends one SUBSCRIBE/UNSUBSCRIBE on the receiving connection and
// reports the outcome to the caller. An op made for an older session is
// already covered by the newer session's CONNECT. Only I/O errors are
// returned (they end the session).
func (c *Client) applyCtrl(sess *session, op *ctrlOp) error {
	if op.sess != sess {
		op.result <- nil
		return nil
	}
	rep, err := sess.recv.roundTrip(op.cmd, subscriptionRequest{Cmd: op.cmd, TopicPattern: op.pattern}, c.opts.CommandTimeout)
	if err != nil {
		op.result <- fmt.Errorf("devbroker: %s %s: %w (kept for the next connection)", op.cmd, op.pattern, err)
		return err
	}
	if rep.Status != broker.StatusOK {
		op.result <- fmt.Errorf("devbroker: %s %s: %w", op.cmd, op.pattern, rep.err(op.cmd))
		return nil
	}
	op.result <- nil
	return nil
}

// Subscribe adds pattern to the subscription set. While connected it is
// sent at once (between two RECEIVEs); while disconnected it is sent with
// the next CONNECT and Subscribe returns nil. Either way it is part of every
// later reconnection.
func (c *Client) Subscribe(ctx context.Context, pattern string) error {
	return c.changeSubscription(ctx, broker.CmdSubscribe, pattern)
}

// Unsubscribe removes pattern from the subscription set, at once while
// connected, and from every later CONNECT.
func (c *Client) Unsubscribe(ctx context.Context, pattern string) error {
	return c.changeSubscription(ctx, broker.CmdUnsubscribe, pattern)
}

func (c *Client) changeSubscription(ctx context.Context, cmd, pattern string) error {
	if pattern == "" {
		return fmt.Errorf("devbroker: %s: empty pattern", cmd)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return transport.ErrClosed
	}
	has := slices.Contains(c.subs, pattern)
	switch {
	case cmd == broker.CmdSubscribe && !has:
		c.subs = append(c.subs, pattern)
	case cmd == broker.CmdUnsubscribe && has:
		c.subs = slices.DeleteFunc(c.subs, func(p string) bool { return p == pattern })
	}
	sess := c.sess
	c.mu.Unlock()
	if sess == nil {
		return nil // establish sends it
	}
	op := &ctrlOp{cmd: cmd, pattern: pattern, sess: sess, result: make(chan error, 1)}
	select {
	case c.ctrl <- op:
	case <-ctx.Done():
		return fmt.Errorf("devbroker: %s %s: %w (kept for the next connection)", cmd, pattern, ctx.Err())
	case <-c.done:
		return transport.ErrClosed
	case <-c.loopDone:
		return transport.ErrClosed
	}
	select {
	case err := <-op.result:
		return err
	case <-ctx.Done():
		return fmt.Errorf("devbroker: %s %s: %w (sent, outcome unknown)", cmd, pattern, ctx.Err())
	case <-c.done:
		return transport.ErrClosed
	}
}

// Publish sends m on the publishing connection. While disconnected it
// waits for the connection (until ctx ends). If the connection fails during
// the exchange, Publish waits for the reconnection and tries once more, so a
// message whose reply was lost can be delivered twice. The payload goes out
// as a raw JSON value when it is valid JSON, else as a JSON string.
func (c *Client) Publish(ctx context.Context, m transport.Message) error {
	if m.Topic == "" {
		return errors.New("devbroker: publish: empty topic")
	}
	// One publish_id for every attempt of this call (and for every call
	// of the caller's that names the message alike: m.ID), so that a
	// retry of a PUBLISH the broker took before the connection was cut is
	// not routed twice (test/fleet: a reply answered twice).
	id := m.ID
	switch {
	case id == "":
		id = newPublishID()
	case len(id) > broker.MaxPublishIDBytes:
		sum := sha256.Sum256([]byte(id))
		id = hex.EncodeToString(sum[:])
	}
	req := publishRequest{Cmd: broker.CmdPublish, Topic: m.Topic, UserProperties: m.UserProperties, PublishID: id}
	if json.Valid(m.Payload) {
		req.Payload = json.RawMessage(m.Payload)
	} else {
		s, _ := json.Marshal(string(m.Payload)) // strings always marshal
		req.Payload = s
	}
	if req.UserProperties == nil {
		req.UserProperties = map[string]string{}
	}
	line, err := publishLine(req)
	if err != nil {
		return fmt.Errorf("devbroker: publish %s: encode: %w", m.Topic, err)
	}
	var lastErr error
	for attempt := 1; attempt <= 2; attempt++ {
		sess, err := c.waitSession(ctx)
		if err != nil {
			if lastErr != nil {
				return fmt.Errorf("devbroker: publish %s: %w (after: %v)", m.Topic, err, lastErr)
			}
			return fmt.Errorf("devbroker: publish %s: %w", m.Topic, err)
		}
		// An exchange cut short leaves a reply in flight and so costs the
		// session; do not start one that cannot finish.
		timeout := c.opts.CommandTimeout
		if dl, ok := ctx.Deadline(); ok {
			timeout = min(timeout, time.Until(dl))
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("devbroker: publish %s: %w", m.Topic, err)
		}
		if timeout <= 0 {
			return fmt.Errorf("devbroker: publish %s: %w", m.Topic, context.DeadlineExceeded)
		}
		sess.pubMu.Lock()
		rep, err := sess.pub.roundTripLine(broker.CmdPublish, line, timeout)
		sess.pubUsed = time.Now()
		sess.pubMu.Unlock()
		if err == nil {
			if rep.Status != broker.StatusOK {
				// NOT_CONNECTED: the session is gone, a new one takes
				// the message; any other error the broker would give
				// again (too long a line, a malformed request).
				if rep.ErrorCode == broker.CodeNotConnected {
					return fmt.Errorf("devbroker: publish %s: %w", m.Topic, rep.err(broker.CmdPublish))
				}
				return transport.Refused("devbroker: publish", m.Topic, rep.err(broker.CmdPublish))
			}
			return nil
		}
		c.drop(sess, err)
		lastErr = err
	}
	return fmt.Errorf("devbroker: publish %s failed twice: %w", m.Topic, lastErr)
}

// newPublishID is a random publish_id (128 bits, hex).
func newPublishID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return hex.EncodeToString(b[:])
}

// MaxMessageBytes is the broker's line limit, taken to be the client's
// own (MaxLineBytes; both default to broker.DefaultMaxLineBytes): a
// PUBLISH line, with its topic, properties and JSON framing, longer than
// that is refused.
func (c *Client) MaxMessageBytes() int { return c.opts.MaxLineBytes }

// PublishToSelf publishes m as Publish does. It comes back to this
// client because the publishing connection has its own client id
// (PublisherID) and the broker skips only the publishing id: the
// receiving connection's subscriptions get it as any other client's.
// With PublisherID equal to ClientID it cannot come back
// (ErrNoSelfDelivery).
func (c *Client) PublishToSelf(ctx context.Context, m transport.Message) error {
	if c.opts.PublisherID == c.opts.ClientID {
		return fmt.Errorf("devbroker: publish %s to self: the publishing connection uses the receiving connection's client id %q: %w",
			m.Topic, c.opts.ClientID, transport.ErrNoSelfDelivery)
	}
	return c.Publish(ctx, m)
}

// Reestablish closes both connections of the live session, however
// healthy they look; the receive loop reconnects after RetryDelay (a
// broker that has not yet seen the old connections end gets time to),
// with the current subscriptions in the new CONNECT.
func (c *Client) Reestablish(cause error) {
	c.mu.Lock()
	sess := c.sess
	c.mu.Unlock()
	if sess == nil {
		return // already reconnecting
	}
	if cause == nil {
		cause = errors.New("asked by the caller")
	}
	c.drop(sess, fmt.Errorf("re-establishing the session: %w", cause))
}

// waitSession returns the live session, waiting for one while disconnected.
func (c *Client) waitSession(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return nil, transport.ErrClosed
		case !c.started:
			c.mu.Unlock()
			return nil, errors.New("not connected (call Connect first)")
		case c.sess != nil:
			s := c.sess
			c.mu.Unlock()
			return s, nil
		}
		ready := c.ready
		c.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the broker connection: %w", ctx.Err())
		case <-c.done:
			return nil, transport.ErrClosed
		case <-c.loopDone:
			return nil, transport.ErrClosed
		}
	}
}

// Receive returns the next message. Ack and Nack are no-ops: the dev broker
// keeps nothing to settle.
func (c *Client) Receive(ctx context.Context) (*transport.Delivery, error) {
	select {
	case d := <-c.deliveries:
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.done:
		return nil, transport.ErrClosed
	}
}

// State reports whether both connections are up.
func (c *Client) State() transport.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil {
		return transport.Connected
	}
	return transport.Disconnected
}

// Close stops the receive loop, then closes both connections (the broker
// forgets the client when it sees them go). A RECEIVE in flight is let
// finish first (it may already have taken a message off the broker's
// queue: so Close can take up to ReceiveTimeout+CommandTimeout), and a
// message fetched but not yet returned by Receive is given back to the
// broker (giveBack), so that closing loses nothing that was never handed
// over. Safe to call more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	sess := c.sess
	c.sess = nil
	started := c.started
	c.mu.Unlock()
	// 1. the loop ends: a connection attempt is cut short (ctx), a
	// RECEIVE in flight finishes, what it holds goes back (done).
	close(c.done)
	c.cancel()
	if started {
		<-c.loopDone
	}
	// 2. then the sockets.
	if sess != nil {
		sess.kill()
	}
	c.log.Info("closed")
	return nil
}

// toDelivery converts a RECEIVE reply's message. A JSON string payload is
// handed over as its decoded content; any other value as its JSON text.
// User property values that are not strings become their JSON text.
func (c *Client) toDelivery(m *replyMessage) (*transport.Delivery, error) {
	if m == nil {
		return nil, errors.New("RECEIVE OK without a message")
	}
	d := &transport.Delivery{
		Message: transport.Message{Topic: m.Topic, UserProperties: make(map[string]string, len(m.UserProperties))},
		Ack:     func() error { return nil },
		Nack:    func(error) error { return nil },
	}
	payload := bytes.TrimSpace(m.Payload)
	if len(payload) > 0 && payload[0] == '"' {
		var s string
		if err := json.Unmarshal(payload, &s); err != nil {
			return nil, fmt.Errorf("message %s payload: %w", jsonText(m.MessageID), err)
		}
		d.Payload = []byte(s)
	} else {
		d.Payload = slices.Clone(payload)
	}
	for k, v := range m.UserProperties {
		d.UserProperties[k] = jsonText(v)
	}
	return d, nil
}

// jsonText is a JSON string's content, or any other value's compact text
// (1700000000123 → "1700000000123").
func jsonText(raw json.RawMessage) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) == nil {
		return buf.String()
	}
	return string(raw)
}

// Requests, with fields in the reference client's order; CONNECT's token,
// str's extension, comes last and only when there is one.
type connectRequest struct {
	Cmd           string   `json:"cmd"`
	ClientID      string   `json:"client_id"`
	QueueName     string   `json:"queue_name"`
	Subscriptions []string `json:"subscriptions"`
	Token         string   `json:"token,omitempty"`
}

type subscriptionRequest struct {
	Cmd          string `json:"cmd"`
	TopicPattern string `json:"topic_pattern"`
}

type publishRequest struct {
	Cmd            string            `json:"cmd"`
	Topic          string            `json:"topic"`
	Payload        json.RawMessage   `json:"payload"`
	UserProperties map[string]string `json:"user_properties"`
	PublishID      string            `json:"publish_id,omitempty"` // str's extension (broker.MaxPublishIDBytes); the reference ignores it
}

// giveBackRequest is a PUBLISH of a received message as it came: its user
// property values are passed through as received.
type giveBackRequest struct {
	Cmd            string                     `json:"cmd"`
	Topic          string                     `json:"topic"`
	Payload        json.RawMessage            `json:"payload"`
	UserProperties map[string]json.RawMessage `json:"user_properties"`
}

type ackRequest struct {
	Cmd string `json:"cmd"`
}

type receiveRequest struct {
	Cmd       string `json:"cmd"`
	TimeoutMS int64  `json:"timeout_ms"`
}

// reply is any response, decoded leniently.
type reply struct {
	Status       string        `json:"status"`
	ClientID     string        `json:"client_id"`
	Message      *replyMessage `json:"message"`
	ErrorCode    string        `json:"error_code"`
	ErrorMessage string        `json:"error_message"`
}

type replyMessage struct {
	MessageID      json.RawMessage            `json:"message_id"`
	Topic          string                     `json:"topic"`
	Payload        json.RawMessage            `json:"payload"`
	UserProperties map[string]json.RawMessage `json:"user_properties"`
}

// BrokerError is an ERROR (or otherwise not OK) reply.
type BrokerError struct {
	Cmd     string
	Status  string
	Code    string
	Message string
}

func (e *BrokerError) Error() string {
	return fmt.Sprintf("broker refused %s: status %s, %s: %s", e.Cmd, e.Status, e.Code, e.Message)
}

func (r *reply) err(cmd string) error {
	return &BrokerError{Cmd: cmd, Status: r.Status, Code: r.ErrorCode, Message: r.ErrorMessage}
}

// lineConn is one connection speaking newline-delimited JSON.
type lineConn struct {
	nc  net.Conn
	r   *bufio.Reader
	max int
}

// roundTrip writes req as one line and reads one reply line, all within
// timeout.
func (lc *lineConn) roundTrip(cmd string, req any, timeout time.Duration) (*reply, error) {
	data, err := broker.EncodeLine(req)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", cmd, err)
	}
	return lc.roundTripLine(cmd, net.Buffers{data}, timeout)
}

// publishLine is broker.EncodeLine(req), byte for byte, in pieces to be
// written at once (writev): the line around the payload, and the payload
// itself when it is already compact (a worker's reply is), else
// compacted once into a buffer of its size. EncodeLine copied a payload
// (most of a large message: a reply of 15 MiB) into a buffer grown by
// doubling, then again into another, at each attempt. req.Payload is
// valid JSON (Publish sends anything else as a JSON string).
func publishLine(req publishRequest) (net.Buffers, error) {
	payload := req.Payload
	req.Payload = json.RawMessage(`0`)
	env, err := broker.EncodeLine(req)
	if err != nil {
		return nil, err
	}
	// The first `"payload":` is the member: before it come only
	// `{"cmd":"PUBLISH","topic":` and the topic as a JSON string, whose
	// every '"' is escaped.
	at := bytes.Index(env, []byte(`"payload":0`)) + len(`"payload":`)
	if !compact(payload) {
		// EncodeLine's own encoding of a json.RawMessage: compacted,
		// nothing escaped (SetEscapeHTML(false)).
		var buf bytes.Buffer
		buf.Grow(len(payload))
		if err := json.Compact(&buf, payload); err != nil {
			return nil, err
		}
		payload = buf.Bytes()
	}
	return net.Buffers{env[:at], payload, env[at+len(`0`):]}, nil
}

// compact reports whether the valid JSON text p is what json.Compact
// makes of it: no whitespace outside its strings.
func compact(p []byte) bool {
	in := false
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}

// roundTripLine sends one encoded command line, in pieces (written
// together, writev), and reads its reply.
func (lc *lineConn) roundTripLine(cmd string, pieces net.Buffers, timeout time.Duration) (*reply, error) {
	if err := lc.nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("%s: set deadline: %w", cmd, err)
	}
	pieces = append(net.Buffers(nil), pieces...) // WriteTo consumes its slice; the caller's may be sent again
	if _, err := pieces.WriteTo(lc.nc); err != nil {
		return nil, fmt.Errorf("send %s: %w", cmd, err)
	}
	line, err := broker.ReadLine(lc.r, lc.max)
	if err != nil {
		return nil, fmt.Errorf("read %s reply: %w", cmd, err)
	}
	var rep reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, fmt.Errorf("decode %s reply: %w", cmd, err)
	}
	return &rep, nil
}

func (lc *lineConn) expectOK(cmd string, req any, timeout time.Duration) error {
	rep, err := lc.roundTrip(cmd, req, timeout)
	if err != nil {
		return err
	}
	if rep.Status != broker.StatusOK {
		return rep.err(cmd)
	}
	return nil
}
