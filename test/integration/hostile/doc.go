// Package hostile is the battery of hostile tools (issue 11): each case is
// a small Python tool (testdata/hostile_tools.py) run end to end through a
// real `str worker` with the embedded broker, under the profile it
// targets, with the exact outcome it must produce (an errno, a refused
// connection, an error code, a timeout, an empty listing...).
//
// What it protects against: regressions of the sandbox's containment as a
// tool sees it — files, processes, privileges, the kernel surface, the
// network, resources and information of the host, of the worker and of
// other tasks and users. What it does not: it tests through Python and
// ctypes, so a case Python cannot express (none so far) is covered by the
// seccomp package's kernel tests instead; it runs on the host it is given,
// not on every kernel: `make test-integration` runs it on the host (there,
// the cgroup v1 fallback) and `make test-vm` in a guest with a pure cgroup
// v2 hierarchy, which sets STR_CGROUP_V2=1. TestHostile/cgroup_mode checks
// from the host that the sandboxes really got cgroups of the mode found
// (STR_CGROUP_V2=1 demands v2), so a silent fallback fails the battery.
//
// With STR_HOSTILE_TEMPLATE=1 every tool of the battery, of every
// profile, is served from a per-tool template (manifest warm: template;
// launcher/template) and the same cases run against template calls;
// the few a template call answers differently (each the same protection,
// reached earlier: templateVariant says why) want the template's answer,
// and the battery fails if a call ran cold instead (checkTemplated).
//
// It trusts the str binary under test ($STR_BIN, else built from this
// tree) and needs root (namespaces, cgroups, a host uid per sandbox):
// without it every test skips with the reason, and STR_MUST_WORK=1 turns
// the skip into a failure. SECURITY.md's "Tested by" table names its
// cases; TestSecurityTestedByTable keeps the two in step.
package hostile
