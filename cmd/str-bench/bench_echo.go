package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

const benchEchoUsage = `usage: str-bench echo --broker HOST:PORT [-n N] [-c C] [--namespace NS] [--python PATH] [-o RAW] [--ready-from URL]

Against a running str worker (scripts/bench.sh starts one with the example
manifest and the embedded broker): sends N echo_tool invocations one after
another and reports publish-to-reply latency p50/p99, then N more with C in
flight and reports invocations per second; and, in the same run, N spawns of
PYTHON -c pass for comparison. Prints key=value lines; asserts nothing.
-o RAW appends the one-at-a-time latencies to RAW, one "lat_us" per line.

--ready-from URL (the worker's health address, http://HOST:PORT) paces the
one-at-a-time calls: each is sent once the worker's /metrics says every
pooled echo_tool sandbox is ready (str_worker_warm_pool_ready equals
str_worker_warm_pool_size, at least 1), so each call meets a warm pool at
rest; without it the calls go back to back and meet a pool still refilling
from the call before. The throughput phase is left out when pacing. Each
scrape costs the worker CPU (its /metrics page, ~0.4 ms on a 2-core VM),
so the pacing scrapes little: it first sleeps about as long as the last
wait took, then scrapes every 5 ms; the line printed says how many
scrapes were made (metrics_scrapes=), for whoever counts the worker's CPU.
`

// benchEcho measures the worker end to end, as an agent sees it.
func benchEcho(args []string, stdout io.Writer) int {
	fs := flag.NewFlagSet("bench echo", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, benchEchoUsage); fs.PrintDefaults() }
	brokerAddr := fs.String("broker", "127.0.0.1:55554", "dev broker `HOST:PORT`")
	ns := fs.String("namespace", "demo/", "SAM namespace of the worker")
	n := fs.Int("n", 100, "invocations per phase")
	conc := fs.Int("c", 4, "invocations in flight in the throughput phase")
	python := fs.String("python", "/usr/bin/python3", "interpreter for the python3 -c pass reference")
	rawPath := fs.String("o", "", "append the one-at-a-time latencies to `RAW` (lat_us per line)")
	readyFrom := fs.String("ready-from", "", "pace the one-at-a-time calls on the pool's readiness in `URL`/metrics")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	host, portStr, err := net.SplitHostPort(*brokerAddr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil || *n < 1 || *conc < 1 {
		fs.Usage()
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	client, err := devbroker.NewClient(devbroker.ClientOptions{Host: host, Port: port, ClientID: "str-bench-" + randomID(),
		Retries: 3, RetryDelay: 500 * time.Millisecond, ReceiveTimeout: 100 * time.Millisecond,
		TokenFile: broker.TokenFileFor(port), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		fmt.Fprintln(os.Stderr, "str-bench echo:", err)
		return 1
	}
	defer client.Close()
	base := worker.TopicBase(*ns)
	replyBase := base + "/sam_remote_tool/response/bench"
	if err := client.Connect(ctx, []string{replyBase + "/>"}); err != nil {
		fmt.Fprintln(os.Stderr, "str-bench echo: connect:", err)
		return 1
	}

	// One receive loop hands replies to whoever waits for that id.
	var mu sync.Mutex
	waiting := map[string]chan []byte{}
	go func() {
		for {
			d, err := client.Receive(ctx)
			if err != nil {
				return
			}
			var r struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(d.Payload, &r) == nil {
				mu.Lock()
				ch := waiting[r.ID]
				mu.Unlock()
				if ch != nil {
					ch <- d.Payload
				}
			}
		}
	}()
	invoke := func() (time.Duration, error) {
		id := randomID()
		ch := make(chan []byte, 1)
		mu.Lock()
		waiting[id] = ch
		mu.Unlock()
		defer func() { mu.Lock(); delete(waiting, id); mu.Unlock() }()
		payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": worker.MethodInvoke,
			"params": map[string]any{"task_id": "task-" + id, "tool_name": "echo_tool", "args": map[string]any{"message": "bench"},
				"app_name": "bench", "user_id": "bench-user", "session_id": "bench-session"}})
		t0 := time.Now()
		err := client.Publish(ctx, transport.Message{Topic: base + "/sam_remote_tool/invoke/echo_tool", Payload: payload,
			UserProperties: map[string]string{worker.PropReplyTo: replyBase + "/" + id, "clientId": "str-bench", "userId": "bench-user"}})
		if err != nil {
			return 0, err
		}
		select {
		case reply := <-ch:
			var r struct {
				Result *json.RawMessage `json:"result"`
			}
			if json.Unmarshal(reply, &r) != nil || r.Result == nil {
				return 0, fmt.Errorf("not a success: %s", reply)
			}
			return time.Since(t0), nil
		case <-time.After(60 * time.Second):
			return 0, fmt.Errorf("no reply to %s within 60 s", id)
		}
	}

	// 1. Latency, one at a time (after a few unmeasured warm-ups).
	for i := 0; i < 3; i++ {
		if _, err := invoke(); err != nil {
			fmt.Fprintln(os.Stderr, "str-bench echo: warm-up:", err)
			return 1
		}
	}
	var lat []time.Duration
	pacer := &benchPacer{base: *readyFrom, tool: "echo_tool"}
	for i := 0; i < *n; i++ {
		if *readyFrom != "" {
			if err := pacer.wait(ctx); err != nil {
				fmt.Fprintln(os.Stderr, "str-bench echo:", err)
				return 1
			}
		}
		d, err := invoke()
		if err != nil {
			fmt.Fprintln(os.Stderr, "str-bench echo:", err)
			return 1
		}
		lat = append(lat, d)
	}
	if *rawPath != "" {
		if err := benchWriteLatencies(*rawPath, lat); err != nil {
			fmt.Fprintln(os.Stderr, "str-bench echo:", err)
			return 1
		}
	}
	// 2. Throughput with C in flight (not when pacing: that measures the
	// pool at rest, this one the pool under load).
	var failed int
	throughput := fmt.Sprintf(" paced=ready metrics_scrapes=%d", pacer.scrapes)
	if *readyFrom == "" {
		t0 := time.Now()
		var wg sync.WaitGroup
		jobs := make(chan struct{})
		for w := 0; w < *conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range jobs {
					if _, err := invoke(); err != nil {
						mu.Lock()
						failed++
						mu.Unlock()
					}
				}
			}()
		}
		for i := 0; i < *n; i++ {
			jobs <- struct{}{}
		}
		close(jobs)
		wg.Wait()
		rate := float64(*n-failed) / time.Since(t0).Seconds()
		throughput = fmt.Sprintf(" invocations_per_s=%.1f concurrency=%d", rate, *conc)
	}

	// 3. The reference: python3 -c pass, spawned the same number of times.
	var py []time.Duration
	for i := 0; i < *n; i++ {
		t := time.Now()
		if err := exec.Command(*python, "-c", "pass").Run(); err != nil {
			fmt.Fprintln(os.Stderr, "str-bench echo:", *python, err)
			return 1
		}
		py = append(py, time.Since(t))
	}
	pct := func(d []time.Duration, p float64) float64 {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
	}
	fmt.Fprintf(stdout, "echo_p50_ms=%.2f echo_p99_ms=%.2f python_p50_ms=%.2f python_p99_ms=%.2f ratio_p50=%.2f%s failed=%d n=%d\n",
		pct(lat, 0.5), pct(lat, 0.99), pct(py, 0.5), pct(py, 0.99), pct(lat, 0.5)/pct(py, 0.5), throughput, failed, *n)
	return 0
}

