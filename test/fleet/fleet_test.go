// Package fleet_test runs several workers on one broker, in containers on
// a private network, and breaks the fleet while it serves: the
// horizontal-scaling test of make test-container (issue 17 §4).
//
// The fleet: a dev broker (`str broker`, the worker image with no
// privilege at all) and three workers (the image with the least
// privileges of docs/deployment.md) on a private docker network, each on
// its own address; the workers join one queue group
// (DEV_BROKER_POOL_NAME), so each call goes to one of them. The caller is
// this test, on the host, through the broker's port published on
// 127.0.0.1.
//
// The run: calls to `record` (fleetTool) with a bounded number in flight;
// a quarter of the way in, `docker stop` one worker; later, `docker
// network disconnect` another; then `docker start` the first and
// `docker network connect` the second. What it shows:
//   - every call is answered exactly once (a result, or an error reply with
//     its code), or is reported lost with what the records say about it;
//   - no call ran twice: each run of the tool saves an artifact named after
//     its call in the store the workers share (an S3 bucket: versitygw in
//     a container of its own on the fleet's network, ARTIFACT_SERVICE_TYPE=s3,
//     its posix directory on the host), so the store's versions count the
//     runs, independently of the replies;
//   - the store is shared: an artifact one worker saved is loaded by a call
//     that another worker runs (read_record);
//   - the fleet recovers by itself: after the faults, calls go on until
//     every one of the three workers has served some (the tool reports
//     which worker ran it).
//
// No timing is asserted: the calls in flight are bounded by count, the
// faults come after a number of calls, and the waits are generous guards.
package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/securetoolruntime/str/internal/objstoretest"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"

	"github.com/securetoolruntime/str/test/internal/enginetest"
)

// The helpers every engine test shares.
var (
	docker    = enginetest.Docker
	firstLine = enginetest.FirstLine
)

// need skips (or, with STR_MUST_WORK=1, fails) when the test cannot run
// here, naming what is missing (enginetest.Need).
func need(t *testing.T) string {
	t.Helper()
	enginetest.Need(t, enginetest.Needs{Area: "fleet", WhyRoot: "the containers' root writes the host dirs the test reads, and the test talks to the docker daemon"})
	return os.Getenv("STR_IMAGE")
}

// The run's size and its faults, by call number.
const (
	calls      = 1000
	inFlight   = 40  // calls published and not yet answered, at most (lost ones excepted)
	stopAt     = 250 // docker stop workers[0]
	cutAt      = 400 // docker network disconnect workers[1]
	restartAt  = 600 // docker start workers[0]
	reattachAt = 750 // docker network connect workers[1]
	// finalBatch calls at a time after the run, until every worker has
	// served one (at most finalRounds batches).
	finalBatch  = 30
	finalRounds = 10
	// quiet ends a wait for replies: this long without any reply while
	// calls are open means the rest are lost (a guard, not a measure:
	// on a loaded machine replies come many times a second).
	quiet = 45 * time.Second
)

const (
	namespace = "fleet/"
	pool      = "fleet"
	app       = "strfleet-agent"
	user      = "fleet-user"
	session   = "fleet-session"
	tool      = "record"
)

// The tool's module, one copy per worker with its own name in WORKER: the
// manifest is the same everywhere, the reply names the worker that ran it.
// The artifact is the run's record (see the package doc).
const fleetTool = `WORKER = %q


def record(ctx, call):
    """Records this run in the shared artifact store and says who ran it."""
    ctx.save_artifact("exec-%%s.txt" %% call, ("%%s %%s\n" %% (call, WORKER)).encode())
    return {"fleet_call": call, "fleet_worker": WORKER}


def read_record(ctx, prior):
    """Returns a record another call saved (an input artifact) and who read it."""
    return {"fleet_worker": WORKER, "fleet_read": ctx.load_artifact_text("prior")}
`

