package nsinit

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// stepWords are words a sentence that names a step uses for it (lower
// case, matched as substrings). A mention "step N" must have one of step
// N's words on its line or the line before or after; "steps A-B" one of
// A's and one of B's. Every step has words (TestStepWordsComplete).
// lastLauncherStep is the launcher's last step (L10, the write-back):
// the mentions past it are wrong.
const (
	lastLauncherStep     = StepLWriteBack
	lastLauncherStepName = "StepLWriteBack"
)

var stepWords = map[Step][]string{
	StepReadPlan:     {"plan", "config pipe"},
	StepCloseFDs:     {"close-on-exec", "cloexec", "descriptor", "fd", "pass-list"},
	StepMakePrivate:  {"private", "propagation"},
	StepCloneSources: {"bind source", "detached", "tree", "open_tree", "clones source", "tasks file"},
	StepRootTmpfs:    {"tmpfs", "hides", "new root"},
	StepMounts:       {"mount", "bind"},
	StepPivotRoot:    {"pivot_root", "old root"},
	StepRootReadOnly: {"read-only", "writable"},
	StepChdir:        {"chdir", "getcwd", "work dir", "search"},
	StepHostname:     {"hostname"},
	StepLoopback:     {"loopback", "lo is up", "egress", "listener"},
	StepResolveTool:  {"resolve", "argv", "envp", "built in"},
	StepEnterCgroup:  {"cgroup"},
	StepDropBounding: {"capabilit", "bounding"},
	StepClearAmbient: {"capabilit", "ambient"},
	StepSetIDs:       {"uid", "gid", "setresuid", "groups"},
	StepClearCaps:    {"capabilit"},
	StepParentDeath:  {"parent-death", "parent death", "pdeathsig", "re-arm"},
	StepNoNewPrivs:   {"no_new_privs"},
	StepSeccomp:      {"seccomp", "filter"},
	StepRlimits:      {"rlimit", "prlimit"},
	StepExec:         {"execve", "exec "},
	StepAwaitCall:    {"call", "pre-built", "str serve"},
	StepHandListener: {"listener", "template"},
	StepJoinNS:       {"join", "--userns", "setns", "fork"},

	StepLCgroup:      {"cgroup", "host id", "lease"},
	StepLPipes:       {"pipe", "socket"},
	StepLBindSources: {"bind source", "clone", "tree", "id-map"},
	StepLClone:       {"clone", "init"},
	StepLCgroupOwner: {"tasks", "self-entry", "cgroup v1"},
	StepLSendPlan:    {"plan"},
	StepLTimeout:     {"timeout", "cancel", "wall clock"},
	StepLTeardown:    {"teardown", "reaped", "remove"},
	StepLWorkDir:     {"work dir", "workdir", "WorkDir"},
	StepLWriteBack:   {"write back", "write-back", "writeback", "copies", "copied", "copy", "overlay"},
}

// stepMention is "step 5", "steps 13-16", "steps 20 and 21", "init
// step 3", "launcher step L3", "(step 4, MS_BIND": one number, or a range
// or list whose first and last number are checked.
var stepMention = regexp.MustCompile(`(?i)\bsteps?\s+(L?\d+[a-z]?)((?:\s*(?:-|–|,|and|or|to)\s*L?\d+[a-z]?)*)`)

var stepNumber = regexp.MustCompile(`L?\d+[a-z]?`)

