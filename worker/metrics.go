package worker

import (
	"crypto/subtle"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/internal/prom"
	"github.com/securetoolruntime/str/launcher/pool"
)

// Metrics are the worker's Prometheus metrics, in their own registry.
type Metrics struct {
	Registry *prom.Registry

	Invocations   *prom.CounterVec   // str_worker_invocations_total{tool,outcome}
	ExecutionTime *prom.HistogramVec // str_worker_execution_seconds{tool}
	Timeouts      *prom.CounterVec   // str_worker_timeouts_total{tool}
	Errors        *prom.CounterVec   // str_worker_errors_total{code}
	Running       *prom.Gauge        // str_worker_running_executions
	RunningMax    *prom.Gauge        // str_worker_running_executions_max
	Queued        *prom.Gauge        // str_worker_queued_executions
	SetupTime     *prom.Histogram    // str_worker_sandbox_setup_seconds: the launcher's figure (observeSetupTime)
	StatusLines   *prom.Counter      // str_worker_status_lines_total
	// StatusLost counts status lines never published: the first failed
	// publish of a task ends its status publishing (status.go).
	StatusLost *prom.Counter // str_worker_status_lines_lost_total
	// RepliesLost counts invocations whose agent got no reply at all.
	RepliesLost *prom.Counter // str_worker_replies_lost_total
	// Faults is 1 while the worker has the fault or degradation name
	// (readiness.go), else 0: an alert needs no JSON parsing of /readyz.
	Faults *prom.GaugeVec // str_worker_faults{kind,name}
	// BrokerReestablished counts broker sessions re-established because
	// the liveness probe did not come back (probe.go).
	BrokerReestablished *prom.Counter // str_worker_broker_reestablished_total
	// NetworkViolations counts the network policy's denials.
	NetworkViolations *prom.CounterVec // str_worker_network_violations_total{kind,reason}

	// The warm pool (pool.go), fed by launcher/pool's counts
	// (warmMetrics).
	WarmHits          *prom.CounterVec // str_worker_warm_hits_total{tool}
	WarmMisses        *prom.CounterVec // str_worker_warm_misses_total{tool}
	WarmDiscards      *prom.CounterVec // str_worker_warm_discarded_total{reason}
	WarmBuildFailures *prom.CounterVec // str_worker_warm_build_failures_total{tool}
	WarmRefill        *prom.Histogram  // str_worker_warm_refill_seconds
	WarmSize          *prom.GaugeVec   // str_worker_warm_pool_size{tool}
	WarmReady         *prom.GaugeVec   // str_worker_warm_pool_ready{tool}
	WarmMemory        *prom.Gauge      // str_worker_warm_memory_bytes

	// Per-tool templates (template.go).
	TemplatesStarted  *prom.CounterVec // str_worker_templates_started_total{tool}
	TemplatesRetired  *prom.CounterVec // str_worker_templates_retired_total{reason}
	TemplateCalls     *prom.CounterVec // str_worker_template_calls_total{tool}
	TemplateFallbacks *prom.CounterVec // str_worker_template_fallbacks_total{reason}
	TemplatesLive     *prom.Gauge      // str_worker_templates_live
	// TemplateStartFailures counts failed template starts (each sets the
	// tool's back-off; its calls run cold meanwhile).
	TemplateStartFailures *prom.CounterVec // str_worker_template_start_failures_total{tool}

	mu         sync.Mutex
	running    int
	runningMax int
}

