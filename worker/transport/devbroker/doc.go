// Package devbroker is str's dev-mode message broker: an embedded server
// (Server) and a client implementing transport.Transport (Client), both
// speaking the reference Secure Tool Runtime's dev broker protocol (spec §10)
// so that the reference's Python broker, its Python clients and str's Go side
// can be mixed freely.
//
// # The protocol
//
// TCP, no authentication, default port 55555. Each side sends UTF-8 JSON
// objects, one per line ('\n'; a trailing '\r' is ignored). Every request
// line gets exactly one response line, in order, on the same connection.
// Requests name their command in "cmd" (case-sensitive); unknown fields are
// ignored. A RECEIVE blocks its connection, so a client uses one connection
// for receiving and a second one for publishing, each with its own CONNECT.
//
// CONNECT — must come first; any other command before it is answered
// NOT_CONNECTED (after the JSON check: unparsable lines are always
// INVALID_COMMAND).
//
//	→ {"cmd":"CONNECT","client_id":"w1","queue_name":"q/w1","subscriptions":["ns/a2a/v1/sam_remote_tool/invoke/echo_tool"]}
//	← {"status":"OK","client_id":"w1"}
//
// client_id names the client; absent or null, the server makes up a UUID
// and returns it. queue_name is optional (str's broker: see queue groups
// below). subscriptions are topic patterns, registered before the reply is
// sent, so a message published after the reply is never missed. Connections
// with the same client_id share one client: one set of subscriptions, one
// queue; the client is forgotten (subscriptions and queued messages dropped)
// when its last connection closes. A second CONNECT on a connection moves
// the connection to the new client_id.
//
// SUBSCRIBE / UNSUBSCRIBE — add or remove one pattern of the client.
//
//	→ {"cmd":"SUBSCRIBE","topic_pattern":"ns/a2a/v1/discovery/>"}
//	← {"status":"OK"}
//
// PUBLISH — topic (required), payload (any JSON value; absent means null),
// user_properties (a JSON object; absent or null means {}). Values are
// passed through as sent, numbers included.
//
//	→ {"cmd":"PUBLISH","topic":"ns/a2a/v1/sam_remote_tool/invoke/echo_tool","payload":{"jsonrpc":"2.0"},"user_properties":{"replyTo":"ns/r/1","timestamp":1700000000123}}
//	← {"status":"OK","message_id":"6f1c…"}
//
// The message (one message_id for all its copies) goes, at publish time, to
// every other client with a matching subscription; never to the client_id
// that published it. Matching is transport.MatchDev: per "/" level, exactly
// "*" is one non-empty level, exactly ">" as the last level is the rest (at
// least one level), everything else is literal. There is no persistence: a
// message with no matching client is gone.
//
// RECEIVE — the next message queued for the client, waiting up to timeout_ms
// (default 5000; 0 or less polls).
//
//	→ {"cmd":"RECEIVE","timeout_ms":1000}
//	← {"status":"OK","message":{"message_id":"6f1c…","topic":"…","payload":{"jsonrpc":"2.0"},"user_properties":{"replyTo":"ns/r/1","timestamp":1700000000123}}}
//	← {"status":"TIMEOUT"}
//
// If the connection closes (or the server stops) during the wait, nothing is
// taken off the queue and no reply is sent.
//
// ACK — accepted and ignored (there is nothing to settle).
//
//	→ {"cmd":"ACK","message_id":"6f1c…"}
//	← {"status":"OK"}
//
// DISCONNECT — the reply, then the server closes the connection.
//
//	→ {"cmd":"DISCONNECT"}
//	← {"status":"OK"}
//
// Errors never close the connection:
//
//	← {"status":"ERROR","error_code":"INVALID_COMMAND","error_message":"Unknown command: FROB"}
//
// with error_code NOT_CONNECTED (no CONNECT yet), INVALID_COMMAND
// (unparsable JSON, not an object, invalid UTF-8, a line longer than the
// limit, unknown or missing cmd, a missing or mistyped field) or
// INTERNAL_ERROR.
//
// # What str's broker adds to the reference
//
// Queue groups: clients sharing a non-empty queue_name form a group, and
// each message goes to one matching member of the group, in turn (the
// members are taken in the order they connected), so several workers share
// the work without running a request twice. Clients with distinct queue
// names get the reference's behaviour: each gets a copy. Each client's queue
// is bounded (Options.QueueSize): when it is full the oldest message is
// dropped and logged. Request lines are bounded (Options.MaxLineBytes); a
// longer line is skipped up to its newline and answered INVALID_COMMAND.
// Malformed requests that crash or hang up the reference are answered
// INVALID_COMMAND. Several connections may share one client_id safely (the
// reference replaces the session and strands the first connection).
//
// # The client
//
// Client keeps a receiving connection (CONNECT with ClientID, QueueName and
// every subscription, then RECEIVE in a loop, with SUBSCRIBE and UNSUBSCRIBE
// sent between two RECEIVEs) and a publishing connection (CONNECT as
// PublisherID, by default ClientID+"-pub", with no subscriptions: against
// the reference broker a second CONNECT under the same id would steal the
// receiver's session). When either connection fails, both are closed and
// re-established every RetryDelay until Close, with the current
// subscription set in the new CONNECT. A payload that is valid JSON is
// published as that JSON value, anything else as a JSON string; on receipt a
// JSON string payload is handed over as its content and any other value as
// its JSON text. User property values that are not strings are handed over
// as their JSON text (1700000000123 becomes "1700000000123").
//
// # Security
//
// What it protects against: a misbehaving peer cannot crash the server,
// exhaust it with one unbounded line, or desynchronise other connections;
// every malformed request gets an error reply. What it does not protect
// against: anything else. There is no authentication, no encryption, no
// authorisation of topics (any peer can subscribe to ">" and read every
// request and reply, or publish forged invocations) and no bound on the
// number of connections or clients; memory per client is bounded only by
// QueueSize × MaxLineBytes. Listen on 127.0.0.1 or a private network and use
// Solace PubSub+ in production. What it trusts: every peer that can reach the
// port.
package devbroker
