#!/usr/bin/env bash
# make bench: spawn latency of str next to bubblewrap and plain exec, on
# this machine, in one interleaved run (machine noise spreads evenly over
# the cells; compare ratios, not absolute numbers).
#
#   scripts/bench.sh [-r ROUNDS] [-n SPAWNS_PER_ROUND]     (default 5 x 40)
#
# Cells (target /bin/true, then /usr/bin/python3 -c pass):
#   plain exec; str run --profile restrictive; bwrap with the restrictive
#   line (--unshare-net --clearenv) and the standard line.
# Driver: shared/bench/spawnloop.c (built into bin/) when ../shared/bench
# exists, else `str bench spawn`; both spawn with no shell and wait for the
# whole process tree (child subreaper). Prints p50/p99 per cell and the
# ratio str / bwrap-restrictive. Raw samples stay in $BENCH_OUT (var/bench).
# Asserts nothing about the numbers.
# Env: STR_BIN (use this str instead of building bin/str), BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rounds=5 n=40
while getopts "r:n:" o; do
  case $o in
    r) rounds=$OPTARG ;;
    n) n=$OPTARG ;;
    *) sed -n '6p' "$0" >&2; exit 2 ;;
  esac
done

# 1. str, bubblewrap, the driver.
if [[ -z ${STR_BIN:-} ]]; then
  mkdir -p bin
  go build -o bin/str ./cmd/str
  STR_BIN=$root/bin/str
