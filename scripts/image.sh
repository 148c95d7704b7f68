#!/usr/bin/env bash
# Builds the str worker image without a registry (make image).
#
#   1. The base: a Debian 12 (bookworm) root built by debootstrap
#      --variant=minbase from the Debian mirror, with what the worker and the
#      sandboxes need at run time, imported with `docker import` as
#      $BASE_REPO:<recipe hash>. The recipe hash covers this script's recipe
#      lines (suite, mirror, packages); an image with that tag is reused, so a
#      second run only rebuilds the worker layer.
#   2. The worker: Dockerfile FROM that base, with the str binaries built on
#      the host (bin/str and bin/str-worker, make build) copied in: no Go
#      toolchain in the image.
#
# Environment: IMAGE (the worker tag, set by the Makefile), DEBIAN_MIRROR.
# Needs root (debootstrap, first run only) and a running docker.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:?IMAGE (the worker tag) is set by the Makefile}
STR_BIN=bin/str               # the two binaries are the only paths
STR_WORKER_BIN=bin/str-worker # .dockerignore lets into the context
STR_EGRESS_BIN=bin/str-egress
BASE_REPO=${BASE_REPO:-str-base}

# ---- the recipe (every line here is part of the hash) ----------------------
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3: runs the tools (str links no libseccomp: its filters are
# generated in pure Go). libssl3 and
# ca-certificates: TLS to a Solace broker (tcps://). passwd: useradd for
# the rootless user (the Dockerfile's own step). python3-pip (with setuptools and
# wheel): installs the packages a manifest declares (packages:).
PACKAGES=python3,python3-pip,python3-setuptools,python3-wheel,libssl3,ca-certificates,passwd
RECIPE="v1 $SUITE $MIRROR minbase $PACKAGES"
# -----------------------------------------------------------------------------

hash=$(printf '%s' "$RECIPE" | sha256sum | cut -c1-12)
BASE="$BASE_REPO:$SUITE-$hash"

for b in "$STR_BIN" "$STR_WORKER_BIN" "$STR_EGRESS_BIN"; do
	[ -x "$b" ] || { echo "image: $b missing (make build first)" >&2; exit 1; }
done
docker version >/dev/null || { echo "image: no docker engine answers (docker version failed)" >&2; exit 1; }

if docker image inspect "$BASE" >/dev/null 2>&1; then
	echo "image: base $BASE exists (same recipe), reused"
else
	[ "$(id -u)" = 0 ] || { echo "image: building the base needs root (debootstrap)" >&2; exit 1; }
	if ! command -v debootstrap >/dev/null; then
		echo "image: installing debootstrap"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
	fi
	root=$(mktemp -d /var/tmp/str-base.XXXXXX)
	trap 'rm -rf "$root"' EXIT
	echo "image: debootstrap $SUITE ($PACKAGES) into $root"
	debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 \
		|| { tail -30 "$root.log" >&2; rm -f "$root.log"; exit 1; }
	rm -f "$root.log"
	# Smaller image: no package lists, caches or docs the worker never reads.
	rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
		"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
	tar -C "$root" --numeric-owner -c . | docker import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["/bin/bash"]' \
		--message "str base: $RECIPE" - "$BASE" >/dev/null
	echo "image: base $BASE imported"
fi

# The Dockerfile's default BASE names the latest local base.
docker tag "$BASE" "$BASE_REPO:$SUITE"

# The worker layer: a small context (.dockerignore keeps everything but the
# binary out).
docker build -q --build-arg BASE="$BASE" --build-arg STR_BIN="$STR_BIN" --build-arg STR_WORKER_BIN="$STR_WORKER_BIN" --build-arg STR_EGRESS_BIN="$STR_EGRESS_BIN" -t "$IMAGE" . >/dev/null
echo "image: $IMAGE built FROM $BASE"
