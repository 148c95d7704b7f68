#!/usr/bin/env bash
# Builds the image test/systemd runs as its host: the str base
# (scripts/image.sh, make image) plus systemd as PID 1
# (test/systemd/host). The tag is strsd-host:<hash of the base image id
# and the recipe files>; an existing tag is reused. Prints the tag.
#
# Environment: BASE (default str-base:bookworm, the latest local base).
# Needs docker, and the Debian mirror reachable from the build (apt-get
# runs with --network host, as debootstrap does for the base).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE=${BASE:-str-base:bookworm}
REPO=${SYSTEMD_IMAGE_REPO:-strsd-host}

base_id=$(docker image inspect -f '{{.Id}}' "$BASE" 2>/dev/null) \
	|| { echo "image-systemd: base $BASE missing (make image)" >&2; exit 1; }
hash=$( { echo "$base_id"; cat test/systemd/host/Dockerfile test/systemd/host/boot.sh; } | sha256sum | cut -c1-12)
TAG="$REPO:$hash"
if docker image inspect "$TAG" >/dev/null 2>&1; then
	echo "image-systemd: $TAG exists (same base and recipe), reused" >&2
else
	echo "image-systemd: building $TAG FROM $BASE (apt-get install systemd)" >&2
	docker build -q --network host --build-arg BASE="$BASE" -t "$TAG" test/systemd/host >/dev/null
fi
echo "$TAG"
