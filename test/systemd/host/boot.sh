#!/bin/sh
# PID 1 of the systemd host container, before systemd: Docker mounts the
# container's cgroups read-only unless --privileged (which this engine
# refuses: its own bounding set lacks CAP_SYS_RESOURCE). With a private
# cgroup namespace each mount shows only the container's subtree, so
# remounting them read-write lets systemd (and the worker under it,
# Delegate=yes) manage that subtree and nothing of the host's.
set -eu
mount -o remount,rw /sys/fs/cgroup
for m in $(awk '$5 ~ "^/sys/fs/cgroup/" {print $5}' /proc/self/mountinfo); do
	mount -o remount,rw,bind "$m" 2>/dev/null || mount -o remount,rw "$m"
done
exec /lib/systemd/systemd
