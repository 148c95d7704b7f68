package prom

import (
	"io"
	"math"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
)

func TestTextFormat(t *testing.T) {
	r := NewRegistry()
	c := NewCounter(Opts{Name: "b_total", Help: "A counter."})
	g := NewGauge(Opts{Name: "a_gauge", Help: "A gauge with a \\ backslash\nand a newline, \"quotes\" kept."})
	cv := NewCounterVec(Opts{Name: "c_total", Help: "Labelled."}, []string{"tool", "outcome"})
	gv := NewGaugeVec(Opts{Name: "d_size", Help: "Empty family, left out."}, []string{"tool"})
	h := NewHistogram(HistogramOpts{Name: "e_seconds", Help: "Plain histogram.", Buckets: []float64{.001, .5, 1, 300}})
	hv := NewHistogramVec(HistogramOpts{Name: "f_seconds", Help: "Labelled histogram.", Buckets: []float64{.01, 1}}, []string{"tool"})
	r.MustRegister(hv, h, gv, cv, g, c)

	c.Inc()
	c.Add(2.5)
	g.Set(7 << 30)
	g.Inc()
	g.Dec()
	g.Add(-0.5)
	cv.WithLabelValues("echo", "success").Inc()
	cv.WithLabelValues("echo", "CANCELLED").Add(2)
	cv.WithLabelValues("a\\b\"c\nd", "success").Inc()
	cv.WithLabelValues("", "x").Inc()
	gv.WithLabelValues("gone").Set(3)
	if !gv.DeleteLabelValues("gone") || gv.DeleteLabelValues("gone") {
		t.Fatal("DeleteLabelValues")
	}
	for _, v := range []float64{0.001, 0.002, 0.5, 2, 1000, math.Inf(1)} {
		h.Observe(v)
	}
	hv.WithLabelValues("z").Observe(0.5)
	hv.WithLabelValues("y").Observe(0.005)
	hv.WithLabelValues("y").Observe(0.25)

	want := `# HELP a_gauge A gauge with a \\ backslash\nand a newline, "quotes" kept.
# TYPE a_gauge gauge
a_gauge 7.5161927675e+09
# HELP b_total A counter.
# TYPE b_total counter
b_total 3.5
# HELP c_total Labelled.
# TYPE c_total counter
c_total{outcome="CANCELLED",tool="echo"} 2
c_total{outcome="success",tool="a\\b\"c\nd"} 1
c_total{outcome="success",tool="echo"} 1
c_total{outcome="x",tool=""} 1
# HELP e_seconds Plain histogram.
# TYPE e_seconds histogram
e_seconds_bucket{le="0.001"} 1
e_seconds_bucket{le="0.5"} 3
e_seconds_bucket{le="1"} 3
e_seconds_bucket{le="300"} 4
e_seconds_bucket{le="+Inf"} 6
e_seconds_sum +Inf
e_seconds_count 6
# HELP f_seconds Labelled histogram.
# TYPE f_seconds histogram
f_seconds_bucket{tool="y",le="0.01"} 1
f_seconds_bucket{tool="y",le="1"} 2
f_seconds_bucket{tool="y",le="+Inf"} 2
f_seconds_sum{tool="y"} 0.255
f_seconds_count{tool="y"} 2
f_seconds_bucket{tool="z",le="0.01"} 0
f_seconds_bucket{tool="z",le="1"} 1
f_seconds_bucket{tool="z",le="+Inf"} 1
f_seconds_sum{tool="z"} 0.5
f_seconds_count{tool="z"} 1
`
	if got := string(r.Text()); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestFormatFloat(t *testing.T) {
	for v, want := range map[float64]string{
		0: "0", 1: "1", -1: "-1", 0.001: "0.001", 1e-5: "1e-05", 300: "300", 1e21: "1e+21", 123456: "123456",
		math.Inf(1): "+Inf", math.Inf(-1): "-Inf", math.NaN(): "NaN",
	} {
		if got := formatFloat(v); got != want {
			t.Errorf("formatFloat(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestInvalidUTF8LabelValue(t *testing.T) {
	r := NewRegistry()
	cv := NewCounterVec(Opts{Name: "x_total", Help: "h"}, []string{"l"})
	r.MustRegister(cv)
	cv.WithLabelValues("a\xffb").Inc()
	if got := string(r.Text()); !strings.Contains(got, "x_total{l=\"a\uFFFDb\"} 1\n") {
		t.Fatalf("got:\n%s", got)
	}
}

func TestPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"negative counter add": func() { NewCounter(Opts{Name: "c"}).Add(-1) },
		"label count":          func() { NewCounterVec(Opts{Name: "c"}, []string{"a", "b"}).WithLabelValues("x") },
		"buckets":              func() { NewHistogram(HistogramOpts{Name: "h", Buckets: []float64{1, 1}}) },
		"duplicate": func() {
			r := NewRegistry()
			r.MustRegister(NewCounter(Opts{Name: "c"}), NewGauge(Opts{Name: "c"}))
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

func TestHandler(t *testing.T) {
	r := NewRegistry()
	c := NewCounter(Opts{Name: "x_total", Help: "h"})
	r.MustRegister(c)
	c.Inc()
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Fatalf("Content-Type %q", ct)
	}
	if b, _ := io.ReadAll(rec.Body); string(b) != "# HELP x_total h\n# TYPE x_total counter\nx_total 1\n" {
		t.Fatalf("body %q", b)
	}
}

// TestConcurrent updates from many goroutines while scraping (run with
// -race); the totals come out exact.
func TestConcurrent(t *testing.T) {
	r := NewRegistry()
	c := NewCounter(Opts{Name: "c_total", Help: "h"})
	g := NewGauge(Opts{Name: "g", Help: "h"})
	cv := NewCounterVec(Opts{Name: "cv_total", Help: "h"}, []string{"k"})
	gv := NewGaugeVec(Opts{Name: "gv", Help: "h"}, []string{"k"})
	hv := NewHistogramVec(HistogramOpts{Name: "hv", Help: "h", Buckets: []float64{1, 2}}, []string{"k"})
	r.MustRegister(c, g, cv, gv, hv, NewProcessCollector())
	const workers, n = 8, 2000
	var wg sync.WaitGroup
	stop := make(chan struct{})
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		for {
			select {
			case <-stop:
				return
			default:
				r.Text()
			}
		}
	}()
	for w := range workers {
		wg.Go(func() {
			k := strconv.Itoa(w % 3)
			for i := range n {
				c.Inc()
				g.Inc()
				g.Dec()
				cv.WithLabelValues(k).Add(0.5)
				gv.WithLabelValues(k).Add(1)
				hv.WithLabelValues(k).Observe(float64(i % 3))
				if i%100 == 0 {
					gv.DeleteLabelValues("never")
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-scraped
	le1 := 0 // observations <= 1 per worker
	for i := range n {
		if i%3 <= 1 {
			le1++
		}
	}
	text := string(r.Text())
	sum := func(re string) float64 {
		var s float64
		for _, m := range regexp.MustCompile(`(?m)^`+re+` (\S+)$`).FindAllStringSubmatch(text, -1) {
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			s += v
		}
		return s
	}
	for re, want := range map[string]float64{
		`c_total`:                    workers * n,
		`g`:                          0,
		`cv_total\{k="\d"\}`:         workers * n / 2,
		`gv\{k="\d"\}`:               workers * n,
		`hv_count\{k="\d"\}`:         workers * n,
		`hv_bucket\{k="\d",le="1"\}`: float64(workers * le1),
	} {
		if got := sum(re); got != want {
			t.Errorf("%s: %v, want %v\n%s", re, got, want, text)
		}
	}
}

func TestProcessCollector(t *testing.T) {
	r := NewRegistry()
	r.MustRegister(NewProcessCollector())
	text := string(r.Text())
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_max_fds", "process_open_fds",
		"process_resident_memory_bytes", "process_start_time_seconds", "process_virtual_memory_bytes"} {
		m := regexp.MustCompile(`(?m)^` + name + ` (\S+)$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("%s missing:\n%s", name, text)
			continue
		}
		if v, err := strconv.ParseFloat(m[1], 64); err != nil || (v <= 0 && name != "process_cpu_seconds_total") {
			t.Errorf("%s = %s", name, m[1])
		}
	}
	if !strings.Contains(text, "# TYPE process_cpu_seconds_total counter\n") {
		t.Errorf("process_cpu_seconds_total not a counter:\n%s", text)
	}
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses; fields 14, 15, 22, 23, 24
	// are 11, 12, 1000, 4096, 50.
	s := "123 (a b) c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 1000 4096 50 99\n"
	st, ok := parseStat(s)
	if !ok || st != (procStat{utime: 11, stime: 12, starttime: 1000, vsize: 4096, rss: 50}) {
		t.Fatalf("parseStat = %+v, %v", st, ok)
	}
	if _, ok := parseStat("123 (x) S 1 2"); ok {
		t.Fatal("short stat parsed")
	}
}

func BenchmarkWithLabelValuesInc(b *testing.B) {
	cv := NewCounterVec(Opts{Name: "c_total", Help: "h"}, []string{"tool", "outcome"})
	cv.WithLabelValues("echo", "success").Inc()
	b.ReportAllocs()
	for b.Loop() {
		cv.WithLabelValues("echo", "success").Inc()
	}
}

func BenchmarkHistogramObserve(b *testing.B) {
	hv := NewHistogramVec(HistogramOpts{Name: "h", Help: "h", Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}}, []string{"tool"})
	b.ReportAllocs()
	for b.Loop() {
		hv.WithLabelValues("echo").Observe(0.3)
	}
}
