#!/bin/sh
# The pod-constraints test's container entrypoint (test/pod): the steps a
# Kubernetes runtime takes for a pod with hostUsers: false, then the worker.
#
#	podinit.sh OUTSIDE PROGRAM ARGS...
#
# 1. The container's cgroup, delegated to the pod's root (OUTSIDE on the
#    node): Docker mounts it read-only, so with --cgroupns=private it is
#    remounted read-write (as deploy/docker/str-container-worker does) and
#    chowned to OUTSIDE, as a runtime delegates a user-namespaced
#    container's cgroup to its root.
# 2. A user namespace mapping 0-65535 to OUTSIDE.. (podns).
# 3. In it, the capability set of the manifest's securityContext, from
#    POD_CAPS (setpriv's syntax; test/pod derives it from the manifest: the
#    runtime's default set less NET_RAW plus SYS_ADMIN): the
#    bounding set, which is what uid 0 keeps across exec.
set -eu
fail() { echo "podinit: $*" >&2; exit 1; }
outside=$1; shift
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	dirs=/sys/fs/cgroup
else
	dirs=""
	for c in memory pids cpu cpuacct freezer; do
		[ -d /sys/fs/cgroup/$c ] && dirs="$dirs /sys/fs/cgroup/$c"
	done
fi
for d in $dirs; do
	if [ ! -w "$d" ]; then
		if [ "$d" = /sys/fs/cgroup ]; then
			mount -o remount,rw "$d" || fail "remount $d read-write"
		else
			mount -o remount,bind,rw "$d" || fail "remount $d read-write"
		fi
	fi
	for f in "$d" "$d/cgroup.procs" "$d/tasks" "$d/cgroup.subtree_control" "$d/cgroup.threads"; do
		if [ -e "$f" ]; then chown "$outside:$outside" "$f"; fi
	done
done
[ -n "${POD_CAPS:-}" ] || fail "POD_CAPS (the capability set) is not set"
exec /pod/podns "$outside" 65536 /usr/bin/setpriv --bounding-set "$POD_CAPS" --inh-caps=-all --ambient-caps=-all "$@"
