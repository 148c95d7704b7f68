package profiles

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// strictness orders the built-in profiles from the loosest to the
// strictest. Each profile is at least as strict as every profile before it
// in every limit, mount and network setting (TestStrictnessMatchesLimits
// checks the files against this list): a request may name its ceiling
// (the manifest tool's profile, else the worker default) or any profile
// after it, never one before it.
//
//	permissive ⊃ standard ⊃ restrictive ⊃ confidential
//
// confidential is restrictive without /dev/shm. Profiles loaded with
// LoadDir are not in the list: they cannot be compared, so a request may
// name one only when it is the ceiling itself. Built-in names cannot be
// taken by a loaded profile (LoadDir refuses collisions), so this list
// always means the embedded files.
var strictness = []string{"permissive", "standard", "restrictive", "confidential"}

// ErrLooser is wrapped by Within when the asked profile is looser than the
// ceiling or cannot be compared with it.
var ErrLooser = errors.New("profile is looser than its ceiling")

// Within returns nil when the profile asked for (a name or alias) is the
// ceiling (a name or alias) or stricter than it. An unknown name wraps
// ErrUnknownProfile; a looser or incomparable profile wraps ErrLooser and
// the message names both and what may be asked for instead.
func (s *Set) Within(asked, ceiling string) error {
	a, ok := s.canonical(asked)
	if !ok {
		return fmt.Errorf("profiles: %w %q", ErrUnknownProfile, asked)
	}
	c, ok := s.canonical(ceiling)
	if !ok {
		return fmt.Errorf("profiles: ceiling: %w %q", ErrUnknownProfile, ceiling)
	}
	if a == c {
		return nil
	}
	ra, rc := slices.Index(strictness, a), slices.Index(strictness, c)
	if ra >= 0 && rc >= 0 && ra > rc {
		return nil
	}
	why := "looser than"
	if ra < 0 || rc < 0 {
		why = "not comparable with (only the built-in profiles are ordered)"
	}
	return fmt.Errorf("profiles: %w: %s is %s the ceiling %s; allowed: %s",
		ErrLooser, describe(asked, a), why, describe(ceiling, c), strings.Join(s.AllowedUnder(c), ", "))
}

// AllowedUnder lists the canonical names a request may ask for under the
// ceiling (a name or alias), the ceiling first, then stricter ones in
// order. An unknown ceiling gives nil.
func (s *Set) AllowedUnder(ceiling string) []string {
	c, ok := s.canonical(ceiling)
	if !ok {
		return nil
	}
	out := []string{c}
	if i := slices.Index(strictness, c); i >= 0 {
		for _, n := range strictness[i+1:] {
			if _, ok := s.profiles[n]; ok {
				out = append(out, n)
			}
		}
	}
	return out
}

// describe is `"untrusted" (restrictive)` for an alias, `"standard"` for
// a name.
func describe(given, canon string) string {
	if given == canon {
		return fmt.Sprintf("%q", given)
	}
	return fmt.Sprintf("%q (%s)", given, canon)
}
