#!/usr/bin/env bash
# phases.sh TARGET... — runs each make target in order and prints how long
# each took (CI reads the table to see where the time went on a loaded
# machine). A failing target does not stop the run: every later target
# still runs, so one red phase never hides the others; the exit status is
# the first failure's, and the table ends with every failed phase named.
#
# Each make runs with -k, so a target whose prerequisites are several
# test runs (make test-unit: the plain and the race run) runs them all
# even when one fails.
#
# A target written TARGET:NEED[,NEED...] needs the earlier phases NEED
# (make test: every container phase needs the image). When a NEED failed,
# TARGET is not run (it would only fail again, or rebuild what failed);
# the table lists it as not run, naming the phase it waited for.
#
# A target written &TARGET starts in the background at that point and runs
# beside the targets after it; its output goes to var/phases/TARGET.log and
# is printed when it ends. Named again later without the &, the phase waits
# for it there; otherwise it is waited for after the last foreground
# target. make test uses it for the image: debootstrap mostly waits on the
# Debian mirror, so the base is built while the unit tests keep the cores
# busy.
#
# Every target runs with -o deps -o init -o build, and with -o for each
# phase that has run by then: the caller (make test) has done those once,
# two makes rebuilding bin/str at the same time would race on the file,
# and a phase's prerequisite that already ran (or failed) is not run again.
set -uo pipefail
MAKE=${MAKE:-make}
cd "$(dirname "$0")/.."
mk=("$MAKE" --no-print-directory -k -o deps -o init -o build)
names=() secs=() status=0
failed=() # the phases that failed, in the order they ended
declare -A outcome # phase -> ok | failed
bg_names=() bg_pids=() bg_starts=() bg_logs=()
# record NAME RC SECONDS [NOTE]: one row of the table.
record() {
  local n=$1 rc=$2 s=$3 note=${4:-}
  if [ "$rc" -eq 0 ]; then
    outcome[$n]=ok
    names+=("$n${note:+ ($note)}")
  else
    outcome[$n]=failed
    failed+=("$n")
    [ "$status" -ne 0 ] || status=$rc
    names+=("$n (${note:+$note, }FAILED, exit $rc)")
  fi
  secs+=("$s")
  mk+=(-o "$n")
}
# finish I: wait for background job I, print its output, record its time.
finish() {
  local i=$1 rc
  wait "${bg_pids[$i]}"; rc=$?
  echo "==== ${bg_names[$i]} (background) output ===="
  cat "${bg_logs[$i]}"
  record "${bg_names[$i]}" "$rc" $(( $(date +%s) - bg_starts[i] )) background
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
  needs=()
  if [[ $target == *:* ]]; then
    IFS=, read -r -a needs <<<"${target#*:}"
    target=${target%%:*}
  fi
  waited=0
  for i in "${!bg_names[@]}"; do
    if [[ ${bg_names[$i]} == "$target" && -n ${bg_pids[$i]} ]]; then finish "$i"; waited=1; fi
  done
  ((waited)) && continue
  # A phase waits for its NEEDs: one still in the background is waited
  # for here; one that failed, or never ran, keeps this phase from running.
  missing=""
  for need in "${needs[@]}"; do
    for i in "${!bg_names[@]}"; do
      if [[ ${bg_names[$i]} == "$need" && -n ${bg_pids[$i]} ]]; then finish "$i"; fi
    done
    [[ ${outcome[$need]:-} == ok ]] || missing+="${missing:+, }$need"
  done
  if [ -n "$missing" ]; then
    echo "phases: $target NOT RUN: it needs $missing, which failed or did not run" >&2
    names+=("$target (NOT RUN: needs $missing)"); secs+=(0)
    failed+=("$target (not run)")
    [ "$status" -ne 0 ] || status=1
    continue
  fi
  start=$(date +%s)
  "${mk[@]}" "$target"; rc=$?
  record "$target" "$rc" $(( $(date +%s) - start ))
  if [ "$rc" -ne 0 ]; then echo "phases: $target FAILED (exit $rc); the next phases run all the same" >&2; fi
done
for i in "${!bg_pids[@]}"; do
  if [[ -n ${bg_pids[$i]} ]]; then finish "$i"; fi
done
echo "phases:"
for i in "${!names[@]}"; do
  printf '  %-56s %5d s\n' "${names[$i]}" "${secs[$i]}"
done
if ((${#failed[@]})); then
  list=$(printf '%s, ' "${failed[@]}")
  echo "phases: FAILED: ${list%, }"
fi
exit "$status"
