package transport

import "strings"

// MatchDev reports whether topic matches pattern under the dev broker's
// rules (spec §10), comparing level by level, levels being separated by
// "/":
//
//   - a level that is exactly "*" matches one non-empty level;
//   - a level that is exactly ">" and is the last level of the pattern
//     matches the rest of the topic, which must hold at least one level;
//   - every other level, including "a*", "*b" and a ">" that is not last,
//     matches only itself.
//
// A published topic never contains wildcards: "*" and ">" in a topic are
// ordinary characters. MatchDev does not allocate.
//
// There is no Solace counterpart: the Solace transport leaves matching to
// the broker (Solace's level-final prefix wildcard "b*" is the broker's
// business), and nothing in str matches Solace patterns locally.
func MatchDev(pattern, topic string) bool {
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