// NewMetrics creates the metrics in a fresh registry (plus a few Go and
// process metrics: goroutines, CPU, memory, file descriptors, start time).
func NewMetrics() *Metrics {
	r := prom.NewRegistry()
	m := &Metrics{
		Registry: r,
		Invocations: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_invocations_total",
			Help: "Invocations answered, by tool and outcome (success, timeout, the error code, or reply_failed when the reply could not be published).",
		}, []string{"tool", "outcome"}),
		ExecutionTime: prom.NewHistogramVec(prom.HistogramOpts{
			Name:    "str_worker_execution_seconds",
			Help:    "Time from receipt (queueing included) to the tool's exit.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"tool"}),
		Timeouts: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_timeouts_total", Help: "Executions that hit their timeout.",
		}, []string{"tool"}),
		Errors: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_errors_total", Help: "Error replies by code.",
		}, []string{"code"}),
		Running: prom.NewGauge(prom.Opts{
			Name: "str_worker_running_executions", Help: "Executions running now.",
		}),
		RunningMax: prom.NewGauge(prom.Opts{
			Name: "str_worker_running_executions_max", Help: "Highest number of executions running at once since start.",
		}),
		Queued: prom.NewGauge(prom.Opts{
			Name: "str_worker_queued_executions", Help: "Executions waiting for a slot.",
		}),
		SetupTime: prom.NewHistogram(prom.HistogramOpts{
			Name:    "str_worker_sandbox_setup_seconds",
			Help:    "Sandbox setup time of cold calls, as the launcher measured it (its phases before the run and the init's).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		StatusLines: prom.NewCounter(prom.Opts{
			Name: "str_worker_status_lines_total", Help: "Status lines relayed from tools.",
		}),
		StatusLost: prom.NewCounter(prom.Opts{
			Name: "str_worker_status_lines_lost_total",
			Help: "Status lines not published because the broker could not take them: a task's first failed status publish ends its status publishing, that line and every later one count here.",
		}),
		RepliesLost: prom.NewCounter(prom.Opts{
			Name: "str_worker_replies_lost_total",
			Help: "Replies that never reached the broker (unreachable until the task's deadline or the end of the shutdown's reply window, or refused together with the error reply replacing it): the agent got no answer. Each also counts in str_worker_invocations_total with outcome reply_failed.",
		}),
		Faults: prom.NewGaugeVec(prom.Opts{
			Name: "str_worker_faults",
			Help: "1 while the worker has this fault (kind fault: /readyz answers 503) or degradation (kind degraded: it serves, /readyz 200), else 0; /readyz has the error seen.",
		}, []string{"kind", "name"}),
		BrokerReestablished: prom.NewCounter(prom.Opts{
			Name: "str_worker_broker_reestablished_total",
			Help: "Broker sessions the worker re-established because its probe message did not come back through its own subscription within STR_BROKER_PROBE_TIMEOUT_MS (the broker looked connected but no longer delivered).",
		}),
		NetworkViolations: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_network_violations_total", Help: "Connections and DNS lookups the network policy denied, by kind (net, dns) and reason.",
		}, []string{"kind", "reason"}),
		WarmHits: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_warm_hits_total", Help: "Executions served by a pre-started sandbox of the warm pool.",
		}, []string{"tool"}),
		WarmMisses: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_warm_misses_total", Help: "Executions of a tool with a warm pool that found none usable and started a sandbox (cold).",
		}, []string{"tool"}),
		WarmDiscards: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_warm_discarded_total", Help: "Pooled sandboxes destroyed unused, by reason (aged, code_changed, died, drained).",
		}, []string{"reason"}),
		WarmBuildFailures: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_warm_build_failures_total", Help: "Pooled sandboxes that could not be made, by tool: the tool's next one waits a back-off of 1 s doubling to 60 s.",
		}, []string{"tool"}),
		WarmRefill: prom.NewHistogram(prom.HistogramOpts{
			Name:    "str_worker_warm_refill_seconds",
			Help:    "Time from creating a pooled sandbox to its runner being ready (tool module imported, waiting for a call).",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		WarmSize: prom.NewGaugeVec(prom.Opts{
			Name: "str_worker_warm_pool_size", Help: "Pre-started sandboxes waiting in the pool, by tool.",
		}, []string{"tool"}),
		WarmReady: prom.NewGaugeVec(prom.Opts{
			Name: "str_worker_warm_pool_ready", Help: "Pre-started sandboxes waiting in the pool whose runner is ready (tool module imported), by tool.",
		}, []string{"tool"}),
		WarmMemory: prom.NewGauge(prom.Opts{
			Name: "str_worker_warm_memory_bytes", Help: "Memory the pool holds, each pooled sandbox counted at its profile's memory limit (the budget is STR_WARM_MEMORY).",
		}),
		TemplatesStarted: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_templates_started_total", Help: "Per-tool templates started (warm: template), by tool.",
		}, []string{"tool"}),
		TemplatesRetired: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_templates_retired_total",
			Help: "Per-tool templates replaced or ended, by reason: " + templateRetireReasons + ".",
		}, []string{"reason"}),
		TemplateCalls: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_template_calls_total", Help: "Executions served by a per-tool template (each forked into namespaces of its own), by tool.",
		}, []string{"tool"}),
		TemplateFallbacks: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_template_fallbacks_total",
			Help: "Executions of a warm: template tool that ran in a sandbox of their own instead, by reason: " + templateFallbackReasons + ".",
		}, []string{"reason"}),
		TemplatesLive: prom.NewGauge(prom.Opts{
			Name: "str_worker_templates_live", Help: "Per-tool templates the worker holds now (one per tool and profile).",
		}),
		TemplateStartFailures: prom.NewCounterVec(prom.Opts{
			Name: "str_worker_template_start_failures_total",
			Help: "Per-tool template starts that failed (the import failed or did not say ready within STR_TEMPLATE_START_TIMEOUT_SECONDS, the launcher refused the template), by tool: the next start waits a back-off of 1 s doubling to 60 s; the tool's calls run cold meanwhile.",
		}, []string{"tool"}),
	}
	r.MustRegister(m.Invocations, m.ExecutionTime, m.Timeouts, m.Errors, m.Running, m.RunningMax,
		m.Queued, m.SetupTime, m.StatusLines, m.StatusLost, m.RepliesLost, m.Faults, m.BrokerReestablished, m.NetworkViolations,
		m.WarmHits, m.WarmMisses, m.WarmDiscards, m.WarmBuildFailures, m.WarmRefill, m.WarmSize, m.WarmReady, m.WarmMemory,
		m.TemplatesStarted, m.TemplatesRetired, m.TemplateCalls, m.TemplateFallbacks, m.TemplatesLive, m.TemplateStartFailures,
		prom.NewProcessCollector())
	return m
}

