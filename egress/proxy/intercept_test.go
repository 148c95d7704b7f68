package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every server here is a real HTTPS server on 127.0.0.1 with a certificate
// from its own test CA (not the proxy's); names resolve through
// stubResolver and only loopback is ever dialed (guardDialer).

const testSecret = "s3cr3t-VALUE-0123456789"

// upstream is one HTTPS test server and what it saw.
type upstream struct {
	srv  *httptest.Server
	port int
	hits atomic.Int64
	mu   sync.Mutex
	seen []seenReq
}

type seenReq struct {
	Proto  int
	Method string
	Path   string
	Query  string
	Auth   string
	Body   string
}

// startUpstream serves host with a leaf minted by ca (HTTP/2 and
// HTTP/1.1). Each response echoes what it saw, in a header and the body.
func startUpstream(t testing.TB, ca *CA, host string) *upstream {
	t.Helper()
	leaf, err := ca.Leaf(host)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		sr := seenReq{Proto: r.ProtoMajor, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Auth: r.Header.Get("Authorization"), Body: string(b)}
		u.mu.Lock()
		u.seen = append(u.seen, sr)
		u.mu.Unlock()
		if r.URL.Path == "/gzip" { // compressed whatever was asked
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			json.NewEncoder(gz).Encode(sr)
			gz.Close()
			return
		}
		if r.URL.Path == "/br" { // an encoding nobody asked for
			w.Header().Set("Content-Encoding", "br")
			json.NewEncoder(w).Encode(sr)
			return
		}
		if r.URL.Path == "/big" {
			w.Write(bigPayload)
			return
		}
		if r.URL.Path == "/bigecho" { // the value echoed inside a large body
			w.Write(bigEcho(strings.TrimPrefix(sr.Auth, "Bearer ")))
			return
		}
		w.Header().Set("X-Echo-Auth", sr.Auth)
		json.NewEncoder(w).Encode(sr)
	}))
	u.srv.TLS = &tls.Config{Certificates: []tls.Certificate{*leaf}}
	u.srv.EnableHTTP2 = true
	u.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are what some tests expect
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	u.port = u.srv.Listener.Addr().(*net.TCPAddr).Port
	return u
}

// lo32 lets the names resolve to the loopback test servers.
var lo32 = []string{"127.0.0.1/32"}

var bigPayload = bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB

// bigEcho is bigPayload with value written over it at offsets around the
// proxy's read sizes (32 KiB, then 256 KiB) and at the very end.
func bigEcho(value string) []byte {
	b := bytes.Clone(bigPayload)
	for _, off := range []int{0, 32<<10 - 3, 100000, 32<<10 + 256<<10 - 7, 700001, len(b) - len(value)} {
		copy(b[off:], value)
	}
	return b
}

func (u *upstream) last(t *testing.T) seenReq {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.seen) == 0 {
		t.Fatal("the server saw no request")
	}
	return u.seen[len(u.seen)-1]
}

// icptFixture is a session with interception, the servers it reaches and
// the CA pools on either side.
type icptFixture struct {
	ts                *testSession
	proxyCA, serverCA *CA
	api, other, plain *upstream
	cred              egress.Credential
	kills             atomic.Int64
	sandboxRoots      *x509.CertPool // what the sandbox trusts: the proxy CA and the servers' CA
}

// newFixture: api.test has the credential, other.test an HTTP rule (so it
// is terminated too), plain.test neither (a tunnel).
func newFixture(t testing.TB, onViolation string, mods ...func(*Options)) *icptFixture {
	t.Helper()
	f := &icptFixture{}
	var err error
	if f.proxyCA, err = NewCA(); err != nil {
		t.Fatal(err)
	}
	if f.serverCA, err = NewCA(); err != nil {
		t.Fatal(err)
	}
	f.api = startUpstream(t, f.serverCA, "api.test")
	f.other = startUpstream(t, f.serverCA, "other.test")
	f.plain = startUpstream(t, f.serverCA, "plain.test")
	ph, err := egress.NewPlaceholder()
	if err != nil {
		t.Fatal(err)
	}
	f.cred = egress.Credential{Name: "API_TOKEN", Hosts: []string{"api.test"}, Header: "Authorization", Format: "Bearer {value}", Query: "key",
		Value: egress.NewSecret([]byte(testSecret)), Placeholder: ph}
	roots := x509.NewCertPool()
	roots.AddCert(f.serverCA.Certificate())
	p := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test", "other.test", "plain.test"},
		AllowedPorts: []int{f.api.port, f.other.port, f.plain.port}, AllowedCIDRs: lo32, OnViolation: onViolation,
		HTTPRules: []egress.HTTPRule{{Host: "other.test", Methods: []string{"GET", "POST"}, Paths: []string{"/repos/"}}}}
	lo := []netip.Addr{loopback}
	o := Options{
		Resolver:  stubResolver{"api.test": lo, "other.test": lo, "plain.test": lo},
		Intercept: &Interception{CA: f.proxyCA, Credentials: []egress.Credential{f.cred}, UpstreamRoots: roots},
		OnKill:    func(egress.Event) { f.kills.Add(1) },
	}
	for _, mod := range mods {
		mod(&o)
	}
	f.ts = startSession(t, p, o)
	f.sandboxRoots = x509.NewCertPool()
	f.sandboxRoots.AddCert(f.proxyCA.Certificate())
	f.sandboxRoots.AddCert(f.serverCA.Certificate())
	return f
}

