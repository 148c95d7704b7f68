package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/securetoolruntime/str/egress"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/mustwork"
	"golang.org/x/sys/unix"
)

// BenchmarkTerminatedLink measures what a tool sees on a real network path:
// the HTTPS server runs as its own process in a network namespace the
// benchmark creates, behind a veth pair whose two ends are shaped with tc
// (the rate and one-way delay of each setting, both directions). The same
// client code reaches it three ways, interleaved round by round:
//
//	direct:     TLS from the client straight to the server
//	terminated: through the proxy, terminated (api.test has a credential)
//	tunnel:     through the proxy's untouched CONNECT tunnel (plain.test)
//
// The client and the proxy stay on this host's loopback, as a sandbox and
// its proxy do. Per setting, three sub-benchmarks (b.N rounds each):
//
//	download-1MiB, download-16MiB: p50 throughput of each path on a
//	    kept-alive connection, the ratios of the p50s to direct, and the
//	    proxy's CPU per byte (this process's CPU time beyond direct's)
//	request: p50 of small GETs on a reused connection (the proxy's added
//	    latency) and of a GET on a new connection (both handshakes; the
//	    leaf is cached), with the new/direct ratios
//
// The delay needs the netem qdisc. A kernel without it (this VM's is built
// without CONFIG_NET_SCH_NETEM) gets the same path with the delay added in
// user space: the settings with a delay then run over a pair of TUN
// devices (MTU 65000, so about 2000 packets a second at 1 Gbit/s) between
// which the server's process holds each packet for the delay, with the
// rate shaped by tbf on both devices; their names end in "-tun".
// Needs root, ip and tc (run by make bench-egress); skips otherwise, or
// fails when STR_MUST_WORK=1. Never asserts a speed.
func BenchmarkTerminatedLink(b *testing.B) {
	l := newLink(b)
	settings := []struct {
		rate  string // "": the veth unshaped
		delay time.Duration
	}{{"", 0}, {"1gbit", time.Millisecond}, {"200mbit", 5 * time.Millisecond}}
	for _, st := range settings {
		var name string
		if st.delay > 0 && !l.netem {
			name = l.shapeTun(b, st.rate, st.delay)
		} else {
			name = l.shape(b, st.rate, st.delay)
		}
		b.Run(name+"/download-1MiB", func(b *testing.B) { l.download(b, 1<<20) })
		b.Run(name+"/download-16MiB", func(b *testing.B) { l.download(b, 16<<20) })
		b.Run(name+"/request", l.requests)
	}
}

// linkServerEnv, when set in the environment of this test binary, makes
// it the benchmark's HTTPS server (TestMain): the value is the file to
// write the server's CA certificate to.
const linkServerEnv = "STR_EGRESS_LINK_SERVER"

// linkPort is the server's port inside its namespace.
const linkPort = 8443

// linkTunEnv names the TUN device the link server creates in its
// namespace; the host's end is its file descriptor 3. Each "delay D" line
// on its stdin sets the delay each way and is answered "ok".
const linkTunEnv = "STR_EGRESS_LINK_TUN"

func TestMain(m *testing.M) {
	if path := os.Getenv(linkServerEnv); path != "" {
		if err := runLinkServer(path); err != nil {
			fmt.Fprintln(os.Stderr, "link server:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runLinkServer serves api.test and plain.test on :linkPort (HTTP/2 and
// HTTP/1.1) with leaves of a CA of its own, whose certificate it writes to
// caPath before printing "ready". /small answers "ok"; /bytes?n=N sends N
// bytes. It ends when its stdin closes (the benchmark is gone).
func runLinkServer(caPath string) error {
	ca, err := NewCA()
	if err != nil {
		return err
	}
	if err := os.WriteFile(caPath, ca.CertPEM(), 0o644); err != nil {
		return err
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = "0123456789abcdef"[i%16]
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil || n < 0 {
			http.Error(w, "n: a byte count", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(linkPort))
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:  mux,
		ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			return ca.Leaf(h.ServerName)
		}},
	}
	var delay atomic.Int64
	if name := os.Getenv(linkTunEnv); name != "" {
		ns, err := openTun(name)
		if err != nil {
			return err
		}
		host := os.NewFile(3, "host-tun")
		go delayLine(ns, host, &delay)
		go delayLine(host, ns, &delay)
	}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "delay "); ok {
				v, err := time.ParseDuration(d)
				if err != nil {
					fmt.Fprintln(os.Stderr, "link server: delay:", err)
					os.Exit(1)
				}
				delay.Store(int64(v))
				fmt.Println("ok")
			}
		}
		os.Exit(0)
	}()
	fmt.Println("ready")
	return srv.ServeTLS(ln, "", "")
}

