package solace

import (
	"errors"
	"fmt"

	sol "solace.dev/go/messaging/pkg/solace"
	"solace.dev/go/messaging/pkg/solace/subcode"

	"github.com/securetoolruntime/str/worker/transport"
)

// refusals are the subcodes with which the broker (or the library on its
// behalf) refuses a message for what it is: sent again, it is refused
// again, so the worker does not retry it. Each with the reason.
var refusals = map[subcode.Code]string{
	subcode.MessageTooLarge:         "larger than the broker takes",
	subcode.MaxTotalMsgsizeExceeded: "larger than the protocol carries",
	subcode.UserDataTooLarge:        "its user data is larger than the broker takes",
	subcode.TopicTooLarge:           "its topic is longer than the broker takes",
	subcode.InvalidTopicSyntax:      "its topic is not a valid Solace topic",
	subcode.TopicMissing:            "it has no topic",
	subcode.PublishAclDenied:        "the client's access list forbids publishing to its topic",
	subcode.NoSubscriptionMatch:     "no guaranteed subscription matches its topic (the receiver's queue is gone)",
	subcode.DataOther:               "the broker rejected it for a reason it does not enumerate",
}

// Not refusals, though the broker says no: subcode.SpoolOverQuota (the
// spool frees as messages are consumed), subcode.QueueShutdown (an
// administrator re-enables it), subcode.LowPriorityMsgCongestion,
// subcode.ReplicationIsStandby (fail-over) and subcode.OutOfResources: the
// same message may be taken a moment later, so they are retried as a
// lost connection is.

// classify wraps err, a failure of op on topic from the Solace library, as
// a transport.Error: Permanent for a refusal (a subcode of refusals, or an
// argument or message setting the library will never take), else worth a
// retry
// (disconnected, a timeout, the publisher's buffer full).
func classify(op, topic string, err error) error {
	var native *sol.NativeError
	if errors.As(err, &native) {
		if reason, refused := refusals[native.SubCode()]; refused {
			return transport.Refused(op, topic, fmt.Errorf("%s: %w", reason, err))
		}
	}
	// The library's own refusals of what it was given: an argument, or a
	// setting of the message out of range (a topic over 250 bytes comes
	// back as an InvalidConfigurationError, subcode ParamOutOfRange).
	var badArg *sol.IllegalArgumentError
	var badSetting *sol.InvalidConfigurationError
	if errors.As(err, &badArg) || errors.As(err, &badSetting) {
		return transport.Refused(op, topic, err)
	}
	return &transport.Error{Op: op, Topic: topic, Err: err}
}
