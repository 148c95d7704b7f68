#!/usr/bin/env bash
# make fuzz / make test-fuzz: run str's native Go fuzz targets, one
# `go test -run '^$' -fuzz '^Target$'` per target, each for FUZZTIME
# (default 20s), with the seed corpora in each package's testdata/fuzz/.
# A failure does not stop the others; the run fails at the end, naming
# every target that failed (its crasher is written to testdata/fuzz/).
#
#   scripts/fuzz.sh            every target          (make fuzz FUZZTIME=10m)
#   scripts/fuzz.sh --ci       the ones marked ci    (make test-fuzz, 12 s each)
#   scripts/fuzz.sh NAME...    only these targets
#
# FUZZMINIMIZETIME (default 5s) bounds the minimisation of each new input;
# Go's default of 60s can eat a short run whole.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
FUZZTIME=${FUZZTIME:-20s}
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-5s}

# Every fuzz target of the repository: package, target, and "ci" for the
# ones `make test` runs (one per area of the fuzzing plan, and every parser
# of bytes that come from inside the sandbox; 14 ci targets x FUZZTIME).
# A Fuzz function missing here fails the run.
targets=(
  "./worker                    FuzzParseRequest      ci" # request parsing and validation
  "./worker                    FuzzParseInitRequest  -"  # init requests of both generations, notifications
  "./worker/manifest           FuzzParse             ci" # the tool manifest
  "./profiles/profileyaml      FuzzDecode            ci" # profiles: decode, validate, Tighten never loosens
  "./profiles                  FuzzParseQuantity     ci" # 512Mi, 500m, 60s and their formatters
  "./seccomp                   FuzzEmbeddedPolicies  ci" # shipped BPF vs policy semantics (Simulate vs Evaluate)
  "./seccomp                   FuzzCompile           ci" # random small policies: compile vs Evaluate
  "./broker                    FuzzLineReaders       ci" # dev broker line framing, server and client
  "./worker/artifacts          FuzzLocate            ci" # artifact names and store paths, NFKC look-alikes
  "./egress                    FuzzNormalizeHost     ci" # network policy host patterns and matching
  "./egress/proxy              FuzzParseConnectLine  -"  # the proxy's CONNECT line alone
  "./egress/proxy              FuzzReadHead          ci" # sandbox bytes: the HTTP proxy's request head and its target
  "./egress/proxy              FuzzParseSOCKSRequest ci" # sandbox bytes: the proxy's SOCKS5 request, framed and parsed
  "./egress/proxy              FuzzParseDNSQuery     ci" # sandbox bytes: the DNS stub's queries and answers
  "./egress/proxy              FuzzClientHelloSNI    ci" # sandbox bytes: SNI of captured TLS connections, parsed and peeked
  "./broker                    FuzzRequest           -"  # dev broker request handling
  "./worker/transport          FuzzMatch             -"  # topic matching
  "./launcher/resident         FuzzDecodeResidentRequest ci" # str serve: a caller's request (str run's binary encoding), decoded and planned
)

ci=0
only=()
for a in "$@"; do
  case $a in
    --ci) ci=1 ;;
    -*) echo "fuzz.sh: unknown option $a" >&2; exit 2 ;;
    *) only+=("$a") ;;
  esac
done

# Every Fuzz function in the tree must be listed above.
listed=" "
for t in "${targets[@]}"; do
  read -r pkg name _ <<<"$t"
  listed+="${pkg#./}:$name "
done
missing=()
while IFS=: read -r file _ decl; do
  name=${decl#func }
  name=${name%%(*}
  dir=$(dirname "$file")
  [[ $listed == *" ${dir#./}:$name "* ]] || missing+=("${dir#./}:$name")
done < <(grep -rnE '^func Fuzz[A-Za-z0-9_]*\(f \*testing\.F\)' --include='*_test.go' . | sed 's/:[0-9]*:/::/')
if ((${#missing[@]})); then
  echo "fuzz.sh: fuzz targets not listed in scripts/fuzz.sh: ${missing[*]}" >&2
  exit 1
fi

# coordinator_race NAME: the last run of NAME (in $log) failed with
# nothing but the coordinator's deadline error, and wrote no failing input.
coordinator_race() {
  grep -q "^--- FAIL: $1 (" "$log" &&
    grep -A1 "^--- FAIL: $1 (" "$log" | tail -n1 | grep -qx '    context deadline exceeded' &&
    ! grep -q 'Failing input written to' "$log" &&
    [[ $(grep -c '^--- FAIL' "$log") == 1 ]]
}

log=$(mktemp)
trap 'rm -f "$log"' EXIT
failed=()
raced=()
ran=0
for t in "${targets[@]}"; do
  read -r pkg name tier <<<"$t"
  if ((ci)) && [[ $tier != ci ]]; then continue; fi
  if ((${#only[@]})) && [[ " ${only[*]} " != *" $name "* ]]; then continue; fi
  echo "=== fuzz $pkg $name for $FUZZTIME"
  ran=$((ran + 1))
  corpus="${pkg#./}/testdata/fuzz/$name"
  before=$(ls "$corpus" 2>/dev/null | wc -l)
  if "$GO" test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg" 2>&1 | tee "$log"; then
    continue
  fi
  after=$(ls "$corpus" 2>/dev/null | wc -l)
  if coordinator_race "$name" && ((after == before)); then
    # Go's fuzz coordinator (before go1.27) can report its own -fuzztime
    # deadline as a failure: the deadline cancels the parent context, and
    # stop() compares against the child's error before the cancellation
    # reaches it (golang/go#75804, fixed in go1.27 by CL 774140). No input
    # failed: no crasher was written. Replay the corpus to be sure.
    echo "fuzz.sh: $name: bare 'context deadline exceeded' at the deadline, no crasher (golang/go#75804); replaying the corpus"
    if "$GO" test -run "^${name}\$" "$pkg"; then
      raced+=("$pkg $name")
      continue
    fi
  fi
  failed+=("$pkg $name")
done
if ((ran == 0)); then
  echo "fuzz.sh: no target matches ${only[*]}" >&2
  exit 2
fi
if ((${#failed[@]})); then
  echo "fuzz.sh: ${#failed[@]} of $ran target(s) failed:" >&2
  printf '  %s\n' "${failed[@]}" >&2
  exit 1
fi
if ((${#raced[@]})); then
  echo "fuzz.sh: passed after the coordinator's deadline race (golang/go#75804) and a clean corpus replay:"
  printf '  %s\n' "${raced[@]}"
fi
echo "fuzz.sh: $ran target(s) passed, $FUZZTIME each"
