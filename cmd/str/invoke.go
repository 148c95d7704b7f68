package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

const invokeUsage = `usage: str invoke TOOL [flags]

Publishes one invocation of TOOL to a dev broker (or a worker's embedded
one), prints each status line as it arrives, then the reply JSON. Exit
status 0 when the reply is a successful (not timed out) result, 1 otherwise,
2 on a usage error. Ctrl-C sends a cancel for the invocation and waits for
the reply.

`

// repeatFlag collects a repeatable flag.
type repeatFlag []string

func (m *repeatFlag) String() string     { return strings.Join(*m, ",") }
func (m *repeatFlag) Set(v string) error { *m = append(*m, v); return nil }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func cmdInvoke(args []string) int {
	fs := flag.NewFlagSet("str invoke", flag.ContinueOnError)
	defBroker := "127.0.0.1:55554"
	if h := os.Getenv("DEV_BROKER_HOST"); h != "" {
		defBroker = net.JoinHostPort(h, envOr("DEV_BROKER_PORT", "55555"))
	}
	var (
		argsJSON   = fs.String("args", "{}", "tool arguments (a JSON object)")
		toolConfig = fs.String("tool-config", "{}", "tool config (a JSON object)")
		profile    = fs.String("profile", "", "sandbox profile to ask for (the manifest's wins)")
		timeout    = fs.Float64("timeout", 0, "timeout_seconds (0 = the worker's default)")
		brokerAddr = fs.String("broker", defBroker, "dev broker host:port [DEV_BROKER_HOST/PORT]")
		namespace  = fs.String("namespace", envOr("SAM_NAMESPACE", "demo/"), "namespace [SAM_NAMESPACE]")
		user       = fs.String("user", "cli-user", "user_id")
		session    = fs.String("session", "cli-session", "session_id")
		app        = fs.String("app", "str-invoke", "app_name (also the agent name in the reply topics)")
		taskID     = fs.String("task-id", "", "task_id (default: random)")
		wait       = fs.Duration("wait", 0, "give up waiting for the reply after this long (default: timeout + 60s)")
		secret     = fs.String("signing-secret", os.Getenv("STR_SIGNING_SECRET"), "sign the request (HMAC-SHA256) [STR_SIGNING_SECRET]")
		preloaded  repeatFlag
		refs       repeatFlag
	)
	fs.Var(&preloaded, "artifact", "PARAM=FILE: send FILE inline as input artifact PARAM (repeatable)")
	fs.Var(&refs, "ref", "PARAM=NAME[@VERSION]: input artifact PARAM from the store (repeatable)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), invokeUsage)
		fs.PrintDefaults()
	}
	// TOOL may come before or after the flags.
	var tool string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		tool, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if tool == "" && fs.NArg() > 0 {
		tool = fs.Arg(0)
	} else if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "str invoke: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if tool == "" {
		fs.Usage()
		return 2
	}

	// 1. the request.
	id := randomID()
	if *taskID == "" {
		*taskID = "task-" + id
	}
	params := map[string]any{
		"task_id": *taskID, "tool_name": tool, "app_name": *app, "user_id": *user, "session_id": *session,
	}
	var problems []string
	for name, raw := range map[string]string{"args": *argsJSON, "tool_config": *toolConfig} {
		var obj map[string]any
		if err := json.Unmarshal([]byte(raw), &obj); err != nil || obj == nil {
			problems = append(problems, fmt.Sprintf("--%s must be a JSON object", strings.ReplaceAll(name, "_", "-")))
		}
		params[name] = json.RawMessage(raw)
	}
	if *profile != "" {
		params["sandbox_profile"] = *profile
	}
	if *timeout > 0 {
		params["timeout_seconds"] = *timeout
	}
	pre := map[string]any{}
	for _, a := range preloaded {
		param, file, ok := strings.Cut(a, "=")
		if !ok || param == "" || file == "" {
			problems = append(problems, fmt.Sprintf("--artifact %q: want PARAM=FILE", a))
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			problems = append(problems, fmt.Sprintf("--artifact %s: %v", param, err))
			continue
		}
		name := filepath.Base(file)
		pre[param] = map[string]any{"filename": name, "content": base64.StdEncoding.EncodeToString(data),
			"mime_type": artifacts.MimeByExtension(name)}
	}
	ref := map[string]any{}
	for _, r := range refs {
		param, spec, ok := strings.Cut(r, "=")
		if !ok || param == "" || spec == "" {
			problems = append(problems, fmt.Sprintf("--ref %q: want PARAM=NAME[@VERSION]", r))
			continue
		}
		entry := map[string]any{"filename": spec}
		if name, v, ok := strings.Cut(spec, "@"); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				problems = append(problems, fmt.Sprintf("--ref %q: version must be a non-negative integer", r))
				continue
			}
			entry = map[string]any{"filename": name, "version": n}
		}
		ref[param] = entry
	}
	if len(pre) > 0 {
		params["preloaded_artifacts"] = pre
	}
	if len(ref) > 0 {
		params["artifact_references"] = ref
	}
	host, portStr, err := net.SplitHostPort(*brokerAddr)
	port, perr := strconv.Atoi(portStr)
	if err != nil || perr != nil {
		problems = append(problems, fmt.Sprintf("--broker %q: want host:port", *brokerAddr))
	}
	if strings.Trim(*namespace, "/") == "" {
		problems = append(problems, "--namespace must not be empty")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "str invoke: %s\n", p)
		}
		return 2
	}
	payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": worker.MethodInvoke, "params": params})

	// 2. connect, subscribed to the reply and status topics.
	base := worker.TopicBase(*namespace)
	replyTo := base + "/sam_remote_tool/response/" + *app + "/" + id
	statusTo := base + "/sam_remote_tool/status/" + *app + "/" + id
	maxWait := *wait
	if maxWait == 0 {
		t := *timeout
		if t == 0 {
			t = 300
		}
		maxWait = time.Duration(t*float64(time.Second)) + 60*time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), maxWait)
	defer cancel()
	client, err := devbroker.NewClient(devbroker.ClientOptions{
		Host: host, Port: port, ClientID: "str-invoke-" + id, Retries: 1, RetryDelay: 500 * time.Millisecond,
		ReceiveTimeout: 200 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "str invoke: %v\n", err)
		return 2
	}
	defer client.Close()
	if err := client.Connect(ctx, []string{replyTo, statusTo}); err != nil {
		fmt.Fprintf(os.Stderr, "str invoke: connect to %s: %v\n", *brokerAddr, err)
		return 1
	}

	// 3. publish.
	props := map[string]string{
		worker.PropReplyTo: replyTo, worker.PropStatusTo: statusTo, "clientId": "str-invoke-" + id,
		"userId": *user, worker.PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10),
	}
	if *secret != "" {
		props[worker.PropSignature] = worker.Sign(*secret, payload)
	}
	if err := client.Publish(ctx, transport.Message{Topic: base + "/sam_remote_tool/invoke/" + tool, Payload: payload, UserProperties: props}); err != nil {
		fmt.Fprintf(os.Stderr, "str invoke: publish: %v\n", err)
		return 1
	}

	// 4. status lines as they come, then the reply; Ctrl-C cancels.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		for range sigs {
			fmt.Fprintln(os.Stderr, "str invoke: cancelling")
			client.Publish(context.Background(), transport.Message{
				Topic: base + "/sam_remote_tool/cancel/" + id, Payload: []byte(fmt.Sprintf(`{"task_id":%q}`, *taskID)),
				UserProperties: map[string]string{"timestamp": strconv.FormatInt(time.Now().UnixMilli(), 10)},
			})
		}
	}()
	for {
		d, err := client.Receive(ctx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "str invoke: no reply: %v\n", err)
			return 1
		}
		if d.Ack != nil {
			d.Ack()
		}
		switch d.Topic {
		case statusTo:
			var st struct {
				Params struct {
					StatusText string `json:"status_text"`
				} `json:"params"`
			}
			json.Unmarshal(d.Payload, &st)
			fmt.Printf("status: %s\n", st.Params.StatusText)
		case replyTo:
			fmt.Println(string(d.Payload))
			var reply struct {
				Result *struct {
					TimedOut bool `json:"timed_out"`
				} `json:"result"`
			}
			if json.Unmarshal(d.Payload, &reply) == nil && reply.Result != nil && !reply.Result.TimedOut {
				return 0
			}
			return 1
		}
	}
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
