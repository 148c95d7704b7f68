package profiles

import (
	"fmt"
	"slices"
	"strings"
)

// strictness orders the built-in profiles from the loosest to the
// strictest. Each profile is at least as strict as every profile before it
// in every limit, mount and network setting (TestStrictnessMatchesLimits
// checks the files against this list), so the later of two listed
// profiles is never looser than the earlier one in any field.
//
//	permissive ⊃ standard ⊃ restrictive ⊃ confidential
//
// confidential is restrictive without /dev/shm. Profiles of an
// operator's directory (AddDecoded) are not in the list: nothing says how
// they compare with any other profile, field by field. Built-in names cannot be taken by a
// loaded profile (AddDecoded refuses collisions), so this list always means
// the embedded files.
var strictness = []string{"permissive", "standard", "restrictive", "confidential"}

// unordered are the built-in profiles outside the strictness order:
// nesting has standard's limits but a seccomp policy looser than
// permissive's (namespaces and mounts inside), so it is comparable only
// with itself, like an operator's profile (Clamp's step 5).
var unordered = []string{"nesting"}

// Clamp is the tighten-only rule for a request's profile (spec §2): it
// returns the profile a call runs with, the stricter of the ceiling (the
// manifest tool's profile, else the worker default) and the profile the
// request asked for, both names or aliases. The result is one of the two
// arguments, as given. A request is never refused for being looser (an
// agent cannot know each tool's ceiling, and reference agents ask for
// "standard" on every call): it is clamped.
//
//  1. an unknown asked name wraps ErrUnknownProfile (the request's fault);
//  2. an unknown ceiling wraps ErrUnknownProfile (the worker's);
//  3. the same profile (names or aliases of one): the ceiling as
//     spelled, not clamped (the warm pool keys its sandboxes by the
//     ceiling's spelling);
//  4. both in the strictness order: the later one; clamped when that is
//     the ceiling;
//  5. otherwise (nesting or a profile of an operator's directory on either side, which the
//     order cannot compare): the ceiling, clamped. The asked profile may
//     be stricter in some fields and looser in others; only the ceiling
//     is known to be no looser than the ceiling in every field.
//
// reason says why a clamped request did not get its profile.
func (s *Set) Clamp(asked, ceiling string) (used string, clamped bool, reason string, err error) {
	// 1.-2. both names known.
	a, ok := s.canonical(asked)
	if !ok {
		return "", false, "", fmt.Errorf("profiles: %w %q", ErrUnknownProfile, asked)
	}
	c, ok := s.canonical(ceiling)
	if !ok {
		return "", false, "", fmt.Errorf("profiles: ceiling: %w %q", ErrUnknownProfile, ceiling)
	}
	// 3. the same profile.
	if a == c {
		return ceiling, false, "", nil
	}
	// 4. comparable: the stricter.
	ra, rc := slices.Index(strictness, a), slices.Index(strictness, c)
	if ra >= 0 && rc >= 0 {
		if ra > rc {
			return asked, false, "", nil
		}
		return ceiling, true, fmt.Sprintf("%s is looser than the ceiling %s", describe(asked, a), describe(ceiling, c)), nil
	}
	// 5. incomparable: the ceiling.
	return ceiling, true, fmt.Sprintf("%s is not comparable with the ceiling %s (only %s are ordered)",
		describe(asked, a), describe(ceiling, c), strings.Join(strictness, ", ")), nil
}

// describe is `"untrusted" (restrictive)` for an alias, `"standard"` for
// a name.
func describe(given, canon string) string {
	if given == canon {
		return fmt.Sprintf("%q", given)
	}
	return fmt.Sprintf("%q (%s)", given, canon)
}
