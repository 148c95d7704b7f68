package manifest

import (
	"fmt"
	"strconv"
	"strings"
)

// Specifier is one version constraint such as ">=1.0" (PEP 440 operators).
type Specifier struct {
	Op      string // "==", "!=", ">=", "<=", ">", "<", "~=", "==="
	Version string // as written; may end in ".*" for == and !=
}

// ParseSpecifiers parses a comma-separated specifier list (">=1.0,<2.0").
// All PEP 440 operators are accepted (pip evaluates them); Satisfies
// evaluates the subset str needs without pip.
func ParseSpecifiers(s string) ([]Specifier, error) {
	var out []Specifier
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("empty specifier in %q", s)
		}
		var op string
		for _, cand := range []string{"===", "==", "!=", ">=", "<=", "~=", ">", "<"} {
			if strings.HasPrefix(part, cand) {
				op = cand
				break
			}
		}
		if op == "" {
			return nil, fmt.Errorf("specifier %q has no operator (==, !=, >=, <=, >, <, ~=, ===)", part)
		}
		v := strings.TrimSpace(part[len(op):])
		if v == "" {
			return nil, fmt.Errorf("specifier %q has no version", part)
		}
		if strings.HasSuffix(v, ".*") && op != "==" && op != "!=" {
			return nil, fmt.Errorf("specifier %q: a .* suffix is only allowed with == and !=", part)
		}
		if op != "===" {
			if _, err := parseRelease(strings.TrimSuffix(v, ".*")); err != nil {
				return nil, fmt.Errorf("specifier %q: %w", part, err)
			}
		}
		out = append(out, Specifier{Op: op, Version: v})
	}
	return out, nil
}

// release is a version's numeric release segments plus whatever follows
// them (pre/post/dev/local parts, compared as text).
type release struct {
	nums []int
	rest string
}

// parseRelease reads "1.2.3", "v1.2", "1.0rc1" (nums [1 0], rest "rc1").
func parseRelease(v string) (release, error) {
	v = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(v)), "v")
	if i := strings.IndexByte(v, '!'); i >= 0 {
		return release{}, fmt.Errorf("version %q: epochs are not supported", v)
	}
	var r release
	i := 0
	for {
		j := i
		for j < len(v) && v[j] >= '0' && v[j] <= '9' {
			j++
		}
		if j == i {
			return release{}, fmt.Errorf("version %q is not a release number", v)
		}
		n, err := strconv.Atoi(v[i:j])
		if err != nil {
			return release{}, fmt.Errorf("version %q: %w", v, err)
		}
		r.nums = append(r.nums, n)
		if j < len(v) && v[j] == '.' && j+1 < len(v) && v[j+1] >= '0' && v[j+1] <= '9' {
			i = j + 1
			continue
		}
		r.rest = v[j:]
		return r, nil
	}
}

// compareRelease orders two versions by release numbers (missing ones are
// zero), then a version without suffix after one with a pre-release-like
// suffix ("1.0rc1" < "1.0"), then suffixes as text.
func compareRelease(a, b release) int {
	for i := 0; i < len(a.nums) || i < len(b.nums); i++ {
		var x, y int
		if i < len(a.nums) {
			x = a.nums[i]
		}
		if i < len(b.nums) {
			y = b.nums[i]
		}
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	switch {
	case a.rest == b.rest:
		return 0
	case a.rest == "":
		if strings.HasPrefix(b.rest, ".post") || strings.HasPrefix(b.rest, "post") || strings.HasPrefix(b.rest, "+") {
			return -1
		}
		return 1
	case b.rest == "":
		return -compareRelease(b, a)
	case a.rest < b.rest:
		return -1
	}
	return 1
}

// CompareVersions orders two version strings (see compareRelease).
func CompareVersions(a, b string) (int, error) {
	ra, err := parseRelease(a)
	if err != nil {
		return 0, err
	}
	rb, err := parseRelease(b)
	if err != nil {
		return 0, err
	}
	return compareRelease(ra, rb), nil
}

// Satisfies reports whether version meets every specifier. It handles
// ==, !=, >=, <=, >, < (and the ".*" prefix form of == and !=), "~="
// (compatible release: "~=1.4.2" is ">=1.4.2, ==1.4.*") and "===" (the
// same string).
func Satisfies(version string, specs []Specifier) (bool, error) {
	for _, s := range specs {
		if s.Op == "===" && strings.TrimSpace(version) != s.Version {
			return false, nil
		}
	}
	rv, err := parseRelease(version)
	if err != nil {
		return false, err
	}
	for _, s := range specs {
		switch s.Op {
		case "===":
			continue
		case "~=":
			rs, err := parseRelease(s.Version)
			if err != nil {
				return false, err
			}
			if len(rs.nums) < 2 {
				return false, fmt.Errorf("specifier ~=%s: a compatible release needs at least two release numbers", s.Version)
			}
			if compareRelease(rv, rs) < 0 {
				return false, nil
			}
			prefix := rs.nums[:len(rs.nums)-1]
			for i, n := range prefix {
				if i >= len(rv.nums) || rv.nums[i] != n {
					return false, nil
				}
			}
			continue
		}
		if prefix, ok := strings.CutSuffix(s.Version, ".*"); ok {
			rp, err := parseRelease(prefix)
			if err != nil {
				return false, err
			}
			match := len(rv.nums) >= len(rp.nums)
			for i := 0; match && i < len(rp.nums); i++ {
				match = rv.nums[i] == rp.nums[i]
			}
			if match == (s.Op == "!=") {
				return false, nil
			}
			continue
		}
		rs, err := parseRelease(s.Version)
		if err != nil {
			return false, err
		}
		c := compareRelease(rv, rs)
		ok := map[string]bool{"==": c == 0, "!=": c != 0, ">=": c >= 0, "<=": c <= 0, ">": c > 0, "<": c < 0}[s.Op]
		if !ok {
			return false, nil
		}
	}
	return true, nil
}