// client is the sandbox's HTTP client through the proxy: h2 true offers
// HTTP/2 and HTTP/1.1, false HTTP/1.1 only.
func (f *icptFixture) client(h2 bool) *http.Client {
	tr := &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", Host: f.ts.proxy}),
		TLSClientConfig:   &tls.Config{RootCAs: f.sandboxRoots},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr}
}

func (f *icptFixture) url(u *upstream, host, path string) string {
	return fmt.Sprintf("https://%s:%d%s", host, u.port, path)
}

func do(t *testing.T, c *http.Client, method, u string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: body: %v", method, u, err)
	}
	return resp, string(b)
}

// noSecretIn fails if the real value appears in any event.
func noSecretIn(t *testing.T, s *Session) {
	t.Helper()
	evs, _ := s.Violations()
	b, _ := json.Marshal(evs)
	if strings.Contains(string(b), testSecret) || strings.Contains(s.Summary(), testSecret) {
		t.Errorf("the secret is in the violation record: %s", b)
	}
}

func TestInterceptCredentialReachesServerOnly(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1.1", true: "h2"}[h2], func(t *testing.T) {
			f := newFixture(t, "")
			c := f.client(h2)
			resp, body := do(t, c, "GET", f.url(f.api, "api.test", "/user"), nil, map[string]string{"Authorization": "token " + f.cred.Placeholder})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			want := 1
			if h2 {
				want = 2
			}
			if resp.ProtoMajor != want {
				t.Errorf("sandbox side spoke HTTP/%d, want %d", resp.ProtoMajor, want)
			}
			seen := f.api.last(t)
			if seen.Auth != "Bearer "+testSecret {
				t.Errorf("server saw Authorization %q, want the real value in the configured format", seen.Auth)
			}
			if seen.Proto != 2 {
				t.Errorf("upstream spoke HTTP/%d, want 2 (the server offers h2)", seen.Proto)
			}
			// The server echoes the value: scrubbed back to the placeholder.
			if strings.Contains(body, testSecret) || strings.Contains(resp.Header.Get("X-Echo-Auth"), testSecret) {
				t.Errorf("the response carried the real value to the sandbox: %q / %q", body, resp.Header.Get("X-Echo-Auth"))
			}
			if got := resp.Header.Get("X-Echo-Auth"); got != "Bearer "+f.cred.Placeholder {
				t.Errorf("echoed header = %q, want the placeholder", got)
			}
			if resp.TLS == nil || resp.TLS.PeerCertificates[0].Issuer.CommonName != f.proxyCA.Certificate().Subject.CommonName {
				t.Errorf("the sandbox was not shown the proxy CA's leaf")
			}
			// The query-parameter form.
			resp, body = do(t, c, "GET", f.url(f.api, "api.test", "/q?key="+f.cred.Placeholder+"&x=1"), nil, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if q := f.api.last(t).Query; !strings.Contains(q, "key="+testSecret) || strings.Contains(q, f.cred.Placeholder) {
				t.Errorf("server saw query %q, want key=<value>", q)
			}
			if strings.Contains(body, testSecret) {
				t.Errorf("the response body carried the real value: %q", body)
			}
			// A gzip echo is decompressed by the proxy and scrubbed; an
			// encoding it cannot read is refused.
			req, _ := http.NewRequest("GET", f.url(f.api, "api.test", "/gzip"), nil)
			req.Header.Set("Authorization", "Bearer "+f.cred.Placeholder)
			req.Header.Set("Accept-Encoding", "gzip")
			gresp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			gbody, _ := io.ReadAll(gresp.Body)
			gresp.Body.Close()
			if gresp.StatusCode != 200 || bytes.Contains(gbody, []byte(testSecret)) || !bytes.Contains(gbody, []byte(f.cred.Placeholder)) {
				t.Errorf("gzip echo: status %d, body %q", gresp.StatusCode, gbody)
			}
			if f.api.last(t).Auth != "Bearer "+testSecret {
				t.Errorf("gzip: the server did not get the value")
			}
			resp, body = do(t, c, "GET", f.url(f.api, "api.test", "/br"), nil, map[string]string{"Authorization": "Bearer " + f.cred.Placeholder})
			if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Str-Reason") != egress.ReasonUnscrubbable || strings.Contains(body, testSecret) {
				t.Errorf("br echo: status %d reason %q", resp.StatusCode, resp.Header.Get("X-Str-Reason"))
			}
			ev := mustEvent(t, f.ts.Session, egress.ReasonUnscrubbable, "api.test")
			if ev.Kind != egress.KindCredential {
				t.Errorf("event %+v", ev)
			}
			// The big body passes whole (and scrubbed where nothing matches).
			resp, body = do(t, c, "GET", f.url(f.api, "api.test", "/big"), nil, nil)
			if resp.StatusCode != 200 || body != string(bigPayload) {
				t.Errorf("1 MiB download: status %d, %d bytes", resp.StatusCode, len(body))
			}
			if evs, _ := f.ts.Violations(); len(evs) != 1 {
				t.Errorf("violations: %+v", evs)
			}
			noSecretIn(t, f.ts.Session)
		})
	}
}

