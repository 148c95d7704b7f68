package seccomp

import "embed"

// precompiledFS holds the amd64 programs and views (precompiled.go).
//
//go:embed precompiled/*_amd64.json precompiled/*_amd64.bpf
var precompiledFS embed.FS
