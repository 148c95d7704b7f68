// Package idmap makes a detached mount tree id-mapped (launcher step L3,
// root mode): to the sandbox's tool for the tree's owner (MapOwner: a
// tree marked nsinit.Mount.IDMapOwner, `str run --workdir DIR` and `str
// bwrap`'s writable binds of a non-root owner), or host root to the
// sandbox's root (MapRoot with a RootMapping: every other bind of a `str
// bwrap` line run by root, launcher.Plan.MapRoot); one code path maps
// both, mount by mount where a filesystem refuses (Mapping.apply). It
// also runs the raw clones that need a user namespace with no Go signal
// handler (WithSignalsBlocked: its own, and the per-tool template's
// id-map opener, package launcher/template).
//
// What it does on the host, as root: a raw clone of the launcher into a
// new user namespace (no program, nothing but raw system calls, no
// memory shared), whose uid_map and gid_map it writes with one id each
// (owner -> tool, or 0 -> the sandbox's root) and whose namespace it
// opens, then kills and reaps the child; mount_setattr(MOUNT_ATTR_IDMAP)
// with that namespace on a tree still detached (the only time the
// kernel allows it), and, when a mount below refuses, on each mount the
// launcher's /proc/self/mountinfo lists below the source, opened beneath
// the tree.
//
// What it protects against: a tool of `str run` leaving files owned by
// root on the host (a root-owned work dir is refused), and any mapping
// to host root (the target ids must be leased); a child outliving the
// launcher (it reads EOF on its pipe and exits) or keeping the
// launcher's descriptors (it closes them all first). What it does not:
// the root mapping gives a `str bwrap` command run by root root's files
// as bubblewrap run by root does (SECURITY.md, "The core sandbox").
//
// What it trusts: the launcher that calls it (the tree, the leased ids)
// and the kernel's id-mapped mounts (only the mapped ids pass; others
// read as the overflow id).
package idmap
