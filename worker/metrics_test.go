package worker

import (
	"io"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// touchAll gives every metric a value (and the vectors a child each).
func touchAll(m *Metrics) {
	m.Invocations.WithLabelValues("echo", "success").Inc()
	m.Invocations.WithLabelValues("a\"b", "CANCELLED").Inc()
	m.ExecutionTime.WithLabelValues("echo").Observe(0.3)
	m.Timeouts.WithLabelValues("echo").Inc()
	m.Errors.WithLabelValues("RESOURCE_EXHAUSTED").Inc()
	m.startRunning()
	m.startRunning()
	m.stopRunning()
	m.Queued.Inc()
	m.SetupTime.Observe(0.004)
	m.StatusLines.Inc()
	m.StatusLost.Add(2)
	m.RepliesLost.Inc()
	m.BrokerReestablished.Inc()
	m.Faults.WithLabelValues("fault", "work_dir").Set(1)
	m.NetworkViolations.WithLabelValues("dns", "not_allowed").Add(3)
	m.WarmHits.WithLabelValues("echo").Inc()
	m.WarmMisses.WithLabelValues("echo").Inc()
	m.WarmDiscards.WithLabelValues("aged").Inc()
	m.WarmBuildFailures.WithLabelValues("echo").Inc()
	m.WarmRefill.Observe(2)
	m.WarmSize.WithLabelValues("echo").Set(2)
	m.WarmReady.WithLabelValues("echo").Set(1)
	m.WarmMemory.Set(2 << 30)
	m.TemplatesStarted.WithLabelValues("echo").Inc()
	m.TemplatesRetired.WithLabelValues("source_changed").Inc()
	m.TemplateCalls.WithLabelValues("echo").Add(5)
	m.TemplateFallbacks.WithLabelValues("not_eligible").Inc()
	m.TemplatesLive.Set(1)
	m.TemplateStartFailures.WithLabelValues("echo").Inc()
}

// TestMetricsText pins the names, help texts, labels and buckets of the
// worker's metrics: testdata/metrics.txt is what client_golang printed for
// them (before internal/prom replaced it), the Go and process metrics
// left out.
func TestMetricsText(t *testing.T) {
	m := NewMetrics()
	touchAll(m)
	hs := httptest.NewServer((&Server{metrics: m}).Handler())
	defer hs.Close()
	resp, err := hs.Client().Get(hs.URL + "/metrics")
	must(t, err)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/plain; version=0.0.4; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	b, err := io.ReadAll(resp.Body)
	must(t, err)
	var got, rest []string
	for l := range strings.Lines(string(b)) {
		name := strings.TrimPrefix(strings.TrimPrefix(l, "# HELP "), "# TYPE ")
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			rest = append(rest, l)
		} else {
			got = append(got, l)
		}
	}
	want, err := os.ReadFile("testdata/metrics.txt")
	must(t, err)
	if strings.Join(got, "") != string(want) {
		t.Errorf("/metrics:\n%s\nwant:\n%s", strings.Join(got, ""), want)
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_open_fds", "process_resident_memory_bytes", "process_start_time_seconds"} {
		if !strings.Contains(strings.Join(rest, ""), "\n"+name+" ") {
			t.Errorf("no %s in:\n%s", name, strings.Join(rest, ""))
		}
	}
}
