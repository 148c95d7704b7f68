#!/usr/bin/env bash
# make lint: report functions no command reaches (golang.org/x/tools deadcode,
# without -test, so code only tests call counts as dead). Fails on any
# finding that scripts/deadcode.allow does not name with a reason.
#
#   scripts/deadcode.sh PATH/TO/deadcode
set -euo pipefail
cd "$(dirname "$0")/.."
deadcode=${1:?usage: deadcode.sh PATH/TO/deadcode}
allow=scripts/deadcode.allow
out=$("$deadcode" ./...)
bad=()
while IFS= read -r line; do
  [[ -z $line ]] && continue
  fn=${line##*unreachable func: }
  file=${line%%:*}
  # an allow line is "FILE FUNC  # reason"
  if grep -qE "^${file//./\\.} ${fn//./\\.}( |$)" "$allow"; then continue; fi
  bad+=("$line")
done <<<"$out"
if ((${#bad[@]})); then
  echo "deadcode: ${#bad[@]} unreachable function(s); delete them, wire them, or name them in $allow with a reason:" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "deadcode: clean"
