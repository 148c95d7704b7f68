// Package profiles holds str's sandbox profiles: the data that says what
// a tool may use (memory, CPU, processes, files, network, environment,
// seccomp policy) and how long it may run.
//
// Profiles are YAML files with one strict schema (version: 1). The five
// built-in ones (restrictive, standard, permissive, confidential, nesting) are
// compiled in with go:embed, each also stored decoded (predecoded/, go
// generate; used only for the exact YAML it came from, see predecoded.go):
// this package reads only that decoded form and links no YAML decoder.
// The one decoder is package profileyaml (linked by str-worker and go
// generate); an operator's directory, decoded by it, is added with
// Set.AddDecoded. Trust-level names resolve through aliases: "untrusted" is
// restrictive, "trusted" is permissive. The reference numbers are in
// str-protocol.md §6 and are pinned by this package's tests.
//
// # What it protects against
//
//   - Misspelled or misplaced settings: unknown fields, a second YAML
//     document, duplicate keys and unparsable quantities are decode
//     errors (profileyaml), never silently ignored defaults; the decoded
//     form is read with unknown fields refused and validated again.
//   - Half-valid profiles: Validate runs a list of named checks (see
//     checks in validate.go) and reports every problem of every field at
//     once (errors.Join of *FieldError), before any sandbox is made. It
//     refuses a missing or zero limit, a core limit other than 0, uid or
//     gid 0, relative or unclean mount paths, '..', mounts over what the
//     launcher provides (/, /proc, /dev, /sys, /var/run/secrets), tmpfs
//     without a size cap, setuid/setgid tmpfs modes, and bad env names.
//   - Silent replacement: a profile loaded from a directory whose name or
//     alias is already taken is an error, and a failed AddDecoded adds
//     nothing. Each file must be named after the profile it holds.
//   - Requests that loosen limits: Tighten accepts overrides of timeout,
//     memory, CPUs, pids and network only when they are at most the
//     profile's; every loosening is reported as a *LoosenError
//     (errors.Is ErrLoosening). Lookup and Tighten return deep copies, so
//     no caller can change the Set's profiles.
//
// # What it does not do
//
//   - It enforces nothing: the launcher turns a profile into namespaces,
//     mounts, rlimits, cgroup limits and a seccomp filter.
//   - It does not check that the seccomp policy a profile names exists
//     (the launcher does, so that this package does not depend on the
//     seccomp package), nor that ro_binds paths exist on the host
//     (optional entries may be absent; required ones fail at launch).
//   - It does not compare cgroup.memory with rlimits.as: one caps the
//     resident memory of the whole sandbox, the other the address space of
//     each process; neither bounds the other.
//
// # What it trusts
//
// The embedded files and the directory an operator names, and whoever can
// write them: a profile is policy, and a valid profile is applied as
// written (for example "network: host"). Requests are not trusted; they
// reach profiles only through Lookup and Tighten.
//
// # Kernel features
//
// None itself. The profiles it produces need, at launch: user, mount,
// PID, UTS, IPC and (network: none) network namespaces; cgroup v2 with the
// memory, cpu and pids controllers; seccomp filters.
package profiles