// openTun creates the TUN device name (IP packets, no header) in the
// caller's network namespace.
func openTun(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// delayLine copies packets from one TUN device to the other, each written
// delay after it was read (in order).
func delayLine(from, to *os.File, delay *atomic.Int64) {
	type packet struct {
		b  *[]byte
		n  int
		at time.Time
	}
	pool := sync.Pool{New: func() any { b := make([]byte, 1<<16); return &b }}
	q := make(chan packet, 1024)
	go func() {
		for p := range q {
			// nanosleep, not time.Sleep: the runtime's timers may wake a
			// millisecond late, as much as the delay itself.
			if d := time.Until(p.at.Add(time.Duration(delay.Load()))); d > 0 {
				ts := unix.NsecToTimespec(int64(d))
				unix.Nanosleep(&ts, nil)
			}
			to.Write((*p.b)[:p.n])
			pool.Put(p.b)
		}
	}()
	for {
		b := pool.Get().(*[]byte)
		n, err := from.Read(*b)
		if err != nil {
			close(q)
			return
		}
		q <- packet{b, n, time.Now()}
	}
}

// link is the benchmark's network: a namespace with the server, the veth
// pair, a proxy session on the host's loopback, and one kept-alive client
// per path.
type link struct {
	ns, hostVeth, nsVeth string
	hostTun, nsTun       string
	server, tunServer    netip.Addr
	cur                  atomic.Value // netip.Addr: the server address of the current setting
	netem                bool
	f                    *linkFixture
	ctlIn                io.Writer
	ctlOut               *bufio.Reader
}

// linkResolver resolves every name to the current setting's server address.
type linkResolver struct{ l *link }

func (r linkResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{r.l.cur.Load().(netip.Addr)}, nil
}

type linkFixture struct {
	ts    *testSession
	roots *x509.CertPool
	ph    string
}

// newLink creates the namespace, the veth pair, the TUN pair and the
// server (all removed in cleanup) and the proxy session. Addresses:
// 10.214.X.1 (host) and 10.214.X.2 (server) on the veth, 10.214.X.5 and
// 10.214.X.6 on the TUN pair, X from the pid; nothing leaves this machine
// (each pair's addresses are routed on the pair only).
func newLink(b *testing.B) *link {
	b.Helper()
	if os.Geteuid() != 0 {
		mustwork.Skip(b, "needs root: creates a network namespace and a veth pair and shapes them with tc")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			mustwork.Skip(b, "needs "+tool+" (iproute2) to build and shape the test link")
		}
	}
	id := os.Getpid() % 100000
	x := id % 250
	l := &link{ns: "strl" + strconv.Itoa(id), hostVeth: "strlh" + strconv.Itoa(id), nsVeth: "strln" + strconv.Itoa(id),
		hostTun: "strlt" + strconv.Itoa(id), nsTun: "strls" + strconv.Itoa(id),
		server: netip.AddrFrom4([4]byte{10, 214, byte(x), 2}), tunServer: netip.AddrFrom4([4]byte{10, 214, byte(x), 6})}
	l.cur.Store(l.server)
	host := netip.AddrFrom4([4]byte{10, 214, byte(x), 1})
	tunHost := netip.AddrFrom4([4]byte{10, 214, byte(x), 5})
	run := func(args ...string) {
		b.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	_ = exec.Command("ip", "link", "del", l.hostVeth).Run()
	_ = exec.Command("ip", "netns", "del", l.ns).Run()
	run("ip", "netns", "add", l.ns)
	var server *exec.Cmd
	b.Cleanup(func() {
		if server != nil && server.Process != nil {
			_ = server.Process.Kill()
			_ = server.Wait()
		}
		_ = exec.Command("ip", "link", "del", l.hostVeth).Run()
		_ = exec.Command("ip", "netns", "del", l.ns).Run()
	})
	run("ip", "link", "add", l.hostVeth, "type", "veth", "peer", "name", l.nsVeth, "netns", l.ns)
	run("ip", "addr", "add", host.String()+"/30", "dev", l.hostVeth)
	run("ip", "link", "set", l.hostVeth, "up")
	run("ip", "-n", l.ns, "addr", "add", l.server.String()+"/30", "dev", l.nsVeth)
	run("ip", "-n", l.ns, "link", "set", l.nsVeth, "up")
	run("ip", "-n", l.ns, "link", "set", "lo", "up")
	// netem, when the kernel has it (the probe leaves no qdisc behind).
	if exec.Command("tc", "qdisc", "add", "dev", l.hostVeth, "root", "netem", "delay", "1ms").Run() == nil {
		l.netem = true
		run("tc", "qdisc", "del", "dev", l.hostVeth, "root")
	}

	// The server: this test binary again, in the namespace.
	caPath := filepath.Join(b.TempDir(), "server-ca.pem")
	server = exec.Command("ip", "netns", "exec", l.ns, os.Args[0], "-test.run=^$")
	server.Env = append(os.Environ(), linkServerEnv+"="+caPath)
	server.Stderr = os.Stderr
	if !l.netem {
		// The host's end of the TUN pair is made here (in the host's
		// namespace) and handed to the server, which makes the other end
		// in its own.
		tun, err := openTun(l.hostTun)
		if err != nil {
			mustwork.Skip(b, "the kernel has no netem qdisc and the user-space delay needs a TUN device: "+err.Error())
		}
		defer tun.Close()
		server.ExtraFiles = []*os.File{tun}
		server.Env = append(server.Env, linkTunEnv+"="+l.nsTun)
	}
	stdin, err := server.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close() })
	out, err := server.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := server.Start(); err != nil {
		b.Fatal(err)
	}
	l.ctlIn, l.ctlOut = stdin, bufio.NewReader(out)
	line, err := l.ctlOut.ReadString('\n')
	if err != nil || line != "ready\n" {
		b.Fatalf("the link server did not start: %q %v", line, err)
	}
	if !l.netem {
		run("ip", "addr", "add", tunHost.String(), "peer", l.tunServer.String()+"/32", "dev", l.hostTun)
		run("ip", "link", "set", l.hostTun, "mtu", "65000", "up")
		run("ip", "-n", l.ns, "addr", "add", l.tunServer.String(), "peer", tunHost.String()+"/32", "dev", l.nsTun)
		run("ip", "-n", l.ns, "link", "set", l.nsTun, "mtu", "65000", "up")
	}
	pemCA, err := os.ReadFile(caPath)
	if err != nil {
		b.Fatal(err)
	}
	serverRoots := x509.NewCertPool()
	if !serverRoots.AppendCertsFromPEM(pemCA) {
		b.Fatal("the link server's CA certificate does not parse")
	}

	// The proxy: api.test terminated (a credential), plain.test tunnelled;
	// it dials the server's address only.
	proxyCA, err := NewCA()
	if err != nil {
		b.Fatal(err)
	}
	ph, err := egress.NewPlaceholder()
	if err != nil {
		b.Fatal(err)
	}
	cred := egress.Credential{Name: "API_TOKEN", Hosts: []string{"api.test"}, Header: "Authorization", Format: "Bearer {value}",
		Value: egress.NewSecret([]byte(testSecret)), Placeholder: ph}
	want := []string{netip.AddrPortFrom(l.server, linkPort).String(), netip.AddrPortFrom(l.tunServer, linkPort).String()}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if !slices.Contains(want, addr) {
			b.Errorf("the proxy dialed %q, not the link server %s", addr, want)
			return nil, errors.New("link: refusing to dial " + addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}
	p := egress.Policy{Mode: egress.Restricted, AllowedHosts: []string{"api.test", "plain.test"}, AllowedPorts: []int{linkPort},
		AllowedCIDRs: []string{l.server.String() + "/32", l.tunServer.String() + "/32"}}
	ts := startSession(b, p, Options{
		Resolver:  linkResolver{l},
		Dialer:    dial,
		Intercept: &Interception{CA: proxyCA, Credentials: []egress.Credential{cred}, UpstreamRoots: serverRoots},
	})
	// The client trusts both CAs: one client configuration for all paths.
	roots := serverRoots.Clone()
	roots.AddCert(proxyCA.Certificate())
	l.f = &linkFixture{ts: ts, roots: roots, ph: ph}
	return l
}

