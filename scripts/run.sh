#!/usr/bin/env bash
# make run: build str and start a worker with the embedded dev broker on
# 127.0.0.1:BROKER_PORT (default 55554; make run BROKER_PORT=N), namespace
# demo/, the example tools and a filesystem artifact store under
# ./var/artifacts. Then, from a second terminal:
#   bin/str invoke echo_tool --args '{"message":"hi"}'
# (with another port: --broker 127.0.0.1:N, or DEV_BROKER_PORT=N).
# The embedded broker requires the token it writes (mode 0600) to
# /run/str/broker-PORT.token as root, else $XDG_RUNTIME_DIR/str/ or
# /tmp/str-UID/ (see bin/str broker --help); str invoke reads it by itself
# when run as the same user.
#
# STR_BIN names an str already built (make run passes the one it has just
# built): then nothing is built here.
set -euo pipefail
cd "$(dirname "$0")/.."

# 0. the broker's port: a number, checked before anything is built.
port=${BROKER_PORT:-55554}
if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
  echo "run.sh: BROKER_PORT=$port: want a TCP port, 1-65535" >&2; exit 2
fi
broker=127.0.0.1:$port

# 1. what is missing: Go and Python.
command -v go >/dev/null || { echo "run.sh: Go is not installed (https://go.dev/dl/)" >&2; exit 1; }
# The sandbox binds the host's /usr, so the interpreter must live there:
# Debian's /usr/bin/python3, not a version-manager shim from PATH.
PYTHON="${SANDBOX_PYTHON_BIN:-/usr/bin/python3}"
if [ ! -x "$PYTHON" ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq python3 >/dev/null
  else
    echo "run.sh: $PYTHON is missing (apt-get install python3)" >&2; exit 1
  fi
fi

# 2. build (unless STR_BIN names a built str).
str=${STR_BIN:-bin/str}
if [ -z "${STR_BIN:-}" ]; then
  mkdir -p bin
  make -s build
fi

# 3. state directories.
mkdir -p var/artifacts var/work var/runner var/site

# 4. the worker (the sandbox needs root or unprivileged user namespaces; see bin/str doctor).
export SAM_NAMESPACE="${SAM_NAMESPACE:-demo/}"
export MANIFEST_PATH="${MANIFEST_PATH:-$PWD/examples/tools/manifest.yaml}"
export TOOLS_PYTHON_DIR="${TOOLS_PYTHON_DIR:-$PWD/examples/tools/python}"
export ARTIFACT_SERVICE_TYPE="${ARTIFACT_SERVICE_TYPE:-filesystem}"
export ARTIFACT_BASE_PATH="${ARTIFACT_BASE_PATH:-$PWD/var/artifacts}"
export SANDBOX_WORK_DIR="${SANDBOX_WORK_DIR:-$PWD/var/work}"
export STR_RUNNER_DIR="${STR_RUNNER_DIR:-$PWD/var/runner}"
export STR_SITE_DIR="${STR_SITE_DIR:-$PWD/var/site}"
export SANDBOX_PYTHON_BIN="$PYTHON"
export HEALTH_PORT="${HEALTH_PORT:-8081}"
try="bin/str invoke echo_tool --args '{\"message\":\"hi\"}'"
demo="make demo"
if [ "$port" != 55554 ]; then
  try="bin/str invoke echo_tool --broker $broker --args '{\"message\":\"hi\"}'"
  demo="make demo BROKER=$broker"
fi
echo "run.sh: worker on $broker (namespace $SAM_NAMESPACE); try, as the same user: $try, or $demo" >&2
exec "$str" worker --embedded-broker "$broker" "$@"
