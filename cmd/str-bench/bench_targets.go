package main

// The target table of issue 19 ("Spawn at the physical floor"): each row
// of the table with the figure this run measured and its target,
// printed as markdown: README.md's Results table is this output and issue
// 20's, pasted.

import (
	"fmt"
	"math"
	"strings"
)

// benchFigures are the measurements the target table is made of; NaN is
// "not measured in this run" (a skipped or failed cell).
type benchFigures struct {
	trueRun, trueRunCPU float64 // str run restrictive / bwrap restrictive, /bin/true: p50 wall, CPU
	pyRun, pyRunCPU     float64 // the same for python3 -c pass
	launcherSelfMS      float64 // the worker's own CPU per cold echo_tool call (its children not counted), ms
	echoColdMS          float64 // the worker's tree CPU per call: cold
	echoWarmMS          float64 // warm, back to back (the pool refilling)
	echoReadyMS         float64 // warm, each call once the pool is ready
	tputCold            float64 // invocations/s cold, 4 in flight / bwrap + python3 -c pass
	tputColdIPS         float64 // the two rates behind it
	tputBwrapIPS        float64
	pssRunMiB           float64 // Pss per sandbox of one-shot str run's own processes
	trueServe, pyServe  float64 // str run --serve (a resident str serve) / bwrap restrictive: p50 wall
	trueRest, pyRest    float64 // the same, each call meeting the pool at rest (the verdict stays on the above)
	serveOwnMS          float64 // str serve's own CPU per served /bin/true call (its children, the sandboxes, not counted), ms
}

// benchTarget is one row: the measure, this run's figure, the
// target, and the verdict ("met", "missed", or why it was not measured).
type benchTarget struct {
	measure, now, target, verdict string
}

func benchVerdict(met bool, values ...float64) string {
	for _, v := range values {
		if math.IsNaN(v) {
			return "not measured in this run (a cell was skipped or failed)"
		}
	}
	if met {
		return "met"
	}
	return "missed"
}

func benchX(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", v)
}

func benchMS(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", v)
}

// benchTargets are issue 19's rows, in its order.
func benchTargets(f benchFigures) []benchTarget {
	return []benchTarget{
		{"`str run` restrictive `/bin/true`, no resident launcher running",
			fmt.Sprintf("%s (CPU %s)", benchX(f.trueRun), benchX(f.trueRunCPU)), "≤ 1.4x (CPU ≤ 1.6x)",
			benchVerdict(f.trueRun <= 1.4 && f.trueRunCPU <= 1.6, f.trueRun, f.trueRunCPU)},
		{"`str run` restrictive `/bin/true`, with a resident launcher on the host", benchX(f.trueServe) + " (`str run --serve`, back to back; " + benchX(f.trueRest) + " with the pool at rest)", "≤ 1.0x (stretch 0.8x)",
			benchVerdict(f.trueServe <= 1.0, f.trueServe)},
		{"`str run` restrictive `python3 -c pass`, no resident launcher running",
			fmt.Sprintf("%s (CPU %s)", benchX(f.pyRun), benchX(f.pyRunCPU)), "≤ 1.1x",
			benchVerdict(f.pyRun <= 1.1, f.pyRun)},
		{"`str run` restrictive `python3 -c pass`, with a resident launcher on the host", benchX(f.pyServe) + " (`str run --serve`, back to back; " + benchX(f.pyRest) + " with the pool at rest)", "≤ 0.9x",
			benchVerdict(f.pyServe <= 0.9, f.pyServe)},
		{"launcher CPU per sandbox in a resident process (the tool's own CPU excluded)",
			benchMS(f.serveOwnMS) + " (`str serve`'s own CPU per served `/bin/true`, refill included; the init's, in its children, not counted); the worker's per cold `echo_tool` call: " + benchMS(f.launcherSelfMS),
			"≤ 5 ms (C floor ~4)", benchVerdict(f.serveOwnMS <= 5, f.serveOwnMS)},
		{"worker `echo_tool` cold, tree CPU per call", benchMS(f.echoColdMS), "≤ 28 ms",
			benchVerdict(f.echoColdMS <= 28, f.echoColdMS)},
		{"worker warm call CPU ≤ cold call CPU",
			fmt.Sprintf("warm %s (pool ready %s) vs cold %s", benchMS(f.echoWarmMS), benchMS(f.echoReadyMS), benchMS(f.echoColdMS)), "yes",
			benchVerdict(f.echoWarmMS <= f.echoColdMS && f.echoReadyMS <= f.echoColdMS, f.echoWarmMS, f.echoReadyMS, f.echoColdMS)},
		{"invocations/s at 4 in flight, cold, vs bwrap + `python3 -c pass`",
			fmt.Sprintf("%s (%.1f vs %.1f /s)", benchX(f.tputCold), f.tputColdIPS, f.tputBwrapIPS), "≥ 0.9x",
			benchVerdict(f.tputCold >= 0.9, f.tputCold)},
		{"Pss per sandbox of str's own processes, one-shot `str run`", fmt.Sprintf("%.2f MiB", f.pssRunMiB), "≤ 1 MiB",
			benchVerdict(f.pssRunMiB <= 1, f.pssRunMiB)},
	}
}