func TestInterceptPlaceholderToOtherHostBlocked(t *testing.T) {
	cases := []struct {
		name   string
		path   string
		body   string
		header map[string]string
	}{
		{"header", "/repos/x", "", map[string]string{"Authorization": "Bearer PH"}},
		{"custom-header", "/repos/x", "", map[string]string{"X-Leak": "a PH b"}},
		{"query", "/repos/x?leak=PH", "", nil},
		{"path", "/repos/PH", "", nil},
		{"body", "/repos/x", `{"k":"PH"}`, nil},
		{"body-beyond-scan-bound", "/repos/x", strings.Repeat("x", 3<<20) + "PH", nil},
	}
	for _, h2 := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/h2=%v", tc.name, h2), func(t *testing.T) {
				f := newFixture(t, "")
				c := f.client(h2)
				hdr := map[string]string{}
				for k, v := range tc.header {
					hdr[k] = strings.ReplaceAll(v, "PH", f.cred.Placeholder)
				}
				var body io.Reader
				method := "GET"
				if tc.body != "" {
					method = "POST"
					body = strings.NewReader(strings.ReplaceAll(tc.body, "PH", f.cred.Placeholder))
				}
				req, _ := http.NewRequest(method, f.url(f.other, "other.test", strings.ReplaceAll(tc.path, "PH", f.cred.Placeholder)), body)
				for k, v := range hdr {
					req.Header.Set(k, v)
				}
				resp, err := c.Do(req)
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if tc.name != "body-beyond-scan-bound" || resp.StatusCode != 502 {
						if resp.StatusCode != http.StatusForbidden || resp.Header.Get("X-Str-Reason") != egress.ReasonCredentialHost {
							t.Fatalf("status %d reason %q: %s", resp.StatusCode, resp.Header.Get("X-Str-Reason"), b)
						}
						if strings.Contains(string(b), testSecret) {
							t.Errorf("denial body carries the secret: %s", b)
						}
					}
				}
				ev := mustEvent(t, f.ts.Session, egress.ReasonCredentialHost, "other.test")
				if ev.Kind != egress.KindCredential || !strings.Contains(ev.Message, "API_TOKEN") || !strings.Contains(ev.Message, "other.test") {
					t.Errorf("event %+v", ev)
				}
				if tc.name != "body-beyond-scan-bound" && f.other.hits.Load() != 0 {
					t.Errorf("other.test received the request")
				}
				f.other.mu.Lock()
				seen := append([]seenReq(nil), f.other.seen...)
				f.other.mu.Unlock()
				for _, s := range seen {
					if strings.Contains(s.Body, f.cred.Placeholder) || strings.Contains(s.Auth, f.cred.Placeholder) {
						t.Errorf("other.test received the placeholder")
					}
				}
				noSecretIn(t, f.ts.Session)
			})
		}
	}
}

