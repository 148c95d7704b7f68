// Package manifest reads the tool manifest (spec §5), watches it for
// changes, locates and hash-checks each tool's source, and installs the
// packages tools declare (Installer: each distribution into a site dir of
// its own, SiteDir/<name>-<version>/; installed-ness read from dist-info
// metadata as files; pip run through a PipRunner, the launcher's
// installation sandbox, or a pure-Python wheel unpacked in Go).
//
// The manifest is policy as data: Parse decodes it strictly (unknown and
// duplicate keys, YAML anchors/aliases/merge keys and mistyped values are
// errors) and runs its named checks over every entry, in two tiers. A
// problem of the whole file (not YAML, not a mapping, an unknown top-level
// key, a bad "version", duplicate tool names) rejects it, with every
// problem at once and line numbers, in an *Error. A problem of one entry
// only makes that entry unavailable (Manifest.Unavailable, with its
// reasons): one bad entry never takes the other tools down. A missing "version"
// reads as 1 because manifests written for the reference often omit it;
// any other version is rejected. Checks: runtime is "python" (the default
// and only runtime); module is a dotted ASCII Python identifier; function
// (required unless class_name names a class-based tool) and class_name
// are ASCII identifiers (the runner looks the function up
// with getattr, so it cannot be dotted); a tool name is one broker topic
// level (no "/", "*", ">", whitespace or control characters, not starting
// with "#", at most 128 bytes); timeout_seconds is 0..86400 (0 or absent
// means the default of 300); version needs package and must parse as PEP
// 440 specifiers; sha256 is 64 hex digits; warm (the tool's number of
// pre-started sandboxes in the worker's pool) is 0..MaxWarm, absent means
// the worker's default, or "template" (a per-tool template serves the
// calls, opt-in); artifacts.user_scope is read (the default), write
// or none: what the tool may do with user-scoped ("user:") artifacts,
// which every session of the user shares (read: its inputs may reference
// them; write: its outputs may also create them; none: neither). The
// newer reference's description fields are read for the init broadcast:
// parameters (a mapping), artifact_params ({param: {is_list,
// is_optional}}), instructions (text) and config_schema (a list).
//
// What it protects against:
//   - A tool's module being swapped after review: with sha256 set,
//     Tool.Verify hashes the module's source file (resolved as Python
//     would, packages before modules) and refuses a mismatch, saying
//     expected and actual. Symlinks that leave the tools dir are refused.
//   - A broken edit taking tools offline: Watch keeps the previous
//     manifest when the new file is invalid or missing and logs why, once
//     per distinct content; an edit that breaks one entry is applied with
//     only that entry unavailable.
//   - Hostile wheels on the unpack path: absolute names, "..", "\",
//     symlinks, more than 20000 entries or 512 MiB are refused; a RECORD,
//     if present, must match the extracted files' sha256 (a wheel without
//     RECORD is accepted); files are created O_EXCL in a staging dir and
//     moved into the site dir only when all succeeded.
//   - Argument injection into pip: package names and version specifiers
//     are re-validated before they reach a command line (and again by
//     the launcher).
//   - Package code running on the host: whether a package is installed
//     is read from its metadata as files (O_NOFOLLOW), never by running
//     Python with it on the path (a sitecustomize.py or .pth would run);
//     pip and any sdist build run only in the PipRunner's sandbox.
//   - One package replacing another's modules: one site dir per
//     distribution and version.
//
// What it does not do: the sha256 covers one file, not the modules it
// imports, installed packages, or a .pyc Python may prefer (run with
// PYTHONDONTWRITEBYTECODE and keep the tools dir read-only). The unpack
// path installs no dependencies and skips a wheel's scripts, headers and
// data. Satisfies evaluates ==, !=, >=, <=, >, <, ~=, === (and ==X.*)
// but not epochs, and orders pre-/post-release suffixes as text. The
// Installer runs the interpreter on the host once, with -I -S, to list
// its own site-packages dirs (standard library only).
//
// What it trusts: the operator who owns the manifest, the tools dir, the
// wheels dir and the index (what they serve is what gets installed); the
// Python interpreter it is given; the PipRunner's sandbox.
package manifest
