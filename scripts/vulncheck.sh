#!/usr/bin/env bash
# make lint: govulncheck against the Go vulnerability database.
#
#   scripts/vulncheck.sh PATH/TO/govulncheck
#
# The database lives at vuln.go.dev (or GOVULNDB, e.g. file:///srv/vulndb for
# an offline copy). Machines that reach only the Go module proxy cannot fetch
# it; then this says so on stderr and exits 0, so that lint still gates on
# everything else. Any finding, or any other failure, exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
govulncheck=${1:?usage: vulncheck.sh PATH/TO/govulncheck}
db=()
[[ -n ${GOVULNDB:-} ]] && db=(-db "$GOVULNDB")
out=$("$govulncheck" "${db[@]}" ./... 2>&1); rc=$?
if ((rc != 0)) && grep -q 'fetching vulnerabilities' <<<"$out"; then
  echo "vulncheck: NOT RUN: the vulnerability database is unreachable from this machine:" >&2
  grep 'fetching vulnerabilities' <<<"$out" | head -1 | sed 's/^/  /' >&2
  echo "  (set GOVULNDB=file:///path/to/a/copy to run it offline)" >&2
  exit 0
fi
echo "$out"
exit $rc
