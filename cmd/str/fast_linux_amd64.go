package main

// fastEntry is str's ELF entry on linux/amd64 (fast_linux_amd64.s): the
// served `str run` fast path before Go's runtime starts, else Go's own
// entry. Never called from Go; the linker enters it (-ldflags=-E, from
// scripts/str-ldflags.sh).
//
//lint:ignore U1000 the linker's entry (-ldflags=-E=main.fastEntry), not called from Go
func fastEntry()
