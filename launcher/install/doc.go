// Package install is the installation sandbox (issue 18 §1): a manifest
// tool's `package:` is installed by pip, run by the tools' own
// interpreter, inside a sandbox of its own, so that nothing of the package
// (a build hook of an sdist, pip's own handling of it) ever runs on the
// host. Plan turns a Spec into a launcher.Request and a network policy
// (pure, unit-tested); Run applies it with a launcher.Launcher:
//
//	I1. check the spec: interpreter, requirement, target, exactly one
//	    source (a wheels folder or an index URL)
//	I2. the network: the wheels folder → isolated (it is bound read-only);
//	    an index → restricted to the index's host and port (plus the
//	    operator's extra file hosts), reached through the egress proxy,
//	    whose address pip takes from HTTPS_PROXY/HTTP_PROXY
//	I3. plan the sandbox on BaseProfile with that policy set by the
//	    installation (not a caller's override): the target bound writable,
//	    the wheels folder read-only, nothing else of the host writable
//	I4. create it; hand the (empty) target to the sandbox's host uid
//	I5. run pip: wheels only (--only-binary=:all:) unless AllowBuilds
//	I6. whatever the outcome, take the target back: every entry owned by
//	    the launcher's uid, group and other write bits cleared, anything
//	    but files, directories and symlinks removed, so the sandboxes that
//	    later read it cannot change it
//
// What it does on the host: it chowns the target to the sandbox's host uid
// (I4) and, after the sandbox has ended, walks the target to chown it back
// and clear its write bits (I6), never following a symlink; everything
// else is the launcher's sandbox (planned, created and torn down as a
// tool's).
//
// What it protects against: a package's code running on the host or
// reaching more of the network than its index (and its file hosts); an
// sdist's build code running at all unless the operator allowed builds;
// a package leaving behind in the target something the sandboxes that
// later read it could change (a file writable by another uid, a setuid
// bit, a FIFO or a device).
//
// What it trusts: the caller (the worker's installer), which decides which
// package is installed, where, and reads the result as files (dist-info
// metadata), never importing it; the interpreter it names; the launcher's
// profiles (BaseProfile's mounts, limits and seccomp policy).
package install
