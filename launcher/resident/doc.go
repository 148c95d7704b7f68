// Package resident is the resident launcher, `str serve` (root only), and
// its client, `str run`'s served path (Call).
//
// The server keeps sandboxes made with launcher.Request.AwaitCall
// pre-built per profile: their init waits at its sub-step 10a;
// launcher.Sandbox.Call arms the wall clock and hands it a caller's argv,
// environment and stdio. Its socket is an authority (file mode,
// SO_PEERCRED, the same plan as one-shot, "not poolable" otherwise),
// checked in the order server.go lists; proto.go has the protocol and the
// client (Call).
//
// What it does on the host, as root:
//
//   - the socket (socket.go): its directory opened O_PATH|O_NOFOLLOW and
//     checked on that descriptor (root's, writable by no one else), the
//     socket bound, owned and moded in a private 0700 directory made in
//     it and published by one rename; removed at Close only if the name
//     is still that socket;
//   - the peer credentials: SO_PEERCRED of every connection (root, the
//     --allow-uid uids, the --allow-group group's members; the user
//     database for group membership), and the caller's stdin, stdout and
//     stderr received as SCM_RIGHTS and passed on to the init;
//   - the pool of pre-built sandboxes: ordinary sandboxes of package
//     launcher (CreateFromPlan: leased host ids, a memory cgroup, fresh
//     namespaces and root), kept, claimed, retired and replaced by
//     launcher/pool's policy; their v1 pids, cpu, cpuacct and freezer
//     cgroups are reused one sandbox at a time when empty and clean
//     (cgroups.go has the checks; launcher.ReuseCgroups).
//
// What it trusts: the launcher it is given (its profiles, its host id
// range) and the operator's flags (the served profiles, --allow-uid,
// --allow-group). A caller's request is trusted for nothing: it is
// decoded with every count checked before anything is allocated
// (FuzzDecodeResidentRequest) and planned as that caller's one-shot `str
// run` would be (launcher.Launcher.PlanFor, with the caller's
// environment).
//
// What it protects against: a caller of the socket it does not admit
// (refused at a bounded cost: no buffer for its request, a few answered
// at a time, a rate-limited log), or asking for more than one-shot `str
// run` would give it (another plan is "not poolable" and runs one-shot);
// a local user who can write the socket's directory swapping the socket
// for a symlink (nothing done by path); a client gone mid-call (its
// sandbox ended as a cancelled one-shot run). The client sends neither
// its request nor its stdio to a listener that is not root.
//
// What it does not: a caller it admits gets a root-mode sandbox (a leased
// host uid) even when its one-shot run would have been rootless.
package resident