const fleetManifest = `version: 1
tools:
  record:
    module: fleet_tools
    function: record
    description: "Saves exec-CALL.txt and returns the worker's name"
    timeout_seconds: 60
    warm: 2
  read_record:
    module: fleet_tools
    function: read_record
    description: "Loads a record (the input artifact prior) and returns it with the worker's name"
    timeout_seconds: 60
`

// waitFor polls cond until it holds or the (generous) deadline passes.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for time.Now().Before(deadline) {
		ok, detail := cond()
		if ok {
			return
		}
		last = detail
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("%s: not after %v; last: %s", what, limit, last)
}

// fleet is the running containers.
type fleet struct {
	t       *testing.T
	image   string
	root    string // the repository
	dir     string // host dirs: state (token), artifacts, tools-<worker>
	prefix  string // of every container and the network
	network string
	broker  string   // container name
	workers []string // container names; the worker's name is its SAM_WORKER_ID
	extra   []string // other containers (the S3 store)
}

func (f *fleet) workerName(i int) string { return fmt.Sprintf("w%d", i+1) }

func TestFleet(t *testing.T) {
	image := need(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, image: image, root: root, dir: t.TempDir(), prefix: fmt.Sprintf("strfleet-%d", os.Getpid())}
	f.start()
	addr := f.brokerAddr()
	c := newCaller(t, addr, filepath.Join(f.dir, "state", "broker.token"))
	defer c.client.Close()

	// 1. The run, with its faults.
	var stopped sync.WaitGroup
	faults := map[int]func(){
		stopAt: func() {
			t.Logf("call %d: docker stop %s", stopAt, f.workers[0])
			stopped.Add(1)
			go func() { // the worker drains for up to its grace: the calls go on meanwhile
				defer stopped.Done()
				if out, err := exec.Command("docker", "stop", "-t", "60", f.workers[0]).CombinedOutput(); err != nil {
					t.Errorf("docker stop %s: %v\n%s", f.workers[0], err, out)
				}
			}()
		},
		cutAt: func() {
			t.Logf("call %d: docker network disconnect %s", cutAt, f.workers[1])
			docker(t, "network", "disconnect", f.network, f.workers[1])
		},
		restartAt: func() {
			stopped.Wait()
			t.Logf("call %d: docker start %s", restartAt, f.workers[0])
			docker(t, "start", f.workers[0])
		},
		reattachAt: func() {
			t.Logf("call %d: docker network connect %s", reattachAt, f.workers[1])
			docker(t, "network", "connect", f.network, f.workers[1])
		},
	}
	for i := range calls {
		if fault := faults[i]; fault != nil {
			fault()
		}
		c.invoke(fmt.Sprintf("c%04d", i))
	}
	// Every call answered, or lost: a call held by a worker when it was
	// cut off gets no reply; the wait ends once nothing has come back for
	// a long while.
	c.settle(c.sent, quiet)

	// 2. Recovery: without anyone acting on the fleet, every worker
	// serves again.
	served := map[string]int{}
	for round := 0; round < finalRounds && len(served) < len(f.workers); round++ {
		var ids []string
		for i := range finalBatch {
			id := fmt.Sprintf("f%02d-%02d", round, i)
			ids = append(ids, id)
			c.invoke(id)
		}
		c.settle(ids, quiet)
		for _, id := range ids {
			if r := c.result(id); r.worker != "" {
				served[r.worker]++
			}
		}
	}

	// 3. The store is shared: records saved by one worker, loaded by
	// calls another worker runs (each read names its reader and returns
	// the record, which names its writer).
	written := map[string]string{} // call -> the worker that saved its record
	for _, id := range c.sent {
		if r := c.result(id); r.code == "" && r.worker != "" && r.replies == 1 {
			written[id] = r.worker
		}
	}
	var prior []string
	for id := range written {
		prior = append(prior, id)
	}
	sort.Strings(prior)
	crossReads := 0
	for round := 0; round < finalRounds && crossReads == 0 && len(prior) > 0; round++ {
		var ids []string
		for i := range finalBatch {
			from := prior[(round*finalBatch+i)%len(prior)]
			id := fmt.Sprintf("r%02d-%02d", round, i)
			ids = append(ids, id)
			c.invokeTool(id, "read_record", map[string]any{},
				map[string]any{"prior": map[string]any{"filename": "exec-" + from + ".txt", "version": 0}})
			c.mu.Lock()
			c.results[id].from = from
			c.mu.Unlock()
		}
		c.settle(ids, quiet)
		for _, id := range ids {
			r := c.result(id)
			switch want := r.from + " " + written[r.from] + "\n"; {
			case r.replies == 0:
				t.Logf("read %s of %s: no reply", id, r.from)
			case r.code != "":
				t.Errorf("read %s of %s's record: %s: %s", id, r.from, r.code, r.message)
			case r.read != want:
				t.Errorf("read %s by %s of %s's record: %q, want %q (saved by %s)", id, r.worker, r.from, r.read, want, written[r.from])
			case r.worker != written[r.from]:
				crossReads++
			}
		}
	}
	if crossReads == 0 {
		t.Errorf("no record saved by one worker was read by a call on another (%d records)", len(written))
	}
	t.Logf("FIGURES: %d records read by a worker other than the one that saved them", crossReads)

	// 4. The records: runs per call, from the artifact store.
	runs := f.runs()

	// 5. The verdict, per call.
	var ok, failed, lost, twiceAnswered, twiceRun int
	codes := map[string]int{}
	for _, id := range c.sent {
		r := c.result(id)
		if r.from != "" {
			continue // a read, checked above
		}
		n := runs[id]
		switch {
		case r.replies > 1:
			twiceAnswered++
			t.Errorf("call %s answered %d times", id, r.replies)
		case r.replies == 0:
			lost++
			t.Logf("call %s lost: no reply; %s", id, lostReason(n))
		case r.code != "":
			failed++
			codes[r.code]++
			t.Logf("call %s answered with an error: %s: %s (store: %d runs)", id, r.code, r.message, n)
		default:
			ok++
			if n != 1 {
				t.Errorf("call %s answered with a result by %s but the store holds %d runs of it", id, r.worker, n)
			}
		}
		if n > 1 {
			twiceRun++
			t.Errorf("call %s ran %d times (the store holds %d versions of exec-%s.txt)", id, n, n, id)
		}
	}
	t.Logf("FIGURES: %d calls (%d in the run, %d after it), %d answered with a result, %d with an error %v, %d lost; answered twice: %d; ran twice: %d; after the faults served by %v",
		len(c.sent), calls, len(c.sent)-calls, ok, failed, codes, lost, twiceAnswered, twiceRun, served)
	for i := range f.workers {
		if served[f.workerName(i)] == 0 {
			t.Errorf("worker %s served none of the calls after the faults (%v)", f.workerName(i), served)
		}
	}
	for id, n := range runs {
		if _, sent := c.results[id]; !sent {
			t.Errorf("the store holds %d runs of %s, a call never sent", n, id)
		}
	}
	if t.Failed() {
		f.dumpLogs()
	}
}

