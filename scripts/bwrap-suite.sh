#!/usr/bin/env bash
# make bwrap-suite: bubblewrap's own tests, run in the same run once
# with this machine's bwrap and once with `str bwrap` (a symlink named
# bwrap to STR_BIN), with pass/fail/skip counts side by side and the name
# of every test whose outcome differs (issue 22).
#
#   scripts/bwrap-suite.sh        (as root: it installs what is missing)
#
# bubblewrap's tests come from the Debian source package of the bwrap
# installed here (apt-get source, through a deb-src list of our own in
# var/bwrap-suite/apt: the system's apt configuration is not touched), so
# the tests match the binary they are compared with; or from BWRAP_SRC, an
# unpacked bubblewrap tree. Nothing of bubblewrap is stored in this
# repository. Each test file is rewritten (scripts/bwrap-suite.py split)
# so that one failing test does not end the file; both sides run the same
# rewritten file. test-seccomp.py (Python unittest, each test on its own)
# runs as it is, with its probe try-syscall built from the same source.
# The FUSE tests are skipped for both sides; the setuid paths are not
# taken (Debian's bwrap is not setuid, nor is str). Two passes: as root,
# and as uid 65534 (str rootless, in a cgroup subtree delegated to it).
#
# Environment: STR_BIN (default: build bin/str), BWRAP_REF (/usr/bin/bwrap),
# BWRAP_SRC, BWRAP_SUITE_DIR (var/bwrap-suite), BWRAP_SUITE_TIMEOUT (seconds
# per test file and side, 120). Exit status 0 when both sides ran; the
# counts are the result, not a pass/fail verdict.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${BWRAP_SUITE_DIR:-$root/var/bwrap-suite}
ref=${BWRAP_REF:-/usr/bin/bwrap}
tests=(test-run.sh test-specifying-userns.sh test-specifying-pidns.sh test-seccomp.py)

need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v capsh >/dev/null || need+=(libcap2-bin)
command -v python3 >/dev/null || need+=(python3)
command -v dpkg-source >/dev/null || need+=(dpkg-dev)
command -v cc >/dev/null || need+=(gcc libc6-dev)
py=/usr/bin/python3
[[ -x $py ]] || py=python3
"$py" -c 'import seccomp' 2>/dev/null || need+=(python3-seccomp)
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || { echo "bwrap-suite: missing Debian packages: ${need[*]}" >&2; exit 1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

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
rm -rf "$gen" && mkdir -p "$gen"
cp "$src"/tests/libtest*.sh "$gen/"
for t in "${tests[@]}"; do
  [[ -f $src/tests/$t ]] || continue
  case $t in
    *.sh) python3 scripts/bwrap-suite.py split "$src/tests/$t" >"$gen/$t" ;;
    *.py) cp "$src/tests/$t" "$gen/$t" ;; # unittest: each test runs on its own already
  esac
  chmod +x "$gen/$t"
done
# test-seccomp.py runs its probe, try-syscall, built from bubblewrap's source.
cc -O2 -o "$gen/try-syscall" "$src/tests/try-syscall.c"

# One test file on one side as one user: its own session, so whatever it
# leaves running (a sandbox waiting on a fifo after a refused option) is
# killed with it.
run_side() { # who side binary test
  local out=$work/out/$1-$2/${4%.*}
  echo "== $4 with $3 as $1" >&2
  local run=(bash "$gen/$4")
  # Debian's python3, the one python3-seccomp is installed for.
  [[ $4 == *.py ]] && run=("$py" "$gen/$4" -v)
  local cmd=(env STR_SUITE_OKFILE="$out.okcount" BWRAP="$3" setsid timeout -k 10 "${BWRAP_SUITE_TIMEOUT:-120}" "${run[@]}")
  if [[ $1 == user ]]; then
    cmd=(bash -c 'for f in "${@:2:$1}"; do echo $$ >"$f"; done; shift $(($1 + 1)); exec setpriv --reuid 65534 --regid 65534 --clear-groups "$@"' \
      - "${#cgprocs[@]}" "${cgprocs[@]}" "${cmd[@]}")
  fi
  if [[ $4 == *.py ]]; then
    # unittest reports on stderr: one TAP line per test from it.
    "${cmd[@]}" >"$out.log" 2>&1 </dev/null || echo "# exit status $?" >>"$out.tap"
    python3 scripts/bwrap-suite.py unittest2tap <"$out.log" >>"$out.tap"
  else
    "${cmd[@]}" >"$out.tap" 2>"$out.log" </dev/null || echo "# exit status $?" >>"$out.tap"
  fi
  rm -f "$out.okcount"
}

# The unprivileged pass (uid 65534, as bubblewrap's tests run in their CI):
# str runs rootless, which needs a cgroup subtree delegated to the user
# (cgroup v1 here, as test/integration's TestRootless sets it up).
whos=(root)
cgprocs=() cgdirs=()
if [[ $(id -u) == 0 ]] && command -v setpriv >/dev/null; then
  while IFS=: read -r _ ctrls path; do
    for c in ${ctrls//,/ }; do
      case $c in memory | pids | cpu | cpuacct | freezer) ;; *) continue ;; esac
      d=/sys/fs/cgroup/$c$path/str-bwrap-suite-$$
      [[ -d /sys/fs/cgroup/$c ]] && mkdir -p "$d" 2>/dev/null || continue
      chown -R 65534:65534 "$d" && cgdirs+=("$d") && cgprocs+=("$d/cgroup.procs")
    done
  done </proc/self/cgroup
  ((${#cgprocs[@]})) && whos+=(user)
fi
cleanup() {
  local d
  for d in "${cgdirs[@]}"; do
    [[ -d $d ]] && { while read -r p; do echo "$p" >"$(dirname "$d")/cgroup.procs"; done <"$d/cgroup.procs"; rmdir "$d"/* "$d" 2>/dev/null; } || true
  done
}
trap cleanup EXIT
[[ " ${whos[*]} " == *" user "* ]] || echo "bwrap-suite: no cgroup v1 subtree to delegate: the unprivileged pass is skipped" >&2

rm -rf "$work/out"
for who in "${whos[@]}"; do
  mkdir -p "$work/out/$who-bwrap" "$work/out/$who-str"
  [[ $who == user ]] && chown 65534:65534 "$work/out/$who-bwrap" "$work/out/$who-str"
  for t in "${tests[@]}"; do
    [[ -f $gen/$t ]] || continue
    run_side "$who" bwrap "$ref" "$t"
    run_side "$who" str "$work/str-bin/bwrap" "$t"
  done
done

pkg=$(dpkg-query -W -f='bubblewrap ${Version}' bubblewrap 2>/dev/null || echo "$src")
for who in "${whos[@]}"; do
  echo
  [[ $who == root ]] && echo "bubblewrap's test suite ($pkg), as root:" || echo "bubblewrap's test suite ($pkg), as uid 65534 (str rootless):"
  python3 scripts/bwrap-suite.py report "$ref=$work/out/$who-bwrap" "str bwrap=$work/out/$who-str"
done
echo "(TAP output and logs: $work/out/)"
