package profiles

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestClampEveryPair: every (ceiling, asked) pair of built-in names and
// trust-level aliases. The call runs with the stricter of the two: the
// asked profile when it is the ceiling or stricter, else the ceiling
// (clamped, with a reason naming both); never refused, never looser.
func TestClampEveryPair(t *testing.T) {
	s := mustEmbedded(t)
	// Canonical rank, loosest first, written out here independently of
	// the strictness list.
	rank := map[string]int{"permissive": 0, "trusted": 0, "standard": 1, "restrictive": 2, "untrusted": 2, "confidential": 3}
	names := []string{"permissive", "trusted", "standard", "restrictive", "untrusted", "confidential"}
	for _, ceiling := range names {
		for _, asked := range names {
			t.Run(ceiling+"/"+asked, func(t *testing.T) {
				used, clamped, reason, err := s.Clamp(asked, ceiling)
				if err != nil {
					t.Fatalf("Clamp(%q, ceiling %q): %v", asked, ceiling, err)
				}
				// Stricter: the asked profile; the same one (a name or
				// an alias of it): the ceiling's spelling, unclamped;
				// looser: the ceiling, clamped.
				want, wantClamped := asked, false
				switch {
				case rank[asked] == rank[ceiling]:
					want = ceiling
				case rank[asked] < rank[ceiling]:
					want, wantClamped = ceiling, true
				}
				if used != want || clamped != wantClamped {
					t.Fatalf("Clamp(%q, ceiling %q) = %q clamped=%v, want %q clamped=%v", asked, ceiling, used, clamped, want, wantClamped)
				}
				if rank[used] < rank[ceiling] {
					t.Fatalf("Clamp(%q, ceiling %q) = %q, looser than the ceiling", asked, ceiling, used)
				}
				if !clamped {
					if reason != "" {
						t.Errorf("reason %q without a clamp", reason)
					}
					return
				}
				for _, w := range []string{fmt.Sprintf("%q", asked), fmt.Sprintf("%q", ceiling), "looser than"} {
					if !strings.Contains(reason, w) {
						t.Errorf("reason %q does not name %s", reason, w)
					}
				}
			})
		}
	}
}

func TestClampUnknownAndLoaded(t *testing.T) {
	s := mustEmbedded(t)
	if _, _, _, err := s.Clamp("bogus", "standard"); !errors.Is(err, ErrUnknownProfile) || !strings.Contains(err.Error(), `"bogus"`) {
		t.Errorf("unknown asked: %v", err)
	}
	if _, _, _, err := s.Clamp("standard", "bogus"); !errors.Is(err, ErrUnknownProfile) || !strings.Contains(err.Error(), "ceiling") {
		t.Errorf("unknown ceiling: %v", err)
	}
	extra := mustLookup(t, s, "restrictive")
	extra.Name, extra.Aliases = "extra", []string{"extra-alias"}
	if err := s.Add([]Decoded{{Source: "extra.yaml", Profile: extra}}); err != nil {
		t.Fatal(err)
	}
	// A loaded profile is comparable only with itself (and its aliases).
	if used, clamped, _, err := s.Clamp("extra-alias", "extra"); err != nil || clamped || used != "extra" {
		t.Errorf("alias of the ceiling: %q clamped=%v %v", used, clamped, err)
	}
	// Incomparable, either way round: the ceiling, even when the asked
	// profile is the strictest built-in one.
	for _, c := range [][2]string{{"extra", "permissive"}, {"extra", "confidential"}, {"restrictive", "extra"}, {"confidential", "extra"}, {"permissive", "extra"}} {
		used, clamped, reason, err := s.Clamp(c[0], c[1])
		if err != nil || used != c[1] || !clamped || !strings.Contains(reason, "not comparable") {
			t.Errorf("Clamp(%q, %q) = %q clamped=%v %q %v, want the ceiling, not comparable", c[0], c[1], used, clamped, reason, err)
		}
	}
}