// A plain http:// request (forwarded, not tunnelled) is inspected the same
// way, and never has a credential put into it.
func TestInterceptPlainForwardInspected(t *testing.T) {
	f := newFixture(t, "")
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	p := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test", "web.test"}, AllowedPorts: []int{port}, AllowedCIDRs: lo32}
	ts := startSession(t, p, Options{
		Resolver:  stubResolver{"web.test": {loopback}, "api.test": {loopback}},
		Intercept: &Interception{CA: f.proxyCA, Credentials: []egress.Credential{f.cred}},
	})
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ts.proxy})}}
	resp, _ := do(t, c, "GET", fmt.Sprintf("http://web.test:%d/?k=%s", port, f.cred.Placeholder), nil, nil)
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonCredentialHost || hits.Load() != 0 {
		t.Fatalf("placeholder to web.test over plain HTTP: status %d reason %q hits %d", resp.StatusCode, resp.Header.Get("X-Str-Reason"), hits.Load())
	}
	mustEvent(t, ts.Session, egress.ReasonCredentialHost, "web.test")
}

func TestInterceptBadCertificateRefused(t *testing.T) {
	f := newFixture(t, "")
	untrusted, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]*upstream{
		"unknown-authority": startUpstream(t, untrusted, "bad.test"),
		"wrong-name":        startUpstream(t, f.serverCA, "not-bad.test"),
	}
	for name, u := range cases {
		t.Run(name, func(t *testing.T) {
			ph, _ := egress.NewPlaceholder()
			cred := egress.Credential{Name: "BAD_TOKEN", Hosts: []string{"bad.test"}, Header: "Authorization", Value: egress.NewSecret([]byte(testSecret)), Placeholder: ph}
			roots := x509.NewCertPool()
			roots.AddCert(f.serverCA.Certificate())
			ts := startSession(t, egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"bad.test"}, AllowedPorts: []int{u.port}, AllowedCIDRs: lo32}, Options{
				Resolver:  stubResolver{"bad.test": {loopback}},
				Intercept: &Interception{CA: f.proxyCA, Credentials: []egress.Credential{cred}, UpstreamRoots: roots},
			})
			f.ts = ts
			resp, body := do(t, f.client(true), "GET", f.url(u, "bad.test", "/"), nil, map[string]string{"Authorization": ph})
			if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("X-Str-Reason") != egress.ReasonUpstreamCert {
				t.Fatalf("status %d reason %q: %s", resp.StatusCode, resp.Header.Get("X-Str-Reason"), body)
			}
			if u.hits.Load() != 0 {
				t.Errorf("the unverified server received a request")
			}
			mustEvent(t, ts.Session, egress.ReasonUpstreamCert, "bad.test")
			noSecretIn(t, ts.Session)
		})
	}
}

func TestInterceptHTTPRules(t *testing.T) {
	f := newFixture(t, "")
	c := f.client(true)
	ok := []struct{ method, path string }{{"GET", "/repos/a/b"}, {"POST", "/repos/x"}, {"GET", "/repos"}}
	for _, r := range ok {
		resp, body := do(t, c, r.method, f.url(f.other, "other.test", r.path), nil, nil)
		if resp.StatusCode != 200 {
			t.Errorf("%s %s: status %d: %s", r.method, r.path, resp.StatusCode, body)
		}
	}
	denied := []struct{ method, path, reason string }{
		{"DELETE", "/repos/a", egress.ReasonMethodNotAllowed},
		{"GET", "/admin", egress.ReasonPathNotAllowed},
		{"GET", "/repository", egress.ReasonPathNotAllowed},
		{"GET", "/repos/../admin", egress.ReasonPathNotAllowed},
		{"GET", "/repos/%2e%2e/admin", egress.ReasonPathNotAllowed},
		{"GET", "/repos//x", egress.ReasonPathNotAllowed},
	}
	before := f.other.hits.Load()
	for _, r := range denied {
		req, _ := http.NewRequest(r.method, f.url(f.other, "other.test", "/"), nil)
		req.URL.Opaque = "//other.test:" + fmt.Sprint(f.other.port) + r.path // sent as written
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != r.reason {
			t.Errorf("%s %s: status %d reason %q, want 403 %s", r.method, r.path, resp.StatusCode, resp.Header.Get("X-Str-Reason"), r.reason)
		}
	}
	if got := f.other.hits.Load(); got != before {
		t.Errorf("%d denied requests reached the server", got-before)
	}
	ev := mustEvent(t, f.ts.Session, egress.ReasonMethodNotAllowed, "other.test")
	if ev.Rule != "http_rules: other.test" {
		t.Errorf("rule %q", ev.Rule)
	}
	// A Host header naming another allowed host inside the terminated
	// tunnel is fronting: refused.
	req, _ := http.NewRequest("GET", f.url(f.other, "other.test", "/repos/x"), nil)
	req.Host = "api.test"
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonHostMismatch {
		t.Errorf("fronted Host: status %d reason %q", resp.StatusCode, resp.Header.Get("X-Str-Reason"))
	}
}

