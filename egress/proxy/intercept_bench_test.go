package proxy

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
//	           share), and the same for today's tunnel for comparison;
//	           then the proxy's share beyond the TLS library's own, less a
//	           control of bare crypto/tls connections (tlsPairs)
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
		// pairs is the same measurement for conns bare crypto/tls pairs
		// (tlsPairs), the TLS library's own share.
		pairs := func() float64 {
			time.Sleep(100 * time.Millisecond)
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			closeAll := tlsPairs(b, f, conns)
			runtime.GC()
			runtime.ReadMemStats(&m1)
			closeAll()
			return float64(int64(m1.HeapInuse+m1.StackInuse)-int64(m0.HeapInuse+m0.StackInuse)) / conns / 1024
		}
		// One round first: one-time allocations (pools, caches, the leaf)
		// are not any connection's.
		open(direct, f.api, "api.test")
		open(proxied, f.api, "api.test")
		open(proxied, f.plain, "plain.test")
		pairs()
		// Medians of the rounds (a round's figures move by several KiB
		// with where the heap's spans fall).
		var ds, ts, tps, beyond, tuns []float64
		for i := 0; i < b.N; i++ {
			d := open(direct, f.api, "api.test")
			t := open(proxied, f.api, "api.test")
			// The same through the untouched tunnel (plain.test has no
			// credential and no rule): today's cost, for comparison. The
			// tunnel holds no TLS connection: all of it is beyond TLS.
			tun := open(proxied, f.plain, "plain.test")
			tp := pairs()
			ds, ts, tps = append(ds, d), append(ts, t-d), append(tps, tp)
			beyond, tuns = append(beyond, t-d-tp), append(tuns, tun-d)
		}
		median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
		b.ReportMetric(median(ds), "direct-KiB/conn")
		b.ReportMetric(median(ts), "terminated-proxy-KiB/conn")
		b.ReportMetric(median(tps), "tls-pair-KiB/conn")
		b.ReportMetric(median(beyond), "terminated-beyond-tls-KiB/conn")
		b.ReportMetric(median(tuns), "tunnel-proxy-KiB/conn")
	})
}

// tlsPairs is the control for the memory measurement: the TLS library's
// own share of a terminated connection. The proxy holds two crypto/tls
// connections per terminated connection: a server side facing the sandbox
// (the leaf its CA minted) and a client side facing the upstream server
// (verified against the server's CA), each on its own TCP socket. One pair
// of bare crypto/tls connections over loopback, a server end and a client
// end, is exactly one of each, with the proxy's configurations (TLS 1.2
// minimum, the same ALPN offer, a P-256 leaf), and carries the same
// exchange: a full handshake, one small request and its small response.
// Then it idles with no goroutine waiting on it: the goroutines the proxy
// keeps reading its two connections (the HTTP/2 server's and transport's)
// count as the proxy's, not the library's. tlsPairs opens n such pairs
// and returns a function that closes them.
func tlsPairs(b *testing.B, f *icptFixture, n int) (closeAll func()) {
	b.Helper()
	leaf, err := f.proxyCA.Leaf("api.test")
	if err != nil {
		b.Fatal(err)
	}
	srvCfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return leaf, nil }}
	cliCfg := &tls.Config{RootCAs: f.sandboxRoots, ServerName: "api.test", MinVersion: tls.VersionTLS12, NextProtos: []string{"h2", "http/1.1"}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	req := []byte("GET /small HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer " + f.cred.Placeholder + "\r\n\r\n")
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
	var open []net.Conn
	closeAll = func() {
		for _, c := range open {
			c.Close()
		}
	}
	for range n {
		accepted := make(chan error, 1)
		var sc *tls.Conn
		go func() {
			raw, err := ln.Accept()
			if err != nil {
				accepted <- err
				return
			}
			sc = tls.Server(raw, srvCfg)
			buf := make([]byte, len(req))
			if _, err := io.ReadFull(sc, buf); err != nil {
				accepted <- err
				return
			}
			_, err = sc.Write(resp)
			accepted <- err
		}()
		raw, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			closeAll()
			b.Fatal(err)
		}
		cc := tls.Client(raw, cliCfg)
		open = append(open, cc)
		if _, err := cc.Write(req); err != nil {
			closeAll()
			b.Fatal(err)
		}
		buf := make([]byte, len(resp))
		if _, err := io.ReadFull(cc, buf); err != nil {
			closeAll()
			b.Fatal(err)
		}
		if err := <-accepted; err != nil {
			closeAll()
			b.Fatal(err)
		}
		open = append(open, sc)
	}
	return closeAll
}