// TestStrictnessMatchesLimits pins the strictness list to the files: each
// profile is at most as loose as the one before it in every limit,
// mount and network setting.
func TestStrictnessMatchesLimits(t *testing.T) {
	s := mustEmbedded(t)
	if got := s.Names(); !slices.Equal(slices.Sorted(slices.Values(append(slices.Clone(strictness), unordered...))), got) {
		t.Fatalf("strictness %v and unordered %v do not list exactly the embedded profiles %v", strictness, unordered, got)
	}
	for i := 1; i < len(strictness); i++ {
		loose, strict := mustLookup(t, s, strictness[i-1]), mustLookup(t, s, strictness[i])
		where := strict.Name + " vs " + loose.Name
		atMost := func(what string, a, b int64) {
			if a > b {
				t.Errorf("%s: %s %d is looser than %d", where, what, a, b)
			}
		}
		atMost("cgroup.memory", int64(strict.Cgroup.Memory), int64(loose.Cgroup.Memory))
		atMost("cgroup.cpus", int64(strict.Cgroup.CPUs), int64(loose.Cgroup.CPUs))
		atMost("cgroup.pids", strict.Cgroup.Pids, loose.Cgroup.Pids)
		atMost("rlimits.as", int64(strict.Rlimits.AS), int64(loose.Rlimits.AS))
		atMost("rlimits.cpu", int64(strict.Rlimits.CPU), int64(loose.Rlimits.CPU))
		atMost("rlimits.fsize", int64(strict.Rlimits.FSize), int64(loose.Rlimits.FSize))
		atMost("rlimits.nofile", strict.Rlimits.NoFile, loose.Rlimits.NoFile)
		atMost("rlimits.nproc", strict.Rlimits.NProc, loose.Rlimits.NProc)
		atMost("rlimits.stack", int64(strict.Rlimits.Stack), int64(loose.Rlimits.Stack))
		atMost("timeout", int64(strict.Timeout), int64(loose.Timeout))
		atMost("dev_shm", int64(strict.Mounts.DevShm), int64(loose.Mounts.DevShm))
		if _, err := loose.Network.Tighten(strict.Network); err != nil {
			t.Errorf("%s: network %s is looser than %s: %v", where, strict.Network.Mode, loose.Network.Mode, err)
		}
		if strict.UID == 0 || strict.GID == 0 {
			t.Errorf("%s: runs as root", where)
		}
		for _, b := range strict.Mounts.ReadOnly {
			if !slices.ContainsFunc(loose.Mounts.ReadOnly, func(l PathSpec) bool { return l.Path == b.Path }) {
				t.Errorf("%s: binds %s, which the looser profile does not", where, b.Path)
			}
		}
		for _, m := range strict.Mounts.Tmpfs {
			i := slices.IndexFunc(loose.Mounts.Tmpfs, func(l TmpfsSpec) bool { return l.Path == m.Path })
			if i < 0 {
				t.Errorf("%s: writable tmpfs %s, which the looser profile does not have", where, m.Path)
				continue
			}
			atMost("tmpfs "+m.Path, int64(m.Size), int64(loose.Mounts.Tmpfs[i].Size))
		}
		for _, e := range strict.Env.Passthrough {
			if !slices.Contains(loose.Env.Passthrough, e) {
				t.Errorf("%s: passes %s through, which the looser profile does not", where, e)
			}
		}
	}
}

// TestNestingIsNeverPickedByClamp: nesting is outside the order, so a
// request for it under another ceiling gets the ceiling, and a ceiling
// of nesting is never swapped for a built-in profile either.
func TestNestingIsNeverPickedByClamp(t *testing.T) {
	s := mustEmbedded(t)
	for _, c := range [][2]string{{"nesting", "standard"}, {"nesting", "permissive"}, {"standard", "nesting"}, {"confidential", "nesting"}} {
		used, clamped, reason, err := s.Clamp(c[0], c[1])
		if err != nil || used != c[1] || !clamped || !strings.Contains(reason, "not comparable") {
			t.Errorf("Clamp(%q, %q) = %q clamped=%v %q %v, want the ceiling, not comparable", c[0], c[1], used, clamped, reason, err)
		}
	}
	p := mustLookup(t, s, "nesting")
	if p.Seccomp != "nesting" || p.CallerSeccomp != CallerSeccompReplace {
		t.Errorf("nesting: seccomp %q, caller_seccomp %q", p.Seccomp, p.CallerSeccomp)
	}
	p.CallerSeccomp = "ignore"
	if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "caller_seccomp") {
		t.Errorf("caller_seccomp ignore: %v", err)
	}
}
