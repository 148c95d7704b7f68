package proxy

import (
	"bytes"
	"github.com/securetoolruntime/str/egress"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
)

// BenchmarkConnectThroughput downloads 1 MB over HTTPS from a loopback
// server, directly and through the proxy (CONNECT), a new connection each
// time, so connect, TLS and the copy loop are all in the measurement.
func BenchmarkConnectThroughput(b *testing.B) {
	payload := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(payload)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ts := startSession(b, egress.Policy{Mode: egress.Restricted, AllowedPorts: []int{port}, AllowedCIDRs: []string{"127.0.0.1/32"}}, Options{Resolver: stubResolver{}})

	run := func(b *testing.B, proxy string) {
		tr := srv.Client().Transport.(*http.Transport).Clone()
		tr.DisableKeepAlives = true
		if proxy != "" {
			u := &url.URL{Scheme: "http", Host: proxy}
			tr.Proxy = http.ProxyURL(u)
		}
		defer tr.CloseIdleConnections()
		client := &http.Client{Transport: tr}
		b.SetBytes(int64(len(payload)))
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			resp, err := client.Get(srv.URL)
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || n != int64(len(payload)) {
				b.Fatalf("read %d bytes: %v", n, err)
			}
		}
	}
	b.Run("direct", func(b *testing.B) { run(b, "") })
	b.Run("proxy", func(b *testing.B) { run(b, ts.proxy) })
	if evs, _ := ts.Violations(); len(evs) != 0 {
		b.Fatalf("violations: %+v", evs)
	}
}
