package transport

import (
	"strings"
	"testing"
)

type matchCase struct {
	pattern, topic string
	dev            bool
}

var matchCases = []matchCase{
	// Literal levels.
	{"a/b/c", "a/b/c", true},
	{"a/b/c", "a/b", false},
	{"a/b", "a/b/c", false},
	{"a/b/c", "a/b/d", false},
	{"a", "a", true},
	{"a", "b", false},
	{"", "", true},
	{"a/", "a/", true},
	{"a/", "a", false},

	// "*" alone: one non-empty level.
	{"a/*/c", "a/b/c", true},
	{"a/*/c", "a//c", false},
	{"a/*/c", "a/b/x/c", false},
	{"a/*", "a/b", true},
	{"a/*", "a/b/c", false},
	{"a/*", "a", false},
	{"a/*", "a/", false},
	{"*", "a", true},
	{"*", "", false},
	{"*/*", "a/b", true},
	{"*/*", "a", false},

	// ">" last: one or more trailing levels.
	{"a/>", "a/b", true},
	{"a/>", "a/b/c/d", true},
	{"a/>", "a", false},
	{"a/>", "b/c", false},
	{">", "a", true},
	{">", "a/b/c", true},
	{"a/*/>", "a/b/c", true},
	{"a/*/>", "a/b", false},
	{"ns/a2a/v1/discovery/>", "ns/a2a/v1/discovery/agentcards", true},
	{"ns/a2a/v1/discovery/>", "ns/a2a/v1/discovery", false},

	// ">" not last is literal.
	{"a/>/c", "a/b/c", false},
	{"a/>/c", "a/>/c", true},
	{"a/>/c", "a/b/x/c", false},

	// A level-final star is literal for the dev broker (Solace's prefix
	// wildcard is not part of spec §10).
	{"a/b*", "a/bcd", false},
	{"a/b*", "a/b", false},
	{"a/b*", "a/b*", true},
	{"a/b*", "a/cb", false},
	{"a/b*", "a/bcd/e", false},
	{"a/b*/c", "a/bxy/c", false},
	{"a/b*/c", "a/xy/c", false},
	{"b*/>", "bee/x", false},

	// A star inside a level is literal.
	{"a/b*c", "a/bxc", false},
	{"a/b*c", "a/b*c", true},
	{"a/*b", "a/xb", false},

	// ">" inside a level is literal.
	{"a/b>", "a/bc", false},
	{"a/b>", "a/b>", true},

	// Wildcards in the topic are ordinary characters.
	{"a/b", "a/*", false},
	{"a/x", "a/>", false},

	// The worker's invoke topics.
	{"ns/a2a/v1/sam_remote_tool/invoke/echo_tool", "ns/a2a/v1/sam_remote_tool/invoke/echo_tool", true},
	{"ns/a2a/v1/sam_remote_tool/invoke/*", "ns/a2a/v1/sam_remote_tool/invoke/echo_tool", true},
	{"ns/a2a/v1/sam_remote_tool/invoke/echo_tool", "ns/a2a/v1/sam_remote_tool/invoke/echo_tool2", false},
}

func TestMatchTable(t *testing.T) {
	for _, c := range matchCases {
		if got := MatchDev(c.pattern, c.topic); got != c.dev {
			t.Errorf("MatchDev(%q, %q) = %v, want %v", c.pattern, c.topic, got, c.dev)
		}
	}
}

// oracle is a second, deliberately naive implementation of the rules (split
// everything, then compare), used to check the allocation-free one.
func oracle(pattern, topic string) bool {
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
		if want := oracle(pattern, topic); dev != want {
			t.Fatalf("MatchDev(%q, %q) = %v, oracle says %v", pattern, topic, dev, want)
		}
		// A pattern without wildcard characters matches exactly itself.
		if !strings.ContainsAny(pattern, "*>") {
			if got := MatchDev(pattern, topic); got != (pattern == topic) {
				t.Fatalf("literal MatchDev(%q, %q) = %v", pattern, topic, got)
			}
		}
	})
}
