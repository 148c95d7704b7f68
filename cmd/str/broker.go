package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/securetoolruntime/str/worker/transport/devbroker"
)

// cmdBroker runs `str broker`: the dev broker (spec §10, plus queue
// groups) until SIGTERM/SIGINT.
func cmdBroker(args []string) int {
	fs := flag.NewFlagSet("str broker", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:55555", "address to listen on (host:port)")
	queue := fs.Int("queue-size", devbroker.DefaultQueueSize, "messages held per client before the oldest are dropped")
	level := fs.String("log-level", "info", "debug | info | warn | error")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: str broker [--listen host:port]\n\nRuns the dev broker: newline-delimited JSON over TCP, no authentication.\nClients sharing a queue_name get each message once, round-robin.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	log := newLogger(*level)
	srv := devbroker.NewServer(devbroker.Options{QueueSize: *queue, Logger: log})
	if err := srv.Listen(*listen); err != nil {
		fmt.Fprintf(os.Stderr, "str broker: listen %s: %v\n", *listen, err)
		return 1
	}
	log.Info("dev broker listening", "addr", srv.Addr().String())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "str broker: close: %v\n", err)
		return 1
	}
	return 0
}
