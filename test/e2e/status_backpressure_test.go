package e2e

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/broker"
)

// slowProxy forwards TCP connections to target, passing what the client
// sends at about rate bytes per second (what the target sends back is not
// slowed): a broker slower than a tool's status lines, as seen by the
// worker. Its pauses only slow the traffic; no assertion depends on them.
type slowProxy struct {
	ln     net.Listener
	target string
	rate   int

	mu    sync.Mutex
	conns []net.Conn
}

func startSlowProxy(t *testing.T, target string, rate int) *slowProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &slowProxy{ln: ln, target: target, rate: rate}
	go p.serve()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	return p
}

func (p *slowProxy) port() int { return p.ln.Addr().(*net.TCPAddr).Port }

func (p *slowProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		go func() { io.Copy(c, b); c.Close(); b.Close() }()
		go func() {
			defer c.Close()
			defer b.Close()
			const chunk = 16 << 10
			buf := make([]byte, chunk)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := b.Write(buf[:n]); werr != nil {
						return
					}
					time.Sleep(time.Duration(n) * time.Second / time.Duration(p.rate))
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

const backpressureTool = `
def status_lines(ctx, n=400, size=16384):
    pad = "s" * (int(size) - 7)
    for i in range(int(n)):
        ctx.send_status("%06d " % i + pad)
    return {"n": int(n)}
`

// Issue 15 §5 end to end: the real worker and sandbox, a tool writing
// 6.4 MB of status lines as fast as it can, and a broker that takes the
// worker's messages at 2 MB/s. The worker's 1 MiB status queue fills; it
// stops reading the tool's status pipe, the tool waits, and every line
// arrives, in order, none dropped (the old relay dropped what did not fit
// in the queue).
func TestStatusBackPressureEndToEnd(t *testing.T) {
	requireRoot(t)
	srv := broker.NewServer(broker.Options{Anonymous: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	must(t, srv.Listen("127.0.0.1:0"))
	t.Cleanup(func() { srv.Close() })
	proxy := startSlowProxy(t, srv.Addr().String(), 2<<20)

	e := newEnv(t)
	must(t, os.WriteFile(filepath.Join(e.tools, "bp_tools.py"), []byte(backpressureTool), 0o644))
	writeManifest(t, e.manifest, e2eManifest+"  status_lines: {module: bp_tools, function: status_lines}\n")
	w := startWorker(t, e, proxy.port(), nil)
	a := newAgent(t, srv.Addr().(*net.TCPAddr).Port)

	const n, size = 400, 16384
	id := a.invoke("status_lines", map[string]any{"args": map[string]any{"n": n, "size": size}})
	reply := a.reply(id, 5*time.Minute) // a liveness bound: 6.4 MB at 2 MB/s takes seconds
	if !strings.Contains(string(reply), `"tool_result":{"n":400}`) {
		t.Fatalf("reply %s", reply)
	}
	// The reply follows the last status line on one connection, and the
	// broker delivers in order: every line relayed is here.
	st := a.status(id)
	for i, s := range st {
		if want := fmt.Sprintf("%06d ", i); !strings.HasPrefix(s, want) || len(s) != size {
			t.Fatalf("status line %d: %.20q... (%d bytes), want %q... (%d bytes)", i, s, len(s), want, size)
		}
	}
	if len(st) != n {
		t.Fatalf("%d status lines arrived, want all %d (none dropped)\n%s", len(st), n, tail(w.log.String(), 20))
	}
	if strings.Contains(w.log.String(), "status lines dropped") {
		t.Fatalf("the worker dropped status lines:\n%s", tail(w.log.String(), 20))
	}
}
