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
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/worker"
	"github.com/securetoolruntime/str/worker/artifacts"
	"github.com/securetoolruntime/str/worker/transport"
	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

const invokeUsage = `usage: str invoke TOOL [flags]   (flags may come before or after TOOL)

Publishes one invocation of TOOL to a dev broker (or a worker's embedded
one), prints each status line as it arrives, then the reply JSON.

The broker is --broker, else DEV_BROKER_HOST:DEV_BROKER_PORT, either of
which may be unset: the host defaults to 127.0.0.1, the port to 55555 when
DEV_BROKER_HOST is set and to 55554 (make run's) when it is not. The
broker's connection token is read from --token-file, else
$DEV_BROKER_TOKEN_FILE, else the default token file of the broker's port
(see str broker --help); when that file does not exist, no token is sent.

The tool runs for at most --timeout seconds (the worker's default, 300 s,
without it), bounded by its manifest's timeout_seconds; the worker gives
the sandbox 5 s more (the reference's rule) before it kills it and the
reply says "timed_out":true.

Alongside the invocation, str invoke asks the namespace's workers which
tools they serve (as str tools does). When workers answer within 3 s and
none serves TOOL, it says so, names the tools they serve and exits 4
instead of waiting for a reply that cannot come. When neither a status
line nor the reply has come 5 s after publishing (or after half of --wait,
if that is shorter), a note on stderr says that no worker has answered
yet and names the topic the request went to. A reply whose profile the
worker clamped to the tool's ceiling is noted on stderr. Ctrl-C publishes
a cancel for the invocation and keeps waiting for the reply; a second
Ctrl-C, or SIGTERM, exits at once.

Exit status:
  0    the reply is a successful (not timed out) result
  1    any other reply, or the broker could not be reached
  2    usage error
  3    no reply within --wait
  4    no worker serves TOOL (the workers that answered serve others)
  130  interrupted (a second Ctrl-C, or Ctrl-C before the request was sent)
  143  terminated (SIGTERM)

`

// str invoke's and str tools' exit codes (see invokeUsage and toolsUsage).
const (
	exitUsage            = 2 // bad flags (before anything was attempted)
	exitInvokeOK         = 0
	exitInvokeFailed     = 1
	exitInvokeNoReply    = 3
	exitInvokeNotServed  = 4
	exitInvokeInterrupt  = 130 // 128 + SIGINT, as a shell reports it
	exitInvokeTerminated = 143 // 128 + SIGTERM
)

// noAnswerHint is how long str invoke waits for a first status line or
// reply before saying on stderr that no worker has answered (capped at half
// of --wait).
const noAnswerHint = 5 * time.Second

// servedWindow is how long str invoke waits for the workers' tools
// answers before it may conclude that no worker serves the tool.
const servedWindow = 3 * time.Second

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

