package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

const toolsUsage = `usage: str tools [flags]

Lists the tools the str workers of a namespace serve: each tool's profile
ceiling (a call runs with it or a stricter profile), network policy, warm
pool size and timeout bound, and why a tool cannot work when it cannot.
It publishes one request on {namespace}/a2a/v1/str/v1/tools/request (str's
own topic, not the reference's) and collects the answers for --wait; every
str worker answers (workers sharing a queue name answer once). Reference
workers do not answer. The broker and its token are found as by str invoke
(see str invoke --help).

Exit status: 0 at least one worker answered, 1 none did (or the broker
could not be reached), 2 usage error.

`

// toolsWait is how long str tools collects answers by default.
const toolsWait = 2 * time.Second

// brokerTarget is where str invoke and str tools connect: host, port and
// the token file (the flag's, else the port's default).
type brokerTarget struct {
	addr, host string
	port       int
	tokenFile  string
}

// resolveBroker checks --broker and --token-file; problems are usage
// errors.
func resolveBroker(addr, tokenFile string) (brokerTarget, []string) {
	var problems []string
	b := brokerTarget{addr: addr, tokenFile: tokenFile}
	host, portStr, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil {
		problems = append(problems, fmt.Sprintf("--broker %q: want host:port", addr))
	}
	b.host, b.port = host, port
	if tokenFile != "" {
		if _, err := os.Stat(tokenFile); err != nil {
			problems = append(problems, fmt.Sprintf("--token-file: %v", err))
		}
	} else if err == nil && perr == nil {
		b.tokenFile = broker.DefaultTokenFile(port)
	}
	return b, problems
}

// connect opens a client subscribed to subs; the error says where the
// token was looked for when the broker wants one.
func (b brokerTarget) connect(ctx context.Context, clientID string, subs []string) (*devbroker.Client, error) {
	client, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: b.host, Port: b.port, ClientID: clientID, Retries: 1, RetryDelay: 500 * time.Millisecond,
		ReceiveTimeout: 200 * time.Millisecond, TokenFile: b.tokenFile,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	if err := client.Connect(ctx, subs); err != nil {
		client.Close()
		err = fmt.Errorf("connect to %s: %w", b.addr, err)
		var be *devbroker.BrokerError
		switch {
		case errors.As(err, &be) && strings.Contains(be.Message, "token"):
			err = fmt.Errorf("%w\nthe broker wants its token; looked in %s (--token-file, %s)", err, b.tokenFile, broker.TokenFileEnv)
		case errors.Is(err, syscall.ECONNREFUSED):
			err = fmt.Errorf("%w\nnothing listens on %s: no broker, nor a worker with its embedded broker, runs there; start one with make run "+
				"(a worker with the embedded broker on 127.0.0.1:55554; make run BROKER_PORT=N for another port), "+
				"or name the running one with --broker or DEV_BROKER_HOST and DEV_BROKER_PORT", err, b.addr)
		}
		return nil, err
	}
	return client, nil
}

// toolsRequest is the tools request message answered on replyTo, signed
// when secret is set.
func toolsRequest(namespace, replyTo, secret string) transport.Message {
	m := transport.Message{Topic: worker.ToolsRequestTopic(namespace), Payload: []byte(`{}`),
		UserProperties: map[string]string{worker.PropReplyTo: replyTo, worker.PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10)}}
	if secret != "" {
		worker.SignMessage(secret, &m, time.Now())
	}
	return m
}

// decodeToolsReply reads one worker's answer.
func decodeToolsReply(payload []byte) (worker.ToolsReply, error) {
	var r worker.ToolsReply
	if err := json.Unmarshal(payload, &r); err != nil {
		return r, fmt.Errorf("a tools reply that is not JSON: %w", err)
	}
	if r.Version != worker.ToolsReplyVersion {
		return r, fmt.Errorf("a tools reply of version %d (this str reads version %d)", r.Version, worker.ToolsReplyVersion)
	}
	return r, nil
}

