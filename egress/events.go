package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Event is one aggregated violation: every denial with the same (kind,
// reason, host, port, via) adds to Count. It never carries query strings,
// headers or bodies; Host is a validated name or a sanitized rendering of an
// invalid one.
type Event struct {
	Kind    string    `json:"kind"`   // net | dns
	Action  string    `json:"action"` // denied
	Reason  string    `json:"reason"`
	Rule    string    `json:"rule,omitempty"`
	Host    string    `json:"host,omitempty"`
	Port    int       `json:"port,omitempty"`
	IP      string    `json:"ip,omitempty"`
	Via     string    `json:"via,omitempty"`
	Count   int       `json:"count"`
	First   time.Time `json:"first_ts"`
	Last    time.Time `json:"last_ts"`
	Message string    `json:"message"`
}

// Event kinds.
const (
	KindNet = "net"
	KindDNS = "dns"
	// KindCredential: a credential's placeholder sent where the
	// credential does not belong.
	KindCredential = "credential"
)

// ActionDenied is every event's action.
const ActionDenied = "denied"

type eventKey struct {
	kind, reason, host string
	port               int
	via                string
}

// EventLog aggregates events, keeps at most max distinct ones and counts the
// occurrences it had to drop.
type EventLog struct {
	mu      sync.Mutex
	max     int
	byKey   map[eventKey]int // index into list
	list    []Event
	dropped int
}

// NewEventLog returns an empty log that keeps at most max distinct events.
func NewEventLog(max int) *EventLog {
	return &EventLog{max: max, byKey: make(map[eventKey]int)}
}

// Add records one occurrence and reports whether it was the session's first
// violation.
func (l *EventLog) Add(ev Event, now time.Time) (first bool) {
	k := eventKey{ev.Kind, ev.Reason, ev.Host, ev.Port, ev.Via}
	l.mu.Lock()
	defer l.mu.Unlock()
	first = len(l.list) == 0 && l.dropped == 0
	if i, ok := l.byKey[k]; ok {
		l.list[i].Count++
		l.list[i].Last = now
		return first
	}
	if len(l.list) >= l.max {
		l.dropped++
		return first
	}
	ev.Action = ActionDenied
	ev.Count, ev.First, ev.Last = 1, now, now
	ev.Message = EventMessage(ev)
	l.byKey[k] = len(l.list)
	l.list = append(l.list, ev)
	return first
}

func (l *EventLog) Snapshot() ([]Event, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.list), l.dropped
}

// reasonText is the model- and human-facing explanation of each reason.
var reasonText = map[string]string{
	ReasonNotAllowlisted:      "not in the allowlist",
	ReasonPortNotAllowed:      "port not in allowed_ports",
	ReasonIPLiteral:           "IP address destinations are not allowed (use a host name, or an allowed_cidrs entry)",
	ReasonPrivateAddress:      "private, loopback, link-local, metadata, documentation or host address",
	ReasonResolvedPrivate:     "resolves only to private, loopback, link-local, metadata, documentation or host addresses",
	ReasonResolveFailed:       "the name could not be resolved",
	ReasonMalformedRequest:    "malformed request",
	ReasonUnsupportedProtocol: "unsupported proxy protocol or command",
	ReasonLimitConnections:    "too many concurrent connections",
	ReasonIsolated:            "this sandbox has no network (policy isolated)",
	ReasonSNIMismatch:         "the TLS server name does not match the destination",
	ReasonNameNotAllowlisted:  "name not in the allowlist",
	ReasonQtypeRefused:        "query type not served (only A and AAAA)",
	ReasonLimitNames:          "too many distinct names looked up",
	ReasonMethodNotAllowed:    "request method not allowed by http_rules",
	ReasonPathNotAllowed:      "request path not allowed by http_rules",
	ReasonHostMismatch:        "the HTTP Host does not match the destination",
	ReasonUpstreamCert:        "the server's certificate did not verify against the host's trust store",
	ReasonCredentialHost:      "the credential may only be sent to its own hosts",
	ReasonUnscrubbable:        "the response was in an encoding the proxy cannot read, so an echo of the credential could not be removed",
}

// EventMessage is the one-line text of an event.
func EventMessage(ev Event) string {
	why := reasonText[ev.Reason]
	if why == "" {
		why = ev.Reason
	}
	if ev.Kind == KindDNS {
		name := ev.Host
		if name == "" {
			name = "query"
		}
		return "dns: " + name + " blocked — " + why
	}
	if ev.Kind == KindCredential && ev.Reason == ReasonUnscrubbable {
		return "credential: " + strings.TrimPrefix(ev.Rule, "credentials: ") + ": the response from " + DestString(ev.Host, ev.IP, ev.Port) + " blocked — " + why
	}
	if ev.Kind == KindCredential {
		return "credential: " + strings.TrimPrefix(ev.Rule, "credentials: ") + "'s placeholder sent to " + DestString(ev.Host, ev.IP, ev.Port) + " blocked — " + why
	}
	return "network: " + DestString(ev.Host, ev.IP, ev.Port) + " blocked — " + why
}

// DestString renders host:port, [v6]:port, or "connection" when there is no
// destination (a limit hit before the request was read).
func DestString(host, ip string, port int) string {
	h := host
	if h == "" {
		h = ip
		if a, err := netip.ParseAddr(ip); err == nil && a.Is6() {
			h = "[" + ip + "]"
		}
	}
	if h == "" {
		return "connection"
	}
	if port == 0 {
		return h
	}
	return h + ":" + strconv.Itoa(port)
}

// Summary renders the text block an agent can show its model; "" when there
// were no violations.
func Summary(events []Event, dropped int) string {
	if len(events) == 0 && dropped == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("<sandbox_violations>\n")
	for _, ev := range events {
		b.WriteString(ev.Message)
		if ev.Count > 1 {
			fmt.Fprintf(&b, " (%d times)", ev.Count)
		}
		b.WriteByte('\n')
	}
	if dropped > 0 {
		fmt.Fprintf(&b, "(%d more violations not listed)\n", dropped)
	}
	b.WriteString("</sandbox_violations>")
	return b.String()
}
