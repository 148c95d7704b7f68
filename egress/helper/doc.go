// Package helper is the launcher's side of the egress helper: the process
// (cmd/str-egress) that serves every sandbox's network policy for one
// launcher, out of the launcher's process, so that the code that parses a
// hostile sandbox's traffic and terminates TLS (package egress/proxy)
// never runs with the launcher's privileges.
//
// A Client starts the helper at the first sandbox traffic it is handed
// (Session), and again after it died: the program str-egress beside the
// running executable ($STR_EGRESS_BIN overrides), with a SOCK_SEQPACKET
// socketpair as its descriptor 3, no environment, in /, Pdeathsig SIGKILL
// from a thread that never exits; when the launcher is root, as uid and
// gid 65534 with no supplementary group (hence no capability). The helper
// sets no_new_privs before anything else and refuses to run as root.
//
// The control socket carries JSON messages (wire.go): a sandbox's
// listeners (SCM_RIGHTS) with its policy and credentials, the reports and
// the final record of its denials, the on_violation: kill events, the TLS
// termination CA's certificate (its key stays in the helper), and the
// public suffix check of wildcard hosts that the launcher's program
// cannot do (it links no HTTP code: egress.PublicSuffix).
//
// What it protects against: a flaw in the proxy reaching the launcher's
// privileges or memory (another uid, no capability); a dead helper
// leaving a sandbox an open network (the helper holds the only copies of
// the listeners it serves: they close with it, and Close reports it).
//
// What it trusts: the str-egress program beside str (or $STR_EGRESS_BIN),
// as the launcher trusts str-worker; the kernel's uid separation.
package helper
