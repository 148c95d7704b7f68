package manifest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/securetoolruntime/str/egress"
	"gopkg.in/yaml.v3"
)

// Credential is one `credentials:` entry of a tool: a secret the tool's
// calls use without seeing it (egress.Credential). The manifest names only
// where the value is (From); the worker reads it for every call, so a
// changed file is used by the next call.
type Credential struct {
	// Name is the environment variable the sandbox gets the placeholder in.
	Name string
	// From is env:VAR (the worker's environment), file:PATH, or dir:DIR
	// (the file DIR/NAME: a directory of secrets the operator mounts).
	From string
	// Hosts, Header, Format, Query: as egress.Credential. The hosts must
	// be within the tool's own network policy's allowed_hosts.
	Hosts  []string
	Header string
	Format string
	Query  string
}

// Credentials are a tool's credentials, in manifest order.
type Credentials struct{ List []Credential }

var credentialFields = map[string]bool{"name": true, "from": true, "hosts": true, "header": true, "format": true, "query": true}

// credentials decodes a tool's credentials: list. A tool with credentials
// must carry its own network policy (restricted or allow_egress), so that
// each credential's hosts are checked against it here, at load, and not
// first at a call.
func (p *parser) credentials(t *Tool, where string, v *yaml.Node) {
	what := where + ".credentials"
	if v.Kind != yaml.SequenceNode {
		p.add(v, fmt.Sprintf("%s must be a list, not %s", what, kindName(v)))
		return
	}
	var list []Credential
	var probe []egress.Credential
	for i, item := range v.Content {
		iw := fmt.Sprintf("%s[%d]", what, i)
		if item.Kind != yaml.MappingNode {
			p.add(item, fmt.Sprintf("%s must be a mapping, not %s", iw, kindName(item)))
			continue
		}
		f := p.mapping(item, iw, credentialFields)
		var c Credential
		for key, dst := range map[string]*string{"name": &c.Name, "from": &c.From, "header": &c.Header, "format": &c.Format, "query": &c.Query} {
			if n, ok := f[key]; ok && n.Tag != "!!null" {
				if s, ok := p.str(n, iw+"."+key); ok {
					*dst = s
				}
			}
		}
		if n, ok := f["hosts"]; ok {
			if n.Kind != yaml.SequenceNode {
				p.add(n, fmt.Sprintf("%s.hosts must be a list, not %s", iw, kindName(n)))
			} else {
				for j, h := range n.Content {
					if s, ok := p.str(h, fmt.Sprintf("%s.hosts[%d]", iw, j)); ok {
						c.Hosts = append(c.Hosts, s)
					}
				}
			}
		}
		kind, arg, _ := strings.Cut(c.From, ":")
		if !slices.Contains([]string{"env", "file", "dir"}, kind) || arg == "" {
			p.add(fieldOr(f, "from", item), fmt.Sprintf("%s.from: %q: want env:VAR, file:PATH or dir:DIR", iw, c.From))
		}
		list = append(list, c)
		// The shape is checked as the proxy will check it, with a stand-in
		// value: names, hosts within the policy, header, format, query.
		ph, err := egress.NewPlaceholder()
		if err != nil {
			p.add(item, fmt.Sprintf("%s: %v", iw, err))
			continue
		}
		probe = append(probe, egress.Credential{Name: c.Name, Hosts: c.Hosts, Header: c.Header, Format: c.Format, Query: c.Query,
			Value: egress.NewSecret([]byte("x")), Placeholder: ph})
	}
	if len(list) == 0 {
		return
	}
	t.Credentials = &Credentials{List: list}
	if t.Network == nil || t.Network.Mode == egress.Isolated {
		p.add(v, what+": a tool with credentials needs its own network policy (restricted, with the credentials' hosts in allowed_hosts)")
		return
	}
	if err := egress.CheckCredentials(*t.Network, probe); err != nil {
		for _, e := range strings.Split(err.Error(), "\n") {
			p.add(v, fmt.Sprintf("%s.%s", where, e))
		}
	}
}

// Secrets reads the values of a tool's credentials for one call and gives
// each a fresh placeholder. getenv is the worker's environment. The error
// names the credential and its source, never a value.
func (cs *Credentials) Secrets(getenv func(string) string) ([]egress.Credential, error) {
	if cs == nil {
		return nil, nil
	}
	out := make([]egress.Credential, 0, len(cs.List))
	for _, c := range cs.List {
		v, err := egress.LoadSecret(c.Name, c.From, getenv)
		if err != nil {
			return nil, err
		}
		ph, err := egress.NewPlaceholder()
		if err != nil {
			return nil, err
		}
		out = append(out, egress.Credential{Name: c.Name, Hosts: slices.Clone(c.Hosts), Header: c.Header, Format: c.Format, Query: c.Query, Value: v, Placeholder: ph})
	}
	return out, nil
}
