#!/usr/bin/env bash
# make bwrap-suite: bubblewrap's own tests, run in the same run once with
# this machine's bwrap and once with `str bwrap` (a symlink named bwrap to
# STR_BIN), as root and as uid 65534, each test file in two variants; the
# counts side by side, every test that passes under bwrap and not under
# str, and a ratchet on that list (issue 31).
#
#   scripts/bwrap-suite.sh                (as root: it installs what is missing)
#   scripts/bwrap-suite.sh --write-known  (rewrite the ratchet's list from the last run)
#
# bubblewrap's tests come from the Debian source package of the bwrap
# installed here (apt-get source, through a deb-src list of our own in
# var/bwrap-suite/apt: the system's apt configuration is not touched), so
# the tests match the binary they are compared with; or from BWRAP_SRC, an
# unpacked bubblewrap tree (an upstream release, by hand). Nothing of
# bubblewrap is stored in this repository.
#
# The variants (scripts/bwrap-suite.py): asis, each shell test file as it
# is (it stops at its first failure: the tests after it count as not run);
# split, each file rewritten so that every group of statements ending in an
# "ok" line runs on its own and every test is counted. In both, a loop that
# waits for a file from a background sandbox also ends when that sandbox
# has exited (else the file hangs until the timeout when the sandbox
# fails). test-seccomp.py (Python unittest, each test on its own) is the
# same in both, with its probe try-syscall built from the same source.
# BWRAP_MUST_WORK=1 as in bubblewrap's CI (a binary that cannot run
# `true` fails the tests instead of skipping the file). The FUSE tests are
# skipped for both sides in both variants (libtest.sh would take any FUSE
# mount of the caller's uid on the host, which another program may make
# and remove during the run); neither binary is setuid.
#
# The passes: root, and uid 65534 (setpriv; HOME a directory of its own,
# no XDG_RUNTIME_DIR, no cgroup delegated or created for it: str must cope
# as bwrap does).
#
# The results: var/bwrap-suite/results.tsv (each test's outcome on both
# sides), counts.tsv, differences.tsv (the tests that pass under bwrap and
# not under str), out/PASS-VARIANT-SIDE/ (TAP output and logs). The ratchet
# (test/bwrap-suite/known-differences.txt, scripts/bwrap-suite.py check):
# the run fails when a test passes under bwrap and fails under str but is
# not listed, and when a listed test now passes under str. It applies to
# the installed package's suite only (not with BWRAP_SRC).
#
# Environment: STR_BIN (default: build bin/str), BWRAP_REF (/usr/bin/bwrap),
# BWRAP_SRC, BWRAP_SUITE_DIR (var/bwrap-suite), BWRAP_SUITE_KNOWN (the
# ratchet's list), BWRAP_SUITE_TIMEOUT (seconds per test file and side, a
# bound against a hang, not a measure: 300; a file that reaches it is named
# at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${BWRAP_SUITE_DIR:-$root/var/bwrap-suite}
known=${BWRAP_SUITE_KNOWN:-$root/test/bwrap-suite/known-differences.txt}
ref=${BWRAP_REF:-/usr/bin/bwrap}
timeout=${BWRAP_SUITE_TIMEOUT:-300}
tests=(test-run.sh test-specifying-userns.sh test-specifying-pidns.sh test-seccomp.py)
variants=(asis split)

case ${1:-} in
  "") ;;
  --write-known)
    [[ -f $work/results.tsv ]] || { echo "bwrap-suite: no run in $work yet: run make bwrap-suite first" >&2; exit 1; }
    exec python3 scripts/bwrap-suite.py write-known "$known" "$work" ;;
  *) echo "usage: scripts/bwrap-suite.sh [--write-known]" >&2; exit 2 ;;