func TestInterceptViolationKills(t *testing.T) {
	f := newFixture(t, egress.OnViolationKill)
	resp, _ := do(t, f.client(false), "DELETE", f.url(f.other, "other.test", "/repos/a"), nil, nil)
	if resp.StatusCode != 403 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if f.kills.Load() != 1 {
		t.Errorf("OnKill called %d times, want 1", f.kills.Load())
	}
}

// Hosts without a credential or a rule keep the plain tunnel: the sandbox
// sees the server's own certificate, and bytes pass untouched.
func TestInterceptOtherHostsKeepTunnel(t *testing.T) {
	f := newFixture(t, "")
	serverOnly := x509.NewCertPool()
	serverOnly.AddCert(f.serverCA.Certificate())
	c := f.client(true)
	c.Transport.(*http.Transport).TLSClientConfig.RootCAs = serverOnly // the proxy CA is not trusted here
	resp, body := do(t, c, "GET", f.url(f.plain, "plain.test", "/anything"), nil, map[string]string{"Authorization": "Bearer " + f.cred.Placeholder})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := resp.TLS.PeerCertificates[0]; !bytes.Equal(got.Raw, f.plain.srv.TLS.Certificates[0].Certificate[0]) {
		t.Errorf("the sandbox saw %q issued by %q, not the server's own certificate", got.Subject.CommonName, got.Issuer.CommonName)
	}
	// The placeholder went through the opaque tunnel as it was: worthless
	// outside its hosts, and never replaced.
	if seen := f.plain.last(t); seen.Auth != "Bearer "+f.cred.Placeholder {
		t.Errorf("plain.test saw %q", seen.Auth)
	}
	// And a non-TLS protocol on a tunnelled host is passed byte for byte.
	echo := startEcho(t)
	ts := startSession(t, egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test", "echo.test"}, AllowedPorts: []int{echo}, AllowedCIDRs: lo32}, Options{
		Resolver:  stubResolver{"echo.test": {loopback}, "api.test": {loopback}},
		Intercept: &Interception{CA: f.proxyCA, Credentials: []egress.Credential{f.cred}},
	})
	conn, br, resp2 := connect(t, ts.proxy, fmt.Sprintf("echo.test:%d", echo))
	defer conn.Close()
	if resp2.StatusCode != 200 {
		t.Fatalf("CONNECT echo.test: %d", resp2.StatusCode)
	}
	echoRoundTrip(t, conn, br)
}

