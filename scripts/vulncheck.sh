#!/usr/bin/env bash
# make lint: govulncheck against the Go vulnerability database.
#
#   scripts/vulncheck.sh TOOLS_DIR GOVULNCHECK_PACKAGE@VERSION
#
# The database lives at vuln.go.dev (or GOVULNDB, e.g. file:///srv/vulndb for
# an offline copy). Machines that reach only the Go module proxy cannot fetch
# it (the proxy serves modules, not the database), and govulncheck has no
# offline mode without a copy. So the database is probed first (one small
# file, index/db.json): when it is unreachable this says so on stderr,
# naming the error, and exits 0 without building or running govulncheck
# (lint still gates on everything else; building it costs more CPU than
# the rest of lint's tools together on a cold cache). When it is
# reachable, govulncheck is installed into TOOLS_DIR at the pinned version
# and any finding, or any other failure, exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
tools=${1:?usage: vulncheck.sh TOOLS_DIR GOVULNCHECK_PACKAGE@VERSION}
spec=${2:?usage: vulncheck.sh TOOLS_DIR GOVULNCHECK_PACKAGE@VERSION}
db=${GOVULNDB:-https://vuln.go.dev}
if ! why=$(python3 - "${db%/}/index/db.json" 2>&1 <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=20).read(1)
except Exception as e:
    print(e)
    sys.exit(1)
PY
); then
  echo "vulncheck: NOT RUN: the vulnerability database $db is unreachable from this machine:" >&2
  echo "  ${why:-no answer}" >&2
  echo "  (set GOVULNDB=file:///path/to/a/copy to run it offline)" >&2
  exit 0
fi
./scripts/install-tool.sh "$tools" "$spec" || exit
pkg=${spec%@*}; govulncheck=$tools/${pkg##*/}
args=()
[[ -n ${GOVULNDB:-} ]] && args=(-db "$GOVULNDB")
"$govulncheck" "${args[@]}" ./...
