package solace

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	messaging "solace.dev/go/messaging"
	sol "solace.dev/go/messaging/pkg/solace"
	"solace.dev/go/messaging/pkg/solace/config"
	"solace.dev/go/messaging/pkg/solace/message"
	"solace.dev/go/messaging/pkg/solace/resource"

	"github.com/securetoolruntime/str/worker/transport"
)

// reservedPrefix marks the library's own message properties: a key with it
// given to WithProperty sets a message header, not a user property.
const reservedPrefix = "solace.messaging."

// publishAckTimeout bounds how long a guaranteed publish waits for the
// broker's acknowledgement when ctx has no deadline.
const publishAckTimeout = 30 * time.Second

// terminateGrace is how long Close lets receivers hand over buffered
// messages before they are discarded (direct) or left for redelivery
// (guaranteed); terminateWait bounds the whole termination call.
const (
	terminateGrace = 2 * time.Second
	terminateWait  = 3 * time.Second
)

// Transport is the Solace PubSub+ implementation of transport.Transport.
// It is safe for concurrent use.
type Transport struct {
	cfg Config
	log *slog.Logger

	// in carries deliveries from the library's receive goroutine to
	// Receive. It is unbuffered: while nobody receives, the library's own
	// buffer (BackPressureBuffer) fills and back-pressure applies there.
	in chan *transport.Delivery
	// done is closed by Close; bg ends the background reconnect loop.
	done     chan struct{}
	bg       context.Context
	stopBG   context.CancelFunc
	closeOne sync.Once
	wg       sync.WaitGroup

	state atomic.Int32 // transport.State

	// subMu serialises subscription changes; it is taken before mu.
	subMu sync.Mutex

	mu        sync.Mutex
	connected bool            // Connect succeeded once
	sess      *session        // the live session, nil while rebuilding
	desired   map[string]bool // subscriptions the worker asked for
}

// session is one MessagingService with its publisher and receiver. A
// service whose Connect failed, or that was interrupted for good, cannot
// be used again, so a new session is built for every attempt.
type session struct {
	svc  sol.MessagingService
	dpub sol.DirectMessagePublisher     // direct mode
	ppub sol.PersistentMessagePublisher // guaranteed mode
	drx  sol.DirectMessageReceiver      // direct mode
	prx  sol.PersistentMessageReceiver  // guaranteed mode
	// applied is what the receiver holds (guarded by Transport.mu).
	applied map[string]bool
}

// New checks cfg and returns an unconnected transport.
func New(cfg Config, logger *slog.Logger) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("solace: configuration: %w", err)
	}
	if logger == nil {
		logger = slog.Default()
	}
	bg, stop := context.WithCancel(context.Background())
	return &Transport{
		cfg:     cfg,
		log:     logger.With("transport", "solace", "host", cfg.Host, "mode", cfg.Mode),
		in:      make(chan *transport.Delivery),
		done:    make(chan struct{}),
		bg:      bg,
		stopBG:  stop,
		desired: map[string]bool{},
	}, nil
}

var _ transport.Transport = (*Transport)(nil)

// Connect builds a session with the given subscriptions and returns once it
// is connected. A failed attempt is retried with a new MessagingService
// every ReconnectInterval until ctx ends. After Connect, drops are repaired
// by the library (ReconnectRetries, subscriptions re-applied) and, when it
// gives up, by building new sessions in the background until Close.
func (t *Transport) Connect(ctx context.Context, subscriptions []string) error {
	// 1. record the subscriptions: every session starts with this set.
	t.mu.Lock()
	if t.connected {
		t.mu.Unlock()
		return errors.New("solace: connect: already connected")
	}
	for _, s := range subscriptions {
		t.desired[s] = true
	}
	t.mu.Unlock()

	// 2. connect, building a new service per attempt.
	s, err := t.connectLoop(ctx)
	if err != nil {
		return err
	}

	// 3. publish the session and start repairing drops in the background.
	t.mu.Lock()
	if t.closed() {
		t.mu.Unlock()
		_ = t.teardown(s, true)
		return transport.ErrClosed
	}
	t.sess = s
	t.connected = true
	t.state.Store(int32(transport.Connected))
	t.mu.Unlock()
	// A subscription change made while connecting may have missed the
	// receiver's initial set.
	t.reconcile(s)
	// An interruption between step 2 and here was ignored (the session was
	// not published yet): repair it now.
	if !s.svc.IsConnected() {
		t.state.Store(int32(transport.Disconnected))
		t.wg.Add(1)
		go func() { defer t.wg.Done(); t.rebuild(s) }()
	}
	return nil
}

