#!/usr/bin/env bash
# The -ldflags every build of cmd/str passes (make build and the scripts
# that build str): on linux/amd64, str's ELF entry is the served `str run`
# fast path (cmd/str/fast_linux_amd64.s), which hands anything else to
# Go's runtime; elsewhere nothing (the Go path alone). For the target
# platform of `go build` ($GOOS/$GOARCH as the go command reads them).
#
#   CGO_ENABLED=0 go build -ldflags="$(scripts/str-ldflags.sh)" -o bin/str ./cmd/str
set -euo pipefail
if [[ $(${GO:-go} env GOOS)/$(${GO:-go} env GOARCH) == linux/amd64 ]]; then
  echo "-E=main.fastEntry"
fi
