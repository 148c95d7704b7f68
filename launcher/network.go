package launcher

import (
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/securetoolruntime/str/egress"
)

// interception is what the sandbox's egress session terminates with (nil
// when nothing is terminated).
func (s *Sandbox) interception() (*egress.Interception, error) {
	return s.l.proxyCA.Interception(s.plan.Network, s.req.Credentials)
}

// startEgress serves the listeners the init opened on the sandbox's lo
// (nsinit step 10) with the plan's network policy: the one decision point
// for everything that leaves the sandbox. Called from the report reader
// before the tool runs; a failure leaves the listeners closed, so the
// sandbox has no network at all (fail closed), and is reported.
func (s *Sandbox) startEgress() {
	l := takeListeners(s.listeners)
	icpt, err := s.interception()
	if err != nil {
		closeListeners(l)
		s.mu.Lock()
		s.egressErr = err
		s.mu.Unlock()
		return
	}
	sess, err := egress.Start(s.ctx, s.plan.Network, l, egress.Options{
		Intercept: icpt,
		OnKill: func(ev egress.Event) {
			s.mu.Lock()
			s.violationKill = true
			s.mu.Unlock()
			s.kill(nil)
		},
	})
	if err != nil {
		closeListeners(l)
		s.mu.Lock()
		s.egressErr = err
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	s.egress = sess
	s.mu.Unlock()
}

// takeListeners makes the egress proxy's listeners of the sockets a
// sandbox's init (step 10) or a template's supervisor (C5) opened in the
// sandbox's or the call's network namespace, by listener name; the files
// are closed (net.File* dup them).
func takeListeners(files map[string]*os.File) egress.Listeners {
	var l egress.Listeners
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

func closeListeners(l egress.Listeners) {
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
