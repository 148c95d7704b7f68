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

# test_timeout_s ARGS...: the -test.timeout the set was given, in seconds
# (600 when none is, Go's default).
test_timeout_s() {
  local t=10m
  while [[ $# -gt 0 ]]; do
    case $1 in -test.timeout) t=${2:-10m}; shift ;; -test.timeout=*) t=${1#*=} ;; esac
    shift
  done
  case $t in *m) echo $((${t%m} * 60)) ;; *s) echo "${t%s}" ;; *h) echo $((${t%h} * 3600)) ;; *) echo 600 ;; esac
}

# processes: every user-space process of the guest but this script's own
# tools, with
# its state and where in the kernel it waits.
processes() { ps -eo pid,ppid,stat,wchan:32,etimes,args --sort=pid 2>&1 | awk '$2 != 2 && $1 != 2' | grep -vE ' (ps|awk|grep|tail|sleep) '; }

# watchdog NAME PID ARGS...: the Go test binary ends itself at its
# -test.timeout (printing every goroutine); if it has not exited a minute
# after that, something below Go holds it (a process in the kernel's
# uninterruptible sleep cannot exit): print what every process waits on
# and the kernel stacks of the blocked ones, then kill the set, so the
# run ends with a diagnosis instead of the VM's timeout.
watchdog() {
  local name=$1 pid=$2
  shift 2
  sleep $(($(test_timeout_s "$@") + 60)) &
  local sp=$!
  trap 'kill "$sp" 2>/dev/null; exit 0' TERM
  wait "$sp"
  kill -0 "$pid" 2>/dev/null || return 0
  {
    echo "guest-tests.sh: $name: still running 60 s past its -test.timeout; processes:"
    processes
    for st in /proc/[0-9]*/stat; do
      read -r p _ state _ <"$st" 2>/dev/null || continue
      [[ $state == D ]] || continue
      echo "--- kernel stack of blocked pid $p ($(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null)):"
      cat "/proc/$p/stack" 2>/dev/null
    done
  } >&2
  kill -KILL "$pid" 2>/dev/null
}

# leftover NAME BEFORE: the user-space processes alive now that were not
# before the set started (BEFORE: their pids, one per line). None should be:
# every sandbox dies with its test. They are printed as a finding; the set
# does not wait for them.
leftover() {
  local name=$1 before=$2 now
  now=$(ps -eo pid=,ppid=,stat=,args= | awk -v me=$$ '$1 != 2 && $2 != 2 && $1 != me && $2 != me' | grep -vE '^ *[0-9]+ +[0-9]+ +[^ ]+ +(ps|awk|grep) ' || true)
  now=$(awk 'NR == FNR { old[$1] = 1; next } !($1 in old)' <(printf '%s\n' "$before") <(printf '%s\n' "$now"))
  [[ -z $now ]] && return 0
  echo "guest-tests.sh: $name: processes left behind after the binary exited:" >&2
  printf '%s\n' "$now" >&2
}
while [[ $# -ge 3 ]]; do
  name=$1 dir=$2 bin=$3
  shift 3
  args=()
  while [[ $# -gt 0 && $1 != --- ]]; do args+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift # the ---
  echo "==== $name: $bin -test.v ${args[*]} (in $dir)"
  log=$(mktemp "/tmp/str-vm-$name.XXXXXX")
  t0=$(date +%s)
  # The binary writes to the log file, not to a pipe: a process it left
  # behind (a sandbox that outlived its test) would keep a pipe's write end
  # open, and the set would then wait for it until the VM's timeout with
  # nothing printed (CI: 2,400 s and not one line). tail follows the log
  # until the binary itself exits; grep passes each line on as it comes
  # (block buffering held a whole set's output back).
  before=$(ps -eo pid=)
  (cd "$dir" && exec "$bin" -test.v "${args[@]}") >"$log" 2>&1 </dev/null &
  pid=$!
  watchdog "$name" "$pid" "${args[@]}" &
  wpid=$!
  tail -n +1 -s 1 --pid="$pid" -f "$log" | grep --line-buffered -vE '^ *=== (RUN|PAUSE|CONT) '
  wait "$pid"
  rc=$?
  kill "$wpid" 2>/dev/null
  wait "$wpid" 2>/dev/null
  leftover "$name" "$before"
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
