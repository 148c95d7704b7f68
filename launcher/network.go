package launcher

import (
	"context"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/proxy"
)

// startEgress serves the listeners the init opened on the sandbox's lo
// (nsinit step 10) with the plan's network policy: the one decision point
// for everything that leaves the sandbox. Called from the report reader
// before the tool runs; a failure leaves the listeners closed, so the
// sandbox has no network at all (fail closed), and is reported.
func (s *Sandbox) startEgress() {
	sess, err := s.ServeEgress(s.ctx, s.listeners, func(egress.Event) {
		s.mu.Lock()
		s.violationKill = true
		s.mu.Unlock()
		s.kill(nil)
	})
	s.mu.Lock()
	s.egress, s.egressErr = sess, err
	s.mu.Unlock()
}

// ServeEgress serves the listeners files (by listener name: proxy,
// dns-tcp, dns-udp, capture-PORT) with the plan's network policy and the
// sandbox's TLS termination, in a session of their own that ends with
// ctx or its Close; onKill runs when the policy's on_violation: kill
// fires. The sandbox's own listeners are served so (startEgress), and
// each per-tool template call's, opened in the call's network namespace
// (package launcher/template, C5). On error the files are closed.
func (s *Sandbox) ServeEgress(ctx context.Context, files map[string]*os.File, onKill func(egress.Event)) (*proxy.Session, error) {
	l := takeListeners(files)
	// What the session terminates (nil when nothing is terminated).
	icpt, err := s.l.proxyCA.Interception(s.plan.Network, s.req.Credentials)
	if err != nil {
		closeListeners(l)
		return nil, err
	}
	sess, err := proxy.Start(ctx, s.plan.Network, l, proxy.Options{Intercept: icpt, OnKill: onKill})
	if err != nil {
		closeListeners(l)
		return nil, err
	}
	return sess, nil
}

// takeListeners makes the egress proxy's listeners of the sockets a
// sandbox's init (step 10) or a template's supervisor (C5) opened in the
// sandbox's or the call's network namespace, by listener name; the files
// are closed (net.File* dup them).
func takeListeners(files map[string]*os.File) proxy.Listeners {
	var l proxy.Listeners
	for name, f := range files {
		switch {
		case name == "proxy":
			l.Proxy, _ = net.FileListener(f)
		case name == "dns-tcp":
			l.DNSTCP, _ = net.FileListener(f)
		case name == "dns-udp":
			l.DNSUDP, _ = net.FilePacketConn(f)
		case strings.HasPrefix(name, "capture-"):
			port, err := strconv.Atoi(strings.TrimPrefix(name, "capture-"))
			if ln, lerr := net.FileListener(f); err == nil && lerr == nil {
				if l.Capture == nil {
					l.Capture = map[int]net.Listener{}
				}
				l.Capture[port] = ln
			}
		}
		f.Close()
	}
	return l
}

func closeListeners(l proxy.Listeners) {
	for _, c := range []interface{ Close() error }{l.Proxy, l.DNSTCP, l.DNSUDP} {
		if c != nil {
			c.Close()
		}
	}
	for _, c := range l.Capture {
		c.Close()
	}
}

// stopEgress closes the sandbox's egress session and moves its record of
// denials into the result.
func (s *Sandbox) stopEgress(r *Result) {
	s.mu.Lock()
	sess, err := s.egress, s.egressErr
	s.egress = nil
	s.mu.Unlock()
	if err != nil {
		r.Warnings = append(r.Warnings, "network: the egress proxy did not start, the sandbox had no network: "+err.Error())
	}
	if sess == nil {
		return
	}
	_ = sess.Close()
	r.Violations, r.ViolationsDropped = sess.Violations()
	r.ViolationSummary = sess.Summary()
}

// NetworkReport is the network policy's record so far, while the sandbox
// runs: the worker replies before teardown and takes it then.
func (s *Sandbox) NetworkReport() (events []egress.Event, dropped int, summary string) {
	s.mu.Lock()
	sess := s.egress
	s.mu.Unlock()
	if sess == nil {
		return nil, 0, ""
	}
	events, dropped = sess.Violations()
	return events, dropped, sess.Summary()
}
