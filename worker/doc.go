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
//     {base}/sam_remote_tool/invoke/{tool} for every manifest tool,
//     {base}/sam_remote_tool/cancel/> and {base}/discovery/> (ignored).
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
//     signature (required when STR_SIGNING_SECRET is set: hex HMAC-SHA256
//     of the payload bytes). The checks, in order: replyTo; signature
//     (AUTHENTICATION_FAILED); payload size (STR_MAX_PAYLOAD_BYTES, default
//     10 MB) and JSON-RPC shape, required fields, types, safe names
//     (task_id, user_id, session_id: no "/", "\", "..", control
//     characters, bounded length; filenames also not absolute) — all
//     problems in one INVALID_REQUEST; tool_name equal to the topic's tool;
//     the tool in the manifest (else TOOL_NOT_AVAILABLE, message "Tool
//     '<t>' is not available on this worker", and the topic unsubscribed);
//     the per-user rate limit (RESOURCE_EXHAUSTED); the profile (manifest,
//     else request, else SANDBOX_DEFAULT_PROFILE; unknown = INVALID_REQUEST);
//     no other execution with the same task id or request id
//     (INVALID_REQUEST); a free place in the queue (RESOURCE_EXHAUSTED).
//     The timeout is the request's (else DEFAULT_TIMEOUT_SECONDS) bounded by
//     the manifest's timeout_seconds (default 300); the sandbox's wall clock
//     limit is that + 5 s, itself bounded by the profile.
//
//  3. Status notification, worker → agent, on the request's statusTo, one
//     per line the tool writes to its status FIFO, in order, all before
//     the reply:
//
//     {"jsonrpc":"2.0","method":"sam_remote_tool/status","params":{"task_id":"<task_id>",
//     "status_text":"…","timestamp":"2026-02-09T12:34:56.789012+00:00"}}
//
//  4. Reply, worker → agent, on exactly the request's replyTo, once. Success:
//
//     {"jsonrpc":"2.0","id":"<id>","result":{"tool_result":{…},"execution_time_ms":N,
//     "timed_out":false,"created_artifacts":[{"filename","version","mime_type","size_bytes"}]}}
//
//     Timeout (a result, not an error; agents map it to SANDBOX_TIMEOUT):
//
//     {"jsonrpc":"2.0","id":"<id>","result":{"tool_result":{},"execution_time_ms":N,"timed_out":true,"created_artifacts":[]}}
//
//     Error ("data" only when set; id "unknown" when unreadable):
//
//     {"jsonrpc":"2.0","id":"<id>","error":{"code":"<CODE>","message":"…"}}
//
//     Codes: TOOL_NOT_AVAILABLE, INVALID_REQUEST, IMPORT_ERROR (module or
//     function missing, sha256 mismatch, package install failed),
//     EXECUTION_ERROR (the tool raised), TOOL_ERROR (the tool raised
//     ToolError), SANDBOX_FAILED (setup step named; OOM kill; pids limit;
//     no result), ARTIFACT_ERROR (input missing/unreadable, output not
//     saved), RESOURCE_EXHAUSTED (queue full, rate limit, disk space,
//     shutting down), AUTHENTICATION_FAILED, CANCELLED, INTERNAL_ERROR.
//     execution_time_ms runs from receipt (queueing included) to the tool's
//     exit. The request is acked only after the reply is published.
//
//  5. Cancel, agent → worker, on {base}/sam_remote_tool/cancel/{id}: id is
//     the request's JSON-RPC id (or its task id; a payload {"task_id":…}
//     is also read). A queued request is answered at once, a running
//     sandbox is killed; either way the reply is the error CANCELLED.
//
//  6. Removed, worker → all, on {base}/sam_remote_tool/removed/{tool}
//     with {"tool_name":"<tool>"}, when a reload drops a tool.
//
// # One execution (spec §7)
//
// Work dir {SANDBOX_WORK_DIR}/{task_id}/ (created exclusively; stale ones
// removed at startup) with input/ (worker-owned), output/ and the FIFO
// status.pipe (0600), the dir, output/ and FIFO chowned to the tool's host
// uid. Inputs are written O_EXCL|O_NOFOLLOW. runner_args.json is written;
// the FIFO's read end is opened (non-blocking) and a worker-held write end
// keeps it from reaching EOF until the sandbox is gone, after which it is
// drained to EOF, so no status line is lost. The launcher runs
// [python, runner.py, runner_args.json] with the tools, runner and site
// dirs bound read-only and PYTHONPATH=<tools>:<site>. result.json is read
// without following symlinks; outputs are the top-level regular files of
// output/, opened through a directory fd with O_NOFOLLOW, capped in count
// and total size (STR_MAX_OUTPUT_BYTES), saved to the artifact store.
// Then: reply, ack, remove the work dir. At most SANDBOX_MAX_CONCURRENT
// run at once; up to SANDBOX_MAX_QUEUED wait.
//
// # Operations
//
// Configuration: see ConfigUsage (flags > environment > file > defaults).
// /healthz (alive), /readyz (connected and taking work) and /metrics on
// HEALTH_PORT. Hot reload of the manifest: subscriptions are changed with
// the dispatch lock held, so no request is served against a half-applied
// manifest; a broken manifest keeps the previous one. SIGTERM: invoke
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
// oversized outputs, endless status lines). Containment of the tool's code
// is the launcher's job. It does not authenticate the broker or agents
// beyond the optional shared-secret signature (which does not prevent
// replay), and it does not encrypt anything. It trusts the manifest, the
// tools directory, the configuration and the artifact store's directory.
// Kernel features are the launcher's (namespaces, seccomp, cgroups); the
// worker itself needs FIFOs and, to chown for the tool, CAP_CHOWN or an
// identity mapping where the tool is the worker's own uid.
package worker