// parseStep is the Step a mention's number names ("12", "10a", "L3"; a
// launcher heading's letter, "L1a", is a part of L1).
func parseStep(s string) (Step, bool) {
	if rest, ok := strings.CutPrefix(s, "L"); ok {
		rest = strings.TrimRight(rest, "abcdefghijklmnopqrstuvwxyz")
		n, err := strconv.Atoi(rest)
		if err != nil || n < 1 || n > int(lastLauncherStep-StepLCgroup)+1 {
			return 0, false
		}
		return StepLCgroup + Step(n-1), true
	}
	if l := s[len(s)-1]; l >= 'a' && l <= 'z' {
		for sub := StepAwaitCall; sub < numSubStepsEnd; sub++ {
			if sub.String() == s {
				return sub, true
			}
		}
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n >= int(numInitSteps) {
		return 0, false
	}
	return Step(n), true
}

// checkStepMentions returns one problem per mention in text whose step
// does not exist or whose context has none of its step's words.
func checkStepMentions(name, text string) []string {
	lines := strings.Split(text, "\n")
	var problems []string
	for i, line := range lines {
		for _, m := range stepMention.FindAllStringSubmatchIndex(line, -1) {
			mention := line[m[0]:m[1]]
			nums := stepNumber.FindAllString(line[m[2]:m[1]], -1)
			ends := []string{nums[0]}
			if len(nums) > 1 {
				ends = append(ends, nums[len(nums)-1])
			}
			context := contextOf(lines, i, m[0])
			for _, n := range ends {
				st, ok := parseStep(n)
				if !ok {
					problems = append(problems, fmt.Sprintf("%s:%d: %q: there is no step %s", name, i+1, mention, n))
					continue
				}
				if !hasAny(context, stepWords[st]) {
					problems = append(problems, fmt.Sprintf("%s:%d: %q: nothing around it speaks of step %s (%s; words %q): %q",
						name, i+1, mention, st, titleOf(st), stepWords[st], strings.TrimSpace(line)))
				}
			}
		}
	}
	return problems
}

// contextOf is the text a mention is judged by: its table cell in a
// Markdown table row, else its line with the one before and after.
func contextOf(lines []string, i, at int) string {
	line := lines[i]
	if strings.HasPrefix(strings.TrimSpace(line), "|") {
		start := strings.LastIndex(line[:at], "|")
		end := strings.Index(line[at:], "|")
		if end < 0 {
			end = len(line) - at
		}
		return strings.ToLower(line[start+1 : at+end])
	}
	lo, hi := i, i+1
	for lo > 0 && i-lo < contextLines && !paragraphEnd(lines[lo-1]) {
		lo--
	}
	for hi < len(lines) && hi-i <= contextLines && !paragraphEnd(lines[hi]) {
		hi++
	}
	var words []string
	for _, l := range lines[lo:hi] {
		l = strings.TrimSpace(l)
		l = strings.TrimLeft(l, "/#>*-") // comment and Markdown markers
		words = append(words, strings.Fields(l)...)
	}
	return strings.ToLower(strings.Join(words, " "))
}

// contextLines is how far from a mention its context reaches, within its
// paragraph (a comment or Markdown paragraph: up to a blank line).
const contextLines = 3

func paragraphEnd(line string) bool {
	l := strings.TrimSpace(line)
	return l == "" || l == "//"
}

func hasAny(s string, words []string) bool {
	for _, w := range words {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

func titleOf(s Step) string {
	if s < numInitSteps {
		return stepTitles[s]
	}
	if t, ok := subSteps[s]; ok {
		return t.title
	}
	return "launcher step"
}

// TestStepWordsComplete: every step, the init's and the launcher's, has
// words to be recognised by.
func TestStepWordsComplete(t *testing.T) {
	for s := Step(0); s < numInitSteps; s++ {
		if len(stepWords[s]) == 0 {
			t.Errorf("step %s (%s) has no words in stepWords", s, stepTitles[s])
		}
	}
	for s := StepLCgroup; s <= lastLauncherStep; s++ {
		if len(stepWords[s]) == 0 {
			t.Errorf("launcher step %s has no words in stepWords", s)
		}
	}
	for s := StepAwaitCall; s < numSubStepsEnd; s++ {
		if len(stepWords[s]) == 0 || subSteps[s].title == "" {
			t.Errorf("sub-step %s has no words in stepWords or no title", s)
		}
	}
}

// TestStepMentionsChecked: the check itself, on synthetic text. A step
// named with words of another step, or a step that does not exist, is
// reported; right mentions are not.
func TestStepMentionsChecked(t *testing.T) {
	for _, c := range []struct {
		text string
		bad  int
	}{
		{"// the exec thread moves itself into the cgroup at step 12", 0},
		{"// the exec thread moves itself into the cgroup at step 13", 1},
		{"// InstallSeccomp is the init's step 18, and", 1},
		{"// InstallSeccomp is the init's step 19, and", 0},
		{"// every capability set empty (steps 13-16)", 0},
		{"// every capability set empty (steps 12-16)", 1},
		{"// the uid change\n// re-arms the parent-death signal (step 16)", 1},
		{"| outliving it | Pdeathsig, re-armed after the uid change (step 17) | seccomp (step 20) |", 1},
		{"// there is a step 22 now", 1},
		{"// the launcher's step L11", 1},
		{"// the launcher's step L10 copies the tool's changes back", 0},
		{"// the work dir is launcher step L9", 0},
		{"// launcher step L6 sends the plan", 0},
		{"// launcher step L5 sends the plan", 1},
		{"// not a step mention: 12 steps, step-by-step", 0},
		{"// a pre-built sandbox waits for its call at step 10a", 0},
		{"// loopback is up at step 10a", 1},
		{"// a pre-built sandbox waits for its call at step 10b", 1},
	} {
		if got := checkStepMentions("synthetic", c.text); len(got) != c.bad {
			t.Errorf("%q: %d problems, want %d: %q", c.text, len(got), c.bad, got)
		}
	}
}

// TestStepMentions: every "step N" in the trusted core's sources and
// documents (nsinit, launcher, the seccomp package doc,
// SECURITY.md, docs/) names the step it speaks of. Step 12 was inserted
// once and five comments kept the old numbers; this keeps it from
// happening again.
func TestStepMentions(t *testing.T) {
	var files []string
	for _, pattern := range []string{"*.go", "../launcher/*.go", "../launcher/*/*.go",
		"../seccomp/doc.go", "../SECURITY.md", "../docs/*.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 20 {
		t.Fatalf("only %d files found: %q", len(files), files)
	}
	for _, f := range files {
		if filepath.Base(f) == "stepmentions_test.go" {
			continue // its synthetic mentions are wrong on purpose
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range checkStepMentions(f, string(data)) {
			t.Error(p)
		}
	}
}

// stepConstants maps each Step constant's name to its value, read from
// steps.go's two iota blocks (the init's from 0, the launcher's from
// StepLCgroup), so a test can resolve a name written in a source file.
func stepConstants(t *testing.T) map[string]Step {
	t.Helper()
	data, err := os.ReadFile("steps.go")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]Step{}
	decl := regexp.MustCompile(`^\t(Step[A-Z]\w*)\b`)
	next := Step(-1)
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "const ("):
			next = -1
		case line == ")":
			next = -2
		}
		m := decl.FindStringSubmatch(line)
		if m == nil || next == -2 {
			continue
		}
		if next == -1 {
			next = 0
			switch m[1] {
			case "StepLCgroup":
				next = StepLCgroup
			case "StepAwaitCall":
				next = StepAwaitCall
			}
		}
		names[m[1]] = next
		next++
	}
	if names["StepExec"] != StepExec || names["StepLCgroup"] != StepLCgroup || names[lastLauncherStepName] != lastLauncherStep || len(names) != int(numInitSteps)+int(lastLauncherStep-StepLCgroup)+1+int(numSubStepsEnd-StepAwaitCall) {
		t.Fatalf("steps.go read wrong: %v", names)
	}
	return names
}