// lostReason says what the records show about a call that got no reply.
func lostReason(runs int) string {
	if runs == 0 {
		return "it never ran (taken by a worker that was stopped or cut off before running it, or never delivered)"
	}
	return fmt.Sprintf("it ran %d time(s), but its reply never came back (its worker was cut off or stopped meanwhile; a worker gives a reply up, logging \"reply lost\", once the call's timeout + 5 s have passed)", runs)
}

// start creates the network, the broker and the workers, and waits until
// every worker is ready.
func (f *fleet) start() {
	t := f.t
	f.network = f.prefix + "-net"
	f.broker = f.prefix + "-broker"
	state := filepath.Join(f.dir, "state")
	art := filepath.Join(f.dir, "artifacts")
	for _, d := range []string{state, art, filepath.Join(art, objstoretest.Bucket)} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, c := range append(append([]string{f.broker}, f.workers...), f.extra...) {
			_ = exec.Command("docker", "rm", "-f", c).Run()
		}
		_ = exec.Command("docker", "network", "rm", f.network).Run()
	})
	docker(t, "network", "create", "--driver", "bridge", f.network)

	// The broker: no capability, read-only root, its token on the state
	// dir the workers (and this test) read.
	docker(t, "run", "-d", "--name", f.broker, "--network", f.network,
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
		"-v", state+":/state", "-p", "127.0.0.1::55555",
		"--entrypoint", "/usr/local/bin/str", f.image,
		"broker", "--listen", "0.0.0.0:55555", "--token-file", "/state/broker.token")
	waitFor(t, "broker token", time.Minute, func() (bool, string) {
		_, err := os.Stat(filepath.Join(state, "broker.token"))
		return err == nil, fmt.Sprint(err)
	})

	// The S3 store: versitygw (make test-tools builds it on the host: it
	// runs in the worker image, which has the same libc), no privilege, its
	// posix directory on the host (a bucket is a directory, an object a
	// file at its key), on the fleet's network only.
	gw := objstoretest.Tool(t, "versitygw", objstoretest.VersitygwSpec)
	s3 := f.prefix + "-s3"
	f.extra = append(f.extra, s3)
	docker(t, "run", "-d", "--name", s3, "--network", f.network,
		"--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--read-only",
		"-v", gw+":/usr/local/bin/versitygw:ro", "-v", art+":/data",
		"--entrypoint", "/usr/local/bin/versitygw", f.image,
		"--port", ":7070", "--access", objstoretest.S3Access, "--secret", objstoretest.S3Secret, "posix", "/data")
	// The workers check the bucket at start-up: the store listens first.
	waitFor(t, "the S3 store listening", time.Minute, func() (bool, string) {
		out, err := exec.Command("docker", "exec", s3, "python3", "-c",
			"import socket; socket.create_connection(('127.0.0.1', 7070), 5)").CombinedOutput()
		return err == nil, string(out)
	})

	// The workers: the least privileges (docs/deployment.md), one pool,
	// one artifact store (the bucket), each its own copy of the tools.
	for i := range 3 {
		name := f.workerName(i)
		tools := filepath.Join(f.dir, "tools-"+name)
		if err := os.MkdirAll(filepath.Join(tools, "python"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tools, "manifest.yaml"), []byte(fleetManifest), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tools, "python", "fleet_tools.py"), []byte(fmt.Sprintf(fleetTool, name)), 0o644); err != nil {
			t.Fatal(err)
		}
		c := f.prefix + "-" + name
		f.workers = append(f.workers, c)
		docker(t, "run", "-d", "--name", c, "--network", f.network,
			"--cap-add", "SYS_ADMIN",
			"--security-opt", "seccomp="+filepath.Join(f.root, "deploy/docker/seccomp.json"),
			"--security-opt", "systempaths=unconfined",
			"--cgroupns", "private",
			"-e", "SAM_NAMESPACE="+namespace, "-e", "SAM_WORKER_ID="+name, "-e", "DEV_BROKER_POOL_NAME="+pool,
			"-e", "DEV_BROKER_HOST="+f.broker, "-e", "DEV_BROKER_PORT=55555",
			"-e", "DEV_BROKER_TOKEN_FILE=/state/broker.token",
			"-e", "ARTIFACT_SERVICE_TYPE=s3", "-e", "ARTIFACT_S3_BUCKET="+objstoretest.Bucket, "-e", "S3_ENDPOINT_URL=http://"+s3+":7070",
			"-e", "AWS_ACCESS_KEY_ID="+objstoretest.S3Access, "-e", "AWS_SECRET_ACCESS_KEY="+objstoretest.S3Secret, "-e", "AWS_REGION=us-east-1",
			"-v", tools+":/tools:ro", "-v", state+":/state:ro",
			"--entrypoint", "/usr/local/bin/str-container-worker", f.image)
	}
	for _, c := range f.workers {
		f.waitReady(c)
	}
}

