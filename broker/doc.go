// Package broker is str's embedded dev-mode message broker (Server, `str
// broker` and the worker's DEV_BROKER_EMBEDDED), speaking the reference
// Secure Tool Runtime's dev broker protocol (spec §10) so that the
// reference's Python broker, its Python clients and str's Go side can be
// mixed freely. It also holds what every peer of that protocol shares: the
// command and status names, the line framing (EncodeLine, ReadLine) and the
// token files. The Go client, a transport of the worker, is
// worker/transport/devbroker; this package imports no worker code but the
// topic matcher.//
// # The protocol
//
// TCP, default port 55555. Each side sends UTF-8 JSON
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
//	→ {"cmd":"CONNECT","client_id":"w1","queue_name":"q/w1","subscriptions":["ns/a2a/v1/sam_remote_tool/invoke/echo_tool"],"token":"9f86…"}
//	← {"status":"OK","client_id":"w1"}
//
// client_id names the client; absent or null, the server makes up a UUID
// and returns it. queue_name is optional (str's broker: see queue groups
// below). subscriptions are topic patterns, registered before the reply is
// sent, so a message published after the reply is never missed. token is
// str's extension (see Authentication below); the reference broker ignores
// it, as it ignores every unknown field. One connection holds a client_id
// at a time (str's broker; see below); the client is forgotten
// (subscriptions and queued messages dropped) when its connection closes. A
// second CONNECT on a connection moves the connection to the new client_id.
//
// A refused CONNECT is answered, and then the server closes the connection
// (the one exception to "errors never close the connection" below):
//
//	← {"status":"ERROR","error_code":"NOT_CONNECTED","error_message":"CONNECT refused: missing or wrong token (…; it is in /run/str/broker-55554.token, readable by the broker's user only)"}
//	← {"status":"ERROR","error_code":"NOT_CONNECTED","error_message":"CONNECT refused: client_id \"w1\" is already connected on another connection (…)"}
//
// NOT_CONNECTED is the spec's code for "this connection has no session",
// which is what a refused CONNECT leaves; clients treat any ERROR as failure.
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
// publish_id (str's extension, optional, at most MaxPublishIDBytes): the
// publisher's name for the message, the same on each retry of it. A
// PUBLISH under a publish_id its client_id used lately (its last 1,024,
// kept for the 64 client_ids that published last) is answered OK with the first message_id and
// not routed again, also on the client's next connection: a PUBLISH the
// broker took just before a connection was cut, whose answer never came
// back, is retried by the client without a second copy (test/fleet found
// a reply answered twice). str's client sends one on every PUBLISH; the
// reference broker ignores it.
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
// # Authentication (str's extension)
//
// str's broker requires a token in every CONNECT unless it was started
// anonymous. The token is 32 bytes from crypto/rand in hex (64 characters),
// made fresh at every start (NewToken). It travels as the CONNECT's "token"
// string field, the one place in spec §10 where an extra field is
// compatible: the reference broker ignores unknown fields and the reference
// clients send none, so a str client works against the reference broker and
// a reference client works against `str broker --anonymous`. The comparison
// is constant-time. Missing, null, non-string or wrong: refused as above.
// Every CONNECT of a connection is checked, the second one included.
//
// The token file. The broker writes the token, followed by a newline, mode
// 0600, atomically (temporary file and rename; WriteTokenFile), before its
// first client can have read anything, and removes it at exit if it still
// holds its token (RemoveTokenFile). The path, for the broker listening on
// PORT (DefaultTokenFile, TokenFileFor):
//
//	$DEV_BROKER_TOKEN_FILE                   when set (and --token-file for str broker and str invoke)
//	/run/str/broker-PORT.token               when running as root (euid 0)
//	$XDG_RUNTIME_DIR/str/broker-PORT.token   otherwise, when XDG_RUNTIME_DIR is set
//	$TMPDIR/str-UID/broker-PORT.token        otherwise (TMPDIR defaults to /tmp)
//
// The directory is created 0700 when missing, and refused when it is a
// symlink, owned by another uid or writable by group or others (so another
// local user cannot pre-create /tmp/str-UID to read or swap the token). The
// port is in the name so that several brokers on one host keep their
// tokens apart. Readers trim white space and accept at most 4096 bytes.
//
// Who writes and who reads. `str broker` writes the file (--token-file, or
// the default above; --anonymous writes none and requires no token);
// `str worker --embedded-broker` writes it for its embedded broker, which
// always requires the token. `str worker` (DEV_BROKER_HOST), `str invoke`
// and `str bench echo` read the file of the port they connect to before
// every connection attempt (ClientOptions.TokenFile), so a restarted broker's
// new token is picked up; when the file does not exist they send no token,
// which suits an anonymous or reference broker. So only the broker's own
// user (root for a root worker) and whoever it hands the file to can
// connect; a process that can reach the port but not read the file (another
// local user, a sandboxed tool sharing the host's network) cannot. The
// reference's own clients send no token: run `str broker --anonymous` for
// them, knowingly.
//
// # What str's broker adds to the reference
//
// Queue groups: clients sharing a non-empty queue_name form a group, and
// each message goes to one matching member of the group, in turn (the
// members are taken in the order they connected), so several workers share
// the work without running a request twice. Clients with distinct queue
// names get the reference's behaviour: each gets a copy.
//
// Bounded queues: each client's queue is bounded in messages
// (Options.QueueSize, default 10000) and in bytes (Options.MaxQueueBytes,
// default 64 MiB, counting topic, payload, user properties and message id
// plus 128 bytes per message). A message that does not fit drops the oldest
// queued messages until it does; a message larger than the byte bound by
// itself is dropped instead. Drops are counted per client and logged as a
// warning on the first drop and every 100th, with the running total, so a
// slow or stuck subscriber costs at most the bound and never disconnects.
// Request lines are bounded (Options.MaxLineBytes); a longer line is
// skipped up to its newline and answered INVALID_COMMAND. Malformed
// requests that crash or hang up the reference are answered
// INVALID_COMMAND.
//
// Connection bounds: the listening socket has TCP_DEFER_ACCEPT, so the
// kernel hands a connection to the broker when its first bytes arrive (or
// about a second after the handshake, if it sends none; until then it
// costs the broker nothing). Before its CONNECT (and token check) a
// connection may send request lines of at most Options.LoginLineBytes
// (default 4 KiB; a longer line is answered INVALID_COMMAND and the
// connection closed, the rest unread) and must complete the CONNECT within
// Options.LoginTimeout of its accept (default 10 s; other commands,
// answered NOT_CONNECTED, do not extend it). Lines before the CONNECT are
// read one at a time, so a request pipelined right behind the CONNECT gets
// MaxLineBytes. At most Options.MaxUnauthenticated connections (default
// 64) wait for their CONNECT, and at most Options.MaxConns are open in all
// (default a quarter of the process's RLIMIT_NOFILE soft limit, at least
// 16, so that broker clients cannot take the descriptors sandboxes need).
//
// When a new connection finds either bound reached, one connection waiting
// for its CONNECT gives way to it (is closed; counted as Stats.GaveWay), so
// that a client without the token, opening connections as fast as it can,
// cannot keep out one with the token (TestPreLoginFloodCannotLockOut; when
// newcomers were refused instead, such a flood let 4 of 20 logins in). Which
// one gives way: first a connection whose first line has been answered and
// which still has no session (a client with the token sends its CONNECT
// first, so this is never one); then one from the peer address holding
// the most waiting connections (a flood from one host makes room from its
// own; on loopback every peer is 127.0.0.1, so this cannot be the only
// defence); then the oldest. A connection never gives way while its first
// line is unread in its socket or read and not yet answered: with
// TCP_DEFER_ACCEPT a client's CONNECT is in its socket when it is
// accepted, so a client with the token loses its place only if its
// CONNECT line arrives in pieces and the flood turns all the places over
// between them (a CONNECT is one segment in practice: a few hundred bytes).
// When no waiting connection may give way yet (every one has its first
// line unread or unanswered, which lasts as long as reading and answering
// one line), the broker accepts nothing until one may, and new
// connections wait in the kernel's accept queue. When MaxConns are open
// and none of them waits for its CONNECT, a new connection is accepted and
// closed at once: connected clients are never pushed out.
//
// A connected client that sends no request for Options.IdleTimeout
// (default 10 min) is closed; the clock
// runs only between a reply and the next request, so a RECEIVE waiting up
// to its maximum (1 h) is not idle. Every refusal and close is counted and
// logged (a warning on the first and every 100th of each kind). There is
// no cap per peer user: TCP carries no credentials (SO_PEERCRED is for Unix
// sockets); after the token check the cap per client_id is one (below).
//
// One connection per client_id: a CONNECT claiming a client_id that
// another connection holds is refused (and its connection closed), so a
// peer cannot join a worker's client to take its share of a queue group,
// read its requests, unsubscribe it or subscribe its publishing connection
// to a flood. (The reference replaces the session and strands the first
// connection.) The id is free again once its connection has closed; a
// client reconnecting after a drop is refused until the broker has seen
// the old connection end, and retries. (Options.ReferenceSessions restores
// the reference's way, for tests of what a client must survive there: the
// id is taken over, and the old connection's end later forgets the new
// session's registration, leaving it connected and deaf.)
//
// # Security
//
// What it protects against: a peer that cannot read the token file (another
// local user; a tool whose sandbox shares the host's network but not its
// files) cannot CONNECT, hence cannot read, forge, or divert any message; a
// peer cannot take over or join a connected client_id; a peer without the
// token cannot keep one with it from logging in by taking every place
// before CONNECT; a slow or stuck
// subscriber holds at most QueueSize messages and MaxQueueBytes bytes; a
// misbehaving peer cannot crash the server, exhaust it with one unbounded
// line, or desynchronise other connections; every malformed request gets an
// error reply.
//
// What it does not protect against: anyone holding the token (it is one
// shared secret, not per-client credentials) may subscribe to ">" and read
// every request and reply, or publish forged invocations: there is no
// authorisation of topics. There is no encryption (the token crosses the
// network in clear text off loopback). Connections are bounded in number (all,
// and those not yet CONNECTed), in time (to CONNECT, and idle after) and, before
// CONNECT, in line length, so an unauthenticated peer holds at most
// MaxUnauthenticated connections of LoginLineBytes each for LoginTimeout,
// and gives them up to newcomers, a client with the token among them;
// subscriptions per client are not bounded, and total memory after CONNECT is
// bounded per client and by MaxConns.
// With --anonymous, everything above that relies on the token is gone.
// Listen on 127.0.0.1 or a private network and use Solace PubSub+ in
// production. What it trusts: whoever can read the token file (and, when
// anonymous, every peer that can reach the port).
package broker