fi
[[ $STR_BIN == /* ]] || STR_BIN=$root/$STR_BIN
if ! command -v bwrap >/dev/null; then
  [[ $(id -u) == 0 ]] || { echo "bench.sh: bubblewrap is missing (sudo apt-get install bubblewrap)" >&2; exit 1; }
  echo "bench.sh: installing bubblewrap" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends bubblewrap >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends bubblewrap >/dev/null; }
fi
bwrap=$(command -v bwrap)
shared=${STR_SHARED:-$root/../shared}
if [[ -f $shared/bench/spawnloop.c ]] && command -v gcc >/dev/null; then
  mkdir -p bin
  gcc -O2 -Wall -o bin/spawnloop "$shared/bench/spawnloop.c"
  driver=("$root/bin/spawnloop") driver_name="spawnloop.c (shared/bench)"
else
  driver=("$STR_BIN" bench spawn) driver_name="str bench spawn"
fi

# 2. the cells.
out=${BENCH_OUT:-$root/var/bench}
rm -rf "$out" && mkdir -p "$out"
w=$(mktemp -d "${TMPDIR:-/tmp}/str-bench.XXXXXX")
trap 'rm -rf "$w"' EXIT
chmod 755 "$w"
bw_std=("$bwrap" --die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-uts
  --ro-bind / / --tmpfs /tmp --bind "$w" "$w" --chdir "$w" --)
bw_res=("$bwrap" --die-with-parent --new-session --unshare-pid --unshare-ipc --unshare-uts
  --unshare-net --clearenv --ro-bind / / --tmpfs /tmp --bind "$w" "$w" --chdir "$w" --)
py=(/usr/bin/python3 -c pass)
cells=(plain-true str-true bwrap-res-true bwrap-std-true plain-py str-py bwrap-res-py)
declare -A title=(
  [plain-true]="/bin/true, plain exec"
  [str-true]="/bin/true, str run --profile restrictive"
  [bwrap-res-true]="/bin/true, bwrap restrictive line"
  [bwrap-std-true]="/bin/true, bwrap standard line"
  [plain-py]="python3 -c pass, plain exec"
  [str-py]="python3 -c pass, str run --profile restrictive"
  [bwrap-res-py]="python3 -c pass, bwrap restrictive line")
cell_cmd() {
  case $1 in
    plain-true) cmd=(/bin/true) ;;
    str-true) cmd=("$STR_BIN" run --profile restrictive -- /bin/true) ;;
    bwrap-res-true) cmd=("${bw_res[@]}" /bin/true) ;;
    bwrap-std-true) cmd=("${bw_std[@]}" /bin/true) ;;
    plain-py) cmd=("${py[@]}") ;;
    str-py) cmd=("$STR_BIN" run --profile restrictive -- "${py[@]}") ;;
    bwrap-res-py) cmd=("${bw_res[@]}" "${py[@]}") ;;
  esac
}
# Each cell must work before it is timed.
for c in "${cells[@]}"; do
  cell_cmd "$c"
  "${cmd[@]}" </dev/null >/dev/null 2>"$out/check.err" ||
    { echo "bench.sh: cell $c fails: ${cmd[*]}" >&2; cat "$out/check.err" >&2; exit 1; }
done

echo "bench: $(date -u +%FT%TZ) kernel $(uname -r), $(nproc) CPUs, cgroup fs $(stat -fc %T /sys/fs/cgroup), uid $(id -u)"
echo "bench: driver $driver_name; $($bwrap --version); $rounds rounds x $n spawns per cell, interleaved"
t0=$(date +%s)
for ((r = 1; r <= rounds; r++)); do
  for c in "${cells[@]}"; do
    cell_cmd "$c"
    "${driver[@]}" -n "$n" -w 3 -l "$c" -o "$out/$c.raw" -- "${cmd[@]}" >>"$out/driver.log"
  done
done

# 3. the table: nearest-rank percentiles over every round's samples (ms).
# RAW columns: lat_us cpu_us maxrss_kb wait_status full_us.
pct() { # FILE COLUMN PERCENT
  awk -v c="$2" '{ print $c }' "$1" | sort -g |
    awk -v p="$3" '{ a[NR] = $1 } END { k = int(p / 100 * NR + 0.999999); if (k < 1) k = 1; if (k > NR) k = NR; printf "%.2f", a[k] / 1000 }'
}
declare -A p50
printf '\n%-48s %8s %8s %9s %8s %6s %5s\n' "cell" "p50 ms" "p99 ms" "full p50" "cpu p50" "n" "fails"
for c in "${cells[@]}"; do
  f=$out/$c.raw
  p50[$c]=$(pct "$f" 1 50)
  printf '%-48s %8s %8s %9s %8s %6d %5d\n' "${title[$c]}" "${p50[$c]}" "$(pct "$f" 1 99)" "$(pct "$f" 5 50)" \
    "$(pct "$f" 2 50)" "$(wc -l <"$f")" "$(awk '$4 != 0' "$f" | wc -l)"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }
echo
echo "ratio str / bwrap restrictive, p50: /bin/true $(ratio "${p50[str-true]}" "${p50[bwrap-res-true]}"), python3 -c pass $(ratio "${p50[str-py]}" "${p50[bwrap-res-py]}")"
echo "str over plain exec, p50: /bin/true +$(awk -v a="${p50[str-true]}" -v b="${p50[plain-true]}" 'BEGIN { printf "%.2f", a - b }') ms, python3 +$(awk -v a="${p50[str-py]}" -v b="${p50[plain-py]}" 'BEGIN { printf "%.2f", a - b }') ms"
echo "(p50/p99: until the launcher is reaped; full: until its whole process tree is gone; cpu: the whole tree)"
echo "bench: $(($(date +%s) - t0)) s; raw samples in $out"

# 4. The worker end to end (issue 3): echo_tool from publish to reply
# through the embedded broker, next to python3 -c pass in the same run, and
# invocations per second at the default concurrency (4). A throw-away
# worker on a free loopback port, with the example tools.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
hport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
wstate=$(mktemp -d "${TMPDIR:-/tmp}/str-bench-worker.XXXXXX")
SAM_NAMESPACE=bench/ MANIFEST_PATH=$root/examples/tools/manifest.yaml TOOLS_PYTHON_DIR=$root/examples/tools/python \
  ARTIFACT_SERVICE_TYPE=memory SANDBOX_WORK_DIR=$wstate/work STR_RUNNER_DIR=$wstate/runner STR_SITE_DIR=$wstate/site \
  SANDBOX_PYTHON_BIN=/usr/bin/python3 HEALTH_PORT=$hport STR_LOG_LEVEL=warn \
  "$STR_BIN" worker --embedded-broker "127.0.0.1:$port" >"$out/worker.log" 2>&1 &
wpid=$!
trap 'kill $wpid 2>/dev/null; wait $wpid 2>/dev/null; rm -rf "$w" "$wstate"' EXIT
for _ in $(seq 100); do
  python3 -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:$hport/readyz',timeout=1).status==200 else 1)" 2>/dev/null && break
  sleep 0.1
done
echo
echo "worker: echo_tool end to end through the embedded broker (${n}x$rounds sequential, then the same with 4 in flight)"
"$STR_BIN" bench echo --broker "127.0.0.1:$port" --namespace bench/ -n $((n * rounds)) -c 4 | tee "$out/echo.txt"