func TestInterceptCredentialValidation(t *testing.T) {
	ph, _ := egress.NewPlaceholder()
	good := egress.Credential{Name: "TOKEN", Hosts: []string{"api.test"}, Header: "Authorization", Format: "Bearer {value}", Value: egress.NewSecret([]byte("v")), Placeholder: ph}
	p := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test", "*.example.com"}}
	if err := egress.CheckCredentials(p, []egress.Credential{good}); err != nil {
		t.Fatalf("good credential refused: %v", err)
	}
	bad := []struct {
		mut  func(*egress.Credential)
		want string
	}{
		{func(c *egress.Credential) { c.Hosts = []string{"evil.test"} }, "not covered by network.allowed_hosts"},
		{func(c *egress.Credential) { c.Hosts = []string{"*.example.com", "a.example.com"}; c.Name = "lower" }, "not an environment variable name"},
		{func(c *egress.Credential) { c.Hosts = nil }, "missing"},
		{func(c *egress.Credential) { c.Header = "Proxy-Authorization" }, "hop-by-hop"},
		{func(c *egress.Credential) { c.Format = "Bearer" }, "exactly once"},
		{func(c *egress.Credential) { c.Value = egress.Secret{} }, "empty"},
		{func(c *egress.Credential) { c.Placeholder = "x" }, "NewPlaceholder"},
		{func(c *egress.Credential) { c.Header, c.Query = "", "" }, "how the value is sent"},
	}
	for _, b := range bad {
		c := good
		b.mut(&c)
		err := egress.CheckCredentials(p, []egress.Credential{c})
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%+v: err %v, want %q", c, err, b.want)
		}
	}
	// The value never prints.
	for _, s := range []string{fmt.Sprintf("%v", good), fmt.Sprintf("%+v", good), fmt.Sprintf("%#v", good)} {
		if strings.Contains(s, `"v"`) || strings.Contains(s, "{b:[118]}") || strings.Contains(s, "118") {
			t.Errorf("the value printed: %s", s)
		}
	}
	if b, _ := json.Marshal(good); strings.Contains(string(b), `"v"`) {
		t.Errorf("the value marshalled: %s", b)
	}
	// http_rules need a CA.
	if _, err := Start(t.Context(), egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"a.test"}, HTTPRules: []egress.HTTPRule{{Host: "a.test", Methods: []string{"GET"}}}}, Listeners{}, Options{}); err == nil {
		t.Error("http_rules without a CA started")
	}
}

