// Package bwrap reads bubblewrap's command line (the options of its 0.11
// manual) and says what it asks of str's launcher: `str bwrap ARGS…`, and
// str invoked as bwrap, run programs that build bubblewrap lines (the
// reference runtime's Python worker, coding agents' sandboxes) in a str
// sandbox without a change on their side.
//
// Parse checks the line as bubblewrap does (every option's arity,
// descriptors, octal modes, sizes, --perms and --size bound to the next
// option, --args FD read in place) and returns the options in order.
// Translate maps them onto the launcher's terms: the filesystem as the
// init's mount steps in the line's order, the environment, working
// directory, ids and hostname the command sees, the caller's seccomp
// programs (installed after the profile's filter, never instead of it),
// and what str itself serves from outside the sandbox (--info-fd,
// --json-status-fd, --sync-fd, --lock-file's lock). Two of str's
// promises hold under any line: secrets directories a bind shows are
// covered (SecretDirs), and --disable-userns is honoured only when the
// profile's seccomp policy refuses user namespaces (CheckUsernsDenied).
//
// What it protects against: an option str cannot honour exactly being
// dropped in silence. Every such option is an *Unsupported error naming
// it and its reason, and a line with one runs nothing.
//
// What it does not do: it has no privilege and performs nothing. The
// sandbox stays the launcher's (every namespace but the network's when
// the line shares the caller's and the profile allows it, the profile's
// limits, seccomp filter and network policy; binds nosuid,nodev; a
// leased host uid as root), and the launcher applies to the mount list
// the checks it applies to its own (launcher.Plan.SetMounts).
//
// What it trusts: the caller, who names host paths to bind as bubblewrap's
// caller does; and the host's view of those paths at translation time
// (the init resolves them again when it mounts).
package bwrap
