package main

import (
	"context"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestBenchSuiteFlagStrB(t *testing.T) {
	cfg, err := benchParseSuite([]string{"--quick", "--str", "bin/str", "--str-b", "/work/old/str"}, io.Discard)
	if err != nil || cfg.str != "bin/str" || cfg.strB != "/work/old/str" {
		t.Fatalf("--str-b: %+v, %v", cfg, err)
	}
	if cfg, _ := benchParseSuite(nil, io.Discard); cfg.strB != "" {
		t.Errorf("no --str-b: strB %q", cfg.strB)
	}
}

// --str-b's ids and titles are --str's, marked as str-bench load marks
// its cells.
func TestBenchStrID(t *testing.T) {
	a, b := &benchStr{tag: benchTagA}, &benchStr{tag: benchTagB}
	for id, want := range map[string]string{
		"true/str-restrictive": "true/str-b-restrictive", "py/str-serve-rest": "py/str-b-serve-rest",
		"echo/cold": "echo/str-b-cold", "worker": "str-b-worker", "str-run": "str-b-run", "cold": "str-b-cold",
	} {
		if got := a.id(id); got != id {
			t.Errorf("--str %q: %q", id, got)
		}
		if got := b.id(id); got != want {
			t.Errorf("--str-b %q: %q, want %q", id, got, want)
		}
	}
	if got := b.title("echo_tool cold"); got != "echo_tool cold [str-b]" {
		t.Errorf("title %q", got)
	}
}

// With --str-b the one-shot restrictive and the served cells come twice,
// each binary's next to the other's, built with its binary and its own
// str serve's socket; every other cell once.
func TestBenchSpawnCellsStrB(t *testing.T) {
	a := &benchStr{tag: benchTagA, path: "/new/str", sock: "/t/serve-str.sock", state: "/run/a"}
	b := &benchStr{tag: benchTagB, path: "/old/str", sock: "/t/serve-str-b.sock", state: "/run/b"}
	cfg := benchSuiteConfig{python: "/usr/bin/python3"}
	one := benchSpawnCells(cfg, []*benchStr{a}, "/usr/bin/bwrap", "/t/w")
	two := benchSpawnCells(cfg, []*benchStr{a, b}, "/usr/bin/bwrap", "/t/w")
	if len(two) != len(one)+6 {
		t.Fatalf("%d cells with --str-b, %d without: want 6 more (3 rows x 2 targets)", len(two), len(one))
	}
	var ids []string
	for _, c := range two {
		ids = append(ids, c.id)
	}
	for _, target := range []string{"true", "py"} {
		for _, row := range []string{"str-restrictive", "str-serve", "str-serve-rest"} {
			i := slices.Index(ids, target+"/"+row)
			if i < 0 || i+1 >= len(ids) || ids[i+1] != b.id(target+"/"+row) {
				t.Errorf("%s/%s: not followed by its --str-b cell: %q", target, row, ids)
				continue
			}
			ca, cb := two[i], two[i+1]
			if ca.str != a || cb.str != b || ca.row != cb.row || ca.row != target+"/"+row {
				t.Errorf("%s: str %v/%v, rows %q %q", ca.id, ca.str, cb.str, ca.row, cb.row)
			}
			if cb.argv[0] != "/old/str" || ca.argv[0] != "/new/str" {
				t.Errorf("%s: argv %q and %q", ca.id, ca.argv, cb.argv)
			}
			if strings.HasPrefix(row, "str-serve") && (!slices.Contains(cb.argv, b.sock) || !slices.Contains(ca.argv, a.sock)) {
				t.Errorf("%s: not each binary's own socket: %q, %q", ca.id, ca.argv, cb.argv)
			}
			if got := cb.env(); !slices.Contains(got, "STR_STATE_DIR=/run/b") {
				t.Errorf("%s: env without its state directory", cb.id)
			}
		}
	}
	for _, c := range two {
		if c.str == b && !strings.Contains(c.title, "[str-b]") {
			t.Errorf("%s: title %q", c.id, c.title)
		}
		if c.str == nil && c.env() != nil {
			t.Errorf("%s: env %q", c.id, c.env())
		}
	}
}

// The A/B table from canned samples: each row with A, B, their ratios to
// bubblewrap's and B/A; n/a where a cell has no figure.
func TestBenchABReport(t *testing.T) {
	a := &benchStr{tag: benchTagA, path: "/new/str", sock: "/t/a.sock"}
	b := &benchStr{tag: benchTagB, path: "/old/str", sock: "/t/b.sock"}
	st := &benchState{cfg: benchSuiteConfig{rounds: 1, n: 2, conc: 4, k: 8, python: "/usr/bin/python3"}, str: a.path, strs: []*benchStr{a, b},
		bwrap: "/nonexistent/bwrap", tput: map[string][]float64{}, echoCPU: map[string][]float64{}, echoSelf: map[string][]float64{},
		serveCPU: map[string][]float64{}, serveOwn: map[string][]float64{}, errs: map[string][]string{}}
	st.cells = benchSpawnCells(st.cfg, st.strs, "/usr/bin/bwrap", "/t/w")
	for _, v := range st.strs {
		cold, _ := st.echoCells(context.Background(), nil, v, false, "") // no python: skipped, nothing started
		st.cells = append(st.cells, cold...)
	}
	sample := func(id string, latMS, cpuMS float64) {
		st.rows = append(st.rows, benchRow{cell: id, round: 1, lat: latMS * 1000, cpu: cpuMS * 1000, full: math.NaN()},
			benchRow{cell: id, round: 1, lat: latMS * 1000, cpu: cpuMS * 1000, full: math.NaN()})
	}
	sample("true/bwrap-restrictive", 8, 4)
	sample("true/str-restrictive", 12, 10)
	sample("true/str-b-restrictive", 10, 8)
	sample("true/str-serve", 6, 2)
	sample("true/str-b-serve", 4, 1)
	st.serveCPU["true/str-serve"] = []float64{2000}
	st.serveCPU["true/str-b-serve"] = []float64{3000}
	st.memory = []benchMemory{{id: "str-run", perSandboxKB: 2048}, {id: "str-b-run", perSandboxKB: 1024}, {id: "bwrap", perSandboxKB: 512}}
	out := st.report()
	_, ab, ok := strings.Cut(out, "\nA/B: A = --str /new/str, B = --str-b /old/str")
	if !ok {
		t.Fatalf("no A/B table:\n%s", out)
	}
	ab, _, _ = strings.Cut(ab, "\n\n")
	lines := strings.Split(ab, "\n")
	for _, want := range []struct{ label, rest string }{
		{"/bin/true, str run restrictive", "12.00 ms 10.00 ms 1.50x 1.25x 0.83x restrictive line"},
		{"/bin/true, str run restrictive, CPU", "10.00 ms 8.00 ms 2.50x 2.00x 0.80x restrictive line, CPU"},
		{"/bin/true, str run --serve (client)", "6.00 ms 4.00 ms 0.75x 0.50x 0.67x restrictive line"},
		{"/bin/true, str run --serve, CPU client + str serve", "4.00 ms 4.00 ms 1.00x 1.00x 1.00x restrictive line, CPU"},
		{"python3 -c pass, str run restrictive", "- - n/a n/a n/a restrictive line"},
		{"Pss per sandbox, str run", "2.00 MiB 1.00 MiB 4.00x 2.00x 0.50x standard line"},
	} {
		i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, want.label+"  ") })
		if i < 0 {
			t.Errorf("no row %q in the A/B table:%s", want.label, ab)
			continue
		}
		if got := strings.Join(strings.Fields(strings.TrimPrefix(lines[i], want.label)), " "); got != want.rest {
			t.Errorf("row %q: %q, want %q", want.label, got, want.rest)
		}
	}
	// One column for the labels: every row's A figure ends where the
	// header's does.
	end := strings.Index(lines[1], " A ") + 2
	for _, l := range lines[2 : len(lines)-1] {
		if f := strings.Fields(l[:end]); l[end] != ' ' || (f[len(f)-1] != "ms" && f[len(f)-1] != "MiB" && f[len(f)-1] != "inv/s" && f[len(f)-1] != "-") {
			t.Errorf("row not aligned with the header %q: %q", lines[1], l)
		}
	}
	// The cell table's title column fits the longest title: a served
	// row of --str-b's has its p50 under the header's.
	all := strings.Split(out, "\n")
	header := all[slices.IndexFunc(all, func(l string) bool { return strings.HasPrefix(l, "cell ") })]
	row := all[slices.IndexFunc(all, func(l string) bool {
		return strings.HasPrefix(l, "/bin/true, str run --serve (restrictive, through a resident str serve) [str-b] ")
	})]
	if end := strings.Index(header, "p50 ms") + len("p50 ms"); row[end-len("4.00"):end] != "4.00" {
		t.Errorf("the cell table's columns do not line up:\n%s\n%s", header, row)
	}
	if !strings.Contains(out, "\nstr-b /old/str, its cells in the same rounds") {
		t.Errorf("header does not name --str-b:\n%s", out)
	}
	// Without --str-b, no such table.
	st.strs = st.strs[:1]
	if out := st.report(); strings.Contains(out, "A/B:") {
		t.Errorf("A/B table without --str-b:\n%s", out)
	}
}
