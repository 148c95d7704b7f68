package egress

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"
)

// BenchmarkTerminated compares a terminated connection (the proxy holds a
// credential for api.test) with a direct one to the same loopback HTTPS
// server, in the same run. Read the ratios, not the absolute figures:
//
//	reused:    a small GET on a kept-alive connection (p50-µs reported)
//	handshake: a new connection per GET (leaf certificate cached)
//	download:  1 MiB on a kept-alive connection
//	memory:    heap and stacks per open, idle terminated connection,
//	           minus the same for direct connections (so the proxy's
//	           share), and the same for today's tunnel for comparison
func BenchmarkTerminated(b *testing.B) {
	f := newFixture(b, "")
	direct := func(keepAlive bool) *http.Client {
		tr := &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: f.sandboxRoots},
			ForceAttemptHTTP2: true,
			DisableKeepAlives: !keepAlive,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				_, port, _ := net.SplitHostPort(addr)
				var d net.Dialer
				return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
			},
		}
		return &http.Client{Transport: tr}
	}
	proxied := func(keepAlive bool) *http.Client {
		c := f.client(true)
		c.Transport.(*http.Transport).DisableKeepAlives = !keepAlive
		return c
	}
	hdr := map[string]string{"Authorization": "Bearer " + f.cred.Placeholder}
	target, targetHost := f.api, "api.test"
	get := func(b *testing.B, c *http.Client, path string, want int) {
		req, _ := http.NewRequest("GET", f.url(target, targetHost, path), nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || want > 0 && n != int64(want) {
			b.Fatalf("status %d, %d bytes: %v", resp.StatusCode, n, err)
		}
	}
	type mk func(bool) *http.Client
	for _, side := range []struct {
		name string
		c    mk
	}{{"direct", direct}, {"terminated", proxied}} {
		b.Run("reused/"+side.name, func(b *testing.B) {
			c := side.c(true)
			get(b, c, "/small", 0) // the connection is open before timing
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				get(b, c, "/small", 0)
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
		})
		b.Run("handshake/"+side.name, func(b *testing.B) {
			c := side.c(false)
			for i := 0; i < b.N; i++ {
				get(b, c, "/small", 0)
			}
		})
		b.Run("download/"+side.name, func(b *testing.B) {
			c := side.c(true)
			get(b, c, "/small", 0)
			b.SetBytes(int64(len(bigPayload)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				get(b, c, "/big", len(bigPayload))
			}
		})
	}
	b.Run("memory", func(b *testing.B) {
		const conns = 50 // below the session's MaxConns (64)
		// open returns the heap and stacks per connection held by conns
		// open, idle connections of c to u (client, proxy and server).
		open := func(c mk, u *upstream, host string) float64 {
			target, targetHost = u, host
			defer func() { target, targetHost = f.api, "api.test" }()
			time.Sleep(100 * time.Millisecond) // the last round's connections are gone
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			var clients []*http.Client
			for i := 0; i < conns; i++ {
				cl := c(true)
				get(b, cl, "/small", 0)
				clients = append(clients, cl)
			}
			time.Sleep(50 * time.Millisecond) // let the goroutines settle
			runtime.GC()
			runtime.ReadMemStats(&m1)
			for _, cl := range clients {
				cl.CloseIdleConnections()
			}
			return float64(int64(m1.HeapInuse+m1.StackInuse)-int64(m0.HeapInuse+m0.StackInuse)) / conns / 1024
		}
		// One round first: one-time allocations (pools, caches, the leaf)
		// are not any connection's.
		open(direct, f.api, "api.test")
		open(proxied, f.api, "api.test")
		open(proxied, f.plain, "plain.test")
		for i := 0; i < b.N; i++ {
			d := open(direct, f.api, "api.test")
			t := open(proxied, f.api, "api.test")
			// The same through the untouched tunnel (plain.test has no
			// credential and no rule): today's cost, for comparison.
			tun := open(proxied, f.plain, "plain.test")
			b.ReportMetric(d, "direct-KiB/conn")
			b.ReportMetric(t-d, "terminated-proxy-KiB/conn")
			b.ReportMetric(tun-d, "tunnel-proxy-KiB/conn")
		}
	})
}
