// Package memory is an in-process message bus implementing
// transport.Transport, for tests that run the worker and its callers in one
// process.
//
// Routing follows str's embedded dev broker (spec §10): a published message
// goes to every other client with a subscription that matches under
// transport.MatchDev; the publishing client (by client id) never receives its
// own message; clients sharing a non-empty queue name form a group and each
// message goes to exactly one matching member of the group, in turn
// (round-robin). Every receiver gets its own copy of the payload and the user
// properties.
//
// PublishToSelf routes a message the same way with the publishing client
// included (the worker's liveness probe). Bus.Forget reproduces a broker
// that drops a session by client id: the client still looks connected but
// nothing is routed to it until its Reestablish.
//
// A message larger than the bus's limit (DefaultMaxMessageBytes, the dev
// broker's; SetMaxMessageBytes) is refused, as is one to a topic given to
// Bus.Refuse: the refusal matches transport.ErrRefused. Bus.Stall holds the
// publishes to one destination until released: a broker slow to take
// them.
//
// What it protects against: nothing; it runs inside the test process and
// trusts every caller. What it does not do: persistence, acknowledgement
// (Ack and Nack are no-ops), back-pressure (queues are unbounded), or any
// failure injection beyond Forget, Refuse and Stall; State is Connected
// from Connect until Close.
package memory
