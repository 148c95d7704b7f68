package transport

import "strings"

// Topic matching. Both functions compare a subscription pattern with a
// published topic level by level, levels being separated by "/". A
// published topic never contains wildcards: "*" and ">" in a topic are
// ordinary characters. Neither function allocates.

// MatchDev reports whether topic matches pattern under the dev broker's
// rules (spec §10):
//
//   - a level that is exactly "*" matches one non-empty level;
//   - a level that is exactly ">" and is the last level of the pattern
//     matches the rest of the topic, which must hold at least one level;
//   - every other level, including "a*", "*b" and a ">" that is not last,
//     matches only itself.
func MatchDev(pattern, topic string) bool {
	return match(pattern, topic, false)
}

// MatchSolace reports whether topic matches pattern under Solace PubSub+'s
// rules (spec §1):
//
//   - a level that is exactly "*" matches one non-empty level;
//   - a level ending in "*" ("b*") matches any level starting with the
//     prefix before the star, the prefix alone included ("b", "bcd");
//   - a level that is exactly ">" and is the last level of the pattern
//     matches one or more trailing levels ("a/>" matches "a/b" and "a/b/c"
//     but not "a");
//   - every other level, including a "*" inside a level ("a*b") and a ">"
//     that is not last, matches only itself.
func MatchSolace(pattern, topic string) bool {
	return match(pattern, topic, true)
}

// match walks pattern and topic one level at a time. prefixStar enables
// Solace's level-final prefix wildcard.
func match(pattern, topic string, prefixStar bool) bool {
	for {
		p, pRest, pMore := strings.Cut(pattern, "/")
		if p == ">" && !pMore {
			// The topic has at least one level left here: either the
			// level being looked at, or we would have returned below.
			return true
		}
		t, tRest, tMore := strings.Cut(topic, "/")
		switch {
		case p == "*":
			if t == "" {
				return false
			}
		case prefixStar && strings.HasSuffix(p, "*"):
			if !strings.HasPrefix(t, p[:len(p)-1]) {
				return false
			}
		default:
			if p != t {
				return false
			}
		}
		if pMore != tMore {
			// One ran out of levels before the other. A trailing ">"
			// in the pattern needs a topic level to match, so a pattern
			// with levels left over never matches a finished topic.
			return false
		}
		if !pMore {
			return true
		}
		pattern, topic = pRest, tRest
	}
}