// startRunning and stopRunning maintain Running and RunningMax together.
func (m *Metrics) startRunning() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running++
	if m.running > m.runningMax {
		m.runningMax = m.running
		m.RunningMax.Set(float64(m.runningMax))
	}
	m.Running.Set(float64(m.running))
}

func (m *Metrics) stopRunning() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running--
	m.Running.Set(float64(m.running))
}

type healthBody struct {
	OK bool `json:"ok"`
	// Broker is "connected", "disconnected", or "deaf": connected, but
	// the worker's probe message did not come back (probe.go), so the
	// session is being re-established; /readyz answers 503 meanwhile.
	Broker string `json:"broker"`
	// Faults (/readyz only) maps each resource the worker cannot use to
	// the error seen (artifact_store, artifact_audit_log, work_dir; see
	// readiness.go); any fault makes /readyz 503. Omitted when none.
	Faults map[string]string `json:"faults,omitempty"`
	// Degraded (/readyz only) maps each degradation to why (manifest: the
	// file is missing or invalid, the last good manifest serves); /readyz
	// stays 200. Omitted when none.
	Degraded map[string]string `json:"degraded,omitempty"`
	// UnavailableTools (/readyz only) maps each manifest entry that cannot
	// work on this worker to why (the entry failed the manifest's checks,
	// module missing or unreadable by the sandbox, unknown profile);
	// omitted when there is none.
	UnavailableTools map[string]string `json:"unavailable_tools,omitempty"`
}

