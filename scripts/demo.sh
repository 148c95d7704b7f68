#!/usr/bin/env bash
# make demo: a scripted tour against a running worker (make run):
# the tools it serves, echo, an artifact round trip, a timeout, an escape
# attempt that is stopped. With no worker serving it says so and stops.
# Run it as the worker's user: str invoke reads the broker's token file
# (bin/str broker --help says where; DEV_BROKER_TOKEN_FILE overrides).
# BROKER=HOST:PORT (make demo BROKER=...) names the broker when it is not
# make run's 127.0.0.1:55554 (make run BROKER_PORT=N: 127.0.0.1:N);
# SAM_NAMESPACE the namespace (demo/).
set -uo pipefail
cd "$(dirname "$0")/.."
STR="${STR:-bin/str}"
# str tools and str invoke run in str-worker beside str (make build builds both).
[ -x "$STR" ] && [ -x "$(dirname "$STR")/str-worker" ] && [ -x "$(dirname "$STR")/str-egress" ] || make -s build
BROKER="${BROKER:-127.0.0.1:55554}"
NS="${SAM_NAMESPACE:-demo/}"
inv() { "$STR" invoke "$@" --broker "$BROKER" --namespace "$NS"; }
step() { printf '\n=== %s\n' "$*"; }
fail=0

step "0. the tools the worker serves (str tools)"
if ! "$STR" tools --broker "$BROKER" --namespace "$NS"; then
  echo "demo: no worker is serving namespace $NS on $BROKER: start one with make run (in another terminal, as this user; make run BROKER_PORT=N and make demo BROKER=127.0.0.1:N for another port) and run make demo again" >&2
  exit 1
fi

step "1. echo_tool: a message goes in and comes back"
inv echo_tool --args '{"message":"hello from the demo"}' || fail=1

step "2. process_file: an artifact goes in (inline), two come out into the store"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
printf 'alpha\nbeta\ngamma\n' > "$tmp/data.txt"
inv process_file --artifact input_file="$tmp/data.txt" --session demo-session || fail=1
step "2b. the same tool again, reading the previous output from the store by reference"
inv process_file --ref input_file=upper.txt --session demo-session || fail=1

step "3. slow_operation with a 2 s timeout (the worker adds 5 s before it kills the sandbox): status lines, then a timed_out result"
out="$(inv slow_operation --args '{"steps":10,"delay":1}' --timeout 2)"; echo "$out"
if echo "$out" | grep -q '"timed_out":true'; then
  echo "(timed out as expected, after 2 + 5 s)"
else
  echo "demo: expected a timed_out result"; fail=1
fi

step "4. escape_attempt: every attempt must be blocked"
out="$(inv escape_attempt)"; echo "$out"
if echo "$out" | grep -q '"all_blocked":true'; then echo "(all blocked)"; else echo "demo: something was NOT blocked"; fail=1; fi

step "5. failing_tool: a tool error comes back as TOOL_ERROR"
inv failing_tool && fail=1 || true

exit $fail
