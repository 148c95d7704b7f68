#!/usr/bin/env bash
# make bench: `str-bench` (cmd/str-bench/bench_suite.go) on this machine: str run
# next to bubblewrap, plain exec and the kernel's clone floor for /bin/true
# and python3 -c pass, warm dispatch, echo_tool end to end cold, warm and
# from a per-tool template through throw-away workers, invocations per
# second with 4 in flight, and per-sandbox memory, all interleaved in one
# run (compare ratios, not absolute numbers), then str run next to
# bubblewrap under the same background load (2 x nproc CPU spinners,
# stopped at the end; --spinners 0 skips it), ending with issue 19's and
# issue 20's target tables and the under-load table in markdown (the
# README's Results table and docs/performance.md come from that output). Asserts nothing about the numbers.
# `--str-b OLD` (another str, its str-worker beside it, e.g. a build of an
# older commit) runs a second str binary in the same rounds, interleaved
# with STR_BIN's and bubblewrap's: one-shot str run restrictive, str run
# --serve through its own str serve, echo_tool cold, warm and from a
# template through its own workers (each binary's serve and workers in a
# state directory of its own, STR_STATE_DIR), Pss per sandbox and the
# phase under load; the summary adds the A/B table (A and B side by side,
# their ratios to bubblewrap and B/A). `str-bench load --str-b OLD` runs
# the under-load phase alone.
#
#   scripts/bench.sh [--quick] [--rounds R] [-n N] [--out DIR] [--str-b OLD] ...   (any str-bench flag; -r R = --rounds R)
#   make bench BENCH_ARGS='--quick --str-b /path/to/old/str'   (a relative OLD is from the repository's root)
#
# Builds bin/str and bin/str-worker unless STR_BIN names a str (with its
# str-worker beside it) and bin/str-bench unless
# STR_BENCH_BIN names one, installs bubblewrap when it is missing and we are
# root (str-bench refuses to compare without it), then execs
# `str-bench --str STR_BIN`. Output: the table and ratios on stdout, and
# summary.txt, samples.csv, latency.svg in $BENCH_OUT (var/bench).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

args=()
while (($#)); do
  case $1 in
    -r) args+=(--rounds "$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

if [[ -z ${STR_BIN:-} ]]; then
  mkdir -p bin
  CGO_ENABLED=0 go build -o bin/str ./cmd/str # as make build: static, no cgo
  CGO_ENABLED=0 go build -o bin/str-egress ./cmd/str-egress # every launcher's egress helper, beside str
  go build -tags disable_grpc_modules -o bin/str-worker ./cmd/str-worker  # the echo cells' str worker execs it (tags: as make build)
  STR_BIN=$root/bin/str
fi
[[ $STR_BIN == /* ]] || STR_BIN=$root/$STR_BIN
if [[ -z ${STR_BENCH_BIN:-} ]]; then
  mkdir -p bin
  go build -o bin/str-bench ./cmd/str-bench
  STR_BENCH_BIN=$root/bin/str-bench
fi
[[ $STR_BENCH_BIN == /* ]] || STR_BENCH_BIN=$root/$STR_BENCH_BIN
if ! command -v bwrap >/dev/null; then
  [[ $(id -u) == 0 ]] || { echo "bench.sh: bubblewrap is missing (sudo apt-get install bubblewrap)" >&2; exit 1; }
  echo "bench.sh: installing bubblewrap" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null; }
fi
exec "$STR_BENCH_BIN" --str "$STR_BIN" --out "${BENCH_OUT:-$root/var/bench}" --examples "$root/examples/tools" "${args[@]}"