// connectLoop builds sessions until one connects, ctx ends or Close runs.
func (t *Transport) connectLoop(ctx context.Context) (*session, error) {
	for attempt := 1; ; attempt++ {
		s, err := t.connectOnce(ctx, attempt)
		if err == nil {
			if attempt > 1 {
				t.log.Info("solace: connected", "attempt", attempt)
			}
			return s, nil
		}
		t.log.Warn("solace: connect failed; a new service will be built", "attempt", attempt,
			"retry_in", t.cfg.ReconnectInterval, "err", err)
		timer := time.NewTimer(t.cfg.ReconnectInterval)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("solace: connect %s (attempt %d): %w (last error: %v)", t.cfg.Host, attempt, ctx.Err(), err)
		case <-t.done:
			timer.Stop()
			return nil, transport.ErrClosed
		case <-timer.C:
		}
	}
}

// connectOnce is one attempt:
//  1. build a new MessagingService from the configuration;
//  2. connect it (the library ends a service whose Connect failed);
//  3. follow its lifecycle events for State;
//  4. start the publisher;
//  5. start the receiver with the desired subscriptions and hand its
//     messages to Receive.
//
// Whatever was started is torn down when a later step fails.
func (t *Transport) connectOnce(ctx context.Context, attempt int) (*session, error) {
	step := func(n int, what string, err error) error {
		return fmt.Errorf("solace: %s %s (attempt %d, step %d): %w", what, t.cfg.Host, attempt, n, err)
	}
	// 1. a new service.
	svc, err := t.buildService()
	if err != nil {
		return nil, step(1, "build service for", err)
	}
	s := &session{svc: svc, applied: map[string]bool{}}

	// 2. connect; Connect cannot be cancelled, so a late success after ctx
	// ended is disconnected in the background.
	result := svc.ConnectAsync()
	select {
	case err := <-result:
		if err != nil {
			return nil, step(2, "connect to", connectHint(err))
		}
	case <-ctx.Done():
		go func() {
			if err := <-result; err == nil {
				_ = svc.Disconnect()
			}
		}()
		return nil, step(2, "connect to", ctx.Err())
	case <-t.done:
		go func() {
			if err := <-result; err == nil {
				_ = svc.Disconnect()
			}
		}()
		return nil, transport.ErrClosed
	}

	// 3. lifecycle events: the library reconnects by itself; when it gives
	// up, the service is over and a new session is built.
	svc.AddReconnectionAttemptListener(func(ev sol.ServiceEvent) {
		if t.current(s) {
			t.state.Store(int32(transport.Disconnected))
			t.log.Warn("solace: connection lost; reconnecting", "cause", ev.GetCause())
		}
	})
	svc.AddReconnectionListener(func(sol.ServiceEvent) {
		if t.current(s) {
			t.state.Store(int32(transport.Connected))
			t.log.Info("solace: reconnected")
			t.wg.Add(1)
			go func() { defer t.wg.Done(); t.reconcile(s) }()
		}
	})
	svc.AddServiceInterruptionListener(func(ev sol.ServiceEvent) {
		if t.current(s) {
			t.state.Store(int32(transport.Disconnected))
			t.log.Error("solace: connection lost for good; building a new service", "cause", ev.GetCause())
			t.wg.Add(1)
			go func() { defer t.wg.Done(); t.rebuild(s) }()
		}
	})

	// 4. the publisher.
	if err := t.startPublisher(s); err != nil {
		_ = t.teardown(s, true)
		return nil, step(4, "start publisher on", err)
	}

	// 5. the receiver, created with the desired subscriptions so that no
	// request published right after the connection is missed.
	t.mu.Lock()
	subs := slices.Sorted(maps.Keys(t.desired))
	t.mu.Unlock()
	if err := t.startReceiver(s, subs); err != nil {
		_ = t.teardown(s, true)
		return nil, step(5, "start receiver on", err)
	}
	t.mu.Lock()
	for _, p := range subs {
		s.applied[p] = true
	}
	t.mu.Unlock()
	return s, nil
}

