package solace

import (
	"context"
	"errors"
	"fmt"
	"testing"

	sol "solace.dev/go/messaging/pkg/solace"
	"solace.dev/go/messaging/pkg/solace/subcode"

	"github.com/securetoolruntime/str/worker/transport"
)

// TestClassify: the library's errors as Publish meets them (a NativeError
// with the broker's subcode, alone or wrapped in one of the library's
// error types, or one of those types alone) classified as a permanent
// refusal or as worth a retry.
func TestClassify(t *testing.T) {
	native := func(code subcode.Code) error { return sol.NewNativeError(fmt.Sprintf("subcode %d", code), code) }
	wrapped := func(kind sol.Error, cause error) error { return sol.NewError(kind, "library: "+cause.Error(), cause) }
	for _, c := range []struct {
		name    string
		err     error
		refused bool
	}{
		// The broker refuses the message for what it is.
		{"publish ACL denied", native(subcode.PublishAclDenied), true},
		{"message too large", native(subcode.MessageTooLarge), true},
		{"total size over the protocol's", native(subcode.MaxTotalMsgsizeExceeded), true},
		{"topic too long", native(subcode.TopicTooLarge), true},
		{"bad topic syntax", native(subcode.InvalidTopicSyntax), true},
		{"no guaranteed subscription", native(subcode.NoSubscriptionMatch), true},
		{"data rejected, other reason", native(subcode.DataOther), true},
		{"refusal inside the receipt's wrapper", fmt.Errorf("encountered error while publishing message: %w", native(subcode.PublishAclDenied)), true},
		{"refusal inside a library error", wrapped(&sol.IllegalStateError{}, native(subcode.MessageTooLarge)), true},
		{"illegal argument", wrapped(&sol.IllegalArgumentError{}, errors.New("nil destination")), true},
		{"setting out of range (a topic over 250 bytes)", wrapped(&sol.InvalidConfigurationError{}, native(subcode.ParamOutOfRange)), true},
		// The same message may be taken later.
		{"spool over quota", native(subcode.SpoolOverQuota), false},
		{"queue shut down", native(subcode.QueueShutdown), false},
		{"low priority congestion", native(subcode.LowPriorityMsgCongestion), false},
		{"standby replication", native(subcode.ReplicationIsStandby), false},
		{"communication error", native(subcode.CommunicationError), false},
		{"publisher overflow", wrapped(&sol.PublisherOverflowError{}, errors.New("would block")), false},
		{"not started", wrapped(&sol.IllegalStateError{}, errors.New("publisher terminated")), false},
		{"unreachable", wrapped(&sol.ServiceUnreachableError{}, errors.New("connection refused")), false},
		{"timeout", wrapped(&sol.TimeoutError{}, errors.New("no acknowledgement")), false},
		{"context", context.DeadlineExceeded, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := classify("solace: publish", "ns/reply/a", c.err)
			if got := errors.Is(err, transport.ErrRefused); got != c.refused {
				t.Fatalf("classify(%v): refused %v, want %v (%v)", c.err, got, c.refused, err)
			}
			var te *transport.Error
			if !errors.As(err, &te) || te.Topic != "ns/reply/a" {
				t.Fatalf("classify(%v) = %v: not a *transport.Error for the topic", c.err, err)
			}
			if !errors.Is(err, c.err) {
				t.Fatalf("classify(%v) = %v: the library's error is not kept", c.err, err)
			}
		})
	}
}

// TestMaxMessageBytes: the limit the transport reports (the default when
// unset) and what a message counts against it.
func TestMaxMessageBytes(t *testing.T) {
	tr := &Transport{}
	if got := tr.MaxMessageBytes(); got != DefaultMaxMessageBytes {
		t.Fatalf("MaxMessageBytes of an unset limit = %d, want %d", got, DefaultMaxMessageBytes)
	}
	tr.cfg.MaxMessageBytes = 2 << 20
	if got := tr.MaxMessageBytes(); got != 2<<20 {
		t.Fatalf("MaxMessageBytes = %d, want %d", got, 2<<20)
	}
	m := transport.Message{Topic: "t", Payload: make([]byte, 10), UserProperties: map[string]string{"ab": "cde"}}
	if n := messageSize(m); n != 1+10+2+3 {
		t.Fatalf("messageSize = %d, want 16", n)
	}
}