// waitReady waits until worker container c answers /readyz with 200
// (connected to the broker, past its start-up probe).
func (f *fleet) waitReady(c string) {
	t := f.t
	waitFor(t, c+" ready", 3*time.Minute, func() (bool, string) {
		if st := docker(t, "inspect", "-f", "{{.State.Status}}", c); st != "running" {
			out, _ := exec.Command("docker", "logs", "--tail", "20", c).CombinedOutput()
			t.Fatalf("container %s %s while starting:\n%s", c, st, out)
		}
		out, err := exec.Command("docker", "exec", c, "python3", "-c",
			"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8081/readyz', timeout=5).status)").CombinedOutput()
		return err == nil && strings.TrimSpace(string(out)) == "200", string(out)
	})
}

func (f *fleet) brokerAddr() string {
	return firstLine([]byte(docker(f.t, "port", f.broker, "55555/tcp")))
}

// runs counts, per call, the versions of exec-CALL.txt in the shared
// bucket (keys {namespace}/{user}/{session}/{filename}/{N}, files of the
// S3 store's posix directory): one per run that saved it.
func (f *fleet) runs() map[string]int {
	dir := filepath.Join(f.dir, "artifacts", objstoretest.Bucket, strings.Trim(namespace, "/"), user, session)
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		f.t.Fatal(err)
	}
	runs := map[string]int{}
	for _, e := range entries {
		id, ok := strings.CutPrefix(e.Name(), "exec-")
		if !ok {
			continue
		}
		id = strings.TrimSuffix(id, ".txt")
		versions, err := os.ReadDir(filepath.Join(dir, e.Name()))
		if err != nil {
			f.t.Fatal(err)
		}
		for _, v := range versions {
			if _, err := strconv.Atoi(v.Name()); err == nil {
				runs[id]++
			}
		}
	}
	return runs
}

