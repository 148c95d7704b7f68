package main

import (
	"slices"
	"testing"
)

func TestStrBwrapOptions(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		plan    bool
		profile string
		rest    []string
	}{
		{[]string{"--ro-bind", "/", "/", "id"}, false, "standard", []string{"--ro-bind", "/", "/", "id"}},
		{[]string{"--plan", "--str-profile", "restrictive", "--unshare-net", "id"}, true, "restrictive", []string{"--unshare-net", "id"}},
		{[]string{"--str-profile=permissive", "--plan", "id"}, true, "permissive", []string{"id"}},
		// str's options count only before bubblewrap's: later they are
		// the command's (or bubblewrap's error).
		{[]string{"--unshare-pid", "--plan", "id"}, false, "standard", []string{"--unshare-pid", "--plan", "id"}},
	} {
		plan, profile, rest, err := strBwrapOptions(tc.args)
		if err != nil || plan != tc.plan || profile != tc.profile || !slices.Equal(rest, tc.rest) {
			t.Errorf("strBwrapOptions(%q) = %v %q %q %v", tc.args, plan, profile, rest, err)
		}
	}
	for _, bad := range [][]string{{"--str-profile"}, {"--str-profile", ""}, {"--str-profile="}} {
		if _, _, _, err := strBwrapOptions(bad); err == nil {
			t.Errorf("strBwrapOptions(%q): no error", bad)
		}
	}
}

// TestStrBwrapProfileFromEnv: without --str-profile the profile is
// $STR_BWRAP_PROFILE (a caller that can only name a program called
// bwrap), and --str-profile still wins.
func TestStrBwrapProfileFromEnv(t *testing.T) {
	t.Setenv("STR_BWRAP_PROFILE", "nesting")
	if _, profile, _, err := strBwrapOptions([]string{"--ro-bind", "/", "/", "true"}); err != nil || profile != "nesting" {
		t.Errorf("profile %q, %v; want nesting from the environment", profile, err)
	}
	if _, profile, _, err := strBwrapOptions([]string{"--str-profile", "standard", "true"}); err != nil || profile != "standard" {
		t.Errorf("profile %q, %v; want the line's standard", profile, err)
	}
}
