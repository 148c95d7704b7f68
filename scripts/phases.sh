#!/usr/bin/env bash
# phases.sh TARGET... — runs each make target in order and prints how long
# each took, also when one fails (CI reads the table to see where the time
# went on a loaded machine). Stops at the first failing target, with its
# exit status.
set -uo pipefail
MAKE=${MAKE:-make}
names=() secs=() status=0
for target in "$@"; do
  start=$(date +%s)
  $MAKE --no-print-directory "$target"; rc=$?
  names+=("$target"); secs+=($(( $(date +%s) - start )))
  if [ "$rc" -ne 0 ]; then status=$rc; names[-1]="$target (FAILED, exit $rc)"; break; fi
done
echo "phases:"
total=0
for i in "${!names[@]}"; do
  printf '  %-32s %5d s\n' "${names[$i]}" "${secs[$i]}"
  total=$(( total + secs[i] ))
done
printf '  %-32s %5d s\n' total "$total"
exit "$status"
