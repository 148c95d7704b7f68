// Package prom is the small part of a Prometheus client the worker needs:
// counters, gauges and histograms (plain or with labels), a registry that
// renders the text exposition format 0.0.4, and its http.Handler. It
// replaces github.com/prometheus/client_golang, whose package init()s and
// size every `str run` paid for.
//
// The output is what client_golang printed for the same metrics: families
// sorted by name, each with # HELP and # TYPE (a labelled family with no
// child yet is left out); label pairs in label-name order (a histogram's le
// last); children sorted by their label values in that order; values
// formatted with strconv 'g' (shortest), +Inf, -Inf and NaN.
//
// Updates are lock-free (atomics); WithLabelValues takes a read lock and
// does not allocate once the child exists.
package prom

import (
	"bytes"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// ContentType is the text exposition format's.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Opts names a metric and says what it measures.
type Opts struct {
	Name, Help string
}

// HistogramOpts adds a histogram's bucket upper bounds (increasing; +Inf
// is implied).
type HistogramOpts struct {
	Name, Help string
	Buckets    []float64
}

// Collector is a metric (or a set of them) a Registry renders.
type Collector interface {
	// collect appends its families to g.
	collect(g *gathering)
}

// Registry holds collectors and renders them.
type Registry struct {
	mu    sync.Mutex
	cs    []Collector
	names map[string]bool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{names: map[string]bool{}} }

// MustRegister adds collectors; it panics on a name registered twice.
func (r *Registry) MustRegister(cs ...Collector) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		if n, ok := c.(interface{ familyName() string }); ok {
			if r.names[n.familyName()] {
				panic("prom: metric " + n.familyName() + " registered twice")
			}
			r.names[n.familyName()] = true
		}
		r.cs = append(r.cs, c)
	}
}

// Text renders every registered metric in the text format.
func (r *Registry) Text() []byte {
	r.mu.Lock()
	cs := slices.Clone(r.cs)
	r.mu.Unlock()
	var g gathering
	for _, c := range cs {
		c.collect(&g)
	}
	sort.SliceStable(g.fams, func(i, j int) bool { return g.fams[i].name < g.fams[j].name })
	out := make([]byte, 0, g.buf.Len())
	for _, f := range g.fams {
		out = append(out, g.buf.Bytes()[f.start:f.end]...)
	}
	return out
}

// ServeHTTP serves Text.
func (r *Registry) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	b := r.Text()
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

// gathering is one rendering: every family's text in buf, in collection
// order, and where each is (Text sorts them by name).
type gathering struct {
	buf  bytes.Buffer
	fams []span
}

type span struct {
	name       string
	start, end int
}

// family writes a family's header, lets body write its samples and
// records it.
func (g *gathering) family(name, help, typ string, body func(b *bytes.Buffer)) {
	start := g.buf.Len()
	b := &g.buf
	b.WriteString("# HELP ")
	b.WriteString(name)
	b.WriteByte(' ')
	writeEscaped(b, help, false)
	b.WriteString("\n# TYPE ")
	b.WriteString(name)
	b.WriteByte(' ')
	b.WriteString(typ)
	b.WriteByte('\n')
	body(b)
	g.fams = append(g.fams, span{name, start, g.buf.Len()})
}

// writeSample writes `name{labels,extra} value`; labels is rendered label
// pairs ("" for none), extra one more pair ("" for none).
func writeSample(b *bytes.Buffer, name, suffix, labels, extra string, v float64) {
	b.WriteString(name)
	b.WriteString(suffix)
	if labels != "" || extra != "" {
		b.WriteByte('{')
		b.WriteString(labels)
		if labels != "" && extra != "" {
			b.WriteByte(',')
		}
		b.WriteString(extra)
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(formatFloat(v))
	b.WriteByte('\n')
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, +1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// writeEscaped writes s escaping backslash and newline, and double quote
// too for a label value; invalid UTF-8 becomes U+FFFD.
func writeEscaped(b *bytes.Buffer, s string, quote bool) {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\n':
			b.WriteString(`\n`)
		case c == '"' && quote:
			b.WriteString(`\"`)
		default:
			b.WriteByte(c)
		}
	}
}

// atomicFloat is a float64 updated atomically.
type atomicFloat struct{ bits atomic.Uint64 }

func (f *atomicFloat) load() float64   { return math.Float64frombits(f.bits.Load()) }
func (f *atomicFloat) store(v float64) { f.bits.Store(math.Float64bits(v)) }
func (f *atomicFloat) add(v float64) {
	for {
		old := f.bits.Load()
		if f.bits.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+v)) {
			return
		}
	}
}

// sampler is one metric's value(s): a plain metric or a labelled child.
type sampler interface {
	writeSamples(b *bytes.Buffer, name, labels string)
}

