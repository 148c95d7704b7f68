package seccomp

import "embed"

// precompiledFS holds the arm64 programs and views (precompiled.go).
//
//go:embed precompiled/*_arm64.json precompiled/*_arm64.bpf
var precompiledFS embed.FS
