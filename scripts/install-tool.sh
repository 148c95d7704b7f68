#!/usr/bin/env bash
# install-tool.sh DIR PACKAGE@VERSION — installs a lint tool into DIR
# (bin/tools) with go install, unless DIR already holds it built from
# exactly PACKAGE at VERSION by this Go toolchain (go version -m says which;
# an analyser built by an older Go may not read newer code): a second
# make lint then costs no module resolution and no link.
set -euo pipefail
dir=${1:?usage: install-tool.sh DIR PACKAGE@VERSION}
spec=${2:?usage: install-tool.sh DIR PACKAGE@VERSION}
GO=${GO:-go}
pkg=${spec%@*} version=${spec##*@}
bin=$dir/${pkg##*/}
if [[ -x $bin ]] && info=$("$GO" version -m "$bin" 2>/dev/null) \
  && [[ $(head -1 <<<"$info") == "$bin: $("$GO" env GOVERSION)" ]] \
  && grep -qE "^[[:space:]]path[[:space:]]+${pkg//./\\.}\$" <<<"$info" \
  && grep -qE "^[[:space:]]mod[[:space:]]+[^[:space:]]+[[:space:]]+${version//./\\.}[[:space:]]" <<<"$info"; then
  exit 0
fi
mkdir -p "$dir"
echo "install-tool: $spec into $dir"
GOBIN=$dir "$GO" install "$spec"
