// Package devbroker is the worker's transport over str's dev broker
// protocol (spec §10, specified in package broker, which also holds the
// embedded server): Client implements transport.Transport, against str's
// broker or the reference's Python one.
//
// Client keeps a receiving connection (CONNECT with ClientID, QueueName and
// every subscription, then RECEIVE in a loop, with SUBSCRIBE and UNSUBSCRIBE
// sent between two RECEIVEs) and a publishing connection (CONNECT as
// PublisherID, by default ClientID+"-pub", with no subscriptions: against
// the reference broker a second CONNECT under the same id would steal the
// receiver's session, and str's broker refuses it). Both CONNECTs carry the
// token from ClientOptions.Token or, read afresh before every attempt,
// ClientOptions.TokenFile. The receive loop sends an ACK on the publishing
// connection when it has carried nothing for ClientOptions.KeepAlive
// (default 1 min), so that a broker's idle timeout leaves it open. When
// either connection fails, both are closed and
// re-established every RetryDelay until Close, with the current
// subscription set in the new CONNECT; Reestablish does the same on
// request (the worker's probe found the session deaf). Close lets a
// RECEIVE in flight finish and publishes a message fetched but not yet
// handed to Receive again, as received, so that a stopping client gives
// it back (to its queue group) instead of losing it. Because the
// publishing connection has its own client id, a message the client
// publishes reaches its own receiving connection's subscriptions
// (PublishToSelf). A payload that is valid JSON is
// published as that JSON value, anything else as a JSON string; on receipt a
// JSON string payload is handed over as its content and any other value as
// its JSON text. User property values that are not strings are handed over
// as their JSON text (1700000000123 becomes "1700000000123").
package devbroker