// stepHeading is a numbered heading of the sequence in the code:
// "// 12. cgroup v1: ...", "// L1a. Root mode: ...", "// L7 (cont.). ...".
var stepHeading = regexp.MustCompile(`^\s*// (L?\d+[a-z]?)(?: \(cont\.\))?\. `)

var stepConstRef = regexp.MustCompile(`\bStep[A-Z]\w*\b`)

// checkStepSections returns one problem per Step constant used under a
// numbered heading of another step (up to the next heading or the end of
// the function). launcherOnly: only L headings count (the file's other
// numbered lists are local checklists).
func checkStepSections(name, text string, consts map[string]Step, launcherOnly bool) []string {
	var problems []string
	var cur Step
	in := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "func ") || line == "}" {
			in = false
			continue
		}
		if m := stepHeading.FindStringSubmatch(line); m != nil && (!launcherOnly || strings.HasPrefix(m[1], "L")) {
			st, ok := parseStep(m[1])
			if !ok {
				problems = append(problems, fmt.Sprintf("%s:%d: heading of a step that does not exist: %q", name, i+1, strings.TrimSpace(line)))
				in = false
				continue
			}
			cur, in = st, true
			continue
		}
		if !in || strings.HasPrefix(strings.TrimSpace(line), "//") {
			continue
		}
		for _, ref := range stepConstRef.FindAllString(line, -1) {
			if st, ok := consts[ref]; ok && st != cur {
				problems = append(problems, fmt.Sprintf("%s:%d: %s (step %s) under the heading of step %s: %q", name, i+1, ref, st, cur, strings.TrimSpace(line)))
			}
		}
	}
	return problems
}

// TestStepSections: the code under each numbered heading of the init's
// sequence (compileDirect) and of the launcher's (CreateFromPlan, run)
// raises that step and no other, so a heading, its code and its errors
// cannot drift apart.
func TestStepSections(t *testing.T) {
	consts := stepConstants(t)
	for _, f := range []struct {
		path         string
		launcherOnly bool
	}{{"direct.go", false}, {"../launcher/sandbox.go", true}} {
		data, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range checkStepSections(f.path, string(data), consts, f.launcherOnly) {
			t.Error(p)
		}
	}
	// The check itself: a heading whose code raises its neighbour's step.
	bad := "func run() {\n\t// 12. cgroup v1: enter\n\t\treturn stepErr(StepDropBounding, \"x\")\n}\n"
	good := "func run() {\n\t// 13. bounding set\n\t\treturn stepErr(StepDropBounding, \"x\")\n}\n"
	if len(checkStepSections("synthetic", bad, consts, false)) != 1 || len(checkStepSections("synthetic", good, consts, false)) != 0 {
		t.Error("checkStepSections misjudges the synthetic sections")
	}
}
