package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/securetoolruntime/str/egress"
)

// credentialFlags are str run's flags for secretless credentials: the
// value never enters the sandbox, which sees NAME=placeholder; the egress
// proxy sends the value to the credential's hosts only.
type credentialFlags struct {
	sources, hosts, headers, queries multiFlag
}

func (c *credentialFlags) register(fs *flag.FlagSet) {
	fs.Var(&c.sources, "credential", "`NAME=SOURCE`: a secret the tool uses without seeing it; SOURCE is env:VAR, file:PATH or dir:DIR (DIR/NAME); "+
		"the tool gets $NAME = a placeholder, which the egress proxy replaces in requests to the credential's hosts (repeatable)")
	fs.Var(&c.hosts, "credential-host", "`NAME=HOST`: a host (or *.DOMAIN) the credential may be sent to; within the allowed hosts (repeatable, at least one)")
	fs.Var(&c.headers, "credential-header", "`NAME='Header: FORMAT'`: the header the value is sent in, FORMAT with {value} (e.g. 'Authorization: Bearer {value}')")
	fs.Var(&c.queries, "credential-query", "`NAME=PARAM`: a query parameter the value may be sent in instead")
}

// build loads each credential's value and makes its placeholder; every
// problem is returned, each naming its flag.
func (c *credentialFlags) build(getenv func(string) string) ([]egress.Credential, []error) {
	var errs []error
	var creds []egress.Credential
	index := map[string]int{}
	split := func(flagName, v string) (string, string, bool) {
		name, rest, ok := strings.Cut(v, "=")
		if !ok || name == "" || rest == "" {
			errs = append(errs, fmt.Errorf("--%s %q: want NAME=VALUE", flagName, v))
			return "", "", false
		}
		return name, rest, true
	}
	for _, v := range c.sources {
		name, src, ok := split("credential", v)
		if !ok {
			continue
		}
		if _, dup := index[name]; dup {
			errs = append(errs, fmt.Errorf("--credential %s: given twice", name))
			continue
		}
		secret, err := egress.LoadSecret(name, src, getenv)
		if err != nil {
			errs = append(errs, fmt.Errorf("--credential: %w", err))
			continue
		}
		ph, err := egress.NewPlaceholder()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		index[name] = len(creds)
		creds = append(creds, egress.Credential{Name: name, Value: secret, Placeholder: ph})
	}
	find := func(flagName, name string) *egress.Credential {
		i, ok := index[name]
		if !ok {
			errs = append(errs, fmt.Errorf("--%s %s: no --credential %s=SOURCE", flagName, name, name))
			return nil
		}
		return &creds[i]
	}
	for _, v := range c.hosts {
		if name, host, ok := split("credential-host", v); ok {
			if cr := find("credential-host", name); cr != nil {
				cr.Hosts = append(cr.Hosts, host)
			}
		}
	}
	for _, v := range c.headers {
		if name, hv, ok := split("credential-header", v); ok {
			if cr := find("credential-header", name); cr != nil {
				h, format, ok := strings.Cut(hv, ":")
				if !ok || cr.Header != "" {
					errs = append(errs, fmt.Errorf("--credential-header %s: want NAME='Header: FORMAT', once", name))
					continue
				}
				cr.Header, cr.Format = strings.TrimSpace(h), strings.TrimSpace(format)
			}
		}
	}
	for _, v := range c.queries {
		if name, q, ok := split("credential-query", v); ok {
			if cr := find("credential-query", name); cr != nil {
				cr.Query = q
			}
		}
	}
	for _, cr := range creds {
		if len(cr.Hosts) == 0 {
			errs = append(errs, fmt.Errorf("--credential %s: no --credential-host %s=HOST", cr.Name, cr.Name))
		}
		if cr.Header == "" && cr.Query == "" {
			errs = append(errs, fmt.Errorf("--credential %s: no --credential-header or --credential-query says how it is sent", cr.Name))
		}
	}
	slices.SortFunc(creds, func(a, b egress.Credential) int { return strings.Compare(a.Name, b.Name) })
	return creds, errs
}