func (f *fleet) dumpLogs() {
	for _, c := range append([]string{f.broker}, f.workers...) {
		out, _ := exec.Command("docker", "logs", "--tail", "60", c).CombinedOutput()
		f.t.Logf("%s (last lines):\n%s", c, out)
	}
}

// caller is the agent: it publishes calls and collects their replies.
type caller struct {
	t       *testing.T
	client  *devbroker.Client
	mu      sync.Mutex
	sent    []string
	results map[string]*result
	answers chan struct{} // one per reply
}

type result struct {
	replies int
	code    string // the error reply's code; "" for a result
	message string // the error reply's message
	worker  string // who ran it (fleet_worker in the result)
	from    string // read_record: the call whose record it loads
	read    string // read_record: the record (fleet_read in the result)
	overdue bool   // open when the replies stopped for a long while: no longer counted in flight
}

func newCaller(t *testing.T, addr, tokenFile string) *caller {
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("broker address %q: %v", addr, err)
	}
	port, _ := strconv.Atoi(portText)
	client, err := devbroker.NewClient(devbroker.ClientOptions{Host: host, Port: port, ClientID: app,
		TokenFile: tokenFile, RetryDelay: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	base := worker.TopicBase(namespace)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := client.Connect(ctx, []string{base + "/sam_remote_tool/response/" + app + "/>"}); err != nil {
		t.Fatal(err)
	}
	c := &caller{t: t, client: client, results: map[string]*result{}, answers: make(chan struct{}, 4096)}
	go c.receive()
	return c
}

func (c *caller) receive() {
	for {
		d, err := c.client.Receive(context.Background())
		if err != nil {
			return
		}
		id := d.Topic[strings.LastIndex(d.Topic, "/")+1:]
		var reply struct {
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Code    any    `json:"code"`
				Message string `json:"message"`
				Data    any    `json:"data"`
			} `json:"error"`
		}
		err = json.Unmarshal(d.Payload, &reply)
		c.mu.Lock()
		r := c.results[id]
		if r == nil {
			c.mu.Unlock()
			c.t.Errorf("a reply to %s, a call never sent: %s", d.Topic, d.Payload)
			continue
		}
		r.replies++
		switch {
		case err != nil:
			r.code = "UNDECODABLE_REPLY"
		case reply.Error != nil:
			r.code, r.message = fmt.Sprint(reply.Error.Code), reply.Error.Message
			if data, _ := json.Marshal(reply.Error.Data); bytes.Contains(data, []byte("error_code")) {
				var dd struct {
					Code string `json:"error_code"`
				}
				json.Unmarshal(data, &dd)
				if dd.Code != "" {
					r.code = dd.Code
				}
			}
		default:
			r.worker, r.read = findString(reply.Result, "fleet_worker"), findString(reply.Result, "fleet_read")
			if r.worker == "" {
				r.code = "RESULT_WITHOUT_WORKER: " + string(d.Payload)
			}
		}
		c.mu.Unlock()
		c.answers <- struct{}{}
	}
}

