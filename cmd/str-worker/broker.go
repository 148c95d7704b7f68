package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/securetoolruntime/str/broker"
	"github.com/securetoolruntime/str/internal/jsonlog"
)

const brokerUsage = `usage: str broker [--listen host:port] [--token-file PATH | --anonymous]

Runs the dev broker: newline-delimited JSON over TCP (spec §10). Clients
sharing a queue_name get each message once, round-robin.

Every CONNECT must carry this run's token in a "token" field. The token is
made at start-up and written, mode 0600, to --token-file, default
$DEV_BROKER_TOKEN_FILE, else in str's state directory:
  STR_STATE_DIR set:         $STR_STATE_DIR/broker-PORT.token
  as root:                   /run/str/broker-PORT.token
  XDG_RUNTIME_DIR set:       $XDG_RUNTIME_DIR/str/broker-PORT.token
  otherwise:                 $TMPDIR/str-UID/broker-PORT.token
It is removed at exit. str invoke and str worker read the same file (by
port) by themselves. --anonymous accepts CONNECTs without a token, for the
reference's own clients: then any local user (and any tool sharing the
host's network) can read and forge every message.

Connection bounds (each refusal or close is logged and counted): a
connection has --login-timeout to CONNECT, with request lines of at most
--login-line-bytes until then (a longer one closes it); at most
--max-unauthenticated connections wait for their CONNECT and at most
--max-conns are open in all (default: a quarter of RLIMIT_NOFILE); beyond
either, a connection still waiting for its CONNECT gives way to the new
one (so a peer without the token cannot keep one with it out), and when
none waits the new connection is closed at once; a connected client that
sends no request for --idle-timeout is closed (a waiting RECEIVE is not
idle).

`

// cmdBroker runs `str broker`: the dev broker (spec §10, plus queue
// groups and the connection token) until SIGTERM/SIGINT.
func cmdBroker(args []string) int {
	fs := flag.NewFlagSet("str broker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:55555", "address to listen on (host:port)")
	queue := fs.Int("queue-size", broker.DefaultQueueSize, "messages held per client before the oldest are dropped")
	queueBytes := fs.Int("queue-bytes", broker.DefaultMaxQueueBytes, "bytes of messages held per client before the oldest are dropped")
	loginLine := fs.Int("login-line-bytes", broker.DefaultLoginLineBytes, "longest request line before CONNECT; a longer one closes the connection")
	loginTimeout := fs.Duration("login-timeout", broker.DefaultLoginTimeout, "time a new connection has to CONNECT")
	maxUnauth := fs.Int("max-unauthenticated", broker.DefaultMaxUnauthenticated, "connections at once that have not CONNECTed (beyond it one of them gives way to a new one)")
	maxConns := fs.Int("max-conns", 0, "connections at once (0: a quarter of RLIMIT_NOFILE)")
	idle := fs.Duration("idle-timeout", broker.DefaultIdleTimeout, "close a connected client that sends no request for this long")
	tokenFile := fs.String("token-file", "", "where to write the connection token (default: see above)")
	anonymous := fs.Bool("anonymous", false, "require no token (for the reference's clients; anyone who can connect can read and forge everything)")
	level := fs.String("log-level", "info", "debug | info | warn | error")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), brokerUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if *anonymous && *tokenFile != "" {
		fmt.Fprintln(os.Stderr, "str broker: --anonymous and --token-file exclude each other")
		return 2
	}
	for name, v := range map[string]int64{"login-line-bytes": int64(*loginLine), "login-timeout": int64(*loginTimeout),
		"max-unauthenticated": int64(*maxUnauth), "max-conns": int64(*maxConns), "idle-timeout": int64(*idle)} {
		if v < 0 {
			fmt.Fprintf(os.Stderr, "str broker: --%s must not be negative\n", name)
			return 2
		}
	}
	log := jsonlog.New(*level)

	// 1. the token (unless anonymous). It exists before the socket does,
	// so there is no moment when the broker accepts anyone.
	opts := broker.Options{QueueSize: *queue, MaxQueueBytes: *queueBytes, Logger: log, Anonymous: *anonymous,
		LoginLineBytes: *loginLine, LoginTimeout: *loginTimeout, MaxUnauthenticated: *maxUnauth,
		MaxConns: *maxConns, IdleTimeout: *idle}
	if !*anonymous {
		opts.Token = broker.NewToken()
	}
	srv := broker.NewServer(opts)

	// 2. the socket.
	if err := srv.Listen(*listen); err != nil {
		fmt.Fprintf(os.Stderr, "str broker: listen %s: %v\n", *listen, err)
		return 1
	}
	defer srv.Close()

	// 3. the token file, named by the port actually bound (--listen may
	// say port 0).
	if !*anonymous {
		path, err := srv.PublishTokenFile(*tokenFile, opts.Token)
		if err != nil {
			fmt.Fprintf(os.Stderr, "str broker: %v\n", err)
			return 1
		}
		defer broker.RemoveTokenFile(path, opts.Token)
		log.Info("dev broker listening", "addr", srv.Addr().String(), "token_file", path)
	} else {
		// No token: a token file named by this port is a dead broker's
		// (killed before it could remove it); clients would send its token.
		if a, ok := srv.Addr().(*net.TCPAddr); ok {
			path, removed, err := broker.RemoveStaleTokenFile(a.Port)
			if err != nil {
				fmt.Fprintf(os.Stderr, "str broker: %v\n", err)
				return 1
			}
			if removed {
				log.Warn("removed a stale token file left by an earlier broker on this port", "token_file", path)
			}
		}
		log.Warn("dev broker listening WITHOUT authentication (--anonymous): anyone who can connect can read and forge every message",
			"addr", srv.Addr().String())
	}

	// 4. serve until a signal.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	// What the bounds cut while it ran, for the operator tuning them.
	st := srv.Stats()
	log.Info("dev broker stopping", "conns", st.Conns, "cut_over_max_conns", st.OverMaxConns,
		"cut_gave_way", st.GaveWay, "cut_login_line", st.LoginLineTooLong,
		"cut_login_timeout", st.LoginTimeout, "cut_idle", st.IdleTimeout)
	if err := srv.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "str broker: close: %v\n", err)
		return 1
	}
	return 0
}
