// Package idmap makes a detached mount tree id-mapped so that its owner
// is a sandbox's tool (MapOwner: launcher step L3, root mode; a tree
// marked nsinit.Mount.IDMapOwner: `str run --workdir DIR` and `str
// bwrap`'s writable binds), and runs the raw clones that need a user
// namespace with no Go signal handler (WithSignalsBlocked: its own, and
// the per-tool template's id-map opener, package launcher/template).
//
// What it does on the host, as root: a raw clone of the launcher into a
// new user namespace (no program, nothing but raw system calls, no
// memory shared), whose uid_map and gid_map it writes with one id each
// (owner -> tool) and whose namespace it opens, then kills and reaps the
// child; mount_setattr(MOUNT_ATTR_IDMAP) with that namespace on a tree
// still detached (the only time the kernel allows it).
//
// What it protects against: a tool leaving files owned by root on the
// host (a root-owned tree is refused, and so are tool ids that are not
// leased: never host root); a child outliving the launcher (it reads EOF
// on its pipe and exits) or keeping the launcher's descriptors (it
// closes them all first).
//
// What it trusts: the launcher that calls it (the tree, the leased ids)
// and the kernel's id-mapped mounts (only the mapped ids pass; others
// read as the overflow id).
package idmap
