#!/bin/sh
# Installs the str worker as a systemd service (and str serve's unit,
# not enabled), the steps of
# docs/deployment.md ("systemd"); test/systemd runs exactly this script.
#
#   deploy/systemd/install.sh BIN TOOLS_DIR
#
# BIN: the str binary (make build: bin/str), with the worker str-worker
# beside it (bin/str-worker: `str worker`, `str broker`, `str invoke` and
# `str tools` exec it from str's own directory, so both go to
# /usr/local/bin). TOOLS_DIR: a directory with
# manifest.yaml and the tools' python/ (e.g. examples/tools). Run it from
# the source tree: it also installs docs/deployment.md, which the units'
# Documentation= names. Needs root.
# It installs and reloads systemd; it does not start the service (edit
# /etc/str/worker.env first, then systemctl enable --now str-worker).
set -eu
bin=${1:?usage: install.sh BIN TOOLS_DIR}
tools=${2:?usage: install.sh BIN TOOLS_DIR}
here=$(dirname "$0")
worker=$(dirname "$bin")/str-worker
[ -f "$tools/manifest.yaml" ] || { echo "install.sh: $tools/manifest.yaml missing" >&2; exit 1; }
[ -x "$worker" ] || { echo "install.sh: $worker missing (the worker, built beside str by make build)" >&2; exit 1; }
[ -x "$(dirname "$bin")/str-egress" ] || { echo "install.sh: $(dirname "$bin")/str-egress missing (the egress helper, built beside str by make build)" >&2; exit 1; }
doc=$here/../../docs/deployment.md
[ -f "$doc" ] || { echo "install.sh: $doc missing (run install.sh from the source tree: the units' Documentation= is this file)" >&2; exit 1; }

# 1. The binaries and the unit.
install -m 0755 "$bin" /usr/local/bin/str
install -m 0755 "$worker" /usr/local/bin/str-worker
# The egress helper beside str (every launcher runs it, as nobody).
install -m 0755 "$(dirname "$bin")/str-egress" /usr/local/bin/str-egress
install -m 0644 "$here/str-worker.service" /etc/systemd/system/str-worker.service
# The resident launcher (optional: pre-built sandboxes for str run).
install -m 0644 "$here/str-serve.service" /etc/systemd/system/str-serve.service
# What both units' Documentation= points at (systemctl help str-worker).
install -D -m 0644 "$doc" /usr/share/doc/str/deployment.md

# 2. Settings: the example on first install only (an operator's edits stay).
#    0640: it holds the broker credentials.
install -d -m 0750 /etc/str
[ -e /etc/str/worker.env ] || install -m 0640 "$here/worker.env.example" /etc/str/worker.env

# 3. The tools where worker.env.example points (MANIFEST_PATH,
#    TOOLS_PYTHON_DIR): readable by all (each sandbox runs under host ids
#    of its own), writable by root only; replaced as a whole.
rm -rf /etc/str/tools.new
cp -R "$tools" /etc/str/tools.new
chown -R root:root /etc/str/tools.new
chmod -R u=rwX,go=rX /etc/str/tools.new
rm -rf /etc/str/tools.old
[ ! -e /etc/str/tools ] || mv /etc/str/tools /etc/str/tools.old
mv /etc/str/tools.new /etc/str/tools
rm -rf /etc/str/tools.old

# 4. The writable paths the unit names (ReadWritePaths=): work dirs,
#    runner and packages under /sandbox; the artifact store.
install -d -m 0755 /sandbox /sam/artifacts

systemctl daemon-reload
echo "installed: edit /etc/str/worker.env, then: systemctl enable --now str-worker && str doctor"
echo "optional, for str run: systemctl enable --now str-serve"