// buildService turns the configuration into service properties.
func (t *Transport) buildService() (sol.MessagingService, error) {
	c := t.cfg
	props := config.ServicePropertyMap{
		config.TransportLayerPropertyHost: c.Host,
		config.ServicePropertyVPNName:     c.VPN,
		// One try per service: str's loop retries with a new service.
		config.TransportLayerPropertyConnectionRetries: 0,
		// Re-apply direct subscriptions after a library reconnect (the
		// default, set so that nobody has to look it up).
		config.ServicePropertyReceiverDirectSubscriptionReapply: true,
	}
	if c.ClientName != "" {
		props[config.ClientPropertyName] = c.ClientName
	}
	reconnect := config.RetryStrategyForeverRetryWithInterval(c.ReconnectInterval)
	if c.ReconnectRetries >= 0 {
		reconnect = config.RetryStrategyParameterizedRetry(uint(c.ReconnectRetries), c.ReconnectInterval)
	}
	b := messaging.NewMessagingServiceBuilder().
		FromConfigurationProvider(props).
		WithReconnectionRetryStrategy(reconnect)
	if c.ClientCertPath != "" {
		auth := config.ClientCertificateAuthentication(c.ClientCertPath, c.ClientKeyPath, "")
		b = b.WithAuthenticationStrategy(auth)
		if c.Username != "" {
			b = b.FromConfigurationProvider(config.ServicePropertyMap{
				config.AuthenticationPropertySchemeClientCertUserName: c.Username,
			})
		}
	} else {
		// Basic is the library's default scheme and needs both fields,
		// even empty (a broker with authentication off ignores them).
		b = b.WithAuthenticationStrategy(config.BasicUserNamePasswordAuthentication(c.Username, c.Password))
	}
	if c.tls() {
		tls := config.NewTransportSecurityStrategy().WithCertificateValidation(false, true, c.TrustStorePath, "")
		b = b.WithTransportSecurityStrategy(tls)
	}
	return b.Build()
}

// startPublisher starts the publisher of the session's mode. Publishing
// waits when the library's buffer is full rather than dropping a reply.
func (t *Transport) startPublisher(s *session) error {
	if t.cfg.Mode == ModeGuaranteed {
		p, err := s.svc.CreatePersistentMessagePublisherBuilder().OnBackPressureWait(uint(t.cfg.BackPressureBuffer)).Build()
		if err != nil {
			return err
		}
		if err := p.Start(); err != nil {
			return err
		}
		s.ppub = p
		return nil
	}
	p, err := s.svc.CreateDirectMessagePublisherBuilder().OnBackPressureWait(uint(t.cfg.BackPressureBuffer)).Build()
	if err != nil {
		return err
	}
	if err := p.Start(); err != nil {
		return err
	}
	s.dpub = p
	return nil
}

