package worker

import (
	"sync"
	"time"
)

// The outbox is the worker's outbound path for the answers the receive
// loop gives itself (a request refused before it is queued): the loop
// only queues them and goes on with the next delivery, so a broker that is
// slow to take one destination's messages, or refuses them, never holds
// the loop nor the dispatch lock (s.mu). In the manner of nats-server's
// per-client writeLoop: one writer goroutine per destination topic that
// has something to send, publishing that destination's messages in order;
// other destinations go on meanwhile. What waits is bounded: at most
// outboxMaxBytes of payload and outboxMaxDests destinations (so writers);
// a message beyond either bound is not queued (post returns false: the
// caller logs and counts it lost). A writer ends when its destination's
// queue is empty.
//
// The other answers have their own paths, none on the receive loop: a
// call's reply and status lines are published by its executor and its
// status relay, in that order (execute.go: the relay has drained before
// the reply goes out); a queued call cancelled is answered by a goroutine
// of its own (cancel); init answers and notices by the notice writer
// (init.go); tools listings by a bounded goroutine each (toolsinfo.go).
const (
	outboxMaxBytes = 8 << 20
	outboxMaxDests = 256
)

type outbox struct {
	s      *Server
	mu     sync.Mutex
	dests  map[string]*outQueue // destination topic -> its queue, while its writer runs
	bytes  int                  // payload bytes queued or being published
	closed bool
	wg     sync.WaitGroup // the writers
}

// outQueue is one destination's messages, oldest first.
type outQueue struct {
	msgs []outMessage
}

type outMessage struct {
	payload []byte
	// sent is called by the writer once the publish is done (err nil) or
	// has failed.
	sent func(err error)
}

func newOutbox(s *Server) *outbox {
	return &outbox{s: s, dests: map[string]*outQueue{}}
}

// post queues payload for topic and returns at once; sent is called when
// it has been published or has failed. false: not queued (a bound is
// reached, or the outbox is closed); sent is not called.
func (o *outbox) post(topic string, payload []byte, sent func(err error)) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	q := o.dests[topic]
	switch {
	case o.closed, o.bytes+len(payload) > outboxMaxBytes, q == nil && len(o.dests) >= outboxMaxDests:
		return false
	}
	o.bytes += len(payload)
	if q == nil {
		q = &outQueue{}
		o.dests[topic] = q
		o.wg.Add(1)
		go o.write(topic, q)
	}
	q.msgs = append(q.msgs, outMessage{payload: payload, sent: sent})
	return true
}

// write is topic's writer: it publishes q's messages in order until q is
// empty, then removes q (a later post starts a new writer).
func (o *outbox) write(topic string, q *outQueue) {
	defer o.wg.Done()
	for {
		o.mu.Lock()
		if len(q.msgs) == 0 {
			delete(o.dests, topic)
			o.mu.Unlock()
			return
		}
		m := q.msgs[0]
		q.msgs[0] = outMessage{}
		q.msgs = q.msgs[1:]
		o.mu.Unlock()
		// No lock is held across the publish.
		err := o.s.publish(topic, m.payload)
		o.mu.Lock()
		o.bytes -= len(m.payload)
		o.mu.Unlock()
		m.sent(err)
	}
}

// close stops taking messages and waits for the writers to publish what
// is queued, at most wait for the broker; then what still waits for it is
// abandoned (s.replyStop ends the publishes) and reported by each sent.
// Called by the shutdown once the receive loop has ended.
func (o *outbox) close(wait time.Duration) {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	done := make(chan struct{})
	go func() { o.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(wait):
		o.s.replyStop(errShutdown)
		<-done
	}
}