// Handler serves /healthz (the process is alive: always 200 unless the
// worker has stopped), /readyz (200 only while connected to the broker,
// taking work and without a fault, else 503; the body names the faults,
// the degradations and the tools that cannot work, checked when asked)
// and, unless METRICS_ADDR gives it a listener of its own, /metrics. A
// tool that cannot work does not make the worker unready: its other tools
// still serve; nor does a degradation (a broken manifest file: the last
// good one serves). A fault does: a resource every call of some kind
// needs (the work dir, the artifact store or its audit log) is unusable.
//
// What the health endpoints tell whoever reaches them (HEALTH_DETAIL):
// with detail off, /readyz names the faults, degradations and tools but
// not the errors (which carry host paths and a tool's import errors).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	cfg := s.cfg
	if cfg == nil { // a bare Server (tests): the defaults
		cfg = &Config{}
	}
	detail := healthDetail(cfg)
	write := func(w http.ResponseWriter, ok bool, body healthBody) {
		w.Header().Set("Content-Type", "application/json")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		body.OK, body.Broker = ok, s.brokerState()
		if !detail {
			body.Faults, body.Degraded, body.UnavailableTools = hideReasons(body.Faults), hideReasons(body.Degraded), hideReasons(body.UnavailableTools)
		}
		json.NewEncoder(w).Encode(body)
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		write(w, !s.stopped.Load(), healthBody{})
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		s.mu.RLock()
		m := s.manifest
		s.mu.RUnlock()
		bad := s.unavailableTools(m)
		if len(bad) == 0 {
			bad = nil
		}
		if s.serving.Load() {
			s.checkResources(resourceCheckMinAge)
		}
		faults, degraded := s.ready.snapshot()
		write(w, s.Ready() && len(faults) == 0, healthBody{Faults: faults, Degraded: degraded, UnavailableTools: bad})
	})
	if cfg.MetricsAddr == "" {
		mux.Handle("/metrics", metricsHandler(s.metrics, cfg.MetricsToken))
	}
	return mux
}

// hiddenReason replaces an error on /healthz and /readyz when
// HEALTH_DETAIL keeps them minimal.
const hiddenReason = "see the worker's log (HEALTH_DETAIL)"

func hideReasons(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k := range m {
		out[k] = hiddenReason
	}
	return out
}

// healthDetail says whether the health endpoints carry errors
// (HEALTH_DETAIL): full yes, minimal no, auto only when the health
// server listens on a loopback address (only this host reaches it).
func healthDetail(cfg *Config) bool {
	switch cfg.HealthDetail {
	case "full":
		return true
	case "minimal":
		return false
	}
	if cfg.HealthAddr == "localhost" || cfg.HealthAddr == "" { // "": a Config not from LoadConfig, default 127.0.0.1
		return true
	}
	ip := net.ParseIP(cfg.HealthAddr)
	return ip != nil && ip.IsLoopback()
}

// MetricsHandler serves /metrics: on the health server, or on
// METRICS_ADDR's listener of its own. With METRICS_TOKEN set a request
// must carry "Authorization: Bearer <token>" (compared in constant
// time); any other is 401 and sees nothing.
func (s *Server) MetricsHandler() http.Handler {
	return metricsHandler(s.metrics, s.cfg.MetricsToken)
}

func metricsHandler(m *Metrics, token string) http.Handler {
	reg := m.Registry
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="str metrics"`)
				http.Error(w, "metrics need a bearer token (METRICS_TOKEN)", http.StatusUnauthorized)
				return
			}
		}
		reg.ServeHTTP(w, r)
	})
}

// warmMetrics feeds the warm pool's metrics from launcher/pool's counts
// (pool.Metrics): a set's name is its tool.
type warmMetrics struct{ m *Metrics }

func (w warmMetrics) Hit(tool string)         { w.m.WarmHits.WithLabelValues(tool).Inc() }
func (w warmMetrics) Miss(tool string)        { w.m.WarmMisses.WithLabelValues(tool).Inc() }
func (w warmMetrics) BuildFailed(tool string) { w.m.WarmBuildFailures.WithLabelValues(tool).Inc() }
func (w warmMetrics) Built(_ string, d time.Duration) {
	w.m.WarmRefill.Observe(d.Seconds())
}
func (w warmMetrics) Retired(_ string, r pool.Reason) {
	w.m.WarmDiscards.WithLabelValues(string(r)).Inc()
}
func (w warmMetrics) Idle(tool string, idle, ready int) {
	w.m.WarmSize.WithLabelValues(tool).Set(float64(idle))
	w.m.WarmReady.WithLabelValues(tool).Set(float64(ready))
}
func (w warmMetrics) Gone(tool string) {
	w.m.WarmSize.DeleteLabelValues(tool)
	w.m.WarmReady.DeleteLabelValues(tool)
}
func (w warmMetrics) Held(bytes int64) { w.m.WarmMemory.Set(float64(bytes)) }