// servedTools is the sorted names of the tools the answers list as
// serving (not unavailable), and whether any answer lists tool at all (a
// worker that lists it as unavailable answers its calls itself, with
// TOOL_NOT_AVAILABLE and the reason).
func servedTools(replies []worker.ToolsReply, tool string) ([]string, bool) {
	seen := map[string]bool{}
	listed := false
	for _, r := range replies {
		for _, ti := range r.Tools {
			listed = listed || ti.Name == tool
			if ti.Unavailable == "" {
				seen[ti.Name] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, listed
}

// printTools writes one line per tool and distinct description; workers
// that describe a tool alike share its line.
func printTools(w io.Writer, replies []worker.ToolsReply) {
	type row struct {
		info    worker.ToolInfo
		workers []string
	}
	rows := map[string]*row{}
	var keys []string
	for _, r := range replies {
		for _, ti := range r.Tools {
			k, _ := json.Marshal(ti)
			if rows[string(k)] == nil {
				rows[string(k)] = &row{info: ti}
				keys = append(keys, string(k))
			}
			rows[string(k)].workers = append(rows[string(k)].workers, r.WorkerID)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := rows[keys[i]].info, rows[keys[j]].info
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return keys[i] < keys[j]
	})
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tPROFILE\tNETWORK\tWARM\tTIMEOUT\tWORKERS\tSTATUS")
	for _, k := range keys {
		r := rows[k]
		netw := string(r.info.Network)
		if len(r.info.AllowedHosts) > 0 {
			netw += " (" + strings.Join(r.info.AllowedHosts, ",") + ")"
		}
		status := "serving"
		if r.info.Unavailable != "" {
			status = "unavailable: " + r.info.Unavailable
		}
		sort.Strings(r.workers)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%ds+5s\t%s\t%s\n", r.info.Name, r.info.Profile, netw, r.info.Warm,
			r.info.TimeoutSeconds, strings.Join(r.workers, ","), status)
	}
	tw.Flush()
}

func cmdTools(args []string) int {
	fs := flag.NewFlagSet("str tools", flag.ContinueOnError)
	var (
		brokerAddr = fs.String("broker", defaultBroker(os.Getenv), "dev broker host:port [DEV_BROKER_HOST/PORT]")
		namespace  = fs.String("namespace", envOr("SAM_NAMESPACE", "demo/"), "namespace [SAM_NAMESPACE]")
		tokenFile  = fs.String("token-file", os.Getenv(broker.TokenFileEnv), "the broker's token file [DEV_BROKER_TOKEN_FILE] (default: the port's, see str broker --help)")
		secret     = fs.String("signing-secret", os.Getenv("STR_SIGNING_SECRET"), "sign the request, for workers that require it [STR_SIGNING_SECRET]")
		wait       = fs.Duration("wait", toolsWait, "collect answers for this long")
		asJSON     = fs.Bool("json", false, "print each worker's answer as one JSON line")
	)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), toolsUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	target, problems := resolveBroker(*brokerAddr, *tokenFile)
	if fs.NArg() > 0 {
		problems = append(problems, fmt.Sprintf("unexpected arguments %q", fs.Args()))
	}
	if strings.Trim(*namespace, "/") == "" {
		problems = append(problems, "--namespace must not be empty")
	}
	if *wait <= 0 {
		problems = append(problems, "--wait must be positive")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "str tools: %s\n", p)
		}
		return exitUsage
	}
	id := randomID()
	replyTo := worker.ToolsReplyPrefix(*namespace) + "str-tools-" + id
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+*wait)
	defer cancel()
	client, err := target.connect(ctx, "str-tools-"+id, []string{replyTo})
	if err != nil {
		fmt.Fprintf(os.Stderr, "str tools: %v\n", err)
		return exitInvokeFailed
	}
	defer client.Close()
	if err := client.Publish(ctx, toolsRequest(*namespace, replyTo, *secret)); err != nil {
		fmt.Fprintf(os.Stderr, "str tools: publish: %v\n", err)
		return exitInvokeFailed
	}
	// Every answer within the window.
	window, stop := context.WithTimeout(ctx, *wait)
	defer stop()
	var replies []worker.ToolsReply
	for {
		d, err := client.Receive(window)
		if err != nil {
			break
		}
		if d.Ack != nil {
			d.Ack()
		}
		r, err := decodeToolsReply(d.Payload)
		if err != nil {
			fmt.Fprintf(os.Stderr, "str tools: %v\n", err)
			continue
		}
		if r.Error != nil {
			fmt.Fprintf(os.Stderr, "str tools: worker %s refused: %s: %s\n", r.WorkerID, r.Error.Code, r.Error.Message)
			continue
		}
		if *asJSON {
			fmt.Println(string(d.Payload))
		}
		replies = append(replies, r)
	}
	if len(replies) == 0 {
		fmt.Fprintf(os.Stderr, "str tools: no worker is serving namespace %q: none answered within %v on %s (is `str worker` running, with SAM_NAMESPACE=%s, against this broker?)\n",
			*namespace, *wait, target.addr, *namespace)
		return exitInvokeFailed
	}
	if !*asJSON {
		printTools(os.Stdout, replies)
	}
	return 0
}
