package main

// The suite's second str binary (--str-b): its cells are the first one's
// built with another benchStr, run in the same rounds, and the report
// pairs them in the A/B table.

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/internal/syncbuf"
	"github.com/securetoolruntime/str/launcher/statedir"
)

// Tags of the str binaries measured.
const (
	benchTagA = "str"   // --str
	benchTagB = "str-b" // --str-b
)

// benchStr is one str binary measured and what the suite starts for it:
// its str serve, on a socket of its own, and its workers, all with a state
// directory of their own (STR_STATE_DIR), so that the two binaries' locks,
// cgroups and broker tokens never meet.
type benchStr struct {
	tag    string // benchTagA or benchTagB
	path   string // the binary (resolved); its str-worker beside it
	state  string // its STR_STATE_DIR ("" = str's default: tests only)
	sock   string // its str serve's socket
	serve  *exec.Cmd
	served chan struct{} // closed once serve has exited and been reaped
}

// id is the id of this binary's cell whose --str id is id: the same for
// --str; for --str-b, the part after TARGET/ starts "str-b-" (its "str-"
// replaced), as str-bench load names its cells: true/str-restrictive ->
// true/str-b-restrictive, echo/cold -> echo/str-b-cold, worker ->
// str-b-worker.
func (v *benchStr) id(id string) string {
	if v.tag == benchTagA {
		return id
	}
	target, rest, ok := strings.Cut(id, "/")
	if !ok {
		target, rest = "", id
	} else {
		target += "/"
	}
	return target + v.tag + "-" + strings.TrimPrefix(rest, "str-")
}

// title is the title of this binary's row whose --str title is title.
func (v *benchStr) title(title string) string {
	if v.tag == benchTagA {
		return title
	}
	return title + " [" + v.tag + "]"
}

// env is the environment of this binary's commands: str-bench's own, with
// its state directory.
func (v *benchStr) env() []string {
	if v.state == "" {
		return nil
	}
	return append(os.Environ(), statedir.Env+"="+v.state)
}

// worker is the str-worker beside the binary, which `str worker` execs.
func (v *benchStr) worker() string { return filepath.Join(filepath.Dir(v.path), "str-worker") }

// egress is the str-egress beside the binary, every launcher's egress
// helper (none beside an older build).
func (v *benchStr) egress() string { return filepath.Join(filepath.Dir(v.path), "str-egress") }

// startServe starts this binary's resident launcher, which its served
// cells call (`str serve`, restrictive, a pool of 2), and waits for its
// socket; it returns why the served cells cannot run here ("" = they can).
func (v *benchStr) startServe(ctx context.Context) string {
	if os.Geteuid() != 0 {
		return "str serve needs root"
	}
	cmd := exec.CommandContext(ctx, v.path, "serve", "--socket", v.sock, "--profiles", "restrictive", "--pool", "2")
	cmd.Env = v.env()
	var errb syncbuf.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		return fmt.Sprintf("str serve: %v", err)
	}
	v.serve, v.served = cmd, make(chan struct{})
	exited := v.served
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(30 * time.Second) // a failure guard, not a measure
	for {
		if fi, err := os.Stat(v.sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return ""
		}
		select {
		case <-exited:
			v.serve = nil
			return "str serve exited: " + benchFirstLine(errb.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			v.stopServe()
			return "str serve did not listen within 30 s: " + benchFirstLine(errb.String())
		}
	}
}

// stopServe ends the resident launcher (SIGTERM; its sandboxes go with it).
func (v *benchStr) stopServe() {
	if v.serve == nil || v.serve.Process == nil {
		return
	}
	_ = v.serve.Process.Signal(syscall.SIGTERM)
	select {
	case <-v.served:
	case <-time.After(30 * time.Second): // a failure guard, not a measure
		_ = v.serve.Process.Kill()
		<-v.served
	}
	v.serve = nil
}

// benchABRow is one row of the A/B table: a figure of --str (a) and of
// --str-b (b), next to bubblewrap's (ref, NaN = none).
type benchABRow struct {
	label   string
	unit    string // ms, MiB, inv/s
	a, b    float64
	ref     float64
	refName string // what ref is (bubblewrap's line)
}

