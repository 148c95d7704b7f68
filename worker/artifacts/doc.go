// Package artifacts stores the files tools read and write, in the layout
// the reference agents share (spec §9):
//
//	{base}/{basename(namespace.rstrip("/"))}/{user_id}/{session_id}/{filename}/{N}
//	{base}/{...}/{filename}/{N}.meta     exactly {"mime_type": "<type>"}
//	{base}/{...}/{user_id}/user/{name}/{N}   for a filename "user:{name}"
//
// NewFilesystem writes and reads that layout byte for byte (the .meta file
// as Python's json.dumps writes it); NewMemory keeps the same semantics in
// process memory for tests and single-process use, within a byte budget
// (WithMemoryBudget, ARTIFACT_MEMORY_MAX_BYTES, default 256 MiB): the
// least recently saved or loaded versions are evicted beyond it, a load of
// an evicted version fails with ErrEvicted, and version numbers are never
// reused. Open builds either from the ARTIFACT_* settings, with the audit
// log (ARTIFACT_AUDIT_LOG, default <base>/.audit/audit.jsonl for the
// filesystem store). SaveReader streams a save of a known size: the
// filesystem store copies it through a fixed buffer (the worker's memory
// does not grow with a tool's outputs), hashing it for the audit log on
// the way; a reader yielding more or fewer bytes fails (ErrSizeMismatch).
//
// NewS3 and NewGCS (ARTIFACT_SERVICE_TYPE=s3 and gcs) keep the same
// semantics in one bucket that workers on several hosts and the agents
// share, in the layouts the reference's services write: its S3 service's
// ({namespace}/{user_id}/{session_id|user}/{name}/{N}, one object per
// version, the mime type as its Content-Type and its metadata
// original_filename, user_id, session_id, version) and ADK's GCS service's
// (the same, but a user-scoped object keeps its "user:" prefix). A save
// lists the versions, then writes the next one only if it does not exist
// (S3's If-None-Match: *, GCS's ifGenerationMatch=0), moving to the next
// number when another writer took it; it streams through one 8 MiB part
// buffer (multipart or resumable uploads beyond it), and a failed upload
// is aborted, which stores nothing. A missing bucket or refused
// credentials fail NewS3 and NewGCS (start-up); Check asks the bucket.
//
// What it protects against:
//   - Path traversal through ids and names. Every component (user id,
//     session id, the namespace's last level) must be one safe path
//     component (CheckName): not empty, ".", "..", absolute, not
//     containing "/", "\" or NUL, at most 255 bytes, valid UTF-8.
//     Filenames follow str's one filename rule (CheckFilename, also used
//     by the worker for request and output names): the same, plus no
//     control characters, bidirectional overrides or zero-width
//     characters, checked as given and NFKC-normalised. Where the
//     reference silently reduces a component to its basename (so "../x"
//     becomes "x"), str rejects it with ErrUnsafeName instead. Filenames
//     are NFKC-normalised first, as in the reference (golang.org/x/text),
//     so that a fullwidth "／" or "．．" is checked in its normalised form.
//     The session id "user" is rejected: its directory is where user-scoped
//     artifacts live.
//   - Lost or torn versions under concurrency. A save takes an in-process
//     mutex and an flock on {filename}/.lock, writes the data to a
//     temporary file that it fsyncs and links (never renames over) to
//     {N}, then writes {N}.meta the same way and renames it into place.
//     A reader sees a version only once both files exist, and a writer
//     that ignores the lock (the reference) is never overwritten.
//   - Symlinks planted in the store: data and .meta files are opened
//     O_NOFOLLOW and must be regular files.
//   - Unaudited access, when WithAuditLog is given: every save and load,
//     refused ones included, appends a JSON line with the sha256 of the
//     content; a failed audit write fails the operation.
//
// What it does not do: it does not authenticate users (the ids come from
// the request, which the worker may verify with a signature), enforce
// quotas or sizes, delete old versions, or remove temporary files left by
// a crash between link and unlink (their names start with ".tmp-", which
// the reference does not list). Directories are created 0755 and files
// 0644 (umask applies), as the reference's defaults, so that agents
// running as another user can read them.
//
// What it trusts: the base directory and the path to it (created by the
// operator, not writable by tools), and the local filesystem's link(2),
// rename(2) and flock(2) semantics (not NFS). The S3 and GCS stores
// trust the bucket's store to honour conditional writes (one that
// ignores them loses a version when two hosts save one name at the same
// moment, as the reference's services do) and to show an object only
// once its upload is complete, and everyone the bucket's credentials
// admit (agents included) to write only the layout.
package artifacts