// startReceiver starts the receiver of the session's mode with subs.
func (t *Transport) startReceiver(s *session, subs []string) error {
	topics := make([]resource.Subscription, 0, len(subs))
	for _, p := range subs {
		topics = append(topics, resource.TopicSubscriptionOf(p))
	}
	if t.cfg.Mode == ModeGuaranteed {
		// A pool queue must already exist and be non-exclusive: if the
		// library created it, it would be exclusive and only one worker of
		// the pool could bind. A per-worker queue is created on start.
		create := config.PersistentReceiverCreateOnStartMissingResources
		queue := resource.QueueDurableExclusive(t.cfg.QueueName)
		if t.cfg.PoolName != "" {
			create = config.PersistentReceiverDoNotCreateMissingResources
			queue = resource.QueueDurableNonExclusive(t.cfg.QueueName)
		}
		r, err := s.svc.CreatePersistentMessageReceiverBuilder().
			WithMessageClientAcknowledgement().
			WithRequiredMessageOutcomeSupport(config.PersistentReceiverAcceptedOutcome, config.PersistentReceiverFailedOutcome).
			WithMissingResourcesCreationStrategy(create).
			WithSubscriptions(topics...).
			Build(queue)
		if err != nil {
			return err
		}
		if err := r.Start(); err != nil {
			return fmt.Errorf("bind queue %q: %w%s", t.cfg.QueueName, err, queueHint(t.cfg))
		}
		s.prx = r
		return r.ReceiveAsync(func(m message.InboundMessage) { t.deliver(s, m) })
	}
	// Direct: the broker cannot be slowed down, so when the worker falls
	// BackPressureBuffer messages behind, the newest message is dropped
	// (the library counts it; the next message carries a discard flag that
	// deliver logs). Dropping the newest keeps the oldest requests, whose
	// agents have waited longest.
	r, err := s.svc.CreateDirectMessageReceiverBuilder().
		OnBackPressureDropLatest(uint(t.cfg.BackPressureBuffer)).
		WithSubscriptions(topics...).
		Build()
	if err != nil {
		return err
	}
	if err := r.Start(); err != nil {
		return err
	}
	s.drx = r
	return r.ReceiveAsync(func(m message.InboundMessage) { t.deliver(s, m) })
}

// deliver runs on the library's receive goroutine: it converts m and waits
// until Receive takes it or the transport closes. Blocking here is the
// back-pressure: the library's buffer fills behind it.
func (t *Transport) deliver(s *session, m message.InboundMessage) {
	if dn := m.GetMessageDiscardNotification(); dn != nil {
		if dn.HasInternalDiscardIndication() {
			t.log.Warn("solace: messages were dropped before this one (receive buffer full)",
				"buffer", t.cfg.BackPressureBuffer, "topic", m.GetDestinationName())
		}
		if dn.HasBrokerDiscardIndication() {
			t.log.Warn("solace: the broker dropped messages before this one (client egress queue full)",
				"topic", m.GetDestinationName())
		}
	}
	payload, _ := m.GetPayloadAsBytes()
	d := &transport.Delivery{
		Message: transport.Message{
			Topic:          m.GetDestinationName(),
			Payload:        slices.Clone(payload),
			UserProperties: userProperties(m),
		},
	}
	if s.prx != nil {
		var settled atomic.Bool
		d.Ack = func() error {
			if !settled.CompareAndSwap(false, true) {
				return errors.New("solace: ack: message already settled")
			}
			if err := s.prx.Ack(m); err != nil {
				return fmt.Errorf("solace: ack message on %q (queue %q): %w", d.Topic, t.cfg.QueueName, err)
			}
			return nil
		}
		d.Nack = func(reason error) error {
			if !settled.CompareAndSwap(false, true) {
				return errors.New("solace: nack: message already settled")
			}
			// FAILED: the broker redelivers (up to the queue's max
			// redelivery count, then the dead message queue); the message
			// is not lost.
			t.log.Warn("solace: settling message as failed", "topic", d.Topic, "reason", reason)
			if err := s.prx.Settle(m, config.PersistentReceiverFailedOutcome); err != nil {
				return fmt.Errorf("solace: settle message on %q as failed (queue %q): %w", d.Topic, t.cfg.QueueName, err)
			}
			return nil
		}
	} else {
		d.Ack = func() error { return nil }
		d.Nack = func(error) error { return nil }
	}
	select {
	case t.in <- d:
	case <-t.done:
		// Not settled: a guaranteed message is redelivered by the broker.
	}
}

