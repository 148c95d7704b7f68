package seccomp

import (
	"bytes"
	"os"
	"testing"
)

// TestPrecompiledUpToDate compiles every embedded policy afresh for every
// supported architecture, with the full self-check, and requires the
// precompiled files to hold exactly those programs.
// STR_UPDATE_PRECOMPILED=1 (go generate) rewrites the files.
func TestPrecompiledUpToDate(t *testing.T) {
	update := os.Getenv("STR_UPDATE_PRECOMPILED") == "1"
	for _, name := range Names() {
		p, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if update {
			// The embedded copies are those of this test binary's build:
			// write the files, and let the next run check them.
			for _, arch := range supportedArches {
				if err := writePrecompiled(p, arch, "."); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
			}
			continue
		}
		key, _ := cacheKey(p)
		for _, arch := range supportedArches {
			fresh, err := p.compileFor(arch)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			// The package directory: what a binary of that arch embeds.
			pre, ok := fromPrecompiledFor(os.DirFS("."), p, key, arch)
			if !ok {
				t.Fatalf("%s: no precompiled program for this policy content and arch %s: run go generate ./seccomp", name, arch.name)
			}
			if !bytes.Equal(EncodeFilter(pre.Filter), EncodeFilter(fresh.Filter)) {
				t.Fatalf("%s: precompiled %s program differs from a fresh compile: run go generate ./seccomp", name, arch.name)
			}
		}
		fresh, err := p.compile()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// CompileEmbedded serves the same program, with the same rule views,
		// without decoding the YAML.
		emb, ok := embeddedPrecompiled(name)
		if !ok || !bytes.Equal(EncodeFilter(emb.Filter), EncodeFilter(fresh.Filter)) {
			t.Fatalf("%s: embedded precompiled program missing or different: run go generate ./seccomp", name)
		}
		rules, def, err := EmbeddedViews(name)
		if err != nil || len(rules) != len(fresh.Rules) || def != fresh.DefaultAction {
			t.Fatalf("%s: precompiled view missing or different (%v): run go generate ./seccomp", name, err)
		}
		for i := range rules {
			if rules[i] != fresh.Rules[i] {
				t.Fatalf("%s: rule view %d differs: %+v vs %+v", name, i, rules[i], fresh.Rules[i])
			}
		}
		// And Compile uses it.
		prog, err := p.Compile()
		if err != nil || !bytes.Equal(EncodeFilter(prog.Filter), EncodeFilter(fresh.Filter)) || len(prog.Rules) != len(fresh.Rules) {
			t.Fatalf("%s: Compile did not return the checked program (err %v)", name, err)
		}
	}
}

// A policy whose content differs from the precompiled one is compiled
// (and self-checked) at run time, never served stale.
func TestPrecompiledNotUsedForChangedPolicy(t *testing.T) {
	p, err := Load("standard")
	if err != nil {
		t.Fatal(err)
	}
	p.Description += " (edited)"
	key, _ := cacheKey(p)
	if _, ok := fromPrecompiled(p, key); ok {
		t.Fatal("precompiled program used for an edited policy")
	}
}
