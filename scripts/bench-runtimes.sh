#!/usr/bin/env bash
# The runtime classes side by side (docs/runtimes.md): one-shot str run of
# /bin/true and python3 -c pass under namespaces (profile restrictive) and
# gvisor (examples/profiles/gvisor.yaml), next to runsc do of the same
# commands. Interleaved: each of R rounds runs the six commands once, in
# that order, stdout and stderr to /dev/null; prints each command's median,
# min and max wall time of the whole command (ms). Asserts nothing.
#
#   scripts/bench-runtimes.sh [ROUNDS]   (default 8; root; needs runsc)
#
# Uses STR_BIN (default: builds bin/str and bin/str-worker, which decodes
# the example profile).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-8}
if [[ -z ${STR_BIN:-} ]]; then make -s build >/dev/null; STR_BIN=$PWD/bin/str; fi
command -v runsc >/dev/null || { echo "bench-runtimes: runsc not found (apt-get install runsc)" >&2; exit 1; }
g=(--profile-dir "$PWD/examples/profiles" --profile gvisor)
names=("namespaces /bin/true" "gvisor /bin/true" "runsc do /bin/true"
  "namespaces python3 -c pass" "gvisor python3 -c pass" "runsc do python3 -c pass")
cell() {
  case $1 in
    0) "$STR_BIN" run --one-shot --profile restrictive -- /bin/true ;;
    1) "$STR_BIN" run --one-shot "${g[@]}" -- /bin/true ;;
    2) runsc --network=none --platform=ptrace do /bin/true ;;
    3) "$STR_BIN" run --one-shot --profile restrictive -- python3 -c pass ;;
    4) "$STR_BIN" run --one-shot "${g[@]}" -- python3 -c pass ;;
    5) runsc --network=none --platform=ptrace do python3 -c pass ;;
  esac
}
declare -a times
cd /tmp
for ((r = 0; r < rounds; r++)); do
  for i in 0 1 2 3 4 5; do
    t0=$(date +%s%N)
    cell $i >/dev/null 2>&1 || echo "bench-runtimes: ${names[$i]} failed" >&2
    times[$i]+=" $((($(date +%s%N) - t0) / 1000000))"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); runsc: $(runsc --version | head -1)"
for i in 0 1 2 3 4 5; do
  sorted=($(tr ' ' '\n' <<<"${times[$i]}" | grep . | sort -n))
  n=${#sorted[@]}
  printf '%-28s median %5d ms  min %5d  max %5d  (n=%d)\n' "${names[$i]}" "${sorted[$((n / 2))]}" "${sorted[0]}" "${sorted[$((n - 1))]}" "$n"
done