// userProperties returns the message's user properties as strings. The
// library only exposes the user property map here; its own headers never
// appear, but any reserved key is dropped all the same.
func userProperties(m message.InboundMessage) map[string]string {
	props := m.GetProperties()
	out := make(map[string]string, len(props))
	for k, v := range props {
		if strings.HasPrefix(k, reservedPrefix) {
			continue
		}
		switch x := v.(type) {
		case nil:
			out[k] = ""
		case string:
			out[k] = x
		case []byte:
			out[k] = string(x)
		default:
			out[k] = fmt.Sprint(x)
		}
	}
	return out
}

// current reports whether s is the live session (events of an old session
// must not change the state).
func (t *Transport) current(s *session) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed() {
		return false
	}
	// During Connect the session is not published yet but its events count.
	return t.sess == s || (t.sess == nil && !t.connected)
}

// reconcile brings the receiver's subscriptions in line with the desired
// set after a library reconnect (a Subscribe or Unsubscribe made while the
// connection was down could not reach the broker).
func (t *Transport) reconcile(s *session) {
	t.subMu.Lock()
	defer t.subMu.Unlock()
	t.mu.Lock()
	if t.sess != s {
		t.mu.Unlock()
		return
	}
	var add, remove []string
	for p := range t.desired {
		if !s.applied[p] {
			add = append(add, p)
		}
	}
	for p := range s.applied {
		if !t.desired[p] {
			remove = append(remove, p)
		}
	}
	t.mu.Unlock()
	for _, p := range add {
		if err := t.apply(s, p, true); err != nil {
			t.log.Error("solace: re-apply subscription after reconnect", "topic", p, "err", err)
		}
	}
	for _, p := range remove {
		if err := t.apply(s, p, false); err != nil {
			t.log.Error("solace: drop subscription after reconnect", "topic", p, "err", err)
		}
	}
}

// rebuild replaces an interrupted session with a new one, forever, until
// Close.
func (t *Transport) rebuild(old *session) {
	t.mu.Lock()
	if t.sess != old {
		t.mu.Unlock()
		return
	}
	t.sess = nil
	t.mu.Unlock()
	_ = t.teardown(old, false)
	s, err := t.connectLoop(t.bg)
	if err != nil {
		return // closed
	}
	t.mu.Lock()
	if t.closed() {
		t.mu.Unlock()
		_ = t.teardown(s, true)
		return
	}
	t.sess = s
	t.state.Store(int32(transport.Connected))
	t.mu.Unlock()
	t.log.Info("solace: new service connected")
	t.reconcile(s)
}

// Subscribe adds pattern. While the connection is down the change is
// recorded and applied on reconnect; a broker refusal is returned.
func (t *Transport) Subscribe(ctx context.Context, pattern string) error {
	return t.change(pattern, true)
}

// Unsubscribe removes pattern, like Subscribe.
func (t *Transport) Unsubscribe(ctx context.Context, pattern string) error {
	return t.change(pattern, false)
}

// change records the desired state of pattern and applies it to the live
// session. Subscription changes are serialised by subMu; mu is not held
// while the library blocks for the broker's confirmation, so Close can
// always proceed (its disconnect ends a call stuck on a dead connection).
func (t *Transport) change(pattern string, subscribe bool) error {
	t.subMu.Lock()
	defer t.subMu.Unlock()
	t.mu.Lock()
	if t.closed() {
		t.mu.Unlock()
		return transport.ErrClosed
	}
	if t.desired[pattern] == subscribe {
		t.mu.Unlock()
		return nil
	}
	s := t.sess
	if s == nil || t.State() != transport.Connected {
		if subscribe {
			t.desired[pattern] = true
		} else {
			delete(t.desired, pattern)
		}
		t.mu.Unlock()
		t.log.Info("solace: subscription change recorded; applied on reconnect", "topic", pattern, "subscribe", subscribe)
		return nil
	}
	if !subscribe {
		// Removed from the desired set first: if the call fails because
		// the connection drops, reconcile removes it after the reconnect.
		delete(t.desired, pattern)
	}
	t.mu.Unlock()
	if err := t.apply(s, pattern, subscribe); err != nil {
		return err
	}
	if subscribe {
		t.mu.Lock()
		t.desired[pattern] = true
		t.mu.Unlock()
	}
	return nil
}

