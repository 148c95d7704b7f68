#!/usr/bin/env bash
# make test-vm: run the cgroup v2 integration set (test/integration,
# TestCgroupV2*) inside a throw-away QEMU guest with a pure cgroup v2
# hierarchy, for hosts whose cgroups are v1 or hybrid.
#
#   scripts/test-vm.sh [extra go test flags, e.g. -test.run CgroupV2PidsMax]
#
# Builds bin/str and the integration test binary on the host, then boots
# test/integration/vm/run-in-vm.sh (KVM when usable, else TCG emulation:
# expect a few minutes) and runs the set there as root with STR_CGROUP_V2=1
# (set by the harness), STR_MUST_WORK=1 and STR_BIN=<absolute bin/str>.
# Env: STR_BIN (use this str instead of building bin/str), STR_VM_TIMEOUT
# (seconds, default 1200), STR_VM_CACHE (kernel cache).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
t0=$(date +%s)

command -v go >/dev/null || { echo "test-vm.sh: Go is not installed" >&2; exit 1; }
if [[ -z ${STR_BIN:-} ]]; then # a prebuilt str may be given instead
  mkdir -p bin
  go build -o bin/str ./cmd/str
  STR_BIN=$root/bin/str
fi
[[ $STR_BIN == /* ]] || STR_BIN=$root/$STR_BIN
tmp=$(mktemp -d "${TMPDIR:-/tmp}/str-test-vm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"
go test -c -o "$tmp/integration.test" ./test/integration

run=(-test.run 'CgroupV2' -test.v -test.count=1)
[[ $# -gt 0 ]] && run=(-test.v -test.count=1 "$@")
rc=0
(cd test/integration && STR_MUST_WORK=1 STR_BIN="$STR_BIN" \
  "$root/test/integration/vm/run-in-vm.sh" --allow-tcg --timeout "${STR_VM_TIMEOUT:-1200}" -- \
  "$tmp/integration.test" "${run[@]}") || rc=$?
echo "test-vm.sh: exit $rc after $(($(date +%s) - t0)) s" >&2
exit $rc