// findString returns the string value of the first key named key anywhere
// in the JSON value raw.
func findString(raw json.RawMessage, key string) string {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	var walk func(any) string
	walk = func(v any) string {
		switch x := v.(type) {
		case map[string]any:
			if s, ok := x[key].(string); ok {
				return s
			}
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if s := walk(x[k]); s != "" {
					return s
				}
			}
		case []any:
			for _, e := range x {
				if s := walk(e); s != "" {
					return s
				}
			}
		case string:
			// A tool's result may arrive as JSON text.
			if strings.Contains(x, key) {
				return findString(json.RawMessage(x), key)
			}
		}
		return ""
	}
	return walk(v)
}

func (c *caller) result(id string) result {
	c.mu.Lock()
	defer c.mu.Unlock()
	return *c.results[id]
}

// inFlight is the number of calls sent, not answered and not overdue.
func (c *caller) inFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.results {
		if r.replies == 0 && !r.overdue {
			n++
		}
	}
	return n
}

// invoke publishes call id once fewer than inFlight calls wait for their
// reply.
func (c *caller) invoke(id string) {
	t := c.t
	for c.inFlight() >= inFlight {
		select {
		case <-c.answers:
		case <-time.After(20 * time.Second):
			// No reply for a long while: the calls still open are held
			// by a worker that is down. They stop counting as in
			// flight, so they do not hold the run up (they are counted
			// at the end).
			c.mu.Lock()
			open := 0
			for _, r := range c.results {
				if r.replies == 0 {
					r.overdue = true
					open++
				}
			}
			c.mu.Unlock()
			t.Logf("no reply for 20 s with %d calls open: they no longer count as in flight", open)
		}
	}
	c.invokeTool(id, tool, map[string]any{"call": id}, nil)
}

// invokeTool publishes call id of a tool with its args and input
// artifacts (artifact_references, nil for none).
func (c *caller) invokeTool(id, tool string, args, refs map[string]any) {
	t := c.t
	base := worker.TopicBase(namespace)
	params := map[string]any{"task_id": "task-" + id, "tool_name": tool, "app_name": app, "user_id": user,
		"session_id": session, "args": args}
	if refs != nil {
		params["artifact_references"] = refs
	}
	payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": worker.MethodInvoke, "params": params})
	m := transport.Message{Topic: base + "/sam_remote_tool/invoke/" + tool, Payload: payload, UserProperties: map[string]string{
		worker.PropReplyTo:   base + "/sam_remote_tool/response/" + app + "/" + id,
		worker.PropStatusTo:  base + "/sam_remote_tool/status/" + app + "/" + id,
		worker.PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10),
		worker.PropClientID:  app, worker.PropUserID: user,
	}}
	c.mu.Lock()
	c.sent = append(c.sent, id)
	c.results[id] = &result{}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.client.Publish(ctx, m); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
}

// settle waits until every call of ids is answered, or no reply has come
// for quiet (the rest are lost).
func (c *caller) settle(ids []string, quiet time.Duration) {
	open := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		n := 0
		for _, id := range ids {
			if c.results[id].replies == 0 {
				n++
			}
		}
		return n
	}
	for open() > 0 {
		select {
		case <-c.answers:
		case <-time.After(quiet):
			c.t.Logf("%d of %d calls unanswered after %v without a reply", open(), len(ids), quiet)
			return
		}
	}
}