// apply adds or removes pattern on s's receiver and records it in
// s.applied. On a persistent receiver this changes the queue's own topic
// subscriptions (the client needs modify-topic permission on the queue).
func (t *Transport) apply(s *session, pattern string, subscribe bool) error {
	sub := resource.TopicSubscriptionOf(pattern)
	var err error
	switch {
	case s.prx != nil && subscribe:
		err = s.prx.AddSubscription(sub)
	case s.prx != nil:
		err = s.prx.RemoveSubscription(sub)
	case subscribe:
		err = s.drx.AddSubscription(sub)
	default:
		err = s.drx.RemoveSubscription(sub)
	}
	if err != nil {
		op := "subscribe"
		if !subscribe {
			op = "unsubscribe"
		}
		return fmt.Errorf("solace: %s %q on %s: %w", op, pattern, t.cfg.Host, err)
	}
	t.mu.Lock()
	if subscribe {
		s.applied[pattern] = true
	} else {
		delete(s.applied, pattern)
	}
	t.mu.Unlock()
	return nil
}

// Publish sends m as a byte-array payload with its user properties. In
// guaranteed mode it returns once the broker has acknowledged the message,
// so a request acknowledged after its reply cannot lose that reply. The
// broker's refusals, and a message larger than MaxMessageBytes, are
// permanent transport errors (errors.go); the rest are worth a retry.
func (t *Transport) Publish(ctx context.Context, m transport.Message) error {
	const op = "solace: publish"
	if t.closed() {
		return transport.ErrClosed
	}
	t.mu.Lock()
	s := t.sess
	t.mu.Unlock()
	if s == nil {
		return &transport.Error{Op: op, Topic: m.Topic, Err: errors.New("not connected")}
	}
	if n, max := messageSize(m), t.MaxMessageBytes(); n > max {
		return transport.Refused(op, m.Topic, fmt.Errorf("message of %d bytes, the limit is %d (SOLACE_MAX_MESSAGE_BYTES)", n, max))
	}
	b := s.svc.MessageBuilder()
	for k, v := range m.UserProperties {
		if strings.HasPrefix(k, reservedPrefix) {
			return transport.Refused(op, m.Topic, fmt.Errorf("user property %q uses the library's reserved prefix %q", k, reservedPrefix))
		}
		b = b.WithProperty(config.MessageProperty(k), v)
	}
	out, err := b.BuildWithByteArrayPayload(m.Payload)
	if err != nil {
		return classify(op, m.Topic, fmt.Errorf("build message: %w", err))
	}
	defer out.Dispose()
	if s.ppub != nil {
		timeout := publishAckTimeout
		if dl, ok := ctx.Deadline(); ok {
			timeout = time.Until(dl)
			if timeout <= 0 {
				return &transport.Error{Op: op, Topic: m.Topic, Err: context.DeadlineExceeded}
			}
		}
		err = s.ppub.PublishAwaitAcknowledgement(out, resource.TopicOf(m.Topic), timeout, nil)
	} else {
		err = s.dpub.Publish(out, resource.TopicOf(m.Topic))
	}
	if err != nil {
		return classify(op, m.Topic, err)
	}
	return nil
}

// MaxMessageBytes is Config.MaxMessageBytes (SOLACE_MAX_MESSAGE_BYTES).
func (t *Transport) MaxMessageBytes() int {
	if t.cfg.MaxMessageBytes == 0 {
		return DefaultMaxMessageBytes
	}
	return t.cfg.MaxMessageBytes
}

// messageSize is what a message counts against MaxMessageBytes: payload,
// topic, and user property names and values.
func messageSize(m transport.Message) int {
	n := len(m.Topic) + len(m.Payload)
	for k, v := range m.UserProperties {
		n += len(k) + len(v)
	}
	return n
}

