// Package worker is `str worker`: it receives tool invocations from a
// broker, runs each tool (a Python function named by the manifest) in a
// fresh sandbox made by the launcher, relays the tool's status lines,
// stores its output artifacts and replies. It is wire-compatible with the
// reference Secure Tool Runtime (../shared/spec/str-protocol.md).
//
// The broker protocol message by message (subscriptions, invoke, status,
// reply, cancel, notices, init requests, the tools listing), request
// signing (str-sign-v2, str-sign-v3), one execution, the warm pool and
// operations (configuration, /readyz, faults, start-up, reload, shutdown)
// are specified in docs/protocol.md. Where each lives here: the receive
// loop and dispatch in server.go, the request's checks in protocol.go,
// signing.go and auth.go; one execution's sequence in execute.go, its
// inputs in inputs.go, its outputs in outputs.go, its status relay in
// status.go, the watched sandbox in sandboxrun.go, the reply's
// classification in classify.go and its publish in reply.go; scheduling in
// sched.go; the warm pool in pool.go; init requests in init.go; the
// broker probe in probe.go.
//
// # What it protects against, what it does not, what it trusts
//
// It protects the worker and the host from hostile requests (oversized,
// malformed, path traversal through task ids, user and session ids and
// filenames, unsigned requests when signing is on, floods per user and
// per agent key: sched.go's shares, which a key's made-up users do not
// multiply) and from hostile tools writing into their work dir (symlinks, FIFOs,
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