// Counter only goes up.
type Counter struct {
	opts Opts
	v    atomicFloat
}

// NewCounter returns a counter.
func NewCounter(o Opts) *Counter { return &Counter{opts: o} }

// Inc adds 1.
func (c *Counter) Inc() { c.v.add(1) }

// Add adds v, which must not be negative.
func (c *Counter) Add(v float64) {
	if v < 0 {
		panic("prom: counter " + c.opts.Name + " cannot decrease")
	}
	c.v.add(v)
}

func (c *Counter) writeSamples(b *bytes.Buffer, name, labels string) {
	writeSample(b, name, "", labels, "", c.v.load())
}
func (c *Counter) familyName() string { return c.opts.Name }
func (c *Counter) collect(g *gathering) {
	g.family(c.opts.Name, c.opts.Help, "counter", func(b *bytes.Buffer) { c.writeSamples(b, c.opts.Name, "") })
}

// Gauge goes up and down.
type Gauge struct {
	opts Opts
	v    atomicFloat
}

// NewGauge returns a gauge.
func NewGauge(o Opts) *Gauge { return &Gauge{opts: o} }

// Set sets the gauge to v.
func (g *Gauge) Set(v float64) { g.v.store(v) }

// Add adds v (which may be negative).
func (g *Gauge) Add(v float64) { g.v.add(v) }

// Inc adds 1.
func (g *Gauge) Inc() { g.v.add(1) }

// Dec subtracts 1.
func (g *Gauge) Dec() { g.v.add(-1) }

func (g *Gauge) writeSamples(b *bytes.Buffer, name, labels string) {
	writeSample(b, name, "", labels, "", g.v.load())
}
func (g *Gauge) familyName() string { return g.opts.Name }
func (g *Gauge) collect(gg *gathering) {
	gg.family(g.opts.Name, g.opts.Help, "gauge", func(b *bytes.Buffer) { g.writeSamples(b, g.opts.Name, "") })
}

// Histogram counts observations into cumulative buckets.
type Histogram struct {
	opts   HistogramOpts
	le     []string        // the bounds rendered as le="..." pairs, +Inf last
	counts []atomic.Uint64 // per bucket, not cumulative; the last is +Inf
	sum    atomicFloat
}

// NewHistogram returns a histogram; it panics unless the buckets increase.
func NewHistogram(o HistogramOpts) *Histogram {
	for i := 1; i < len(o.Buckets); i++ {
		if !(o.Buckets[i] > o.Buckets[i-1]) {
			panic("prom: histogram " + o.Name + ": buckets not increasing")
		}
	}
	if n := len(o.Buckets); n > 0 && math.IsInf(o.Buckets[n-1], +1) {
		o.Buckets = o.Buckets[:n-1]
	}
	h := &Histogram{opts: o, counts: make([]atomic.Uint64, len(o.Buckets)+1)}
	for _, ub := range o.Buckets {
		h.le = append(h.le, `le="`+formatFloat(ub)+`"`)
	}
	h.le = append(h.le, `le="+Inf"`)
	return h
}

// Observe adds v: to the first bucket whose bound is at least v.
func (h *Histogram) Observe(v float64) {
	i := sort.SearchFloat64s(h.opts.Buckets, v)
	h.counts[i].Add(1)
	h.sum.add(v)
}

// writeSamples writes the buckets, _sum and _count; _count is the +Inf
// bucket's count, so the two always agree.
func (h *Histogram) writeSamples(b *bytes.Buffer, name, labels string) {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
		writeSample(b, name, "_bucket", labels, h.le[i], float64(n))
	}
	writeSample(b, name, "_sum", labels, "", h.sum.load())
	writeSample(b, name, "_count", labels, "", float64(n))
}
func (h *Histogram) familyName() string { return h.opts.Name }
func (h *Histogram) collect(g *gathering) {
	g.family(h.opts.Name, h.opts.Help, "histogram", func(b *bytes.Buffer) { h.writeSamples(b, h.opts.Name, "") })
}

// vec is a labelled family of M.
type vec[M sampler] struct {
	name, help, typ string
	labels          []string // as declared
	order           []int    // label indexes in label-name order
	newM            func() M

	mu       sync.RWMutex
	children map[string]*child[M] // by key(values)
}

type child[M sampler] struct {
	sortKey []string // values in label-name order
	labels  string   // rendered pairs
	m       M
}

func newVec[M sampler](name, help, typ string, labels []string, newM func() M) *vec[M] {
	v := &vec[M]{name: name, help: help, typ: typ, labels: slices.Clone(labels), newM: newM, children: map[string]*child[M]{}}
	for i := range labels {
		v.order = append(v.order, i)
	}
	sort.SliceStable(v.order, func(i, j int) bool { return labels[v.order[i]] < labels[v.order[j]] })
	return v
}

