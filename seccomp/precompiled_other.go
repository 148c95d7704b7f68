//go:build !amd64 && !arm64

package seccomp

import "embed"

// precompiledFS is empty on an architecture str does not support (native
// refuses it before anything is read).
var precompiledFS embed.FS