// benchTargetsTable is the rows as a markdown table.
func benchTargetsTable(rows []benchTarget) string {
	var b strings.Builder
	b.WriteString("| measure | this run | target | verdict |\n|---|---:|---:|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.measure, r.now, r.target, r.verdict)
	}
	return b.String()
}

// benchTemplateFigures are the measurements of issue 20's target table
// (per-tool templates); NaN is "not measured in this run".
type benchTemplateFigures struct {
	tput                   float64 // invocations/s from a template, 4 in flight / bwrap + python3 -c pass
	tputIPS, tputBwrapIPS  float64 // the two rates behind it
	p50                    float64 // echo_tool p50 from a template, one in flight / python3 -c pass
	p50MS, p99MS, pyP50MS  float64 // the figures behind it
	cpuMS                  float64 // the worker's live tree CPU per template call, ms
	oneTemplate, oneCold   float64 // calls/s one in flight (1 / mean latency): template, cold,
	oneWarmReady, oneBwrap float64 // warm pool ready, bwrap + python3 -c pass
}

// benchTemplateTargets are issue 20's rows, in its order.
func benchTemplateTargets(f benchTemplateFigures) []benchTarget {
	return []benchTarget{
		{"`echo_tool` calls/s at 4 in flight vs bubblewrap + `python3 -c pass`",
			fmt.Sprintf("%s (%.1f vs %.1f /s)", benchX(f.tput), f.tputIPS, f.tputBwrapIPS), "≥ 3x (stretch 5x)",
			benchVerdict(f.tput >= 3, f.tput)},
		{"`echo_tool` latency p50, one in flight, vs `python3 -c pass`",
			fmt.Sprintf("%s (p50 %s, p99 %s; `python3 -c pass` p50 %s)", benchX(f.p50), benchMS(f.p50MS), benchMS(f.p99MS), benchMS(f.pyP50MS)), "≤ 0.4x",
			benchVerdict(f.p50 <= 0.4, f.p50)},
		{"worker tree CPU per template call", benchMS(f.cpuMS), "≤ 7 ms",
			benchVerdict(f.cpuMS <= 7, f.cpuMS)},
	}
}

// benchOneInFlight is the line under issue 20's table: calls/s with one
// in flight (1 / mean latency), template next to cold, warm and bwrap.
func benchOneInFlight(f benchTemplateFigures) string {
	r := func(v float64) string {
		if math.IsNaN(v) {
			return "-"
		}
		return fmt.Sprintf("%.1f/s", v)
	}
	return fmt.Sprintf("calls/s one in flight (1 / mean latency): template %s, cold %s, warm pool ready %s, bwrap + `python3 -c pass` %s\n",
		r(f.oneTemplate), r(f.oneCold), r(f.oneWarmReady), r(f.oneBwrap))
}
