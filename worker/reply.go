package worker

// The reply of a call: its size limit and its publish with retries.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/securetoolruntime/str/worker/transport"
)

// publishEnvelopeRoom is what a reply leaves of the transport's
// MaxMessageBytes for its topic, its user properties and the transport's
// framing (the dev broker's PUBLISH command around it); see maxReplyBytes.
const publishEnvelopeRoom = 64 << 10

// maxReplyBytes is the largest reply payload: the transport's message
// limit (its broker's, reported by the transport) less
// publishEnvelopeRoom. result.json gets the same cap; the encoded reply
// (tool_result plus execution time and created_artifacts) is checked
// again before it is published.
func (s *Server) maxReplyBytes() int { return s.tr.MaxMessageBytes() - publishEnvelopeRoom }

// Reply publishing: a reply is retried (backoff from replyRetryFirst up to
// replyRetryMax between attempts) until the task's deadline (receipt +
// timeout + 5 s) and for at least replyRetryWindow. Once the worker is
// stopping, a reply gets two attempts, so that a dead broker cannot hold a
// shutdown for the deadline of every queued request; and an attempt still
// waiting for the broker replyShutdownWindow after the grace period is
// abandoned (the reply is reported lost).
var (
	replyRetryWindow    = 30 * time.Second
	replyRetryFirst     = 100 * time.Millisecond
	replyRetryMax       = 5 * time.Second
	replyShutdownWindow = 5 * time.Second
)

// outcomeReplyFailed is the outcome label of an invocation whose reply
// could not be published.
const outcomeReplyFailed = "reply_failed"

// cancelTaskID reads a task id from a cancel payload, if any.
func cancelTaskID(payload []byte) string {
	var doc struct {
		TaskID string `json:"task_id"`
		Params struct {
			TaskID string `json:"task_id"`
		} `json:"params"`
	}
	if json.Unmarshal(payload, &doc) != nil {
		return ""
	}
	if doc.TaskID != "" {
		return doc.TaskID
	}
	return doc.Params.TaskID
}

// publishReply publishes a reply to the task's replyTo, retrying while the
// broker cannot be reached, until the task's deadline (receipt + timeout
// + 5 s) or for at least replyRetryWindow. A refusal by the broker (as
// the transport classifies it: transport.ErrRefused) is not retried.
func (s *Server) publishReply(t *task, payload []byte) error {
	deadline := t.received.Add(t.timeout + timeoutSlack)
	if least := time.Now().Add(replyRetryWindow); deadline.Before(least) {
		deadline = least
	}
	ctx, cancel := context.WithDeadline(s.replyCtx, deadline)
	defer cancel()
	wait := replyRetryFirst
	// One ID for every attempt of this reply (and only this one: an
	// agent may reuse a request id later).
	replyID := rand.Text()
	for attempt := 1; ; attempt++ {
		props := map[string]string{PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10)}
		if t.clamped != "" {
			props[PropProfileClamped] = t.clamped
		}
		// One ID for every attempt: a broker that took an attempt whose
		// answer was lost routes the next one no more (transport.Message.ID).
		err := s.tr.Publish(ctx, transport.Message{Topic: t.replyTo, Payload: payload, UserProperties: props, ID: replyID})
		if err == nil {
			if attempt > 1 {
				t.log.Info("reply published after retries", "attempts", attempt)
			}
			return nil
		}
		if errors.Is(err, transport.ErrRefused) {
			return err
		}
		if s.stopping.Load() && attempt >= 2 {
			return fmt.Errorf("worker stopping: reply not published after %d attempts: %w", attempt, err)
		}
		t.log.Warn("publishing the reply failed; retrying", "attempt", attempt, "retry_until", deadline.UTC().Format(time.RFC3339), "error", err)
		select {
		case <-ctx.Done():
			if s.replyCtx.Err() != nil {
				return fmt.Errorf("worker stopped: reply not published %v after the shutdown grace period (%d attempts): %w", replyShutdownWindow, attempt, err)
			}
			return fmt.Errorf("reply not published within the task's deadline (%d attempts): %w", attempt, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, replyRetryMax)
	}
}
