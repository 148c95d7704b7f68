package worker

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/securetoolruntime/str/egress"
	"github.com/securetoolruntime/str/worker/manifest"
	"github.com/securetoolruntime/str/worker/transport"
)

// The tools listing is str's own request/reply (`str tools`), outside the
// reference's sam_remote_tool/ topic space so no agent or reference worker
// ever sees it:
//
//	request  {base}/str/v1/tools/request             any payload; user property replyTo
//	reply    replyTo, under {base}/str/v1/tools/reply/  a ToolsReply
//
// Every worker subscribed answers (workers sharing a queue name answer
// once per queue); the client collects the answers for a short window.
// replyTo must lie under the reply prefix, so the request cannot make a
// worker publish its listing onto an agent's reply topic or anywhere else.
// With STR_SIGNING_SECRET set the request must be signed like an invoke
// (else the reply is an AUTHENTICATION_FAILED error).

// ToolsReplyVersion is the version of ToolsReply.
const ToolsReplyVersion = 1

// ToolsRequestTopic is the topic `str tools` publishes to.
func ToolsRequestTopic(namespace string) string {
	return TopicBase(namespace) + "/str/v1/tools/request"
}

// ToolsReplyPrefix is the prefix every tools reply topic must have.
func ToolsReplyPrefix(namespace string) string { return TopicBase(namespace) + "/str/v1/tools/reply/" }

// ToolsReply is one worker's answer to a tools request.
type ToolsReply struct {
	Version  int         `json:"version"`
	WorkerID string      `json:"worker_id"`
	Tools    []ToolInfo  `json:"tools"`
	Error    *ToolsError `json:"error,omitempty"` // the request was refused; Tools is empty
}

// ToolsError is why a worker refused a tools request.
type ToolsError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ToolInfo is one manifest tool as a worker serves it.
type ToolInfo struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Profile is the ceiling: the manifest's sandbox_profile, else the
	// worker default (a call runs with it or a stricter one).
	Profile        string      `json:"profile"`
	Network        egress.Mode `json:"network"` // the profile's, narrowed by the manifest's network:
	AllowedHosts   []string    `json:"allowed_hosts,omitempty"`
	Warm           int         `json:"warm"`            // pre-started sandboxes wanted
	TimeoutSeconds int         `json:"timeout_seconds"` // the manifest's bound; the sandbox gets 5 s more
	// Unavailable says why calls get TOOL_NOT_AVAILABLE; "" = serving.
	Unavailable string `json:"unavailable,omitempty"`
}

// maxToolsRepliesInFlight bounds the tools replies being built or
// published at once; a request beyond it is dropped (logged), so a flood
// of requests costs the worker nothing but the receive.
const maxToolsRepliesInFlight = 4

// toolsRequest handles one delivery on the tools request topic, in the
// receive loop: the checks there, the listing and its publish in a
// goroutine (the receive loop never waits on the network).
func (s *Server) toolsRequest(d *transport.Delivery, received time.Time) {
	defer ack(s.log, d)
	// 1. a replyTo under the reply prefix.
	replyTo := d.UserProperties[PropReplyTo]
	if !strings.HasPrefix(replyTo, ToolsReplyPrefix(s.cfg.Namespace)) || len(replyTo) == len(ToolsReplyPrefix(s.cfg.Namespace)) {
		s.log.Warn("tools request ignored: replyTo is not under "+ToolsReplyPrefix(s.cfg.Namespace), "reply_to", truncateName(replyTo))
		return
	}
	// 2. the signature, when signing is required.
	var refused *Error
	if s.signing() {
		_, refused = s.checkSignature(d, received)
	}
	// 3. a free place, else dropped.
	select {
	case s.toolsSem <- struct{}{}:
	default:
		s.log.Warn("tools request dropped: too many being answered", "in_flight", maxToolsRepliesInFlight)
		return
	}
	// 4. the manifest as it is now (a reload replaces it whole).
	s.mu.RLock()
	m := s.manifest
	s.mu.RUnlock()
	go func() {
		defer func() { <-s.toolsSem }()
		reply := ToolsReply{Version: ToolsReplyVersion, WorkerID: s.cfg.WorkerID, Tools: []ToolInfo{}}
		if refused != nil {
			s.log.Warn("tools request refused", "code", refused.Code, "error", refused.Message)
			reply.Error = &ToolsError{Code: string(refused.Code), Message: refused.Message}
		} else if m != nil {
			for _, name := range m.Names() {
				reply.Tools = append(reply.Tools, s.toolInfo(m.Tools[name]))
			}
		}
		payload, err := json.Marshal(reply)
		if err == nil {
			err = s.publish(replyTo, payload)
		}
		if err != nil {
			s.log.Warn("publishing the tools reply failed", "reply_to", truncateName(replyTo), "error", err)
		}
	}()
}

// toolInfo describes one manifest tool: its ceiling, the network policy
// its calls get, its warm pool size and whether it can work here.
func (s *Server) toolInfo(tool *manifest.Tool) ToolInfo {
	info := ToolInfo{Name: tool.Name, Description: tool.Description, Profile: tool.SandboxProfile,
		Warm: s.cfg.WarmDefault, TimeoutSeconds: int(manifestTimeout(tool) / time.Second)}
	if info.Profile == "" {
		info.Profile = s.cfg.DefaultProfile
	}
	if tool.WarmSet {
		info.Warm = tool.Warm
	}
	// Why it cannot work, named as the agent's texts name the worker's
	// directories (agentpaths.go).
	unavailable := func(err error) {
		if info.Unavailable == "" {
			info.Unavailable = s.forAgent(err.Error(), "")
		}
	}
	if err := s.toolProblem(tool); err != nil {
		unavailable(err)
	}
	prof, err := s.profiles.Lookup(info.Profile)
	if err != nil {
		unavailable(err)
		return info
	}
	pol := prof.Network
	if tool.Network != nil {
		if pol, err = prof.Network.Tighten(*tool.Network); err != nil {
			unavailable(err)
		}
	}
	info.Network, info.AllowedHosts = pol.Mode, pol.AllowedHosts
	return info
}
