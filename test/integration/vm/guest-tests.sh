#!/usr/bin/env bash
# guest-tests.sh: the guest side of scripts/test-vm.sh. Runs test binaries
# one after the other in the cgroup v2 guest and prints, for each, its
# verdict, its pass/fail/skip counts and its time; exits 1 if any failed.
#
#   guest-tests.sh NAME DIR BINARY [ARGS...] [--- NAME DIR BINARY [ARGS...]]...
#
# Each binary runs in DIR (its package directory: the tests read their
# testdata relative to it) with -test.v; the === RUN/PAUSE/CONT lines
# are left out of the output; every --- PASS/FAIL/SKIP line, log and
# === NAME line (which test the logs below it belong to) stays.
set -uo pipefail

[[ ${STR_CGROUP_V2:-} == 1 ]] || { echo "guest-tests.sh: STR_CGROUP_V2 is not 1: not in the cgroup v2 guest" >&2; exit 125; }
summary=()
failed=0
while [[ $# -ge 3 ]]; do
  name=$1 dir=$2 bin=$3
  shift 3
  args=()
  while [[ $# -gt 0 && $1 != --- ]]; do args+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift # the ---
  echo "==== $name: $bin -test.v ${args[*]} (in $dir)"
  log=$(mktemp "/tmp/str-vm-$name.XXXXXX")
  t0=$(date +%s)
  (cd "$dir" && "$bin" -test.v "${args[@]}") 2>&1 | tee "$log" | grep -vE '^ *=== (RUN|PAUSE|CONT) '
  rc=${PIPESTATUS[0]}
  secs=$(($(date +%s) - t0))
  pass=$(grep -cE '^ *--- PASS: ' "$log")
  fail=$(grep -cE '^ *--- FAIL: ' "$log")
  skip=$(grep -cE '^ *--- SKIP: ' "$log")
  verdict=PASS
  if [[ $rc != 0 ]]; then verdict="FAIL (exit $rc)"; failed=1; fi
  summary+=("$(printf '%-12s %-14s %4d passed %3d failed %3d skipped  %5d s' "$name" "$verdict" "$pass" "$fail" "$skip" "$secs")")
  if [[ $fail -gt 0 ]]; then
    summary+=("$(grep -E '^ *--- FAIL: ' "$log" | sed 's/^ */               /')")
  fi
done
[[ $# -eq 0 ]] || { echo "guest-tests.sh: bad arguments: $*" >&2; exit 125; }
echo "==== summary (cgroup v2 guest, kernel $(uname -r)):"
printf '  %s\n' "${summary[@]}"
exit "$failed"