// defaultBroker is --broker's default, from DEV_BROKER_HOST and
// DEV_BROKER_PORT, each of which may be unset.
func defaultBroker(getenv func(string) string) string {
	host, port := getenv("DEV_BROKER_HOST"), getenv("DEV_BROKER_PORT")
	if port == "" {
		port = "55554" // make run's embedded broker
		if host != "" {
			port = strconv.Itoa(broker.DefaultPort) // the reference's default
		}
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

func cmdInvoke(args []string) int {
	fs := flag.NewFlagSet("str invoke", flag.ContinueOnError)
	defBroker := defaultBroker(os.Getenv)
	var (
		argsJSON   = fs.String("args", "{}", "tool arguments (a JSON object)")
		toolConfig = fs.String("tool-config", "{}", "tool config (a JSON object)")
		profile    = fs.String("profile", "", "sandbox_profile to ask for (a name or trust level; default: none, the tool's ceiling). The call runs with the stricter of it and the tool's ceiling (its manifest profile, else the worker's default): a looser one is clamped, never refused; an unknown name is INVALID_REQUEST")
		timeout    = fs.Float64("timeout", 0, "timeout_seconds (0 = the worker's default, 300 s); at most the manifest's timeout_seconds, and the sandbox gets 5 s more (the reference's rule) before it is killed and the reply says timed_out")
		brokerAddr = fs.String("broker", defBroker, "dev broker host:port [DEV_BROKER_HOST/PORT]")
		namespace  = fs.String("namespace", envOr("SAM_NAMESPACE", "demo/"), "namespace [SAM_NAMESPACE]")
		user       = fs.String("user", "cli-user", "user_id")
		session    = fs.String("session", "cli-session", "session_id")
		app        = fs.String("app", "str-invoke", "app_name, also the agent: the clientId property and the agent level of the reply topics (a signed request must use its key's agent)")
		taskID     = fs.String("task-id", "", "task_id (default: random)")
		wait       = fs.Duration("wait", 0, "give up waiting for the reply after this long, exit status 3 (default: --timeout + 60s; 6m0s without --timeout, the worker's default 300 s + 60 s)")
		tokenFile  = fs.String("token-file", os.Getenv(broker.TokenFileEnv), "the broker's token file [DEV_BROKER_TOKEN_FILE] (default: the port's, see str broker --help)")
		secret     = fs.String("signing-secret", os.Getenv("STR_SIGNING_SECRET"), "sign the request and its cancel (HMAC-SHA256) with the worker's shared secret, or with --key-id's secret [STR_SIGNING_SECRET]")
		keyID      = fs.String("key-id", os.Getenv("STR_SIGNING_KEY_ID"), "sign with this key of the worker's keys file (STR_SIGNING_KEYS; --signing-secret is its secret) [STR_SIGNING_KEY_ID]")
		authToken  = fs.String("auth-token", os.Getenv("STR_AUTH_TOKEN"), "the user's token (a JWT), sent in the authToken user property [STR_AUTH_TOKEN]")
		preloaded  repeatFlag
		refs       repeatFlag
	)
	fs.Var(&preloaded, "artifact", "PARAM=FILE: send FILE inline as input artifact PARAM (repeatable)")
	fs.Var(&refs, "ref", "PARAM=NAME[@VERSION]: input artifact PARAM from the store (repeatable)")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), invokeUsage)
		fs.PrintDefaults()
	}
	// TOOL may come before, between or after the flags.
	positional, err := parseInterspersed(fs, args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return exitUsage
	}
	if len(positional) > 1 {
		fmt.Fprintf(os.Stderr, "str invoke: one TOOL, got %q\n", positional)
		return exitUsage
	}
	if len(positional) == 0 {
		fs.Usage()
		return exitUsage
	}
	tool := positional[0]

	// 1. the request.
	id := randomID()
	if *taskID == "" {
		*taskID = "task-" + id
	}
	params := map[string]any{
		"task_id": *taskID, "tool_name": tool, "app_name": *app, "user_id": *user, "session_id": *session,
	}
	var problems []string
	for _, p := range []struct{ name, flag, raw string }{{"args", "--args", *argsJSON}, {"tool_config", "--tool-config", *toolConfig}} {
		if problem := jsonObjectProblem(p.flag, p.raw); problem != "" {
			problems = append(problems, problem)
		}
		params[p.name] = json.RawMessage(p.raw)
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
	target, bad := resolveBroker(*brokerAddr, *tokenFile)
	problems = append(problems, bad...)
	if strings.Trim(*namespace, "/") == "" {
		problems = append(problems, "--namespace must not be empty")
	}
	if *wait < 0 {
		problems = append(problems, "--wait must not be negative")
	}
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintf(os.Stderr, "str invoke: %s\n", p)
		}
		return exitUsage
	}
	payload, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": worker.MethodInvoke, "params": params})

	// identify adds who is asking to an invoke or a cancel: the agent (the
	// app, also the agent level of the reply topics) and the user, the
	// user's token, and the signature (with --key-id, that key's).
	identify := func(m transport.Message) transport.Message {
		m.UserProperties[worker.PropClientID] = *app
		m.UserProperties[worker.PropUserID] = *user
		if *authToken != "" {
			m.UserProperties[worker.PropAuthToken] = *authToken
		}
		if *secret != "" {
			if *keyID != "" {
				m.UserProperties[worker.PropKeyID] = *keyID
			}
			worker.SignMessage(*secret, &m, time.Now())
		}
		return m
	}

	// 2. signals: from here on, SIGTERM ends the run at once, and so does
	// SIGINT until the request is out; after that the first SIGINT
	// publishes a cancel and the second ends the run.
	base := worker.TopicBase(*namespace)
	invokeTopic := base + "/sam_remote_tool/invoke/" + tool
	replyTo := base + "/sam_remote_tool/response/" + *app + "/" + id
	statusTo := base + "/sam_remote_tool/status/" + *app + "/" + id
	toolsTo := worker.ToolsReplyPrefix(*namespace) + "str-invoke-" + id
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
	var (
		published atomic.Bool
		signalled atomic.Int32 // the exit code a signal asked for
		client    *devbroker.Client
	)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		cancelSent := false
		for {
			var sig os.Signal
			select {
			case sig = <-sigs:
			case <-ctx.Done():
				return
			}
			switch {
			case sig == syscall.SIGTERM:
				signalled.Store(exitInvokeTerminated)
				cancel()
				return
			case !published.Load() || cancelSent:
				signalled.Store(exitInvokeInterrupt)
				cancel()
				return
			}
			cancelSent = true
			fmt.Fprintln(os.Stderr, "str invoke: cancelling (Ctrl-C again to quit without waiting for the reply)")
			go client.Publish(ctx, identify(transport.Message{
				Topic: base + "/sam_remote_tool/cancel/" + id, Payload: []byte(fmt.Sprintf(`{"task_id":%q}`, *taskID)),
				UserProperties: map[string]string{"timestamp": strconv.FormatInt(time.Now().UnixMilli(), 10)},
			}))
		}
	}()
	// stopped reports a signal's exit code once ctx has ended because of
	// one.
	stopped := func() (int, bool) {
		code := int(signalled.Load())
		if code == 0 {
			return 0, false
		}
		if code == exitInvokeTerminated {
			fmt.Fprintln(os.Stderr, "str invoke: terminated")
		} else {
			fmt.Fprintln(os.Stderr, "str invoke: interrupted")
		}
		return code, true
	}

	// 3. connect, subscribed to the reply, status and tools reply topics.
	client, err = target.connect(ctx, "str-invoke-"+id, []string{replyTo, statusTo, toolsTo})
	if err != nil {
		if code, ok := stopped(); ok {
			return code
		}
		fmt.Fprintf(os.Stderr, "str invoke: %v\n", err)
		return exitInvokeFailed
	}
	defer client.Close()

	// 4. publish: which tools the workers serve (answered on toolsTo),
	// then the invocation.
	if err := client.Publish(ctx, toolsRequest(*namespace, toolsTo, *secret)); err != nil {
		if code, ok := stopped(); ok {
			return code
		}
		fmt.Fprintf(os.Stderr, "str invoke: publish: %v\n", err)
		return exitInvokeFailed
	}
	props := map[string]string{
		worker.PropReplyTo: replyTo, worker.PropStatusTo: statusTo,
		worker.PropTimestamp: strconv.FormatInt(time.Now().UnixMilli(), 10),
	}
	msg := identify(transport.Message{Topic: invokeTopic, Payload: payload, UserProperties: props})
	if err := client.Publish(ctx, msg); err != nil {
		if code, ok := stopped(); ok {
			return code
		}
		fmt.Fprintf(os.Stderr, "str invoke: publish: %v\n", err)
		return exitInvokeFailed
	}
	published.Store(true)

	// 5. status lines as they come, then the reply. Until something comes
	// back, a note after a few seconds says nobody has answered yet, and
	// once the tools answers have had servedWindow, workers that answered
	// and do not serve the tool end the wait.
	hint := time.NewTimer(min(noAnswerHint, maxWait/2))
	defer hint.Stop()
	windowOver := time.NewTimer(min(servedWindow, maxWait/2))
	defer windowOver.Stop()
	answered, windowDone := false, false
	var toolsReplies []worker.ToolsReply
	notServed := func() bool {
		if answered || !windowDone || len(toolsReplies) == 0 {
			return false
		}
		served, ok := servedTools(toolsReplies, tool)
		if ok {
			return false
		}
		list := "none"
		if len(served) > 0 {
			list = strings.Join(served, ", ")
		}
		fmt.Fprintf(os.Stderr, "str invoke: no worker serves %q in namespace %q: the %d worker(s) that answered serve %s (str tools lists them)\n",
			tool, *namespace, len(toolsReplies), list)
		return true
	}
	deliveries := make(chan *transport.Delivery)
	recvErr := make(chan error, 1)
	go func() {
		for {
			d, err := client.Receive(ctx)
			if err != nil {
				recvErr <- err
				return
			}
			select {
			case deliveries <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		var d *transport.Delivery
		select {
		case <-windowOver.C:
			windowDone = true
			if notServed() {
				return exitInvokeNotServed
			}
			continue
		case <-hint.C:
			if !answered {
				fmt.Fprintf(os.Stderr, "str invoke: no worker has answered yet (no status or reply %v after publishing to %s); is a worker serving %q in namespace %q? Waiting up to %v in all (--wait).\n",
					min(noAnswerHint, maxWait/2), invokeTopic, tool, *namespace, maxWait)
			}
			continue
		case err := <-recvErr:
			if code, ok := stopped(); ok {
				return code
			}
			if errors.Is(err, context.DeadlineExceeded) {
				if !answered {
					fmt.Fprintf(os.Stderr, "str invoke: no worker answered within %v (--wait): nothing came back on %s after publishing to %s; is a worker serving %q in namespace %q?\n",
						maxWait, replyTo, invokeTopic, tool, *namespace)
				} else {
					fmt.Fprintf(os.Stderr, "str invoke: a worker answered with status lines but sent no reply within %v (--wait)\n", maxWait)
				}
				return exitInvokeNoReply
			}
			fmt.Fprintf(os.Stderr, "str invoke: no reply: %v\n", err)
			return exitInvokeFailed
		case d = <-deliveries:
		}
		if d.Ack != nil {
			d.Ack()
		}
		switch d.Topic {
		case toolsTo:
			if r, err := decodeToolsReply(d.Payload); err == nil && r.Error == nil {
				toolsReplies = append(toolsReplies, r)
			}
			if notServed() {
				return exitInvokeNotServed
			}
		case statusTo:
			answered = true
			var st struct {
				Params struct {
					StatusText string `json:"status_text"`
				} `json:"params"`
			}
			json.Unmarshal(d.Payload, &st)
			fmt.Printf("status: %s\n", st.Params.StatusText)
		case replyTo:
			if c := d.UserProperties[worker.PropProfileClamped]; c != "" {
				fmt.Fprintf(os.Stderr, "str invoke: the worker ran the tool with a stricter profile than asked (%s: the tool's ceiling)\n", c)
			}
			fmt.Println(string(d.Payload))
			var reply struct {
				Result *struct {
					TimedOut bool `json:"timed_out"`
				} `json:"result"`
			}
			if json.Unmarshal(d.Payload, &reply) == nil && reply.Result != nil && !reply.Result.TimedOut {
				return exitInvokeOK
			}
			return exitInvokeFailed
		}
	}
}

// jsonObjectProblem says why raw, the value of flag, is not a JSON object:
// a syntax error with its position and the text around it, or the kind of
// JSON value it is instead. "" when it is one.
func jsonObjectProblem(flag, raw string) string {
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		var se *json.SyntaxError
		if !errors.As(err, &se) {
			return fmt.Sprintf("%s is not valid JSON: %v", flag, err)
		}
		if int(se.Offset) >= len(raw) && strings.Contains(err.Error(), "unexpected end") {
			return fmt.Sprintf("%s is not valid JSON: it ends (after %d bytes) before the value does: %v", flag, len(raw), err)
		}
		// Offset counts the bytes read when the error was found: the
		// offending byte is the last of them.
		bad := max(int(se.Offset)-1, 0)
		from, to := max(bad-24, 0), min(bad+12, len(raw))
		// The text around it, shown with a caret under it; bytes that do
		// not print (newlines, control bytes, invalid UTF-8) as '.'.
		shown := func(s string) string {
			return strings.Map(func(r rune) rune {
				if r == utf8.RuneError || !unicode.IsGraphic(r) {
					return '.'
				}
				return r
			}, s)
		}
		return fmt.Sprintf("%s is not valid JSON at byte %d of %d: %v\n  %s\n  %s^", flag, bad+1, len(raw), err,
			shown(raw[from:to]), strings.Repeat(" ", utf8.RuneCountInString(raw[from:bad])))
	}
	switch v.(type) {
	case map[string]any:
		return ""
	case nil:
		return fmt.Sprintf("%s must be a JSON object ({...}), got null", flag)
	case []any:
		return fmt.Sprintf("%s must be a JSON object ({...}), got an array", flag)
	case string:
		return fmt.Sprintf("%s must be a JSON object ({...}), got a string (did the shell eat the braces? quote the object: '{\"key\":\"value\"}')", flag)
	default:
		return fmt.Sprintf("%s must be a JSON object ({...}), got %s", flag, raw)
	}
}

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// parseInterspersed parses fs's flags wherever they stand among the
// positional arguments (the flag package stops at the first positional
// one) and returns the positional ones in order; everything after "--"
// is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional, rest []string
	for i, a := range args {
		if a == "--" {
			args, rest = args[:i], args[i+1:]
			break
		}
	}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return append(positional, rest...), nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
