// Package writeback is the copy back of a capped `str run --workdir DIR`
// (root mode; nsinit.Mount.WriteBack): the launcher calls Overlay on the
// directory's clone at its step L3, and Dir.CopyBack at its step L10.
//
// The tool writes into DIR through an overlay: the lower layer is the
// detached clone of DIR made at L3 (id-mapped to the tool when DIR's owner
// is not root), the upper layer a tmpfs capped by the profile's work_dir
// (size=, nr_inodes=), never attached anywhere on the host. The tool meets
// ENOSPC at the cap, as in a worker's work dir, and its pages are charged
// to its memory cgroup. Once the sandbox has ended (every process of it
// reaped, L8), step L10 copies what the upper layer holds into DIR:
//
//	L10.1. the thread doing it is locked and its filesystem identity (fsuid,
//	       fsgid, groups) set to the identity a live bind would have written
//	       with: DIR's owner when DIR is id-mapped, else the tool's leased host
//	       ids. The kernel's own permission checks then bound what the copy can
//	       touch: never more than the tool could have through a live bind. The
//	       upper layer is read with the identity switched back to root (its
//	       files belong to the tool's leased ids and may have any mode);
//	L10.2. DIR is reached only through the descriptor opened at L3 (checked to
//	       be the clone's root: same device and inode), and every path below it
//	       with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_XDEV): a
//	       symlink placed in DIR meanwhile (by anyone) is refused, not followed;
//	L10.3. each upper entry, parents before children:
//	       - a whiteout (a character device 0:0) removes the name in DIR
//	         (a directory with everything below it);
//	       - a directory is made (or kept) and, when opaque (the tool removed
//	         it and made it again), emptied first;
//	       - a regular file or symlink is written under a fresh name beside
//	         its target and renamed over it: a reader of DIR never sees half a
//	         file, and the rename replaces a symlink rather than following it;
//	       - modes keep only the permission bits (never setuid or setgid), and
//	         modification times are kept;
//	       - anything else (a FIFO, a socket: the tool can make no device) is
//	         skipped and named in the report;
//	L10.4. the tmpfs goes with its last descriptor: nothing of it remains.
//
// The overlay is mounted with redirect_dir=off, index=off and metacopy=off
// (so the upper layer holds whole files and whiteouts only, all that the
// copy reads): renaming a directory that came from DIR gets EXDEV inside the
// sandbox, which mv and shutil.move answer by copying. What is lost: a
// launcher killed before L10 loses the tool's changes (the tmpfs goes with
// it); hard links among the tool's files are copied as separate files; a
// file changed in DIR by someone else during the run is replaced by the
// tool's version where the tool changed it too.
//
// What it does on the host: it mounts a detached tmpfs and a detached
// overlay (fsopen, fsmount: never attached to any host path), and at L10
// writes, renames and removes files below DIR with the filesystem identity
// of a live bind's writer, on a locked thread that is never given back to
// the runtime.
//
// What it protects against: a tool writing more than the profile's
// work_dir caps (size, inodes) before anything reaches DIR; a tool (or
// anyone changing DIR meanwhile) using the copy to write outside DIR or
// through a symlink, to write where a live bind would not have let it, or
// to plant a setuid or setgid file, a device or a FIFO; a reader of DIR
// seeing half a file.
//
// What it trusts: the launcher that calls it (the clone of DIR it passes
// and the identity it names), and the kernel's overlay (what the upper
// layer holds: whole files, whiteouts and opaque markers only).
package writeback
