package launcher

import (
	"context"
	"os"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/egress/helper"
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

// ServeEgress hands the listeners files (by listener name: proxy,
// dns-tcp, dns-udp, capture-PORT) to the launcher's egress helper, which
// serves them with the plan's network policy and the request's
// credentials, in a session of their own that ends with ctx or its Close;
// onKill runs when the policy's on_violation: kill fires. The sandbox's
// own listeners are served so (startEgress), and each per-tool template
// call's, opened in the call's network namespace (package
// launcher/template, C5). The listeners go to the helper at their first
// traffic (helper.Session); the files are closed either way.
func (s *Sandbox) ServeEgress(ctx context.Context, files map[string]*os.File, onKill func(egress.Event)) (*helper.Session, error) {
	return s.l.egress.Serve(ctx, s.plan.Network, s.req.Credentials, files, onKill)
}

// stopEgress closes the sandbox's egress session (once) and moves its
// record of denials into the result. The session stays s.egress: a
// NetworkReport while Close asks the helper for the final record waits for
// it (the session's lock) instead of finding no session and reporting
// none (the worker takes the report as soon as the tool is done, which
// can be while the reaper is here).
func (s *Sandbox) stopEgress(r *Result) {
	s.mu.Lock()
	sess, err, stopped := s.egress, s.egressErr, s.egressStopped
	s.egressStopped = true
	s.mu.Unlock()
	if stopped {
		return
	}
	if err != nil {
		r.Warnings = append(r.Warnings, "network: the egress proxy did not start, the sandbox had no network: "+err.Error())
	}
	if sess == nil {
		return
	}
	if err := sess.Close(); err != nil {
		r.Warnings = append(r.Warnings, "network: "+err.Error())
	}
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