func TestHTTPRulesValidateAndTighten(t *testing.T) {
	base := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test"}, HTTPRules: []egress.HTTPRule{{Host: "api.test", Methods: []string{"GET"}}}}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []egress.HTTPRule{
		{Host: "nowhere.test", Methods: []string{"GET"}},
		{Host: "api.test"},
		{Host: "api.test", Methods: []string{"get"}},
		{Host: "api.test", Paths: []string{"repos"}},
		{Host: "api.test", Paths: []string{"/a/../b"}},
	} {
		p := base
		p.HTTPRules = []egress.HTTPRule{bad}
		if err := p.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// A tightening request keeps the base's rules and may add its own.
	eff, err := base.Tighten(egress.Policy{HTTPRules: []egress.HTTPRule{{Host: "api.test", Paths: []string{"/x/"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(eff.HTTPRules) != 2 {
		t.Errorf("rules after tightening: %+v", eff.HTTPRules)
	}
	eff, err = base.Tighten(egress.Policy{HTTPRules: []egress.HTTPRule{}})
	if err != nil || len(eff.HTTPRules) != 1 {
		t.Errorf("an empty rule list dropped the base's rules: %+v %v", eff.HTTPRules, err)
	}
}

// TestInterceptLargeResponseScrubbed: a 1 MiB response of a credential's
// host that echoes the value six times (across the proxy's read sizes and
// at the end) reaches the sandbox with each replaced by the placeholder
// and every other byte intact, over HTTP/1.1 and HTTP/2.
func TestInterceptLargeResponseScrubbed(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(map[bool]string{false: "http1.1", true: "h2"}[h2], func(t *testing.T) {
			f := newFixture(t, "")
			resp, body := do(t, f.client(h2), "GET", f.url(f.api, "api.test", "/bigecho"), nil, map[string]string{"Authorization": "Bearer " + f.cred.Placeholder})
			if resp.StatusCode != 200 {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if f.api.last(t).Auth != "Bearer "+testSecret {
				t.Fatalf("the server did not see the value, so it echoed none")
			}
			want := bytes.ReplaceAll(bigEcho(testSecret), []byte(testSecret), []byte(f.cred.Placeholder))
			if n := strings.Count(body, testSecret); n > 0 {
				t.Fatalf("the value reached the sandbox %d times", n)
			}
			if body != string(want) {
				t.Errorf("body: %d bytes, %d placeholders; want %d bytes, 6 placeholders", len(body), strings.Count(body, f.cred.Placeholder), len(want))
			}
		})
	}
}

func TestScrubberAcrossChunks(t *testing.T) {
	c := &egress.Credential{Value: egress.NewSecret([]byte("SECRET")), Placeholder: "PH"}
	in := "aaSECRETbbSECsSECRETSECRET"
	for split := 0; split <= len(in); split++ {
		sc := newScrubber([]*egress.Credential{c})
		var out []byte
		out = append(out, sc.push([]byte(in[:split]))...)
		out = append(out, sc.push([]byte(in[split:]))...)
		out = append(out, sc.flush()...)
		if got, want := string(out), "aaPHbbSECsPHPH"; got != want {
			t.Errorf("split %d: %q, want %q", split, got, want)
		}
	}
}

func TestCALeaves(t *testing.T) {
	ca, err := NewCA()
	if err != nil {
		t.Fatal(err)
	}
	a, err := ca.Leaf("api.test")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := ca.Leaf("api.test"); b != a {
		t.Error("the leaf was not cached")
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	if _, err := a.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: roots}); err != nil {
		t.Errorf("leaf does not verify: %v", err)
	}
	if _, err := a.Leaf.Verify(x509.VerifyOptions{DNSName: "other.test", Roots: roots}); err == nil {
		t.Error("leaf verifies for another name")
	}
	if !strings.Contains(string(ca.CertPEM()), "BEGIN CERTIFICATE") {
		t.Error("CertPEM")
	}
}

// The SOCKS5 adapter reaches the same termination as CONNECT (one
// decision, one pass-on step for every ingress).
func TestInterceptThroughSOCKS5(t *testing.T) {
	f := newFixture(t, "")
	c := f.client(true)
	c.Transport.(*http.Transport).Proxy = http.ProxyURL(&url.URL{Scheme: "socks5", Host: f.ts.proxy})
	resp, body := do(t, c, "GET", f.url(f.api, "api.test", "/user"), nil, map[string]string{"Authorization": "Bearer " + f.cred.Placeholder})
	if resp.StatusCode != 200 || strings.Contains(body, testSecret) {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := f.api.last(t).Auth; got != "Bearer "+testSecret {
		t.Errorf("server saw %q", got)
	}
	req, _ := http.NewRequest("GET", f.url(f.other, "other.test", "/repos/x"), nil)
	req.Header.Set("X-Leak", f.cred.Placeholder)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 || resp.Header.Get("X-Str-Reason") != egress.ReasonCredentialHost {
		t.Errorf("placeholder to other.test over SOCKS5: %d %q", resp.StatusCode, resp.Header.Get("X-Str-Reason"))
	}
	if ev := mustEvent(t, f.ts.Session, egress.ReasonCredentialHost, "other.test"); ev.Via != egress.ViaSOCKS5h {
		t.Errorf("event via %q, want %s", ev.Via, egress.ViaSOCKS5h)
	}
}

// Transparent capture (a plain connect() to a fake IP on a capture port)
// is terminated too: the ClientHello peeked for the SNI check is replayed
// into the termination.
func TestInterceptThroughCapture(t *testing.T) {
	f := newFixture(t, "")
	roots := x509.NewCertPool()
	roots.AddCert(f.serverCA.Certificate())
	lo := []netip.Addr{loopback}
	p := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test"}, AllowedPorts: []int{443}, AllowedCIDRs: lo32}
	ts := startSession(t, p, Options{
		Resolver:  stubResolver{"api.test": lo},
		Dialer:    guardDialer(t, map[int]int{443: f.api.port}),
		Intercept: &Interception{CA: f.proxyCA, Credentials: []egress.Credential{f.cred}, UpstreamRoots: roots},
	}, 443)
	ts.fake.pin("api.test", loopback)
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: f.sandboxRoots},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, ts.capture[443])
		},
	}
	c := &http.Client{Transport: tr}
	resp, body := do(t, c, "GET", "https://api.test/user", nil, map[string]string{"Authorization": "Bearer " + f.cred.Placeholder})
	if resp.StatusCode != 200 || strings.Contains(body, testSecret) {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if got := f.api.last(t).Auth; got != "Bearer "+testSecret {
		t.Errorf("server saw %q", got)
	}
	if resp.ProtoMajor != 2 {
		t.Errorf("HTTP/%d over capture, want 2", resp.ProtoMajor)
	}
}

// A terminated connection that never sends a request costs the upstream
// only a TLS handshake: no request reaches the server, and the session
// still closes (the parallel handshake's goroutine ends with it).
func TestInterceptNoRequestReleases(t *testing.T) {
	f := newFixture(t, "")
	conn, br, resp := connect(t, f.ts.proxy, fmt.Sprintf("api.test:%d", f.api.port))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	tc := tls.Client(readerConn{conn, br}, &tls.Config{RootCAs: f.sandboxRoots, ServerName: "api.test"})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake with the proxy: %v", err)
	}
	if got := tc.ConnectionState().PeerCertificates[0].Issuer.CommonName; got != f.proxyCA.Certificate().Subject.CommonName {
		t.Errorf("issuer %q", got)
	}
	tc.Close()
	if err := f.ts.Close(); err != nil {
		t.Fatal(err)
	}
	if n := f.api.hits.Load(); n != 0 {
		t.Errorf("the server got %d requests", n)
	}
}

// A terminated connection is served on by the session's HTTP server once
// its handler goroutine has returned (termServer): it keeps its MaxConns
// slot while open, gives it back when it closes, and Close still ends it.
func TestInterceptHandedOverHoldsSlot(t *testing.T) {
	f := newFixture(t, "", func(o *Options) { o.MaxConns = 2 })
	u := f.url(f.api, "api.test", "/small")
	hdr := map[string]string{"Authorization": "Bearer " + f.cred.Placeholder}
	var open []*http.Client
	for range 2 {
		c := f.client(true)
		if resp, _ := do(t, c, "GET", u, nil, hdr); resp.StatusCode != 200 {
			t.Fatalf("GET: %d", resp.StatusCode)
		}
		open = append(open, c)
	}
	if !refused(t, f.ts.proxy, []byte(fmt.Sprintf("CONNECT api.test:%d HTTP/1.1\r\n\r\n", f.api.port))) {
		t.Fatal("a third connection was served: an open terminated connection gave back its slot")
	}
	mustEvent(t, f.ts.Session, egress.ReasonLimitConnections, "")
	// Closing one gives its slot back (once the proxy has seen the close).
	open[0].CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := f.client(true)
		req, _ := http.NewRequest("GET", u, nil)
		req.Header.Set("Authorization", "Bearer "+f.cred.Placeholder)
		resp, err := c.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("GET: %d", resp.StatusCode)
			}
			open[0] = c
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the closed connection's slot was not given back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Close ends the open ones and returns (it waits for their ends).
	if err := f.ts.Close(); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", u, nil)
	if resp, err := open[1].Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a request on a terminated connection after Close: %d", resp.StatusCode)
	}
	for _, c := range open {
		c.CloseIdleConnections()
	}
}