// PublishToSelf publishes m as Publish does. On a Solace broker it comes
// back to this session: "no local" is off by default, for the session
// (direct subscriptions) and for the queue's flow (guaranteed), so a
// session receives its own publishes that match its subscriptions or
// its queue's. It does not in the C library's peer-to-peer mode (the
// tests' stand-in), nor with a pool (SOLACE_POOL_NAME): the pool's queue
// is shared, so the message could go to another worker of the pool; that
// case is refused here (ErrNoSelfDelivery).
func (t *Transport) PublishToSelf(ctx context.Context, m transport.Message) error {
	if t.cfg.PoolName != "" {
		return fmt.Errorf("solace: publish %q to self: the pool queue %q is shared by the pool's workers, any of which may get it: %w",
			m.Topic, t.cfg.QueueName, transport.ErrNoSelfDelivery)
	}
	return t.Publish(ctx, m)
}

// Reestablish tears the live session down and builds a new service, as
// after the library gives up reconnecting (rebuild), with the desired
// subscriptions.
func (t *Transport) Reestablish(cause error) {
	t.mu.Lock()
	s := t.sess
	t.mu.Unlock()
	if s == nil || t.closed() {
		return // being rebuilt already, or closed
	}
	t.state.Store(int32(transport.Disconnected))
	t.log.Warn("solace: re-establishing the session", "cause", cause)
	t.wg.Add(1)
	go func() { defer t.wg.Done(); t.rebuild(s) }()
}

// Receive returns the next message.
func (t *Transport) Receive(ctx context.Context) (*transport.Delivery, error) {
	select {
	case d := <-t.in:
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.done:
		return nil, transport.ErrClosed
	}
}

// State is Connected between a (re)connection and the next drop.
func (t *Transport) State() transport.State {
	return transport.State(t.state.Load())
}

// Close terminates the receiver and publisher and disconnects.
func (t *Transport) Close() error {
	var err error
	t.closeOne.Do(func() {
		close(t.done)
		t.stopBG()
		t.mu.Lock()
		s := t.sess
		t.sess = nil
		t.mu.Unlock()
		graceful := t.State() == transport.Connected
		t.state.Store(int32(transport.Disconnected))
		if s != nil {
			err = t.teardown(s, graceful)
		}
		t.wg.Wait()
	})
	return err
}

func (t *Transport) closed() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// teardown ends s. graceful (the connection was up) first terminates the
// receiver, letting it hand over buffered messages, then the publisher,
// each bounded by terminateWait: on a connection that has just died the
// library's receiver termination waits for unsubscribe confirmations that
// cannot come (measured in peer mode: 10 s, and indefinitely while it is
// reconnecting forever). Then it disconnects, which ends the receivers and
// publishers that are left and any call still waiting on the connection.
func (t *Transport) teardown(s *session, graceful bool) error {
	var errs []error
	if graceful {
		var parts []sol.LifecycleControl
		if s.drx != nil {
			parts = append(parts, s.drx)
		}
		if s.prx != nil {
			parts = append(parts, s.prx)
		}
		if s.dpub != nil {
			parts = append(parts, s.dpub)
		}
		if s.ppub != nil {
			parts = append(parts, s.ppub)
		}
		for _, p := range parts {
			errs = append(errs, bounded(terminateWait, func() error { return p.Terminate(terminateGrace) }))
		}
	}
	if err := s.svc.Disconnect(); err != nil && graceful {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("solace: close session on %s: %w", t.cfg.Host, err)
	}
	return nil
}

// bounded runs f and waits at most d for it; f keeps running after that.
func bounded(d time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		return fmt.Errorf("no answer within %v; disconnecting", d)
	}
}

// connectHint adds the usual cause to a connect error.
func connectHint(err error) error {
	var auth *sol.AuthenticationError
	if errors.As(err, &auth) {
		return fmt.Errorf("%w (hint: check SOLACE_USERNAME/SOLACE_PASSWORD or the client certificate, and SOLACE_VPN)", err)
	}
	return err
}

// queueHint explains the usual cause of a failed bind.
func queueHint(c Config) string {
	if c.PoolName != "" {
		return " (hint: the pool queue must be provisioned as a durable non-exclusive queue with modify-topic permission for this client; see docs/solace.md)"
	}
	return " (hint: the client profile must allow endpoint creation, or the queue must be provisioned; see docs/solace.md)"
}
