package worker

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// TestHealthDetail: on a non-loopback HEALTH_ADDR /readyz names the tools
// that cannot work but not why (the reasons carry host paths and a
// tool's import errors) unless HEALTH_DETAIL=full; on loopback (and with
// full) it gives the reasons.
func TestHealthDetail(t *testing.T) {
	for _, c := range []struct {
		addr, detail string
		shown        bool
	}{{"0.0.0.0", "auto", false}, {"::", "auto", false}, {"10.1.2.3", "auto", false}, {"127.0.0.1", "auto", true},
		{"0.0.0.0", "full", true}, {"127.0.0.1", "minimal", false}} {
		h := newHarness(t, func(cfg *Config) { cfg.HealthAddr, cfg.HealthDetail = c.addr, c.detail })
		must(t, os.WriteFile(h.cfg.ManifestPath, []byte(testManifest+"  ghost: {module: nosuchmodule, function: f}\n"), 0o644))
		h.start()
		hs := httptest.NewServer(h.srv.Handler())
		resp, err := hs.Client().Get(hs.URL + "/readyz")
		must(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		hs.Close()
		_, body := readyz(t, h)
		reason, listed := body.Unavailable["ghost"]
		switch {
		case !listed:
			t.Errorf("%s %s: ghost not listed: %s", c.addr, c.detail, raw)
		case c.shown && !strings.Contains(reason, "nosuchmodule"):
			t.Errorf("%s %s: reason %q, want it shown", c.addr, c.detail, reason)
		case !c.shown && (reason != hiddenReason || strings.Contains(string(raw), h.dir) || strings.Contains(string(raw), "nosuchmodule")):
			t.Errorf("%s %s: /readyz %s, want no reason or path", c.addr, c.detail, raw)
		}
		h.stop()
	}
}

// TestMetricsAccess: METRICS_TOKEN makes /metrics answer only the bearer
// of the token; METRICS_ADDR moves /metrics off the health server (to
// MetricsHandler's listener), and /healthz stays open there.
func TestMetricsAccess(t *testing.T) {
	get := func(h http.Handler, path, auth string) (int, string) {
		hs := httptest.NewServer(h)
		defer hs.Close()
		req, _ := http.NewRequest("GET", hs.URL+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hs.Client().Do(req)
		must(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	h := newHarness(t, func(cfg *Config) { cfg.MetricsToken = "s3cret-token" })
	for _, auth := range []string{"", "Bearer wrong", "Bearer s3cret-tokenX", "Basic s3cret-token", "s3cret-token"} {
		if code, body := get(h.srv.Handler(), "/metrics", auth); code != http.StatusUnauthorized || strings.Contains(body, "str_worker") {
			t.Errorf("/metrics with %q: %d %.100s, want 401 and nothing", auth, code, body)
		}
	}
	if code, body := get(h.srv.Handler(), "/metrics", "Bearer s3cret-token"); code != http.StatusOK || !strings.Contains(body, "str_worker_") {
		t.Errorf("/metrics with the token: %d %.100s", code, body)
	}
	if code, _ := get(h.srv.Handler(), "/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz needs no token: %d", code)
	}

	h = newHarness(t, func(cfg *Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	if code, body := get(h.srv.Handler(), "/metrics", ""); code != http.StatusNotFound || strings.Contains(body, "str_worker") {
		t.Errorf("/metrics on the health server with METRICS_ADDR set: %d %.100s, want 404", code, body)
	}
	if code, body := get(h.srv.MetricsHandler(), "/metrics", ""); code != http.StatusOK || !strings.Contains(body, "str_worker_") {
		t.Errorf("MetricsHandler: %d %.100s", code, body)
	}
}
