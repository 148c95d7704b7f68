// Package worker is `str worker`: it receives tool invocations from a
// broker, runs each tool (a Python function named by the manifest) in a
// fresh sandbox made by the launcher, relays the tool's status lines,
// stores its output artifacts and replies. It is wire-compatible with the
// reference Secure Tool Runtime (../shared/spec/str-protocol.md).
//
// # The broker protocol, message by message
//
// base = SAM_NAMESPACE without trailing "/" + "/a2a/v1". Every payload is
// compact UTF-8 JSON; every message the worker publishes carries the user
// property "timestamp" (epoch milliseconds, as a string).
//
//  1. Subscriptions (all sent inside the transport's connect, so a request
//     published the moment the worker appears is not missed):
//     {base}/sam_remote_tool/invoke/{tool}, .../init/{tool} and
//     .../init_request/{tool} for every manifest entry, served or
//     unavailable (see 7), {base}/sam_remote_tool/cancel/>,
//     {base}/discovery/> (ignored) and {base}/str/v1/tools/request (the
//     str tools listing).
//
//  2. Invoke request, agent → worker, on {base}/sam_remote_tool/invoke/{tool}:
//
//     {"jsonrpc":"2.0","id":"<id>","method":"sam_remote_tool/invoke",
//     "params":{"task_id","tool_name","app_name","user_id","session_id",
//     "args":{},"tool_config":{},"preloaded_artifacts":{p:{filename,content(base64),mime_type,version}},
//     "artifact_references":{p:{filename,version?}},"timeout_seconds":300,"sandbox_profile":"standard"}}
//
//     User properties: replyTo (required: without it the request is logged,
//     acked and not answered), statusTo (optional), clientId, userId,
//     timestamp and signature (both required when STR_SIGNING_SECRET or
//     STR_SIGNING_KEYS is set; see "Request signing" below), keyId (a key
//     of STR_SIGNING_KEYS), authToken (a user token, STR_USER_TOKEN_KEYS).
//     The checks, in order: replyTo present, a {base}/sam_remote_tool/response/{agent}/…
//     topic and statusTo a …/status/{agent}/… one (else logged and acked,
//     not answered); signature, and the signed clientId the {agent} of
//     both (AUTHENTICATION_FAILED, not answered); payload size (STR_MAX_PAYLOAD_BYTES, default
//     10 MB) and JSON-RPC shape, required fields, types, safe names
//     (task_id, user_id, session_id: no "/", "\", "..", control
//     characters, bounded length; session_id not "user", which the
//     artifact store reserves for "user:" artifacts; filenames also not
//     absolute) — all problems in one INVALID_REQUEST; tool_name equal to
//     the topic's tool; the requester (auth.go: the signed userId equal to
//     params.user_id, what a key may claim, the user token; AUTHENTICATION_FAILED,
//     answered only when the signature verified); a manifest entry that
//     failed its checks is TOOL_NOT_AVAILABLE with the manifest's reason
//     ("Tool '<t>' is not available on this worker: its manifest entry is
//     invalid: line 12: tools.<t>.runtime: ..."); the tool in the manifest
//     (else TOOL_NOT_AVAILABLE, message "Tool '<t>' is not available on
//     this worker", and the topic unsubscribed); the per-user rate limit (RESOURCE_EXHAUSTED); the
//     profile, tighten-only: the ceiling is the manifest tool's
//     sandbox_profile, else SANDBOX_DEFAULT_PROFILE; the call runs with
//     the stricter of the ceiling and the request's sandbox_profile
//     (permissive ⊃ standard ⊃ restrictive ⊃ confidential; the aliases
//     trusted and untrusted are permissive and restrictive; a profile
//     loaded from SANDBOX_PROFILE_DIR is comparable only with itself, so
//     under or against one the ceiling wins): a looser request is
//     clamped, never refused and never honoured, logged at debug, and
//     its reply carries the user property strProfileClamped
//     ("asked->used"); an unknown name is INVALID_REQUEST; a ceiling the
//     worker cannot use is TOOL_NOT_AVAILABLE; no
//     other execution with the same task id or request id
//     (INVALID_REQUEST; one of another requester's is refused without an
//     answer, its replyTo being that requester's); a free place in the queue (RESOURCE_EXHAUSTED).
//     The timeout is the request's (else DEFAULT_TIMEOUT_SECONDS) bounded by
//     the manifest's timeout_seconds (default 300); the sandbox's wall clock
//     limit is that + 5 s, itself bounded by the profile (callTimeout, the
//     one place; the sandboxes refuse more). When an executor
//     takes the request from the queue, the tool is looked up again: gone
//     from the manifest, or its module missing or unreadable by the
//     sandbox, is TOOL_NOT_AVAILABLE (the worker's fault, never
//     INVALID_REQUEST); changed, its profile and timeout are chosen again.
//     Names from the wire (tool names, ids, topics) are cut to 128 bytes,
//     at a rune boundary, wherever a message or log line repeats them.
//
//  3. Status notification, worker → agent, on the request's statusTo, one
//     per line the tool writes to its status FIFO, in order, all before
//     the reply:
//
//     {"jsonrpc":"2.0","method":"sam_remote_tool/status","params":{"task_id":"<task_id>",
//     "status_text":"…","timestamp":"2026-02-09T12:34:56.789012+00:00"}}
//
//     Bounds per task: a line is cut to 64 KiB; at most 10,000 lines and
//     16 MiB of status text are relayed; lines read from the FIFO wait for
//     their publish in a queue of at most 1 MiB. While that queue is full
//     the worker stops reading the FIFO, so the tool's status writes block
//     until the broker catches up (back-pressure, as the reference's
//     synchronous publish slows the tool): no line within the bounds is
//     lost, a slow subscriber costs the worker at most 1 MiB per task, and
//     the tool's timeout still ends a tool blocked writing. A line beyond
//     the line or byte bound is dropped: the first drop is logged with its reason, the count
//     (status_lines_dropped, status_bytes_dropped) is logged at the end,
//     and one last status line "[str] N status lines (B bytes) were
//     dropped: <reason>" tells the agent. A status publish that fails (the
//     broker unreachable for the whole 30 s wait) ends the task's status
//     publishing: that line and every later one are read and counted in
//     str_worker_status_lines_lost_total without waiting for the broker
//     again, and the failure is logged once; the reply is still sent.
//
//  4. Reply, worker → agent, on exactly the request's replyTo, once. Success:
//
//     {"jsonrpc":"2.0","id":"<id>","result":{"tool_result":{…},"execution_time_ms":N,
//     "timed_out":false,"created_artifacts":[{"filename","version","mime_type","size_bytes"}]}}
//
//     plus, only when output files were not stored because their names
//     break the filename rule (artifacts.CheckFilename: control
//     characters, invalid UTF-8, separators, …) or because they are
//     user-scoped ("user:…") and the tool's manifest entry does not say
//     artifacts: {user_scope: write}, str's own member
//     "skipped_outputs":[{"filename","reason"}]; every other reply is
//     byte-identical to the reference's. Outputs are all or nothing:
//     every output is read and checked (count, total size, name, scope,
//     mime type) before any is saved, so a call that fails on its
//     outputs stores none of them; a store failure part-way (which
//     cannot be undone: versions are never removed) is an ARTIFACT_ERROR
//     naming each output already saved and its version. A mime type the
//     tool gave that breaks artifacts.CheckMimeType (more than 255 bytes,
//     not RFC 6838 type/subtype with optional parameters) is replaced by
//     the extension's and logged. tool_result is nested at most 512
//     levels (else TOOL_ERROR) and has invalid UTF-8 replaced by U+FFFD
//     (logged); a reply over 16 MiB − 64 KiB (the dev broker's line less
//     the PUBLISH envelope) is a TOOL_ERROR.
//
//     Timeout (a result, not an error; agents map it to SANDBOX_TIMEOUT):
//
//     {"jsonrpc":"2.0","id":"<id>","result":{"tool_result":{},"execution_time_ms":N,"timed_out":true,"created_artifacts":[]}}
//
//     Error ("data" only when set; id "unknown" when unreadable):
//
//     {"jsonrpc":"2.0","id":"<id>","error":{"code":"<CODE>","message":"…"}}
//
//     An error message names the worker's directories as the agent may
//     know them, never by their host paths (agentpaths.go): the call's
//     work dir (and any other under SANDBOX_WORK_DIR) is /work, the tools
//     dir <tools>, the runner <str runner>, the site dir <site-packages>,
//     the artifact store <artifact store>; tracebacks and stderr tails
//     included. The worker's log keeps the full message.
//
//     A reply (success or error) to a call whose sandbox_profile was
//     clamped carries the user property strProfileClamped ("asked->used").
//
//     Codes: TOOL_NOT_AVAILABLE, INVALID_REQUEST, IMPORT_ERROR (module or
//     function missing, sha256 mismatch, package install failed),
//     EXECUTION_ERROR (the tool raised), TOOL_ERROR (the tool raised
//     ToolError), SANDBOX_FAILED (setup step named; OOM kill; pids limit;
//     no result), ARTIFACT_ERROR (input missing/unreadable, output not
//     saved), RESOURCE_EXHAUSTED (queue full, rate limit, disk space,
//     shutting down), AUTHENTICATION_FAILED, CANCELLED, INTERNAL_ERROR.
//     A reference to a user-scoped artifact ("user:…", also after NFKC)
//     by a tool whose manifest entry says artifacts: {user_scope: none}
//     is an ARTIFACT_ERROR naming the permission (read, the default, and
//     write allow it).
//     execution_time_ms runs from receipt (queueing included) to the tool's
//     exit. The request is acked only after the reply is published; a
//     reply is retried while the broker cannot be reached, until the
//     task's deadline (at least 30 s), and one the broker refuses is
//     replaced by INTERNAL_ERROR; either way the invocation is counted
//     with outcome "reply_failed". A reply that never reached the broker
//     (nor its INTERNAL_ERROR replacement) is lost: logged "reply lost: the
//     agent got no answer" and counted in str_worker_replies_lost_total.
//
//  5. Cancel, agent → worker, on {base}/sam_remote_tool/cancel/{id}: id is
//     the request's JSON-RPC id (or its task id; a payload {"task_id":…}
//     is also read). A queued request is answered at once, a running
//     sandbox is killed; either way the reply is the error CANCELLED. A
//     call whose result was complete (the runner's done signal, or the
//     tool's own exit with a result) before the cancel, or before the end
//     of the shutdown grace period, is answered with that result instead.
//     With an identity mode on, a cancel is signed (or carries a token)
//     like an invoke, and is honoured only from the task's requester.
//
//  6. Notices, worker → all, queued for one writer goroutine so that
//     neither the receive loop nor a reload waits on the broker (a full
//     queue of 1024 drops one, logged): {"jsonrpc":"2.0","method":
//     "sam_remote_tool/removed","params":{"tool_name":"<tool>"}} on
//     {base}/sam_remote_tool/removed/{tool} when a reload drops an entry;
//     {"jsonrpc":"2.0","method":"sam_remote_tool/init","params":{"tool_name",
//     "description"}} on {base}/sam_remote_tool/init/{tool} at start-up
//     and for each tool a reload adds (or repairs), for tools with a
//     description (spec §14, the reference's newer generation).
//
//  7. Init requests of class-based tools (spec §14), agent → worker, on
//     {base}/sam_remote_tool/init/{tool} (method sam_remote_tool/init,
//     the older generation) or .../init_request/{tool}
//     (sam_remote_tool/init_request, the newer), params {tool_name,
//     tool_config}, user property replyTo. A message there without an id
//     is a notification (an init broadcast) and is ignored. The runner
//     describes the class in init mode inside a sandbox of the tool's
//     profile ceiling (at most 60 s and the tool's timeout; at most
//     SANDBOX_MAX_CONCURRENT runs at a time), and the reply carries the
//     generation's own fields: older {tool_name, tool_description,
//     parameters_schema, ctx_facade_param_name}; newer {tool_name,
//     description, parameters, artifact_params, instructions,
//     config_schema, ctx_facade_param_name} (absent ones omitted). Errors:
//     INIT_ERROR "Init failed: <why>"; TOOL_NOT_AVAILABLE for a tool that
//     is not class-based, not in the manifest, or unavailable (with the
//     reason); INVALID_REQUEST, AUTHENTICATION_FAILED (when signing is on)
//     and RESOURCE_EXHAUSTED as for invokes. Descriptions are cached per
//     (tool, tool_config, module source hash). Details: init.go.
//
//  7. Tools listing (str's own, for `str tools` and `str invoke`; outside
//     the reference's sam_remote_tool/ space), client → worker on
//     {base}/str/v1/tools/request, any payload, user property replyTo,
//     which must lie under {base}/str/v1/tools/reply/ (else the request is
//     logged and dropped: the listing cannot be aimed at an agent's reply
//     topic). With STR_SIGNING_SECRET set the request is signed as an
//     invoke is (same eight fields, topic = the request topic), else the
//     answer is an AUTHENTICATION_FAILED error. Each worker answers, from
//     outside the receive loop, at most 4 at a time (more are dropped):
//
//     {"version":1,"worker_id":"w1","tools":[{"name":"echo_tool","description":"…",
//     "profile":"standard","network":"allow_egress","allowed_hosts":[…],"warm":0,
//     "timeout_seconds":300,"unavailable":"<why, when it cannot work>"}]}
//
//     or {"version":1,"worker_id":"w1","tools":[],"error":{"code":"AUTHENTICATION_FAILED","message":"…"}}.
//     profile is the ceiling, network the profile's policy narrowed by the
//     manifest's network:, warm the pool size wanted.
//
// # Request signing (str-sign-v2, str-sign-v3)
//
// When STR_SIGNING_SECRET or STR_SIGNING_KEYS is set, every invoke and
// cancel must carry two user properties, and anything else is
// AUTHENTICATION_FAILED (the older payload-only signature is not
// accepted):
//
//   - timestamp: the sending time, integer milliseconds since the Unix
//     epoch, in decimal ("1700000000000");
//   - signature: lowercase (any case is read) hex of
//     HMAC-SHA256(key = the secret's UTF-8 bytes, message = S).
//
// S is these eight fields joined by a single "\n" (0x0A), with no trailing
// newline, each as its UTF-8 bytes:
//
//  1. the literal "str-sign-v2";
//  2. the timestamp property, exactly as sent;
//  3. the topic the request is published to
//     ({base}/sam_remote_tool/invoke/{tool});
//  4. the replyTo property;
//  5. the statusTo property;
//  6. the clientId property;
//  7. the userId property;
//  8. the lowercase hex SHA-256 of the payload bytes exactly as sent.
//
// Signed with a key of the keys file (STR_SIGNING_KEYS), the request
// carries the key's id in the keyId property, the HMAC key is that key's
// secret, and S has nine fields: "str-sign-v3", the keyId, then fields
// 2-8 above.
//
// An absent property is the empty string. A field containing "\n" cannot
// be signed and the request is refused. In Python:
//
//	s = "\n".join(["str-sign-v2", ts, topic, reply_to, status_to or "",
//	               client_id or "", user_id or "", hashlib.sha256(payload).hexdigest()])
//	sig = hmac.new(secret.encode(), s.encode(), hashlib.sha256).hexdigest()
//
// The worker checks, in order: signature present (64 hex digits);
// timestamp present, an integer, at most 5 minutes (SigningWindow) before
// or after the worker's clock; the HMAC, compared in constant time; then
// that the same signature has not been accepted within the last 10
// minutes (twice the window: the span in which the same timestamp stays
// acceptable). So a request replayed verbatim, replayed later, or replayed
// with another replyTo, statusTo, clientId, userId or topic is refused.
// Clocks of agents and workers must agree within the window. The seen
// signatures live in the worker's memory: a restarted worker, or another
// worker of the pool, does not know them; a broker redelivery of a
// request the worker already accepted is refused as a replay.
// worker.SignMessage implements the client side (str invoke
// --signing-secret and --key-id use it). A valid signature is not all:
// the signed userId must equal params.user_id, the signed clientId the
// agent of replyTo, and a key may claim only its apps, users and tools
// (auth.go; docs/deployment.md "Requester identity").
//
// # One execution (spec §7)
//
// The sandbox is created (not started) with its work dir
// {SANDBOX_WORK_DIR}/call-{16 random hex}/, which the launcher makes
// (launcher.Provider, step L9, launcher/workdir.go: a name generated from
// the worker's prefix, never the task id; created exclusively and marked;
// removed only while still the dir made; stale ones swept at startup,
// launcher.SweepWorkDirs, only with the marker). The worker mounts and
// chowns nothing. In root mode the launcher mounts a tmpfs of the work
// dir's own on it (source
// "str-workdir", nosuid, nodev, mode 0700, owned by the sandbox's host
// ids; size= and nr_inodes= from the profile's work_dir: restrictive and
// confidential 256Mi / 65536 inodes, standard 1Gi / 262144, permissive
// 4Gi / 1048576), so a tool that fills it gets ENOSPC and no other task
// or host filesystem is touched; its pages are charged to the memory
// cgroup of whoever writes them, the tool's for what it writes (so the
// profile's memory limit bounds it too), the worker's for the inputs,
// which count against the cap. It is unmounted (MNT_DETACH) at teardown,
// after the outputs are stored; the warm pool's work areas and the
// start-up probe get one the same way, and the start-up sweep unmounts
// those a SIGKILLed worker left (str-workdir tmpfs mounts directly under
// SANDBOX_WORK_DIR, read from /proc/self/mountinfo) before removing the
// stale dirs. ROOTLESS MODE CANNOT MOUNT ON THE HOST: there the work dir
// stays a plain, UNCAPPED bind of a host directory (the worker says so
// loudly at start-up); put SANDBOX_WORK_DIR on a filesystem of its own
// or with quotas. Then the
// dir gets input/ (worker-owned), output/ and .str/, the runner's
// directory, on a small tmpfs of its own in root mode (64 MiB, 16 inodes,
// off the tool's cap, so a tool that fills its work dir still returns its
// result) holding runner_args.json, result.json and the FIFO status.pipe
// (0600); the dir, output/, .str/ and the FIFO belong to that sandbox's
// own host uid; every
// mode is set explicitly, whatever the umask. A sandbox created but not
// started is killed on every error path. The sandbox's stderr is kept
// (last 8 KiB) for the log; a SANDBOX_FAILED message ends with only its
// last 300 bytes, after a "--- tool stderr ---" marker line. Inputs are written O_EXCL|O_NOFOLLOW
// to input/<filename>; two parameters naming one file (an artifact passed
// in a list and alone) share it when their bytes are the same, and are
// INVALID_REQUEST when not (the reference's last write would give one the
// other's bytes). runner_args.json is written;
// the FIFO's read end is opened (non-blocking) and a worker-held write end
// keeps it from reaching EOF until the sandbox is gone, after which it is
// drained to EOF, so no status line is lost. The launcher runs
// [python, runner.py, --done-fd, 3, .str/runner_args.json] with the tools
// and runner dirs, and the site dir of the tool's declared package if it
// has one (packages.go), bound read-only and PYTHONPATH=<tools>[:<site>];
// descriptor 3 is the done pipe, on which the runner writes one byte once
// result.json is complete (renamed into place). Reply before teardown:
// on that byte the worker relays the status lines already in the FIFO
// (non-blocking, no wait for EOF: a process of the tool may still hold a
// write end), reads result.json and stores the outputs while the sandbox
// may still be exiting; without the byte (the runner died, or
// SANDBOX_MODE=none, which has no done pipe) or when result.json is then
// unreadable (a tool can write on the descriptor too), it waits for the
// sandbox's end as before. result.json is read without following
// symlinks; outputs are the top-level regular files of output/, opened
// through a directory fd with O_NOFOLLOW|O_NONBLOCK (the tool may still
// run: no path it can change is followed, a FIFO or a leased file cannot
// block the read), fstat'ed as regular files, read up to the remaining
// budget (a file growing meanwhile cannot exceed it), capped in count and
// total size (STR_MAX_OUTPUT_BYTES), saved to the artifact store. Then:
// reply, ack, and only then the sandbox is killed if still there, waited
// for (cgroup removed) and the work dir removed. At most
// SANDBOX_MAX_CONCURRENT run at once (a sandbox being torn down still
// counts); up to SANDBOX_MAX_QUEUED wait. Each requester (task.who) has
// a share of both, STR_USER_MAX_RUNNING and STR_USER_MAX_QUEUED, and a
// free slot goes to the requesters with calls waiting in turn (sched.go).
//
// # The warm pool
//
// A tool may keep sandboxes started ahead of its calls: warm: N in its
// manifest entry (0..16), else STR_WARM_DEFAULT (default 0). A pooled
// sandbox is an ordinary one (nothing is shared or reused; each serves
// one call and is destroyed) whose work dir is a fresh work area
// {SANDBOX_WORK_DIR}/.warm-<random> and whose runner runs in warm mode:
// it imports the tool's module ahead of time and waits for the call's
// runner arguments on descriptor 3. A call of that tool with the
// manifest's profile takes the oldest one that is alive, younger than
// STR_WARM_MAX_AGE_SECONDS (default 120) and whose module file has not
// changed since (the sha256, when set, is checked for every call as
// always); else it runs cold, as above. A pooled sandbox waits unarmed
// (killed by its sandbox a minute after the max age if the pool has not
// recycled it); the claim arms the call's own wall clock, counted from
// the claim, so a call asking the profile's whole limit (the reference
// agent's standard/300 s) is served warm too. Its inputs go through the
// input/ descriptor the worker holds, its arguments over the pipe; its
// cancellation counts from the claim as well. STR_WARM_MEMORY (default 4Gi) bounds the pool, each pooled
// sandbox counted at its profile's memory limit. The pool follows
// manifest reloads (a changed or removed tool's sandboxes are killed)
// and is emptied at shutdown. Metrics: str_worker_warm_hits_total,
// _misses_total, _discarded_total{reason}, _refill_seconds, _pool_size,
// _pool_ready (those whose runner has imported the tool), _memory_bytes.
// Details: pool.go.
//
// # Operations
//
// Configuration: see ConfigUsage (flags > environment > file > defaults).
// Relative paths (TOOLS_PYTHON_DIR, MANIFEST_PATH, SANDBOX_WORK_DIR, ...)
// are resolved against the working directory at start-up, like any path
// on a command line. /healthz (alive), /readyz and /metrics on
// HEALTH_ADDR:HEALTH_PORT (127.0.0.1:8081 by default; HEALTH_ADDR=0.0.0.0
// for every interface).
//
// /readyz answers {"ok","broker","faults","degraded","unavailable_tools"}
// (the last three omitted when empty), 200 when connected, taking work
// and without a fault, else 503. "broker" is "connected", "disconnected"
// or "deaf": the broker looks connected but the worker's probe message,
// sent to itself through its own subscription every
// STR_BROKER_PROBE_INTERVAL_MS (10 s), did not come back within
// STR_BROKER_PROBE_TIMEOUT_MS (30 s); the worker then re-establishes its
// session and subscriptions (counted in
// str_worker_broker_reestablished_total) and is 503 until a probe comes
// back (probe.go has the topic and each transport's way of getting its
// own message back). Each of the three maps a name to the
// error seen (path, errno text):
//
//   - faults (503: the worker cannot do its job): "artifact_store" (the
//     store's filesystem full, read-only or not writable), "artifact_audit_log"
//     (the audit log cannot be appended to), "work_dir" (no work dir can
//     be made under SANDBOX_WORK_DIR);
//   - degraded (200): "manifest" (the file missing, unreadable, invalid,
//     or its subscriptions failing: the last good manifest serves);
//   - unavailable_tools (200): each tool that cannot work here (a
//     manifest entry that failed its checks, "manifest entry invalid:
//     <reasons>"; module missing or unreadable by the sandbox, unknown
//     profile).
//
// A fault is set the moment a call fails on it and re-checked every 5 s
// and at each /readyz (at most once a second), cheaply and without
// writing anything (internal/fscheck): access(2) and statfs(2) of the
// work base, the store's scope dir and the audit log's dir (writable,
// free bytes, free inodes, read-only), the audit log opened for
// appending. A repaired resource clears its fault without a restart;
// each change is logged and shown as str_worker_faults{kind,name} (1
// while set, else 0). The codes blame the worker's side: a full store,
// audit log filesystem or work dir filesystem is RESOURCE_EXHAUSTED, as
// is a user over an artifact quota (ARTIFACT_*_MAX_*: that user's limit,
// never a fault);
// a read-only or unwritable store or audit log ARTIFACT_ERROR (a save
// whose audit line fails was stored, unaudited, and is reported failed);
// a sandbox refusing a call's spec (a bind source gone) TOOL_NOT_AVAILABLE
// when the tool cannot work here, else SANDBOX_FAILED. A failed save
// leaves no file of its own in the store (temporary files removed, a
// data file whose metadata failed unlinked).
//
// Start-up, in order: work, runner and site dirs; the sandbox probe —
// /bin/true in one sandbox of SANDBOX_DEFAULT_PROFILE through the same
// launcher the calls use; if it fails the worker refuses to start with
// the launcher's error and "run `str doctor`" (fail closed); the
// manifest (a problem of the whole file is fatal; an entry's own
// problem makes only that entry unavailable), with every tool checked (module file present under
// TOOLS_PYTHON_DIR; the tools dir, package dirs and module readable by
// the sandbox's uid, i.e. world-readable and world-searchable as root,
// owner bits rootless; a manifest profile the worker knows; the common
// mistake of naming the manifest's directory instead of its python/
// folder, or a path relative to the manifest's directory, is named with
// the fix; its declared package installed, see packages.go), one error
// logged per tool that cannot work, again at every manifest reload; then
// the broker connection. A SIGTERM before the
// first connection is a clean stop (exit 0). SANDBOX_MODE=none (only
// when set explicitly) runs tools as plain processes of the worker with
// NO ISOLATION, skips the probe, warns at start-up and puts
// sandbox_mode=NONE on every log line of every call.
//
// Hot reload of the manifest: subscriptions are changed with
// the dispatch lock held, so no request is served against a half-applied
// manifest; a broken manifest file keeps the previous one (logged, and
// reported under /readyz's degraded.manifest until repaired), while a
// manifest whose only problems are some entries' own is applied with those
// entries unavailable. SIGTERM: invoke
// topics unsubscribed, queued requests answered RESOURCE_EXHAUSTED,
// running tools given SHUTDOWN_GRACE_SECONDS, then killed and answered
// CANCELLED.
//
// # What it protects against, what it does not, what it trusts
//
// It protects the worker and the host from hostile requests (oversized,
// malformed, path traversal through task ids, user and session ids and
// filenames, unsigned requests when signing is on, floods per user) and
// from hostile tools writing into their work dir (symlinks, FIFOs,
// oversized outputs, endless status lines, filling it: capped in root
// mode only) and from tools writing user-scoped artifacts they were not
// given (manifest artifacts.user_scope). Containment of the tool's code
// is the launcher's job. It does not authenticate the broker or agents
// beyond the optional shared-secret signature (str-sign-v2: payload,
// topic, routing and identifying properties and a timestamp, replays
// refused within the window; every agent holding the secret can sign
// anything), and it does not encrypt anything. It trusts the manifest, the
// tools directory, the configuration and the artifact store's directory.
// Kernel features are the launcher's (namespaces, seccomp, cgroups, and
// the work dirs: their tmpfs cap and ownership, root mode); the worker
// itself mounts and chowns nothing.
package worker