esac

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v capsh >/dev/null || need+=(libcap2-bin)
command -v python3 >/dev/null || need+=(python3)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v pkill >/dev/null || need+=(procps)
py=/usr/bin/python3
[[ -x $py ]] || py=python3
# -I: not the seccomp/ directory of this repository (the working directory).
"$py" -I -c 'import seccomp' 2>/dev/null || need+=(python3-seccomp)
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || { echo "bwrap-suite: missing Debian packages: ${need[*]}" >&2; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
[[ $(id -u) == 0 ]] || { echo "bwrap-suite: run as root (the second pass runs as uid 65534 through setpriv)" >&2; exit 1; }

# str's side runs under the nesting profile (STR_BWRAP_PROFILE, the
# profile of a line without --str-profile): bubblewrap's suite runs
# bubblewrap inside bubblewrap and expects its own --seccomp filters to be
# the only ones, which the strict default profiles refuse by design
# (docs/bwrap.md, "Nested sandboxes"). STR_BWRAP_PROFILE=standard measures
# the default instead (the ratchet's list is for nesting).
export STR_BWRAP_PROFILE=${STR_BWRAP_PROFILE:-nesting}

if [[ -z ${STR_BIN:-} ]]; then
  mkdir -p bin
  CGO_ENABLED=0 go build -o bin/str ./cmd/str
  STR_BIN=$root/bin/str
fi
[[ $STR_BIN == /* ]] || STR_BIN=$root/$STR_BIN

mkdir -p "$work"
src=${BWRAP_SRC:-}
if [[ -z $src ]]; then
  # The source of the installed bubblewrap, from Debian's archive (its
  # Release file's signature and hashes checked by apt as for any package).
  version=$(dpkg-query -W -f='${Version}' bubblewrap)
  src=$work/src-$version
  if [[ ! -f $src/tests/test-run.sh ]]; then
    apt=$work/apt
    rm -rf "$apt" && mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/parts" "$apt/dl"
    . /etc/os-release
    cat >"$apt/parts/deb-src.sources" <<EOF
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: $VERSION_CODENAME $VERSION_CODENAME-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: $VERSION_CODENAME-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    chmod -R a+rX "$apt"
    aptopt=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$apt/parts"
      -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o APT::Sandbox::User=root)
    apt-get "${aptopt[@]}" update -qq
    (cd "$apt/dl" && apt-get "${aptopt[@]}" source --download-only -qq "bubblewrap=$version")
    rm -rf "$src"
    # dpkg-source applies Debian's patches (some of them change the tests).
    dpkg-source --no-check -x "$apt/dl"/bubblewrap_*.dsc "$src" >/dev/null
  fi
fi
[[ -f $src/tests/test-run.sh ]] || { echo "bwrap-suite: no tests/test-run.sh under $src" >&2; exit 1; }

# The str side: a symlink named bwrap, so str takes bubblewrap's line.
mkdir -p "$work/str-bin"
ln -sfn "$STR_BIN" "$work/str-bin/bwrap"

gen=$work/tests
rm -rf "$gen"
for v in "${variants[@]}"; do
  mkdir -p "$gen/$v"
  cp "$src"/tests/libtest-core.sh "$gen/$v/"
  python3 scripts/bwrap-suite.py lib "$src/tests/libtest.sh" >"$gen/$v/libtest.sh"
  for t in "${tests[@]}"; do
    [[ -f $src/tests/$t ]] || continue
    case $t in
      *.sh) python3 scripts/bwrap-suite.py "$v" "$src/tests/$t" >"$gen/$v/$t" ;;
      *.py) cp "$src/tests/$t" "$gen/$v/$t" ;; # unittest: each test runs on its own already
    esac
    chmod +x "$gen/$v/$t"
  done
  # test-seccomp.py runs its probe, try-syscall, built from bubblewrap's source.
  cc -O2 -o "$gen/$v/try-syscall" "$src/tests/try-syscall.c"
done
chmod -R a+rX "$gen"

# The unprivileged pass's home: its own, as any user's (nothing else is
# set up for it).
home=$work/home-65534
rm -rf "$home" && mkdir -p "$home" && chown 65534:65534 "$home"

# One test file, in one variant, on one side, as one user, in a session
# of its own: whatever the file leaves running (the die-with-parent
# tests' loop, a sandbox waiting on a fifo after a refused option) is
# killed when the file ends.
timedout=()
run_side() { # who variant side binary test
  local who=$1 variant=$2 side=$3 bin=$4 t=$5
  local out=$work/out/$who-$variant-$side/${t%.*} rc=0 sid
  echo "== $t ($variant) with $side as $who" >&2
  local run=(bash "$gen/$variant/$t")
  # Debian's python3, the one python3-seccomp is installed for.
  [[ $t == *.py ]] && run=("$py" "$gen/$variant/$t" -v)
  local cmd=(env BWRAP_MUST_WORK=1 STR_SUITE_OKFILE="$out.okcount" BWRAP="$bin" timeout -k 10 "$timeout" "${run[@]}")
  [[ $who == uid65534 ]] && cmd=(setpriv --reuid 65534 --regid 65534 --clear-groups env -u XDG_RUNTIME_DIR HOME="$home" "${cmd[@]}")
  cmd=(setsid -w bash -c 'echo $$ >"$0"; exec "$@"' "$out.sid" "${cmd[@]}")
  if [[ $t == *.py ]]; then
    # unittest reports on stderr: one TAP line per test from it.
    "${cmd[@]}" >"$out.log" 2>&1 </dev/null || rc=$?
    python3 scripts/bwrap-suite.py unittest2tap <"$out.log" >"$out.tap"
  else
    "${cmd[@]}" >"$out.tap" 2>"$out.log" </dev/null || rc=$?
  fi
  ((rc == 0)) || echo "# exit status $rc" >>"$out.tap"
  ((rc == 124 || rc == 137)) && timedout+=("$who $variant $side $t")
  sid=$(cat "$out.sid")
  pkill -KILL -s "$sid" 2>/dev/null || true
  rm -f "$out.okcount" "$out.sid"
}

rm -rf "$work/out"
start=$(date +%s)
for who in root uid65534; do
  for v in "${variants[@]}"; do
    mkdir -p "$work/out/$who-$v-bwrap" "$work/out/$who-$v-str"
    [[ $who == uid65534 ]] && chown 65534:65534 "$work/out/$who-$v-bwrap" "$work/out/$who-$v-str"
    for t in "${tests[@]}"; do
      [[ -f $gen/$v/$t ]] || continue
      run_side "$who" "$v" bwrap "$ref" "$t"
      run_side "$who" "$v" str "$work/str-bin/bwrap" "$t"
    done
  done
done

pkg=$(dpkg-query -W -f='bubblewrap ${Version}' bubblewrap 2>/dev/null || true)
[[ -n ${BWRAP_SRC:-} ]] && pkg="the tests of $BWRAP_SRC"
echo
echo "bubblewrap's test suite ($pkg; $ref and str bwrap), $(($(date +%s) - start)) s:"
python3 scripts/bwrap-suite.py results "$work"
echo "(results.tsv, counts.tsv, differences.tsv, TAP output and logs: $work)"
if ((${#timedout[@]})); then
  echo "bwrap-suite: these files reached the ${timeout} s bound (their tests not reached count as not run):"
  printf '  %s\n' "${timedout[@]}"
fi
if [[ -n ${BWRAP_SRC:-} ]]; then
  echo "bwrap-suite: BWRAP_SRC is set: the ratchet ($known) is for the installed package's suite and is not checked"
  exit 0
fi
python3 scripts/bwrap-suite.py check "$known" "$work"
