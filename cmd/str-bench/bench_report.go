package main

// The output side of str-bench: percentiles over the raw samples, the
// samples as CSV and the latency chart as hand-written SVG (no dependency).

import (
	"bufio"
	"encoding/csv"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// benchRow is one raw sample of str-bench: one line of samples.csv. Times
// are in microseconds; NaN is "not measured" (an empty CSV field).
type benchRow struct {
	cell   string
	round  int
	lat    float64 // until the launched command is reaped (echo: publish until reply)
	cpu    float64 // user+system CPU of the whole process tree
	full   float64 // until every process it left behind is reaped too
	status int     // wait status (0 = exited 0)
	// str-bench spawn --schedstat: the command's own schedstat, when it
	// printed one (sched): its time on a CPU and waiting on the run queue.
	sched           bool
	cmdRun, cmdWait float64
}

// benchCSVHeader is samples.csv's header.
var benchCSVHeader = []string{"cell", "round", "lat_us", "cpu_us", "full_us", "status", "cmd_run_us", "cmd_wait_us"}

// benchWriteCSV writes rows as samples.csv.
func benchWriteCSV(w io.Writer, rows []benchRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(benchCSVHeader); err != nil {
		return err
	}
	num := func(v float64) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	for _, r := range rows {
		run, wait := "", ""
		if r.sched {
			run, wait = num(r.cmdRun), num(r.cmdWait)
		}
		if err := cw.Write([]string{r.cell, strconv.Itoa(r.round), num(r.lat), num(r.cpu), num(r.full), strconv.Itoa(r.status), run, wait}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// benchStats summarises one cell's samples (microseconds).
type benchStats struct {
	n, fails           int
	p50, p90, p99, min float64
	cpuP50             float64 // NaN when no sample has a CPU figure
}

func benchStatsOf(rows []benchRow) benchStats {
	var lat, cpu []float64
	st := benchStats{}
	for _, r := range rows {
		st.n++
		if r.status != 0 {
			st.fails++
		}
		lat = append(lat, r.lat)
		if !math.IsNaN(r.cpu) {
			cpu = append(cpu, r.cpu)
		}
	}
	sort.Float64s(lat)
	sort.Float64s(cpu)
	st.p50, st.p90, st.p99 = benchPercentile(lat, 50), benchPercentile(lat, 90), benchPercentile(lat, 99)
	st.min = benchPercentile(lat, 0)
	st.cpuP50 = benchPercentile(cpu, 50)
	return st
}

// benchMedian is the nearest-rank median of unsorted values (NaN if none).
func benchMedian(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return benchPercentile(s, 50)
}

// benchReadRaw parses a spawn driver RAW file ("lat_us cpu_us maxrss_kb
// wait_status full_us" per line, with --schedstat "cmd_run_us cmd_wait_us"
// after it, -1 -1 when the command printed none) into rows of cell and
// round.
func benchReadRaw(path, cell string, round int) ([]benchRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []benchRow
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) == 0 {
			continue
		}
		if len(fl) != 5 && len(fl) != 7 {
			return nil, fmt.Errorf("%s: line %q: want 5 or 7 fields", path, sc.Text())
		}
		var v [7]float64
		for i, s := range fl {
			if v[i], err = strconv.ParseFloat(s, 64); err != nil {
				return nil, fmt.Errorf("%s: line %q: %w", path, sc.Text(), err)
			}
		}
		row := benchRow{cell: cell, round: round, lat: v[0], cpu: v[1], full: v[4], status: int(v[3])}
		if len(fl) == 7 && v[5] >= 0 && v[6] >= 0 {
			row.sched, row.cmdRun, row.cmdWait = true, v[5], v[6]
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

// benchWriteLatencies appends one "lat_us" line per duration to path (str
// bench echo -o).
func benchWriteLatencies(path string, lat []time.Duration) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	for _, d := range lat {
		fmt.Fprintf(f, "%.1f\n", benchUs(d))
	}
	return f.Close()
}

// benchReadLatencies reads what benchWriteLatencies wrote, as rows.
func benchReadLatencies(path, cell string, round int) ([]benchRow, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rows []benchRow
	for _, l := range strings.Fields(string(data)) {
		v, err := strconv.ParseFloat(l, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", path, l, err)
		}
		rows = append(rows, benchRow{cell: cell, round: round, lat: v, cpu: math.NaN(), full: math.NaN()})
	}
	return rows, nil
}

// benchPanel is one panel of latency.svg: the cells of one target.
type benchPanel struct {
	title string
	cells []benchPanelCell
}

type benchPanelCell struct {
	label string
	ms    []float64 // latency samples in milliseconds, in measurement order
}

// SVG geometry (pixels).
const (
	svgWidth    = 980
	svgLabelW   = 330 // cell labels left of the plot
	svgRightW   = 90  // p50 figure right of the plot
	svgRowH     = 24
	svgPanelTop = 46 // panel title and legend
	svgAxisH    = 40
	svgGap      = 18
	svgMaxDots  = 300 // per cell; more samples are thinned evenly
)

// benchWriteSVG draws one panel per target: per cell a strip of its
// samples, a box from p25 to p75, whiskers p1..p99 and p50 in red, on a
// logarithmic millisecond axis of the panel's own range.
func benchWriteSVG(w io.Writer, heading string, panels []benchPanel) error {
	var b strings.Builder
	esc := func(s string) string {
		var e strings.Builder
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	height := 40
	for _, p := range panels {
		height += svgPanelTop + len(p.cells)*svgRowH + svgAxisH + svgGap
	}
	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		svgWidth, height, svgWidth, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgWidth, height)
	fmt.Fprintf(&b, `<text x="10" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", esc(heading))
	y := 40
	plotX0, plotX1 := float64(svgLabelW), float64(svgWidth-svgRightW)
	for pi, p := range panels {
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, c := range p.cells {
			for _, v := range c.ms {
				if v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		if math.IsInf(lo, 1) {
			lo, hi = 1, 10
		}
		lo, hi = lo/1.25, hi*1.25
		if hi/lo < 10 { // at least one decade, so that ticks exist
			mid := math.Sqrt(lo * hi)
			lo, hi = mid/math.Sqrt(10), mid*math.Sqrt(10)
		}
		xOf := func(v float64) float64 {
			v = math.Min(math.Max(v, lo), hi)
			return plotX0 + (math.Log(v)-math.Log(lo))/(math.Log(hi)-math.Log(lo))*(plotX1-plotX0)
		}
		fmt.Fprintf(&b, `<g class="panel" id="panel-%d">`+"\n", pi+1)
		fmt.Fprintf(&b, `<text x="10" y="%d" font-size="14" font-weight="bold">%s</text>`+"\n", y+18, esc(p.title))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">dots: samples; box p25-p75; whiskers p1-p99; red bar and figure: p50</text>`+"\n", svgLabelW, y+36)
		top := y + svgPanelTop
		bottom := top + len(p.cells)*svgRowH
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#fafafa" stroke="#ccc"/>`+"\n", plotX0, top, plotX1-plotX0, bottom-top)
		// Axis: ticks at 1, 2, 5 x 10^k ms.
		for d := math.Floor(math.Log10(lo)); d <= math.Ceil(math.Log10(hi)); d++ {
			for _, m := range []float64{1, 2, 5} {
				v := m * math.Pow(10, d)
				if v < lo || v > hi {
					continue
				}
				x := xOf(v)
				fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, bottom)
				fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, bottom+15, strconv.FormatFloat(v, 'g', 4, 64))
			}
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#333">latency, ms (log scale)</text>`+"\n", (plotX0+plotX1)/2, bottom+32)
		for ci, c := range p.cells {
			cy := float64(top + ci*svgRowH + svgRowH/2)
			fmt.Fprintf(&b, `<g class="cell"><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", svgLabelW-8, cy+4, esc(c.label))
			s := append([]float64(nil), c.ms...)
			sort.Float64s(s)
			if len(s) == 0 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#999">no samples</text></g>`+"\n", plotX0+6, cy+4)
				continue
			}
			stride := max(1, len(c.ms)/svgMaxDots)
			for i := 0; i < len(c.ms); i += stride {
				jitter := float64((i*7919)%13-6) * 0.8
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="1.6" fill="#4a78b0" fill-opacity="0.35"/>`+"\n", xOf(c.ms[i]), cy+jitter)
			}
			p1, p25, p50, p75, p99 := benchPercentile(s, 1), benchPercentile(s, 25), benchPercentile(s, 50), benchPercentile(s, 75), benchPercentile(s, 99)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333"/>`+"\n", xOf(p1), cy, xOf(p99), cy)
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%d" fill="none" stroke="#333"/>`+"\n", xOf(p25), cy-7, math.Max(xOf(p75)-xOf(p25), 1), 14)
			fmt.Fprintf(&b, `<line class="p50" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#d62728" stroke-width="3"/>`+"\n", xOf(p50), cy-9, xOf(p50), cy+9)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#d62728">%s ms</text></g>`+"\n", plotX1+6, cy+4, strconv.FormatFloat(p50, 'f', 2, 64))
		}
		b.WriteString("</g>\n")
		y = bottom + svgAxisH + svgGap
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