// withLabelValues returns the child for the values (in declaration
// order), creating it the first time.
func (v *vec[M]) withLabelValues(values []string) M {
	if len(values) != len(v.labels) {
		panic("prom: " + v.name + ": " + strconv.Itoa(len(values)) + " label values for " + strconv.Itoa(len(v.labels)) + " labels")
	}
	var kb [128]byte
	k := appendKey(kb[:0], values)
	v.mu.RLock()
	c := v.children[string(k)]
	v.mu.RUnlock()
	if c != nil {
		return c.m
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if c = v.children[string(k)]; c == nil {
		c = &child[M]{m: v.newM()}
		var b bytes.Buffer
		for n, i := range v.order {
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteString(v.labels[i])
			b.WriteString(`="`)
			writeEscaped(&b, values[i], true)
			b.WriteByte('"')
			c.sortKey = append(c.sortKey, values[i])
		}
		c.labels = b.String()
		v.children[string(k)] = c
	}
	return c.m
}

// deleteLabelValues removes the child for the values; false if there was
// none.
func (v *vec[M]) deleteLabelValues(values []string) bool {
	if len(values) != len(v.labels) {
		return false
	}
	k := string(appendKey(nil, values))
	v.mu.Lock()
	defer v.mu.Unlock()
	_, ok := v.children[k]
	delete(v.children, k)
	return ok
}

// appendKey joins the values with 0xff, a byte no UTF-8 text holds.
func appendKey(b []byte, values []string) []byte {
	for _, s := range values {
		b = append(b, s...)
		b = append(b, 0xff)
	}
	return b
}

func (v *vec[M]) familyName() string { return v.name }

func (v *vec[M]) collect(g *gathering) {
	v.mu.RLock()
	cs := make([]*child[M], 0, len(v.children))
	for _, c := range v.children {
		cs = append(cs, c)
	}
	v.mu.RUnlock()
	if len(cs) == 0 {
		return
	}
	slices.SortFunc(cs, func(a, b *child[M]) int { return slices.Compare(a.sortKey, b.sortKey) })
	g.family(v.name, v.help, v.typ, func(b *bytes.Buffer) {
		for _, c := range cs {
			c.m.writeSamples(b, v.name, c.labels)
		}
	})
}

// CounterVec is a labelled family of counters.
type CounterVec struct{ *vec[*Counter] }

// NewCounterVec returns a counter family with the labels.
func NewCounterVec(o Opts, labels []string) *CounterVec {
	return &CounterVec{newVec(o.Name, o.Help, "counter", labels, func() *Counter { return NewCounter(o) })}
}

// WithLabelValues is the counter for the label values (in the order the
// labels were given).
func (v *CounterVec) WithLabelValues(values ...string) *Counter { return v.withLabelValues(values) }

// DeleteLabelValues removes the counter for the label values.
func (v *CounterVec) DeleteLabelValues(values ...string) bool { return v.deleteLabelValues(values) }

// GaugeVec is a labelled family of gauges.
type GaugeVec struct{ *vec[*Gauge] }

// NewGaugeVec returns a gauge family with the labels.
func NewGaugeVec(o Opts, labels []string) *GaugeVec {
	return &GaugeVec{newVec(o.Name, o.Help, "gauge", labels, func() *Gauge { return NewGauge(o) })}
}

// WithLabelValues is the gauge for the label values.
func (v *GaugeVec) WithLabelValues(values ...string) *Gauge { return v.withLabelValues(values) }

// DeleteLabelValues removes the gauge for the label values.
func (v *GaugeVec) DeleteLabelValues(values ...string) bool { return v.deleteLabelValues(values) }

// HistogramVec is a labelled family of histograms.
type HistogramVec struct{ *vec[*Histogram] }

// NewHistogramVec returns a histogram family with the labels.
func NewHistogramVec(o HistogramOpts, labels []string) *HistogramVec {
	proto := NewHistogram(o) // checks the buckets now; its children share its bounds
	return &HistogramVec{newVec(o.Name, o.Help, "histogram", labels, func() *Histogram {
		return &Histogram{opts: proto.opts, le: proto.le, counts: make([]atomic.Uint64, len(proto.counts))}
	})}
}

// WithLabelValues is the histogram for the label values.
func (v *HistogramVec) WithLabelValues(values ...string) *Histogram { return v.withLabelValues(values) }

// DeleteLabelValues removes the histogram for the label values.
func (v *HistogramVec) DeleteLabelValues(values ...string) bool { return v.deleteLabelValues(values) }
