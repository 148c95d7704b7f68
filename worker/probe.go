package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/securetoolruntime/str/worker/transport"
)

// The broker liveness probe (issue 15 §4). A broker can keep a session
// that looks connected while it routes nothing to it: the reference dev
// broker, when a worker restarts under the same id before the broker has
// seen the old connection end, forgets the new session's subscriptions
// as the old connection goes. The transport's state cannot see that, so
// the worker checks delivery itself:
//
//  1. every ProbeInterval, while the transport is connected, it publishes
//     a message to a topic only it subscribes to,
//     {base}/str/v1/probe/{worker_id}/{nonce} (subscription
//     {base}/str/v1/probe/{worker_id}/*, a fresh random nonce per probe;
//     never a request topic, so no agent or other worker acts on it), with
//     transport.PublishToSelf (each transport's way round "a client never
//     receives its own publishes": the dev broker's separate publishing
//     connection, the memory bus's self-routing, Solace's "no local" off);
//  2. the receive loop hands a message on that subscription back here
//     (dispatch), and acks it; only the probe in flight counts;
//  3. a probe not back within ProbeTimeout makes the worker deaf: /readyz
//     answers 503 with "broker":"deaf", str_worker_broker_reestablished_total
//     counts one, and the transport re-establishes its session and its
//     subscriptions (transport.Reestablish);
//  4. the next probe that comes back clears it (logged).
//
// Two live workers under one id against such a broker take the session
// from each other in turn (each one's re-establishment strands the
// other): the probe keeps each serving part of the time, the log shows
// the re-establishments; the id must be unique.
//
// A transport that cannot get its own message back (a Solace pool, whose
// queue is shared) turns the probe off, logged once. A probe late only
// because the receive loop is busy counts as lost: the bound is generous
// (30 s by default) for that reason, and a needless re-establishment costs
// a reconnection, on the dev broker also the messages it had queued for
// the old session.

// probeTopicLevel is the topic level under the base that str's own
// messages use; requests live under sam_remote_tool.
const probeTopicLevel = "/str/v1/probe/"

// prober runs the probe loop and holds the deaf state.
type prober struct {
	s      *Server
	prefix string // {base}/str/v1/probe/{worker_id}/

	deaf atomic.Bool

	mu   sync.Mutex
	want string        // topic of the probe in flight; "" none
	back chan struct{} // closed when it came back
}

func newProber(s *Server) *prober {
	return &prober{s: s, prefix: s.base + probeTopicLevel + s.cfg.WorkerID + "/"}
}

// pattern is the subscription the probes come back on.
func (p *prober) pattern() string { return p.prefix + "*" }

// isProbe reports whether topic is on the probe subscription.
func (p *prober) isProbe(topic string) bool {
	return strings.HasPrefix(topic, p.prefix)
}

// arrived is called by dispatch for a message on the probe subscription.
// A probe of an earlier round (or of an earlier process of this worker id)
// is ignored.
func (p *prober) arrived(topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.want != "" && topic == p.want {
		close(p.back)
		p.want = ""
	}
}

// expect registers the next probe's topic and returns the channel closed
// when it comes back.
func (p *prober) expect(topic string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.want = topic
	p.back = make(chan struct{})
	return p.back
}

// isDeaf reports whether the last probe was lost and none came back
// since; false with the probe off (nil).
func (p *prober) isDeaf() bool { return p != nil && p.deaf.Load() }

func (p *prober) forget() {
	p.mu.Lock()
	p.want = ""
	p.mu.Unlock()
}

// run probes until ctx ends (steps in the comment above).
func (p *prober) run(ctx context.Context) {
	done := ctx.Done()
	s := p.s
	interval, bound := s.cfg.ProbeInterval, s.cfg.ProbeTimeout
	log := s.log.With("probe_interval", interval, "probe_timeout", bound)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		// A transport repairing a drop it has seen needs no probe.
		if s.tr.State() != transport.Connected {
			continue
		}
		// 1. publish to ourselves.
		topic := p.prefix + nonce()
		back := p.expect(topic)
		sent := time.Now()
		pctx, cancel := context.WithTimeout(ctx, bound)
		err := s.tr.PublishToSelf(pctx, transport.Message{Topic: topic, Payload: []byte(`{"probe":true}`),
			UserProperties: map[string]string{PropTimestamp: strconv.FormatInt(sent.UnixMilli(), 10)}})
		cancel()
		if errors.Is(err, transport.ErrNoSelfDelivery) {
			p.forget()
			log.Warn("broker liveness probe off: this transport cannot deliver the worker's own messages back to it; "+
				"a session that stops delivering is not detected", "error", err)
			return
		}
		if err != nil {
			// Not a verdict on delivery: the transport sees and repairs
			// its own publish failures (or ctx ended).
			p.forget()
			log.Debug("broker probe not published", "error", err)
			continue
		}
		// 2. and 3. back within the bound, or deaf.
		timer := time.NewTimer(time.Until(sent.Add(bound)))
		select {
		case <-done:
			timer.Stop()
			return
		case <-back:
			timer.Stop()
			if p.deaf.CompareAndSwap(true, false) {
				log.Info("broker delivers again: the worker's probe came back", "round_trip_ms", time.Since(sent).Milliseconds())
			}
		case <-timer.C:
			p.forget()
			p.deaf.Store(true)
			s.metrics.BrokerReestablished.Inc()
			cause := fmt.Errorf("the worker's probe on %s did not come back within %v: the broker no longer delivers to this session", topic, bound)
			log.Error("broker session deaf: re-establishing it and its subscriptions (/readyz says broker \"deaf\" until a probe comes back)",
				"error", cause.Error())
			s.tr.Reestablish(cause)
		}
	}
}

// nonce is 8 random bytes in hex: one topic level, no wildcard characters.
func nonce() string {
	var b [8]byte
	rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}