// shape sets both ends' root qdisc for rate and one-way delay ("" rate:
// none) and returns the setting's name.
func (l *link) shape(b *testing.B, rate string, delay time.Duration) string {
	b.Helper()
	for _, dev := range [][]string{{"tc"}, {"tc", "-n", l.ns}} {
		veth := l.hostVeth
		if len(dev) > 1 {
			veth = l.nsVeth
		}
		_ = exec.Command(dev[0], append(dev[1:], "qdisc", "del", "dev", veth, "root")...).Run()
		if rate == "" {
			continue
		}
		var args []string
		if l.netem {
			args = []string{"qdisc", "add", "dev", veth, "root", "netem", "rate", rate, "delay", delay.String(), "limit", "10000"}
		} else {
			// burst above the largest GSO packet (64 KiB), so tbf never
			// splits one; the queue holds 20 ms.
			args = []string{"qdisc", "add", "dev", veth, "root", "tbf", "rate", rate, "burst", "128kb", "latency", "20ms"}
		}
		if out, err := exec.Command(dev[0], append(dev[1:], args...)...).CombinedOutput(); err != nil {
			b.Fatalf("tc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	l.cur.Store(l.server)
	switch {
	case rate == "":
		return "veth-unshaped"
	case l.netem:
		return rate + "-" + delay.String()
	default:
		return rate + "-nodelay"
	}
}

// shapeTun sets the TUN pair's rate (tbf, both ends) and the delay line's
// delay each way, makes the pair the current path and returns the
// setting's name.
func (l *link) shapeTun(b *testing.B, rate string, delay time.Duration) string {
	b.Helper()
	for _, dev := range [][]string{{"tc", "qdisc", "replace", "dev", l.hostTun}, {"tc", "-n", l.ns, "qdisc", "replace", "dev", l.nsTun}} {
		args := append(dev[1:], "root", "tbf", "rate", rate, "burst", "128kb", "latency", "20ms")
		if out, err := exec.Command(dev[0], args...).CombinedOutput(); err != nil {
			b.Fatalf("tc %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if _, err := fmt.Fprintf(l.ctlIn, "delay %s\n", delay); err != nil {
		b.Fatal(err)
	}
	if line, err := l.ctlOut.ReadString('\n'); err != nil || line != "ok\n" {
		b.Fatalf("the link server did not take the delay: %q %v", line, err)
	}
	l.cur.Store(l.tunServer)
	return rate + "-" + delay.String() + "-tun"
}

// paths are the three ways to the server, in the order of a round's
// first cell (rounds rotate it).
var linkPaths = []string{"direct", "terminated", "tunnel"}

// client is the same client code for every path: HTTP/2 offered, keep-alive
// on unless fresh; only the proxy setting differs.
func (l *link) client(path string, keepAlive bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: l.f.roots},
		ForceAttemptHTTP2: true,
		DisableKeepAlives: !keepAlive,
	}
	if path == "direct" {
		addr := netip.AddrPortFrom(l.cur.Load().(netip.Addr), linkPort).String()
		tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}
	} else {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: l.f.ts.proxy})
	}
	return &http.Client{Transport: tr}
}

