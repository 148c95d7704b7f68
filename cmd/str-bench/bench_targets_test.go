package main

import (
	"math"
	"strings"
	"testing"
)

// TestBenchTargets: the table has issue 19's nine rows in its order, each
// with its target; a figure at its target is met, one past it missed, a
// NaN (a cell that did not run) is said so.
func TestBenchTargets(t *testing.T) {
	atTarget := benchFigures{trueRun: 1.4, trueRunCPU: 1.6, pyRun: 1.1, pyRunCPU: 3, launcherSelfMS: 9, echoColdMS: 28,
		echoWarmMS: 28, echoReadyMS: 27, tputCold: 0.9, tputColdIPS: 90, tputBwrapIPS: 100, pssRunMiB: 1,
		trueServe: 1.0, pyServe: 0.9, serveOwnMS: 5}
	rows := benchTargets(atTarget)
	wantTargets := []string{"≤ 1.4x (CPU ≤ 1.6x)", "≤ 1.0x (stretch 0.8x)", "≤ 1.1x", "≤ 0.9x", "≤ 5 ms (C floor ~4)", "≤ 28 ms", "yes", "≥ 0.9x", "≤ 1 MiB"}
	if len(rows) != len(wantTargets) {
		t.Fatalf("%d rows, want %d", len(rows), len(wantTargets))
	}
	for i, r := range rows {
		if r.target != wantTargets[i] {
			t.Errorf("row %d (%s): target %q, want %q", i, r.measure, r.target, wantTargets[i])
		}
		if r.verdict != "met" {
			t.Errorf("row %d (%s) at its target: %q, want met", i, r.measure, r.verdict)
		}
	}

	past := benchFigures{trueRun: 1.3, trueRunCPU: 1.7, pyRun: 1.2, pyRunCPU: 1, launcherSelfMS: 1, echoColdMS: 28.1,
		echoWarmMS: 20, echoReadyMS: 28.2, tputCold: 0.89, pssRunMiB: 1.01, trueServe: 1.01, pyServe: 0.91, serveOwnMS: 5.1}
	for i, r := range benchTargets(past) {
		if r.verdict != "missed" {
			t.Errorf("row %d (%s) past its target: %q, want missed", i, r.measure, r.verdict)
		}
	}

	nan := math.NaN()
	none := benchFigures{trueRun: nan, trueRunCPU: nan, pyRun: nan, pyRunCPU: nan, launcherSelfMS: nan, echoColdMS: nan,
		echoWarmMS: nan, echoReadyMS: nan, tputCold: nan, tputColdIPS: nan, tputBwrapIPS: nan, pssRunMiB: nan,
		trueServe: nan, pyServe: nan, serveOwnMS: nan}
	for i, r := range benchTargets(none) {
		if !strings.HasPrefix(r.verdict, "not measured in this run") {
			t.Errorf("row %d (%s) without figures: %q", i, r.measure, r.verdict)
		}
	}

	table := benchTargetsTable(rows)
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != 2+len(rows) || !strings.HasPrefix(lines[0], "| measure | this run | target | verdict |") {
		t.Errorf("markdown table:\n%s", table)
	}
}

// TestBenchTemplateTargets: issue 20's three rows, in its order, each
// met at its target, missed past it, and said not measured without it.
func TestBenchTemplateTargets(t *testing.T) {
	at := benchTemplateFigures{tput: 3, tputIPS: 300, tputBwrapIPS: 100, p50: 0.4, p50MS: 4, p99MS: 9, pyP50MS: 10, cpuMS: 7}
	rows := benchTemplateTargets(at)
	want := []string{"≥ 3x (stretch 5x)", "≤ 0.4x", "≤ 7 ms"}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		if r.target != want[i] || r.verdict != "met" {
			t.Errorf("row %d (%s): target %q verdict %q, want %q met", i, r.measure, r.target, r.verdict, want[i])
		}
	}
	for i, r := range benchTemplateTargets(benchTemplateFigures{tput: 2.99, p50: 0.41, cpuMS: 7.1}) {
		if r.verdict != "missed" {
			t.Errorf("row %d (%s) past its target: %q", i, r.measure, r.verdict)
		}
	}
	nan := math.NaN()
	for i, r := range benchTemplateTargets(benchTemplateFigures{tput: nan, p50: nan, cpuMS: nan}) {
		if !strings.HasPrefix(r.verdict, "not measured in this run") {
			t.Errorf("row %d (%s) without figures: %q", i, r.measure, r.verdict)
		}
	}
	if l := benchOneInFlight(benchTemplateFigures{oneTemplate: 250, oneCold: nan, oneWarmReady: 200, oneBwrap: 80}); !strings.Contains(l, "template 250.0/s, cold -,") {
		t.Errorf("one in flight line: %q", l)
	}
}