// connectFirst sends a CONNECT request in the same write as the first
// bytes written through it (a client that does not wait for the 200) and
// reads the proxy's response before the first bytes read.
type connectFirst struct {
	net.Conn
	connect []byte
	br      *bufio.Reader
	status  int
}

func (c *connectFirst) Write(b []byte) (int, error) {
	if c.connect != nil {
		p := append(c.connect, b...)
		c.connect = nil
		if _, err := c.Conn.Write(p); err != nil {
			return 0, err
		}
		return len(b), nil
	}
	return c.Conn.Write(b)
}

func (c *connectFirst) Read(b []byte) (int, error) {
	if c.status == 0 {
		resp, err := http.ReadResponse(c.br, &http.Request{Method: "CONNECT"})
		if err != nil {
			return 0, err
		}
		c.status = resp.StatusCode
		if c.status != 200 {
			return 0, fmt.Errorf("CONNECT: %d", c.status)
		}
	}
	return c.br.Read(b)
}

// A ClientHello sent with the CONNECT request, in one segment, sits in the
// request phase's buffer when the connection is terminated: it reaches the
// TLS server first (unbuffer), and the request goes through.
func TestInterceptClientHelloWithConnect(t *testing.T) {
	f := newFixture(t, "")
	raw := dialT(t, f.ts.proxy)
	defer raw.Close()
	raw.SetDeadline(time.Now().Add(20 * time.Second))
	target := fmt.Sprintf("api.test:%d", f.api.port)
	cf := &connectFirst{Conn: raw, connect: []byte("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"), br: bufio.NewReader(raw)}
	tc := tls.Client(cf, &tls.Config{RootCAs: f.sandboxRoots, ServerName: "api.test", NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake with the proxy: %v", err)
	}
	req, _ := http.NewRequest("GET", f.url(f.api, "api.test", "/small"), nil)
	req.Header.Set("Authorization", "Bearer "+f.cred.Placeholder)
	if err := req.Write(tc); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET: %d", resp.StatusCode)
	}
	if got := f.api.last(t).Auth; got != "Bearer "+testSecret {
		t.Errorf("the server saw %q", got)
	}
}