func (l *link) url(path, p string) string {
	host := "api.test"
	if path == "tunnel" {
		host = "plain.test"
	}
	return "https://" + host + ":" + strconv.Itoa(linkPort) + p
}

// get fetches p over c and returns the time until the body's last byte.
func (l *link) get(b *testing.B, c *http.Client, path, p string, want int64) time.Duration {
	b.Helper()
	req, err := http.NewRequest("GET", l.url(path, p), nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+l.f.ph)
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		b.Fatalf("%s %s: %v", path, p, err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	d := time.Since(t0)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || want >= 0 && n != want {
		b.Fatalf("%s %s: status %d, %d bytes (want %d): %v", path, p, resp.StatusCode, n, want, err)
	}
	return d
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// download: one download of size per path per round, on kept-alive
// connections opened before timing.
func (l *link) download(b *testing.B, size int64) {
	clients := map[string]*http.Client{}
	for _, path := range linkPaths {
		clients[path] = l.client(path, true)
		l.get(b, clients[path], path, "/small", -1)
		defer clients[path].CloseIdleConnections()
	}
	p := "/bytes?n=" + strconv.FormatInt(size, 10)
	took := map[string][]time.Duration{}
	cpu := map[string]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range linkPaths {
			path := linkPaths[(i+j)%len(linkPaths)]
			c0 := cpuTime(b)
			took[path] = append(took[path], l.get(b, clients[path], path, p, size))
			cpu[path] += cpuTime(b) - c0
		}
	}
	b.StopTimer()
	// This process runs the client and the proxy (the server is another
	// process): a path's CPU time beyond direct's is the proxy's.
	perByte := func(path string) float64 {
		return float64(cpu[path]-cpu["direct"]) / float64(size) / float64(b.N)
	}
	b.ReportMetric(perByte("terminated"), "terminated-proxy-cpu-ns/B")
	b.ReportMetric(perByte("tunnel"), "tunnel-proxy-cpu-ns/B")
	mbps := func(path string) float64 { return float64(size) / p50(took[path]).Seconds() / 1e6 }
	for _, path := range linkPaths {
		b.ReportMetric(mbps(path), path+"-MB/s")
	}
	b.ReportMetric(mbps("terminated")/mbps("direct"), "terminated/direct")
	b.ReportMetric(mbps("tunnel")/mbps("direct"), "tunnel/direct")
}

// reusedPerRound is the number of small GETs on a reused connection per
// path and round (their p50 is steadier than one round's one).
const reusedPerRound = 5

// requests: per path and round, reusedPerRound small GETs on a reused
// connection and one on a new connection (both handshakes through the
// proxy; the leaf is cached after the warm-up).
func (l *link) requests(b *testing.B) {
	reused := map[string]*http.Client{}
	for _, path := range linkPaths {
		reused[path] = l.client(path, true)
		l.get(b, reused[path], path, "/small", -1)
		defer reused[path].CloseIdleConnections()
	}
	old, fresh := map[string][]time.Duration{}, map[string][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range linkPaths {
			path := linkPaths[(i+j)%len(linkPaths)]
			for range reusedPerRound {
				old[path] = append(old[path], l.get(b, reused[path], path, "/small", -1))
			}
			c := l.client(path, false)
			fresh[path] = append(fresh[path], l.get(b, c, path, "/small", -1))
			c.CloseIdleConnections()
		}
	}
	b.StopTimer()
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	for _, path := range linkPaths {
		b.ReportMetric(us(p50(old[path])), path+"-reused-µs")
	}
	b.ReportMetric(us(p50(old["terminated"])-p50(old["direct"])), "terminated-added-µs")
	for _, path := range linkPaths {
		b.ReportMetric(us(p50(fresh[path])), path+"-new-µs")
	}
	b.ReportMetric(float64(p50(fresh["terminated"]))/float64(p50(fresh["direct"])), "terminated/direct-new")
	b.ReportMetric(float64(p50(fresh["tunnel"]))/float64(p50(fresh["direct"])), "tunnel/direct-new")
}
