#!/usr/bin/env bash
# phases.sh TARGET... — runs each make target in order and prints how long
# each took, also when one fails (CI reads the table to see where the time
# went on a loaded machine). Stops at the first failing target, with its
# exit status.
#
# A target written &TARGET starts in the background at that point and runs
# beside the targets after it; its output goes to var/phases/TARGET.log and
# is printed when it ends. Named again later without the &, the phase waits
# for it there (and fails there if it failed); otherwise it is waited for
# after the last foreground target, also when one of those fails. make test
# uses it for the image: debootstrap mostly waits on the Debian mirror, so
# the base is built while the unit tests keep the cores busy.
#
# Every target runs with -o deps -o init -o build: the caller (make test)
# has done those once, and two makes rebuilding bin/str at the same time
# would race on the file.
set -uo pipefail
MAKE=${MAKE:-make}
cd "$(dirname "$0")/.."
mk=("$MAKE" --no-print-directory -o deps -o init -o build)
names=() secs=() status=0
bg_names=() bg_pids=() bg_starts=() bg_logs=()
# finish I: wait for background job I, print its output, record its time.
finish() {
  local i=$1 rc n
  wait "${bg_pids[$i]}"; rc=$?
  echo "==== ${bg_names[$i]} (background) output ===="
  cat "${bg_logs[$i]}"
  n="${bg_names[$i]} (background)"
  if [ "$rc" -ne 0 ]; then
    n="${bg_names[$i]} (background, FAILED, exit $rc)"
    [ "$status" -ne 0 ] || status=$rc
  fi
  names+=("$n"); secs+=($(( $(date +%s) - bg_starts[i] )))
  bg_pids[$i]=""
}
for target in "$@"; do
  if [[ $target == '&'* ]]; then
    target=${target#&}
    mkdir -p var/phases
    log=var/phases/$target.log
    echo "phases: $target runs in the background (output in $log, printed when it ends)"
    "${mk[@]}" "$target" >"$log" 2>&1 &
    bg_names+=("$target") bg_pids+=("$!") bg_starts+=("$(date +%s)") bg_logs+=("$log")
    continue
  fi
  waited=0
  for i in "${!bg_names[@]}"; do
    if [[ ${bg_names[$i]} == "$target" && -n ${bg_pids[$i]} ]]; then finish "$i"; waited=1; fi
  done
  if ((waited)); then
    if [ "$status" -ne 0 ]; then break; fi
    continue
  fi
  start=$(date +%s)
  "${mk[@]}" "$target"; rc=$?
  names+=("$target"); secs+=($(( $(date +%s) - start )))
  if [ "$rc" -ne 0 ]; then status=$rc; names[-1]="$target (FAILED, exit $rc)"; break; fi
done
for i in "${!bg_pids[@]}"; do
  if [[ -n ${bg_pids[$i]} ]]; then finish "$i"; fi
done
echo "phases:"
for i in "${!names[@]}"; do
  printf '  %-44s %5d s\n' "${names[$i]}" "${secs[$i]}"
done
exit "$status"