// benchABTable is the A/B table: each row's two figures, their ratios to
// bubblewrap's and B/A.
func benchABTable(a, b string, rows []benchABRow) string {
	var s strings.Builder
	width := len("row") // the longest label's
	for _, r := range rows {
		width = max(width, len(r.label))
	}
	fmt.Fprintf(&s, "\nA/B: A = --str %s, B = --str-b %s (p50 unless said; same rounds, interleaved)\n", a, b)
	fmt.Fprintf(&s, "%-*s %12s %12s %8s %8s %7s  %s\n", width, "row", "A", "B", "A/bwrap", "B/bwrap", "B/A", "bwrap")
	val := func(v float64, unit string) string {
		if math.IsNaN(v) {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 2, 64) + " " + unit
	}
	ratio := func(x, y float64) string {
		if math.IsNaN(x) || math.IsNaN(y) || y <= 0 {
			return "n/a"
		}
		return strconv.FormatFloat(x/y, 'f', 2, 64) + "x"
	}
	for _, r := range rows {
		fmt.Fprintf(&s, "%-*s %12s %12s %8s %8s %7s  %s\n", width, r.label, val(r.a, r.unit), val(r.b, r.unit),
			ratio(r.a, r.ref), ratio(r.b, r.ref), ratio(r.b, r.a), r.refName)
	}
	s.WriteString("(B/A > 1: B slower, bigger, or for inv/s faster; bwrap: the figure each ratio is taken against)\n")
	return s.String()
}

// abRows are the A/B table's rows: each cell built for both binaries, by
// its --str id, from the report's figures (p50 and cpu of a cell in µs,
// tput in invocations per second, mem the Pss per sandbox in KiB; NaN
// where a cell did not run).
func (st *benchState) abRows(p50, cpu, tput, mem func(id string) float64) []benchABRow {
	a, b := st.strs[0], st.strs[1]
	var rows []benchABRow
	add := func(label, unit string, of func(string) float64, scale float64, id, ref, refName string) {
		rows = append(rows, benchABRow{label: label, unit: unit, a: of(a.id(id)) * scale, b: of(b.id(id)) * scale,
			ref: of(ref) * scale, refName: refName})
	}
	const ms, mib = 1e-3, 1.0 / 1024
	for _, t := range []struct{ id, name string }{{"true", "/bin/true"}, {"py", "python3 -c pass"}} {
		add(t.name+", str run restrictive", "ms", p50, ms, t.id+"/str-restrictive", t.id+"/bwrap-restrictive", "restrictive line")
		add(t.name+", str run restrictive, CPU", "ms", cpu, ms, t.id+"/str-restrictive", t.id+"/bwrap-restrictive", "restrictive line, CPU")
		add(t.name+", str run --serve (client)", "ms", p50, ms, t.id+"/str-serve", t.id+"/bwrap-restrictive", "restrictive line")
		add(t.name+", str run --serve, pool at rest", "ms", p50, ms, t.id+"/str-serve-rest", t.id+"/bwrap-restrictive", "restrictive line")
		// The client's CPU plus its str serve's per call (the sandbox and
		// the refill included); bubblewrap's own.
		servedCPU := func(id string) float64 {
			if strings.Contains(id, "/bwrap-") {
				return cpu(id)
			}
			return cpu(id) + benchMedian(st.serveCPU[id]) // NaN without the server's
		}
		add(t.name+", str run --serve, CPU client + str serve", "ms", servedCPU, ms, t.id+"/str-serve", t.id+"/bwrap-restrictive", "restrictive line, CPU")
	}
	const py = "standard line + python3 -c pass"
	add("echo_tool cold", "ms", p50, ms, "echo/cold", "py/bwrap-standard", py)
	add("echo_tool warm, back to back", "ms", p50, ms, "echo/warm", "py/bwrap-standard", py)
	add("echo_tool warm, pool ready", "ms", p50, ms, "echo/warm-ready", "py/bwrap-standard", py)
	add("echo_tool per-tool template", "ms", p50, ms, "echo/template", "py/bwrap-standard", py)
	echoCPU := func(id string) float64 {
		if v := st.echoCPU[id]; len(v) > 0 {
			return benchMedian(v)
		}
		return cpu(id) // bubblewrap's: its tree's
	}
	add("echo_tool cold, worker CPU per call", "ms", echoCPU, ms, "echo/cold", "py/bwrap-standard", py+", CPU")
	add("echo_tool warm, worker CPU per call", "ms", echoCPU, ms, "echo/warm", "py/bwrap-standard", py+", CPU")
	add("echo_tool per-tool template, worker CPU per call", "ms", echoCPU, ms, "echo/template", "py/bwrap-standard", py+", CPU")
	inFlight := fmt.Sprintf(", %d in flight", st.cfg.conc)
	add("echo_tool cold"+inFlight, "inv/s", tput, 1, "echo/cold", "tput/bwrap-standard-py", py+inFlight)
	add("echo_tool warm"+inFlight, "inv/s", tput, 1, "echo/warm", "tput/bwrap-standard-py", py+inFlight)
	add("echo_tool per-tool template"+inFlight, "inv/s", tput, 1, "echo/template", "tput/bwrap-standard-py", py+inFlight)
	add("Pss per sandbox, str run", "MiB", mem, mib, "str-run", "bwrap", "standard line")
	add("Pss per sandbox, str worker", "MiB", mem, mib, "worker", "bwrap", "standard line")
	return rows
}