// benchPacer sends each paced call once the pool is ready again, with as
// few scrapes of the worker's /metrics as it can (one or two per call):
// every scrape is work of the worker's, counted in the cell's worker CPU
// per call (polled every 2 ms it was 10-13 scrapes, 4-9 ms, per call:
// more than a warm call's own difference to a cold one).
type benchPacer struct {
	base, tool string
	expect     time.Duration // slept before the first scrape
	scrapes    int           // made so far
}

// wait returns once every pooled sandbox of the tool is ready. When the
// first scrape finds it ready, the sleep may have been longer than
// needed and the next one is shorter; otherwise the next sleep is this
// whole wait.
func (p *benchPacer) wait(ctx context.Context) error {
	t0 := time.Now()
	if p.expect > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.expect):
		}
	}
	n, err := benchWaitPoolReady(ctx, p.base, p.tool)
	p.scrapes += n
	if n == 1 {
		p.expect = p.expect * 9 / 10
	} else {
		p.expect = time.Since(t0)
	}
	return err
}

// benchWaitPoolReady polls base/metrics every 5 ms until every pooled
// sandbox of tool is ready (str_worker_warm_pool_ready equals
// str_worker_warm_pool_size, at least 1), for at most a minute. It
// returns the number of scrapes made.
func benchWaitPoolReady(ctx context.Context, base, tool string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t0 := time.Now()
	ready, size := `str_worker_warm_pool_ready{tool="`+tool+`"}`, `str_worker_warm_pool_size{tool="`+tool+`"}`
	last := "no scrape"
	for scrapes := 1; ; scrapes++ {
		page, err := benchScrapeMetrics(ctx, base)
		switch {
		case err != nil && ctx.Err() != nil:
			// our own deadline cut it short: keep what the last scrape said
		case err != nil:
			last = err.Error()
		default:
			v := benchMetricValues(page, ready, size)
			if r, ok := v[ready]; ok && r >= 1 && r == v[size] {
				return scrapes, nil
			}
			last = fmt.Sprintf("%s %v, %s %v", ready, v[ready], size, v[size])
		}
		select {
		case <-ctx.Done():
			return scrapes, fmt.Errorf("the warm pool of %s at %s was not ready after %s: %w (last: %s)", tool, base, time.Since(t0).Round(time.Millisecond), ctx.Err(), last)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// benchScrapeMetrics returns a worker's /metrics page (at most 4 MiB);
// base is its health address, http://HOST:PORT.
func benchScrapeMetrics(ctx context.Context, base string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s/metrics: %s", base, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 4<<20))
}

// benchMetricValues returns the values of the named samples (name with
// labels, as printed) in a Prometheus text page; absent ones are left out.
func benchMetricValues(page []byte, samples ...string) map[string]float64 {
	out := map[string]float64{}
	for l := range strings.Lines(string(page)) {
		name, value, ok := strings.Cut(strings.TrimSpace(l), " ")
		if !ok || !slices.Contains(samples, name) {
			continue
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out
}
