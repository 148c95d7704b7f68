package seccomp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// The frozen fixtures under testdata/frozen/ pin what the embedded
// policies mean, independently of how they are written and compiled:
//
//   - POLICY.rules.json: the effective rule set, per syscall the ordered
//     list of (action, condition, reason), conditional rules first, and
//     the default action. It was
//     written from the three stand-alone policy files before standard and
//     permissive were rewritten to extend restrictive; the resolved
//     policies must reproduce it exactly.
//   - POLICY_ARCH.decisions: rows of seccomp_data (every syscall number
//     0..1100 with all-zero and all-ones arguments, numbers around the x32
//     bit, a foreign arch, and every argument probe of the self-check)
//     with the SECCOMP_RET value of the program. Written from the programs
//     libseccomp and argcode.go produced together, before the generator
//     became pure Go; the single generator must return the same value on
//     every row.
//
// A deliberate policy change rewrites both with STR_UPDATE_FROZEN=1 (from
// the current compiler) and shows the difference in review.
const frozenDir = "testdata/frozen"

type frozenRule struct {
	Action    string `json:"action"`
	Condition string `json:"condition,omitempty"`
	Reason    string `json:"reason"`
}

type frozenRules struct {
	DefaultAction string                  `json:"default_action"`
	Syscalls      map[string][]frozenRule `json:"syscalls"`
}

// effectiveRules lists, per syscall, its conditional rules in file order
// (the order decides) and then its unconditional rule (the fallback,
// wherever it stands in the file).
func effectiveRules(p *Policy) frozenRules {
	out := frozenRules{DefaultAction: p.DefaultAction.String(), Syscalls: map[string][]frozenRule{}}
	uncond := map[string]frozenRule{}
	for _, r := range p.Rules {
		for _, n := range r.Names {
			fr := frozenRule{r.Action.String(), condText(r.Args), r.Reason}
			if len(r.Args) == 0 {
				uncond[n] = fr
				continue
			}
			out.Syscalls[n] = append(out.Syscalls[n], fr)
		}
	}
	for n, fr := range uncond {
		out.Syscalls[n] = append(out.Syscalls[n], fr)
	}
	return out
}

// decisionRows builds the rows of a decisions fixture for p.
func decisionRows(p *Policy, arch archSpec) []Data {
	seen := map[Data]bool{}
	var rows []Data
	add := func(d Data) {
		if !seen[d] {
			seen[d] = true
			rows = append(rows, d)
		}
	}
	ones := ^uint64(0)
	for nr := int32(0); nr <= 1100; nr++ {
		add(Data{Nr: nr, Arch: arch.audit})
		add(Data{Nr: nr, Arch: arch.audit, Args: [6]uint64{ones, ones, ones, ones, ones, ones}})
	}
	for _, nr := range []int32{0x3fffffff, X32SyscallBit, X32SyscallBit | 1, 0x7fffffff, -1 << 31, -1} {
		add(Data{Nr: nr, Arch: arch.audit})
	}
	for _, d := range probes(p, arch) {
		add(d)
	}
	return rows
}

func formatRow(d Data, ret uint32) string {
	return fmt.Sprintf("%d %#x %#x %#x %#x %#x %#x %#x -> %#x", d.Nr, d.Arch, d.Args[0], d.Args[1], d.Args[2], d.Args[3], d.Args[4], d.Args[5], ret)
}

func parseRow(line string) (Data, uint32, error) {
	f := strings.Fields(line)
	if len(f) != 10 || f[8] != "->" {
		return Data{}, 0, fmt.Errorf("bad row %q", line)
	}
	var d Data
	n, err := strconv.ParseInt(f[0], 10, 32)
	if err != nil {
		return d, 0, err
	}
	d.Nr = int32(n)
	a, err := strconv.ParseUint(f[1], 0, 32)
	if err != nil {
		return d, 0, err
	}
	d.Arch = uint32(a)
	for i := range 6 {
		if d.Args[i], err = strconv.ParseUint(f[2+i], 0, 64); err != nil {
			return d, 0, err
		}
	}
	r, err := strconv.ParseUint(f[9], 0, 32)
	return d, uint32(r), err
}

func writeFrozen(t *testing.T, name string, p *Policy, prog *Program, arch archSpec) {
	t.Helper()
	b, err := json.MarshalIndent(effectiveRules(p), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(frozenDir, name+".rules.json"), append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# nr arch arg0..arg5 -> SECCOMP_RET of policy %s on %s (see frozen_test.go)\n", name, arch.name)
	rows := decisionRows(p, arch)
	sort.SliceStable(rows, func(a, b int) bool { return uint32(rows[a].Nr) < uint32(rows[b].Nr) })
	for _, d := range rows {
		ret, err := Simulate(prog.Filter, d)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(&buf, formatRow(d, ret))
	}
	if err := os.WriteFile(filepath.Join(frozenDir, name+"_"+arch.name+".decisions"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFrozenRuleSets: the resolved policies have exactly the effective
// rule sets recorded before inheritance existed.
func TestFrozenRuleSets(t *testing.T) {
	for _, name := range Names() {
		p, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(frozenDir, name+".rules.json"))
		if err != nil {
			t.Fatal(err)
		}
		var want frozenRules
		if err := json.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		got := effectiveRules(p)
		if got.DefaultAction != want.DefaultAction {
			t.Errorf("%s: default action %s, frozen %s", name, got.DefaultAction, want.DefaultAction)
		}
		for n, w := range want.Syscalls {
			g, _ := json.Marshal(got.Syscalls[n])
			wb, _ := json.Marshal(w)
			if !bytes.Equal(g, wb) {
				t.Errorf("%s: %s: rules\n  %s\nfrozen\n  %s", name, n, g, wb)
			}
		}
		for n := range got.Syscalls {
			if _, ok := want.Syscalls[n]; !ok {
				t.Errorf("%s: %s has rules %+v, frozen has none", name, n, got.Syscalls[n])
			}
		}
	}
}

// TestFrozenDecisions: the compiled program returns the recorded value on
// every row of the decisions fixture.
func TestFrozenDecisions(t *testing.T) {
	arch, err := native()
	if err != nil {
		t.Fatal(err)
	}
	update := os.Getenv("STR_UPDATE_FROZEN") == "1"
	for _, name := range Names() {
		p, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := p.Compile()
		if err != nil {
			t.Fatal(err)
		}
		if update {
			writeFrozen(t, name, p, prog, arch)
			continue
		}
		f, err := os.Open(filepath.Join(frozenDir, name+"_"+arch.name+".decisions"))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		rows := 0
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "#") {
				continue
			}
			d, want, err := parseRow(sc.Text())
			if err != nil {
				t.Fatal(err)
			}
			got, err := Simulate(prog.Filter, d)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s: %s: program returns %s, frozen %s", name, formatRow(d, want), DescribeRet(got), DescribeRet(want))
			}
			rows++
		}
		f.Close()
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if rows < 2200 {
			t.Fatalf("%s: only %d rows in the decisions fixture", name, rows)
		}
	}
}
