// Package solace is the worker's transport to a Solace PubSub+ event broker
// (spec §11), behind the same transport.Transport interface as the dev
// broker. It is selected when SOLACE_HOST is set.
//
// # Modes
//
// Direct (SOLACE_DELIVERY_MODE=direct): the session subscribes to the
// invoke topics; subscriptions are added and removed at runtime when the
// manifest changes. Nothing is stored: a request published while the worker
// is down is lost, and when the worker falls BackPressureBuffer messages
// behind, the newest message is dropped (logged with the discard flag the
// library sets on the next message). Ack and Nack are no-ops.
//
// Guaranteed (the default): the worker binds to a durable queue
// ("{ns}/q/sandbox/{worker_id}", created on start if missing) and adds the
// invoke topics to it as queue subscriptions at runtime. A message is
// acknowledged only when the worker calls Delivery.Ack, after its reply was
// published (replies are published as persistent messages and Publish
// returns once the broker has acknowledged them); Delivery.Nack settles it
// as FAILED, so the broker redelivers it. Workers started with the same
// SOLACE_POOL_NAME bind to one provisioned non-exclusive queue
// ("{ns}/q/sandbox/pool/{pool}") and each request is delivered to one of
// them only (docs/solace.md).
//
// # Connection
//
// A failed first Connect is retried every ReconnectInterval with a new
// MessagingService (the library ends a service whose Connect failed) until
// the context ends. After a drop, the library reconnects ReconnectRetries
// times and re-applies the subscriptions; subscription changes made while
// the connection was down are reconciled after the reconnect. When the
// library gives up, the transport builds new services until Close. State
// follows the service's lifecycle events and feeds /readyz. Reestablish
// (the worker's probe found the session deaf) builds a new service the
// same way at once.
//
// The worker's probe (PublishToSelf) is a publish on the same session:
// a Solace broker hands a session its own messages unless "no local" is
// set, which str never sets (for the session or a queue's flow). The C
// library's peer-to-peer mode does not, so the probe cannot be tested
// there; with a pool (SOLACE_POOL_NAME) the shared queue could give the
// probe to another worker, so PublishToSelf refuses and the probe is off.
//
// # What it protects against, and what not
//
// It keeps the library's reserved properties apart from user properties
// (a "solace.messaging.*" key given as a user property is refused, since
// the library would read it as a message header) and carries payloads as
// byte arrays, never through the SDT string encoding. It does not
// authenticate requests (request signing is the worker's job, spec §13)
// and trusts the broker to route only messages the session subscribed to.
// TLS certificate validation is always on for tcps:// hosts.
//
// # What it needs
//
// cgo and the C library bundled with solace.dev/go/messaging v1.10.1;
// libssl3 at run time for TLS. Guaranteed mode needs a client profile that
// allows guaranteed receive and send and, for per-worker queues, endpoint
// creation (or a provisioned queue).
//
// # Tested
//
// Direct mode is tested over the C library's peer-to-peer mode (a service
// with host "listen:127.0.0.1:PORT", no broker): properties, payloads,
// runtime subscriptions, wildcards, reconnection and rebuilding. Guaranteed
// mode, queue binding, settlement, pool sharing and broker authentication
// exist only on a real broker; broker_test.go runs them when
// STR_SOLACE_URL is set and was not run on the machines str is developed on.
package solace
