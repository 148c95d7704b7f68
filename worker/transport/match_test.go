package transport

import (
	"strings"
	"testing"
)

type matchCase struct {
	pattern, topic string
	dev, solace    bool
}

var matchCases = []matchCase{
	// Literal levels.
	{"a/b/c", "a/b/c", true, true},
	{"a/b/c", "a/b", false, false},
	{"a/b", "a/b/c", false, false},
	{"a/b/c", "a/b/d", false, false},
	{"a", "a", true, true},
	{"a", "b", false, false},
	{"", "", true, true},
	{"a/", "a/", true, true},
	{"a/", "a", false, false},

	// "*" alone: one non-empty level.
	{"a/*/c", "a/b/c", true, true},
	{"a/*/c", "a//c", false, false},
	{"a/*/c", "a/b/x/c", false, false},
	{"a/*", "a/b", true, true},
	{"a/*", "a/b/c", false, false},
	{"a/*", "a", false, false},
	{"a/*", "a/", false, false},
	{"*", "a", true, true},
	{"*", "", false, false},
	{"*/*", "a/b", true, true},
	{"*/*", "a", false, false},

	// ">" last: one or more trailing levels.
	{"a/>", "a/b", true, true},
	{"a/>", "a/b/c/d", true, true},
	{"a/>", "a", false, false},
	{"a/>", "b/c", false, false},
	{">", "a", true, true},
	{">", "a/b/c", true, true},
	{"a/*/>", "a/b/c", true, true},
	{"a/*/>", "a/b", false, false},
	{"ns/a2a/v1/discovery/>", "ns/a2a/v1/discovery/agentcards", true, true},
	{"ns/a2a/v1/discovery/>", "ns/a2a/v1/discovery", false, false},

	// ">" not last is literal.
	{"a/>/c", "a/b/c", false, false},
	{"a/>/c", "a/>/c", true, true},
	{"a/>/c", "a/b/x/c", false, false},

	// Level-final prefix: Solace only; literal for the dev broker.
	{"a/b*", "a/bcd", false, true},
	{"a/b*", "a/b", false, true},
	{"a/b*", "a/b*", true, true},
	{"a/b*", "a/cb", false, false},
	{"a/b*", "a/bcd/e", false, false},
	{"a/b*/c", "a/bxy/c", false, true},
	{"a/b*/c", "a/xy/c", false, false},
	{"b*/>", "bee/x", false, true},

	// A star inside a level is literal for both.
	{"a/b*c", "a/bxc", false, false},
	{"a/b*c", "a/b*c", true, true},
	{"a/*b", "a/xb", false, false},

	// ">" inside a level is literal.
	{"a/b>", "a/bc", false, false},
	{"a/b>", "a/b>", true, true},

	// Wildcards in the topic are ordinary characters.
	{"a/b", "a/*", false, false},
	{"a/x", "a/>", false, false},

	// The worker's invoke topics.
	{"ns/a2a/v1/sam_remote_tool/invoke/echo_tool", "ns/a2a/v1/sam_remote_tool/invoke/echo_tool", true, true},
	{"ns/a2a/v1/sam_remote_tool/invoke/*", "ns/a2a/v1/sam_remote_tool/invoke/echo_tool", true, true},
	{"ns/a2a/v1/sam_remote_tool/invoke/echo_tool", "ns/a2a/v1/sam_remote_tool/invoke/echo_tool2", false, false},
}

func TestMatchTable(t *testing.T) {
	for _, c := range matchCases {
		if got := MatchDev(c.pattern, c.topic); got != c.dev {
			t.Errorf("MatchDev(%q, %q) = %v, want %v", c.pattern, c.topic, got, c.dev)
		}
		if got := MatchSolace(c.pattern, c.topic); got != c.solace {
			t.Errorf("MatchSolace(%q, %q) = %v, want %v", c.pattern, c.topic, got, c.solace)
		}
	}
}

// oracle is a second, deliberately naive implementation of both rule sets
// (split everything, then compare), used to check the allocation-free one.
func oracle(pattern, topic string, solace bool) bool {
	ps := strings.Split(pattern, "/")
	ts := strings.Split(topic, "/")
	for i, p := range ps {
		last := i == len(ps)-1
		if last && p == ">" {
			return len(ts) > i
		}
		if i >= len(ts) {
			return false
		}
		t := ts[i]
		var ok bool
		switch {
		case p == "*":
			ok = t != ""
		case solace && len(p) > 0 && p[len(p)-1] == '*':
			ok = len(t) >= len(p)-1 && t[:len(p)-1] == p[:len(p)-1]
		default:
			ok = p == t
		}
		if !ok {
			return false
		}
	}
	return len(ps) == len(ts)
}

func FuzzMatch(f *testing.F) {
	for _, c := range matchCases {
		f.Add(c.pattern, c.topic)
	}
	f.Add("a/*/>", "a//b")
	f.Add(">/>", "a/b")
	f.Add("**", "x")
	f.Fuzz(func(t *testing.T, pattern, topic string) {
		dev := MatchDev(pattern, topic)
		sol := MatchSolace(pattern, topic)
		if want := oracle(pattern, topic, false); dev != want {
			t.Fatalf("MatchDev(%q, %q) = %v, oracle says %v", pattern, topic, dev, want)
		}
		if want := oracle(pattern, topic, true); sol != want {
			t.Fatalf("MatchSolace(%q, %q) = %v, oracle says %v", pattern, topic, sol, want)
		}
		// Solace's rules only add matches to the dev broker's.
		if dev && !sol {
			t.Fatalf("MatchDev(%q, %q) but not MatchSolace", pattern, topic)
		}
		// A pattern without wildcard characters matches exactly itself.
		if !strings.ContainsAny(pattern, "*>") {
			if got := MatchDev(pattern, topic); got != (pattern == topic) {
				t.Fatalf("literal MatchDev(%q, %q) = %v", pattern, topic, got)
			}
		}
	})
}
